//! The gallery version key (DESIGN.md §4): a stemcell version made into `MAJOR.MINOR.PATCH`.
//!
//! `N` → `N.0.0`, `N.M` → `N.M.0`, `N.M.P` → itself. Each part is decimal digits, no leading zeros
//! (except `0` itself), at most 2147483647 (Azure's 32-bit signed version parts). Everything else is
//! refused — never truncated: the Azure CPI drops a fourth part, so `1.2.3.4` and `1.2.3.5` would
//! collide on one gallery version.

use std::cmp::Ordering;
use std::fmt;

/// The largest value Azure accepts for one part of a gallery image version.
pub const MAX_PART: u64 = 2_147_483_647;

/// Why a stemcell version cannot become a gallery version key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VersionError {
    #[error("stemcell version is empty; a gallery version needs MAJOR[.MINOR[.PATCH]] with decimal digits")]
    Empty,
    #[error(
        "stemcell version {version:?} contains whitespace; use digits and dots only, e.g. 1.506"
    )]
    Whitespace { version: String },
    #[error("stemcell version {version:?} has {parts} parts; a gallery version has at most 3 (MAJOR.MINOR.PATCH) and extra parts are never dropped, so use a stemcell whose version has 1 to 3 parts")]
    TooManyParts { version: String, parts: usize },
    #[error("gallery version {version:?} must have exactly 3 parts (MAJOR.MINOR.PATCH)")]
    NotThreeParts { version: String },
    #[error("stemcell version {version:?}: part {index} ({part:?}) is not a decimal number; pre-release (-rc.1), build (+meta) and letters cannot be expressed as a gallery version")]
    NotNumeric {
        version: String,
        index: usize,
        part: String,
    },
    #[error("stemcell version {version:?}: part {index} ({part:?}) has a leading zero; write it without (e.g. 1.5 rather than 1.05) so it maps to exactly one gallery version")]
    LeadingZero {
        version: String,
        index: usize,
        part: String,
    },
    #[error("stemcell version {version:?}: part {index} ({part}) is larger than {MAX_PART}, the largest version part Azure accepts")]
    TooLarge {
        version: String,
        index: usize,
        part: String,
    },
}

/// The stemcell is what it is: the same on every retry.
impl crate::error::Classified for VersionError {
    fn class(&self) -> crate::error::Class {
        crate::error::Class::Permanent
    }
}

/// A validated gallery version key, `MAJOR.MINOR.PATCH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct VersionKey {
    pub major: u32,
    pub minor: u32,
    pub patch: u32,
}

impl VersionKey {
    /// Turn a stemcell version (`N`, `N.M` or `N.M.P`) into its gallery version key.
    pub fn parse(version: &str) -> Result<VersionKey, VersionError> {
        let parts = split(version)?;
        if parts.len() > 3 {
            return Err(VersionError::TooManyParts {
                version: version.to_string(),
                parts: parts.len(),
            });
        }
        Self::from_parts(version, &parts)
    }

    /// Parse the name of an existing gallery version, which must have exactly three parts.
    pub fn parse_gallery(name: &str) -> Result<VersionKey, VersionError> {
        let parts = split(name)?;
        if parts.len() != 3 {
            return Err(VersionError::NotThreeParts {
                version: name.to_string(),
            });
        }
        Self::from_parts(name, &parts)
    }

    fn from_parts(version: &str, parts: &[&str]) -> Result<VersionKey, VersionError> {
        let mut nums = [0u32; 3];
        for (index, part) in parts.iter().enumerate() {
            nums[index] = parse_part(version, index, part)?;
        }
        Ok(VersionKey {
            major: nums[0],
            minor: nums[1],
            patch: nums[2],
        })
    }

    /// The key as a `semver::Version` (no pre-release, no build metadata).
    pub fn semver(&self) -> semver::Version {
        semver::Version::new(self.major.into(), self.minor.into(), self.patch.into())
    }
}

fn split(version: &str) -> Result<Vec<&str>, VersionError> {
    if version.is_empty() {
        return Err(VersionError::Empty);
    }
    if version.chars().any(char::is_whitespace) {
        return Err(VersionError::Whitespace {
            version: version.to_string(),
        });
    }
    Ok(version.split('.').collect())
}

fn parse_part(version: &str, index: usize, part: &str) -> Result<u32, VersionError> {
    let err_numeric = || VersionError::NotNumeric {
        version: version.to_string(),
        index: index + 1,
        part: part.to_string(),
    };
    if part.is_empty() || !part.bytes().all(|b| b.is_ascii_digit()) {
        return Err(err_numeric());
    }
    if part.len() > 1 && part.starts_with('0') {
        return Err(VersionError::LeadingZero {
            version: version.to_string(),
            index: index + 1,
            part: part.to_string(),
        });
    }
    let too_large = || VersionError::TooLarge {
        version: version.to_string(),
        index: index + 1,
        part: part.to_string(),
    };
    // Longer than any u64 can hold: too large, not "not numeric".
    let value: u64 = part.parse().map_err(|_| too_large())?;
    if value > MAX_PART {
        return Err(too_large());
    }
    u32::try_from(value).map_err(|_| too_large())
}

