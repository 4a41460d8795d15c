//! Who holds a reference, as the record keeps it.

use super::MAX_HOLDER_LEN;

/// Who holds a reference, in the form the record keeps: a director UUID as `director:<uuid>`,
/// anything else as given. `Err` says what is wrong with a label.
pub fn holder_label(raw: &str) -> std::result::Result<String, String> {
    let h = raw.trim();
    let ok = !h.is_empty()
        && h.len() <= MAX_HOLDER_LEN
        && h.chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-' | ':' | '@' | '/'));
    if !ok {
        return Err(format!(
            "holder {raw:?} is not valid: use 1 to {MAX_HOLDER_LEN} characters from A-Z a-z 0-9 . _ - : @ /"
        ));
    }
    if is_uuid(h) {
        return Ok(director_holder(h));
    }
    Ok(h.to_string())
}

/// The holder of a director's (or create-env's) references: `director:<uuid>`, lower case.
pub fn director_holder(uuid: &str) -> String {
    format!("director:{}", uuid.trim().to_ascii_lowercase())
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}
