//! Replays fixtures/arm/*.json (written from the REST spec example shapes, api-version 2023-07-03)
//! against the emulator: each request gets the recorded status and a response with every field
//! the real API returns.

use crate::support::emulated;

use serde_json::Value;

use emulated::*;

/// Follow a path like `a.b[0].c` into a JSON value.
fn at<'a>(v: &'a Value, path: &str) -> Option<&'a Value> {
    let mut cur = v;
    for part in path.split('.') {
        let (name, index) = match part.split_once('[') {
            Some((n, rest)) => (n, rest.trim_end_matches(']').parse::<usize>().ok()),
            None => (part, None),
        };
        cur = cur.get(name)?;
        if let Some(i) = index {
            cur = cur.get(i)?;
        }
    }
    Some(cur)
}

#[tokio::test]
async fn the_rest_spec_shaped_payloads_round_trip() {
    let h = start_default().await;
    let r = Raw::new(&h.arm);
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/arm");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .collect();
    files.sort();
    assert!(files.len() >= 6, "fixtures present: {files:?}");
    for file in files {
        let name = file.file_name().unwrap().to_string_lossy().to_string();
        let text = std::fs::read_to_string(&file)
            .unwrap()
            .replace("{subscription-id}", SUB);
        let fx: Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
        let path = fx["path"].as_str().unwrap();
        if fx["poll_first"] == true {
            // Let the previous operation on this resource finish.
            r.get(path).await;
        }
        let resp = r
            .send(
                fx["method"].as_str().unwrap(),
                &with_api(path),
                fx.get("request").cloned(),
                true,
            )
            .await;
        assert_eq!(
            resp.status as u64,
            fx["status"].as_u64().unwrap(),
            "{name}: {}",
            resp.text
        );
        for field in fx["response_has"].as_array().unwrap() {
            let field = field.as_str().unwrap();
            assert!(
                at(&resp.body, field).is_some(),
                "{name}: response lacks {field}: {}",
                resp.text
            );
        }
        if let Some(eqs) = fx["response_equals"].as_object() {
            for (field, want) in eqs {
                assert_eq!(
                    at(&resp.body, field),
                    Some(want),
                    "{name}: {field} in {}",
                    resp.text
                );
            }
        }
    }
}