impl fmt::Display for VersionKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

impl std::str::FromStr for VersionKey {
    type Err = VersionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl Ord for VersionKey {
    fn cmp(&self, other: &Self) -> Ordering {
        self.semver().cmp(&other.semver())
    }
}

impl PartialOrd for VersionKey {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}

impl serde::Serialize for VersionKey {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn key(s: &str) -> String {
        VersionKey::parse(s).unwrap().to_string()
    }

    #[test]
    fn stemcell_versions_map_to_three_parts() {
        assert_eq!(key("1"), "1.0.0");
        assert_eq!(key("1.506"), "1.506.0");
        assert_eq!(key("1.506.7"), "1.506.7");
        assert_eq!(key("0"), "0.0.0");
        assert_eq!(key("1.10"), "1.10.0");
        assert_eq!(key("2147483647.0.2147483647"), "2147483647.0.2147483647");
    }

    #[test]
    fn fourth_part_is_refused_not_dropped() {
        let err = VersionKey::parse("1.2.3.4").unwrap_err();
        assert!(matches!(err, VersionError::TooManyParts { parts: 4, .. }));
        assert!(err.to_string().contains("never dropped"), "{err}");
    }

    #[test]
    fn everything_else_is_refused() {
        for bad in [
            "",
            " 1",
            "1 ",
            "1. 2",
            "1.2-rc.1",
            "1.2+build",
            "1.2.3-rc",
            "v1",
            "1.a",
            "1..2",
            ".1",
            "1.",
            "01",
            "1.02",
            "2147483648",
            "1.99999999999999999999999",
            "-1",
            "+1",
            "1.2.3.4.5",
            "１",
        ] {
            assert!(VersionKey::parse(bad).is_err(), "{bad:?} must be refused");
        }
    }

    #[test]
    fn gallery_names_need_three_parts() {
        assert_eq!(
            VersionKey::parse_gallery("1.506.0").unwrap().to_string(),
            "1.506.0"
        );
        assert!(VersionKey::parse_gallery("1.506").is_err());
        assert!(VersionKey::parse_gallery("1.2.3.4").is_err());
        assert!(VersionKey::parse_gallery("latest").is_err());
    }

    #[test]
    fn ordering_is_numeric_not_lexical() {
        let a = VersionKey::parse("1.9").unwrap();
        let b = VersionKey::parse("1.10").unwrap();
        assert!(a < b);
    }

    proptest! {
        #[test]
        fn round_trip_three_parts(a in 0u32..=2147483647, b in 0u32..=2147483647, c in 0u32..=2147483647) {
            let s = format!("{a}.{b}.{c}");
            let k = VersionKey::parse(&s).unwrap();
            prop_assert_eq!(k.to_string(), s.clone());
            prop_assert_eq!(VersionKey::parse_gallery(&s).unwrap(), k);
            prop_assert_eq!(k.semver().to_string(), s);
        }

        #[test]
        fn shorter_versions_pad_with_zero(a in 0u32..=2147483647, b in 0u32..=2147483647) {
            prop_assert_eq!(VersionKey::parse(&a.to_string()).unwrap().to_string(), format!("{a}.0.0"));
            prop_assert_eq!(VersionKey::parse(&format!("{a}.{b}")).unwrap().to_string(), format!("{a}.{b}.0"));
        }

        #[test]
        fn never_truncates(parts in proptest::collection::vec(0u32..1000, 4..7)) {
            let s = parts.iter().map(u32::to_string).collect::<Vec<_>>().join(".");
            prop_assert!(VersionKey::parse(&s).is_err());
        }

        #[test]
        fn accepted_keys_preserve_every_digit(s in "[0-9.a-z+-]{0,24}") {
            if let Ok(k) = VersionKey::parse(&s) {
                // Whatever is accepted maps back onto its input plus zero padding.
                let printed = k.to_string();
                prop_assert!(printed.starts_with(&s));
                let rest = &printed[s.len()..];
                prop_assert!(rest.is_empty() || rest == ".0" || rest == ".0.0");
            }
        }

        #[test]
        fn ordering_equals_semver(a in (0u32..5, 0u32..5, 0u32..5), b in (0u32..5, 0u32..5, 0u32..5)) {
            let ka = VersionKey::parse(&format!("{}.{}.{}", a.0, a.1, a.2)).unwrap();
            let kb = VersionKey::parse(&format!("{}.{}.{}", b.0, b.1, b.2)).unwrap();
            let sa = semver::Version::new(a.0.into(), a.1.into(), a.2.into());
            let sb = semver::Version::new(b.0.into(), b.1.into(), b.2.into());
            prop_assert_eq!(ka.cmp(&kb), sa.cmp(&sb));
            prop_assert_eq!(ka.cmp(&kb), (a.0, a.1, a.2).cmp(&(b.0, b.1, b.2)));
        }

        #[test]
        fn out_of_range_parts_are_refused(big in 2147483648u64..=u64::MAX) {
            prop_assert!(matches!(VersionKey::parse(&format!("1.{big}")), Err(VersionError::TooLarge { .. })), "{}", big);
        }
    }
}
