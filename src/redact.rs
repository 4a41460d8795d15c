//! Redaction of what must never be printed: the query string of a URI (it may hold a SAS token,
//! whose `sig` grants access to the blob). Every place that renders a URI in an output, an error
//! or a log goes through [`uri`].

/// What replaces a redacted query.
pub const REDACTED: &str = "<redacted>";

/// `uri` with its query string (and fragment) replaced by `?<redacted>`; unchanged when it has
/// none. Works on text that is not a valid URL too (it only looks for `?` and `#`).
pub fn uri(uri: &str) -> String {
    let (base, had_query) = match uri.split_once('?') {
        Some((base, _)) => (base, true),
        None => (uri, false),
    };
    let base = base.split('#').next().unwrap_or(base);
    if had_query {
        format!("{base}?{REDACTED}")
    } else {
        base.to_string()
    }
}

/// [`uri`] over an optional URI.
pub fn opt_uri(v: Option<&str>) -> Option<String> {
    v.map(uri)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn queries_are_redacted_and_plain_uris_kept() {
        assert_eq!(
            uri("https://a.blob.core.windows.net/stemcell/x.vhd?sv=2022&sig=SECRET"),
            "https://a.blob.core.windows.net/stemcell/x.vhd?<redacted>"
        );
        assert_eq!(
            uri("https://a.blob.core.windows.net/stemcell/x.vhd"),
            "https://a.blob.core.windows.net/stemcell/x.vhd"
        );
        assert_eq!(uri("not a url?sig=SECRET#frag"), "not a url?<redacted>");
        assert_eq!(uri("https://a/b#sig=SECRET"), "https://a/b");
        assert_eq!(uri("https://a/b?"), "https://a/b?<redacted>");
    }
}
