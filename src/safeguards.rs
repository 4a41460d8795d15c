//! Ground floor, pure. What a new version is published with to guard it against deletion (issue 30 item 6): an end of
//! life, and whether Azure refuses to delete it before then (`--end-of-life`,
//! `--block-deletion-before-end-of-life`, the config keys and cpi.json properties). Checked
//! before any write: a malformed or past end of life, or a block with nothing to end it, is
//! refused with the remedy (Azure would refuse the create: "EndOfLifeDate must be set to a future
//! date", REFERENCE.md "Today's Azure").

use std::time::Duration;

use time::format_description::well_known::Rfc3339;
use time::OffsetDateTime;

/// When a version's life ends: a date, or a span after it is published.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EndOfLife {
    At(OffsetDateTime),
    After(Duration),
}

impl std::str::FromStr for EndOfLife {
    type Err = String;

    /// An RFC 3339 date-time (`2027-06-30T00:00:00Z`), a date (`2027-06-30`, midnight UTC), or
    /// a span after publishing (`180days`, `26weeks`, `6months`).
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if let Ok(at) = OffsetDateTime::parse(s, &Rfc3339) {
            return Ok(EndOfLife::At(at));
        }
        let date = time::macros::format_description!("[year]-[month]-[day]");
        if let Ok(d) = time::Date::parse(s, &date) {
            return Ok(EndOfLife::At(d.midnight().assume_utc()));
        }
        match humantime::parse_duration(s) {
            Ok(d) if !d.is_zero() => Ok(EndOfLife::After(d)),
            _ => Err(format!(
                "{s:?} is not an end of life: give a date (2027-06-30), an RFC 3339 date-time (2027-06-30T00:00:00Z) or a span after publishing (180days, 26weeks)"
            )),
        }
    }
}

/// The guards a new version is created with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Safeguards {
    pub end_of_life: Option<EndOfLife>,
    /// Ask Azure to refuse deletion before the end of life.
    pub block_deletion_before_end_of_life: bool,
}

impl Safeguards {
    /// Refuse what Azure would refuse, before anything is written: an end of life at or before
    /// `now`, or a block with no end of life (it could never end).
    pub fn check(&self, now: OffsetDateTime) -> Result<(), String> {
        if let Some(EndOfLife::At(at)) = self.end_of_life {
            if at <= now {
                return Err(format!(
                    "the end of life {} is not in the future: give a later date, or a span after publishing such as 180days",
                    at.format(&Rfc3339).unwrap_or_default()
                ));
            }
        }
        if self.block_deletion_before_end_of_life && self.end_of_life.is_none() {
            return Err(
                "--block-deletion-before-end-of-life needs an end of life (--end-of-life DATE, or the end_of_life setting): without one the block could never end"
                    .into(),
            );
        }
        Ok(())
    }

    /// The end of life to send, as RFC 3339, for a version published at `now`.
    pub fn end_of_life_at(&self, now: OffsetDateTime) -> Option<String> {
        let at = match self.end_of_life? {
            EndOfLife::At(at) => at,
            EndOfLife::After(span) => now + span,
        };
        at.replace_nanosecond(0).unwrap_or(at).format(&Rfc3339).ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    const NOW: OffsetDateTime = datetime!(2026-12-03 12:00 UTC);

    #[test]
    fn an_end_of_life_is_a_date_a_date_time_or_a_span() {
        assert_eq!(
            "2027-06-30".parse::<EndOfLife>(),
            Ok(EndOfLife::At(datetime!(2027-06-30 00:00 UTC)))
        );
        assert_eq!(
            "2027-06-30T08:00:00+02:00".parse::<EndOfLife>(),
            Ok(EndOfLife::At(datetime!(2027-06-30 06:00 UTC)))
        );
        assert_eq!(
            "180days".parse::<EndOfLife>(),
            Ok(EndOfLife::After(Duration::from_secs(180 * 86_400)))
        );
        for bad in ["next year", "", "0s", "2027-13-01", "30/06/2027"] {
            let e = bad.parse::<EndOfLife>().unwrap_err();
            assert!(e.contains("not an end of life"), "{bad}: {e}");
        }
    }

    #[test]
    fn a_past_end_of_life_or_a_block_without_one_is_refused_before_any_write() {
        let past = Safeguards {
            end_of_life: Some(EndOfLife::At(datetime!(2026-12-01 00:00 UTC))),
            block_deletion_before_end_of_life: false,
        };
        assert!(past.check(NOW).unwrap_err().contains("not in the future"));
        let endless = Safeguards {
            end_of_life: None,
            block_deletion_before_end_of_life: true,
        };
        assert!(endless
            .check(NOW)
            .unwrap_err()
            .contains("needs an end of life"));
        let fine = Safeguards {
            end_of_life: Some(EndOfLife::After(Duration::from_secs(86_400))),
            block_deletion_before_end_of_life: true,
        };
        assert_eq!(fine.check(NOW), Ok(()));
        assert_eq!(
            fine.end_of_life_at(NOW).as_deref(),
            Some("2026-12-04T12:00:00Z")
        );
        assert_eq!(Safeguards::default().end_of_life_at(NOW), None);
    }
}
