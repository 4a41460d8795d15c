//! Tag names as Azure compares them: case-insensitively.

use std::collections::BTreeMap;

use super::{
    BIRTH_MARK, CPI_REFERENCES, CREATED_BY, GALLERY_NAME, IMAGE_DEFINITION, IMAGE_SHA256,
    LEGACY_CHUNK_PREFIX, MODE, OVERFLOW_PREFIX, PROTECT, SOURCE_BLOB, STEMCELL, STEMCELL_NAME,
    STEMCELL_VERSION, VHD_CONTENT,
};

/// Whether `tags` holds a tag named `name`. Azure tag names are case-insensitive (REFERENCE.md
/// "Tags"; Azure Resource Manager docs, "Use tags to organize your Azure resources": "Tag names
/// are case-insensitive for operations"), so `Stemcell_Gallery_Protect` is `stemcell_gallery_protect`.
pub fn has(tags: &BTreeMap<String, String>, name: &str) -> bool {
    get(tags, name).is_some()
}

/// The value of the tag named `name`, whatever the casing of its name (see [`has`]).
pub fn get<'a>(tags: &'a BTreeMap<String, String>, name: &str) -> Option<&'a String> {
    tags.get(name).or_else(|| {
        tags.iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// `tags` with the names this tool and the Azure CPI read spelled as they define them (so a tag
/// another client wrote as `Stemcell_References` or `SG_REFS_00` is still read). Other names are
/// kept as they are.
pub fn canonical_names(tags: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    const KNOWN: [&str; 13] = [
        IMAGE_SHA256,
        GALLERY_NAME,
        IMAGE_DEFINITION,
        CPI_REFERENCES,
        STEMCELL_NAME,
        STEMCELL,
        MODE,
        STEMCELL_VERSION,
        SOURCE_BLOB,
        CREATED_BY,
        PROTECT,
        BIRTH_MARK,
        VHD_CONTENT,
    ];
    tags.iter()
        .map(|(k, v)| {
            let name = KNOWN
                .iter()
                .find(|n| n.eq_ignore_ascii_case(k))
                .map(|n| n.to_string())
                .or_else(|| {
                    [OVERFLOW_PREFIX, LEGACY_CHUNK_PREFIX]
                        .iter()
                        .find_map(|prefix| {
                            let head = k.get(..prefix.len())?;
                            head.eq_ignore_ascii_case(prefix)
                                .then(|| format!("{prefix}{}", &k[prefix.len()..]))
                        })
                })
                .unwrap_or_else(|| k.clone());
            (name, v.clone())
        })
        .collect()
}
