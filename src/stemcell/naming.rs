//! Image definition naming, in one place: the director's definitions are named as the Azure CPI
//! (v53+) names them (the stemcell name, plus `-<generation>` for anything but gen1), and
//! create-env definitions are the director's name plus a suffix (`-create-env` unless
//! configured), so the two never share a definition (DESIGN.md §4).

/// The create-env suffix when none is configured.
pub const DEFAULT_CREATE_ENV_SUFFIX: &str = "-create-env";

/// The director-mode definition: `base`, plus `-<generation>` unless the generation is gen1.
pub fn director_definition(base: &str, generation: &str) -> String {
    if generation.eq_ignore_ascii_case("gen1") {
        base.to_string()
    } else {
        format!("{base}-{generation}")
    }
}

/// The create-env definition of a director definition.
pub fn create_env_definition(director: &str, suffix: &str) -> String {
    format!("{director}{suffix}")
}

/// A configured suffix, else [`DEFAULT_CREATE_ENV_SUFFIX`] (an empty value counts as unset).
pub fn suffix_or_default(configured: Option<&str>) -> &str {
    match configured {
        Some(s) if !s.trim().is_empty() => s,
        _ => DEFAULT_CREATE_ENV_SUFFIX,
    }
}

/// Whether `definition` is a create-env definition under `suffix` (a version without our mode
/// tag, made by an older tool, is classified by its definition's name).
pub fn is_create_env_definition(definition: &str, suffix: &str) -> bool {
    !suffix.is_empty() && definition.ends_with(suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn director_and_create_env_definitions_follow_the_cpis_naming() {
        assert_eq!(director_definition("bosh-azure-x", "gen1"), "bosh-azure-x");
        assert_eq!(
            director_definition("bosh-azure-x", "gen2"),
            "bosh-azure-x-gen2"
        );
        assert_eq!(
            create_env_definition("bosh-azure-x-gen2", DEFAULT_CREATE_ENV_SUFFIX),
            "bosh-azure-x-gen2-create-env"
        );
        assert_eq!(suffix_or_default(Some(" ")), DEFAULT_CREATE_ENV_SUFFIX);
        assert_eq!(suffix_or_default(Some("-ce")), "-ce");
        assert!(is_create_env_definition("x-gen2-ce", "-ce"));
        assert!(!is_create_env_definition("x-gen2-create-env", "-ce"));
    }
}
