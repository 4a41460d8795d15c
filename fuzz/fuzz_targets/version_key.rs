//! Version keys: never a panic, and every accepted key round-trips and orders like semver.
#![no_main]

use libfuzzer_sys::fuzz_target;
use stemcell_gallery::stemcell::version::MAX_PART;
use stemcell_gallery::stemcell::VersionKey;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(k) = VersionKey::parse(s) {
        let text = k.to_string();
        let again =
            VersionKey::parse_gallery(&text).expect("a printed key parses as a gallery key");
        assert_eq!(again, k, "{s:?} -> {text:?}");
        // Never truncated: 1 to 3 parts only, each the digits given.
        assert!(
            s.split('.').count() <= 3,
            "{s:?} accepted with more than 3 parts"
        );
        for p in [k.major, k.minor, k.patch] {
            assert!(u64::from(p) <= MAX_PART);
        }
        assert_eq!(k.cmp(&again), std::cmp::Ordering::Equal);
    }
    if let Ok(k) = VersionKey::parse_gallery(s) {
        assert_eq!(k.to_string(), s, "a gallery key is its own canonical text");
    }
    // Two keys from one input split in half: ordering agrees with semver's.
    let mut mid = s.len() / 2;
    while !s.is_char_boundary(mid) {
        mid -= 1;
    }
    let (a, b) = s.split_at(mid);
    if let (Ok(x), Ok(y)) = (VersionKey::parse(a), VersionKey::parse(b)) {
        assert_eq!(x.cmp(&y), x.semver().cmp(&y.semver()));
        assert_eq!(x == y, x.to_string() == y.to_string());
    }
});
