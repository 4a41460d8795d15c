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

/// How far ahead an end of life must be, after publishing or from now: Azure keeps an end of
/// life to the second and refuses one that is not in the future when the create reaches it
/// ("EndOfLifeDate must be set to a future date", REFERENCE.md "Today's Azure"). The create
/// comes after the upload, and this tool sends the date to the second, rounded down, from its
/// estimate of Azure's clock (whole seconds from `Date` headers): `--end-of-life 1ms` was already
/// past when Azure read it, after the whole upload (issue 46 item 5). A minute covers the
/// rounding, the clock estimate and the create's travel with room; an image that ends its life
/// sooner than that has no use.
pub const MIN_END_OF_LIFE_AHEAD: Duration = Duration::from_secs(60);

/// The guards a new version is created with.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Safeguards {
    pub end_of_life: Option<EndOfLife>,
    /// Ask Azure to refuse deletion before the end of life.
    pub block_deletion_before_end_of_life: bool,
}

impl Safeguards {
    /// Refuse what Azure would refuse, before anything is written: an end of life less than
    /// [`MIN_END_OF_LIFE_AHEAD`] after publishing (a span) or from `now` (a date), naming the
    /// earliest one Azure accepts; or a block with no end of life (it could never end).
    pub fn check(&self, now: OffsetDateTime) -> Result<(), String> {
        // To the second, rounded up: the date named is itself accepted.
        let ahead = now + MIN_END_OF_LIFE_AHEAD;
        let earliest = match ahead.nanosecond() {
            0 => ahead,
            _ => (ahead + time::Duration::SECOND)
                .replace_nanosecond(0)
                .unwrap_or(ahead),
        };
        let earliest_text = format!(
            "the earliest end of life Azure accepts is {} (a minute from now): Azure keeps it to the second and refuses one already past when the create reaches it, after the upload",
            earliest.format(&Rfc3339).unwrap_or_default()
        );
        match self.end_of_life {
            Some(EndOfLife::At(at)) if at < now + MIN_END_OF_LIFE_AHEAD => {
                let when = if at <= now {
                    "is not in the future"
                } else {
                    "is less than a minute away"
                };
                return Err(format!(
                    "the end of life {} {when}; {earliest_text}. Give a later date, or a span after publishing of at least 1m such as 180days",
                    at.format(&Rfc3339).unwrap_or_default()
                ));
            }
            Some(EndOfLife::After(span)) if span < MIN_END_OF_LIFE_AHEAD => {
                return Err(format!(
                    "an end of life {} after publishing would be past before Azure records it; {earliest_text}. Give a span of at least 1m such as 180days, or a date",
                    humantime::format_duration(span)
                ));
            }
            _ => {}
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

    /// Azure keeps an end of life to the second and compares it with its clock when the create
    /// arrives, after the upload: an end of life less than a minute after publishing (or from
    /// now, for a date) is refused, naming the earliest one accepted (issue 46 item 5).
    #[test]
    fn an_end_of_life_less_than_a_minute_ahead_is_refused_naming_the_earliest() {
        let with = |end_of_life| Safeguards {
            end_of_life: Some(end_of_life),
            block_deletion_before_end_of_life: false,
        };
        for too_soon in [
            EndOfLife::After(Duration::from_millis(1)),
            EndOfLife::After(Duration::from_secs(59)),
            EndOfLife::At(datetime!(2026-12-03 12:00:30 UTC)),
            EndOfLife::At(datetime!(2026-12-01 00:00 UTC)),
        ] {
            let e = with(too_soon).check(NOW).unwrap_err();
            assert!(
                e.contains("the earliest end of life Azure accepts is 2026-12-03T12:01:00Z")
                    && e.contains("at least 1m"),
                "{too_soon:?}: {e}"
            );
        }
        assert!(with(EndOfLife::After(Duration::from_millis(1)))
            .check(NOW)
            .unwrap_err()
            .contains("1ms after publishing"));
        for fine in [
            EndOfLife::After(Duration::from_secs(60)),
            EndOfLife::At(datetime!(2026-12-03 12:01:00 UTC)),
        ] {
            assert_eq!(with(fine).check(NOW), Ok(()), "{fine:?}");
        }
    }
}
