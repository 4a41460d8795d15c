//! Which life of its version a record belongs to (see the module documentation of
//! `gallery::record`, "Whose record it is"): its `publishedDate` once bound, the birth mark of
//! the create it was written before until then, and the references a replacement of a Failed
//! version carries across its own DELETE.

use super::super::tags;
use super::super::ImageVersion;
use super::Record;

/// A version's life as a record keeps it: its `publishedDate` in RFC 3339.
pub fn life_of(v: &ImageVersion) -> Option<String> {
    v.published_date.and_then(|d| {
        d.format(&time::format_description::well_known::Rfc3339)
            .ok()
    })
}

/// Whether two lives (`life_of` strings) are the same instant, however each was written.
pub fn same_instant(a: &str, b: &str) -> bool {
    let parse = |s: &str| {
        time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()
    };
    match (parse(a), parse(b)) {
        (Some(x), Some(y)) => x == y,
        _ => a == b,
    }
}

impl Record {
    /// Whether this record belongs to the version as now read (`None`: absent): of its content
    /// (when both say), and of its life — a record bound to a life that is over (the version is
    /// gone, or was made again) is not this version's; one bound to no life yet but written
    /// before a create is the record of the version that create made (its birth mark) only.
    pub fn fits(&self, v: Option<&ImageVersion>) -> bool {
        let Some(v) = v else {
            return self.life.is_none() || !self.carried.is_empty();
        };
        if let (Some(vs), Some(_)) = (tags::get(&v.tags, tags::IMAGE_SHA256), &self.image_sha256) {
            if !self.is_for(&super::Content::image(vs)) {
                return false;
            }
        }
        if let (Some(mine), Some(its)) = (&self.life, life_of(v)) {
            return same_instant(mine, &its);
        }
        match (&self.life, &self.born) {
            (None, Some(mark)) => tags::get(&v.tags, tags::BIRTH_MARK)
                .is_some_and(|m| m.trim().eq_ignore_ascii_case(mark)),
            _ => true,
        }
    }

    /// This record bound to the life of `v` (its `publishedDate`).
    pub fn bound_to(mut self, v: &ImageVersion) -> Record {
        self.life = life_of(v);
        self.carried.clear();
        self.carried_cpi.clear();
        self
    }

    /// This record of the Failed version `v`, noting that its references `carried` go to the
    /// version this tool creates after deleting it (see [`Record::carried`]).
    pub fn carrying_from(self, v: &ImageVersion, carried: &[String]) -> Record {
        let mut r = self.bound_to(v);
        r.carried = carried.to_vec();
        r.carried_cpi = tags::sourced_references(&v.tags)
            .into_iter()
            .filter(|(c, s)| *s == tags::Source::StemcellReferences && carried.contains(c))
            .map(|(c, _)| c)
            .collect();
        r
    }

    /// This record without its note of references to carry (the Failed version stays): the
    /// CPI's own CIDs it noted go with the note (the version's tags hold them, if the CPI
    /// still does).
    pub fn without_carry_note(mut self) -> Record {
        let cpi = std::mem::take(&mut self.carried_cpi);
        self.references.retain(|e| !cpi.contains(&e.reference));
        self.carried.clear();
        self
    }

    /// This record as the base of a create of its (absent) version: what it carries to the
    /// new version. A record bound to no life and written by no create (an earlier release's)
    /// carries every reference; one a create or a replacement wrote carries only what it noted
    /// as carried — the version it was written for is gone, and with it the rest.
    pub fn carried_to_create(&self) -> Record {
        let mut r = self.clone();
        if self.life.is_some() || self.born.is_some() {
            r.references.retain(|e| self.carried.contains(&e.reference));
        }
        r.life = None;
        r.born = None;
        r.carried.clear();
        r
    }

    /// This record written before a create whose PUT carries `mark`, carrying `carried` (the
    /// CPI's own among them stay marked so: `Record::carried_cpi`).
    pub fn before_create(mut self, mark: &str, carried: &[String]) -> Record {
        self.life = None;
        self.born = Some(mark.to_string());
        self.carried = carried.to_vec();
        self.carried_cpi.retain(|c| carried.contains(c));
        self
    }
}

impl super::Loaded {
    /// The record that says what the version as now read holds (`None`: absent):
    /// [`super::Loaded::applicable`] for a version that is there, [`super::Loaded::of_absent`]
    /// for one that is not.
    pub fn holding(&self, v: Option<&ImageVersion>) -> Option<Record> {
        match v {
            Some(_) => self.applicable(v),
            None => self.of_absent(),
        }
    }

    /// The record a removal applies to while the version is absent: the one a create would
    /// carry from (bound to no life, or noting references to carry), else the record of the
    /// life that was there last — bound to it, so it comes back only with that life (a
    /// soft-deleted version restored) and never applies to another. Chosen only when those
    /// copies name one content and life: with the version gone there is nothing to check a copy
    /// against, so copies that disagree (one overwritten) are never written over the good one
    /// (a removal reaches each: `record::forget_in_each_copy`).
    pub fn of_absent(&self) -> Option<Record> {
        let unbound: Vec<&Record> = self.valid().filter(|r| r.fits(None)).collect();
        if !unbound.is_empty() {
            return agreed(unbound);
        }
        agreed(self.valid().filter(|r| r.life.is_some()).collect())
    }

    /// Whether the record of the version as now read (`None`: absent) holds `reference`: the
    /// one [`super::Loaded::holding`] chooses, or, for an absent version whose copies disagree,
    /// any of them (a removal reaches each; a search must not answer "not found").
    pub fn holds(&self, v: Option<&ImageVersion>, reference: &str) -> bool {
        match (self.holding(v), v) {
            (Some(r), _) => r.holds(reference),
            (None, Some(_)) => false,
            (None, None) => self.valid().any(|r| r.holds(reference)),
        }
    }

    /// Whether any copy is a valid record of this version's binding.
    pub fn has_valid_copy(&self) -> bool {
        self.valid().next().is_some()
    }
}

impl super::Loaded {
    /// Whether a copy notes references to carry (`Record::carried`) from a life other than
    /// `v`'s: a replacement of a Failed version that died before its create, after which
    /// someone else made the version again. Deleting `v` without voiding that note would let
    /// the next create carry references of a life two lives back.
    pub fn notes_carry_past(&self, v: &ImageVersion) -> bool {
        self.valid()
            .any(|r| !r.carried.is_empty() && !r.fits(Some(v)))
    }
}

/// The newest of `copies` when they all name one content and life; `None` when they disagree
/// (one was overwritten: with no version to check them against, neither is chosen).
fn agreed(copies: Vec<&Record>) -> Option<Record> {
    let first = copies.first()?;
    let agree = copies.iter().all(|r| {
        r.image_sha256 == first.image_sha256
            && match (&r.life, &first.life) {
                (Some(a), Some(b)) => same_instant(a, b),
                (a, b) => a == b,
            }
    });
    if !agree {
        return None;
    }
    copies.into_iter().max_by_key(|r| r.generation).cloned()
}
