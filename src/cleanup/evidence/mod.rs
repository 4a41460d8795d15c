//! Evidence of use: every source that can show a gallery version is still needed.
//!
//! A source yields [`Claim`]s: "this target is in use, because ...". Targets are deliberately
//! coarse where the source is (a stemcell name and version, a CID, a whole definition's `latest`);
//! the planner protects every version a claim can match. Protecting too much is safe, deleting too
//! much is not.
//!
//! One file a source: `references` (the versions' own tags), `director` (`bosh stemcells --json`),
//! `create_env` (`bosh-state.json`), `consumers` (VMs, scale sets, disks); `strict` is the strict
//! JSON reader the two file sources share.
//!
//! The evidence files an operator gives are declared once, here: [`FileKind`] answers everything
//! that differs between the kinds (flag, names, reason, holder, dating), [`EvidenceFile`] is one
//! file given (and its reader, [`EvidenceFile::source`]), [`EvidenceFiles`] the files a use case
//! reads; a stemcell record of any of them is one [`Basis::FileRecord`], whose reason the planners
//! write once.

use std::path::{Path, PathBuf};

use super::{CleanupError, SourceError};
use crate::gallery::{Consumer, ConsumerKind};

mod consumers;
mod create_env;
mod director;
mod references;
mod strict;

pub use consumers::ConsumersSource;
pub use create_env::{CreateEnvStateFile, StemcellRecord};
pub use director::DirectorStemcellsFile;
pub use references::ReferencesSource;

/// A kind of evidence file: a record BOSH keeps of the stemcells it holds, given by the
/// operator. Every difference between the kinds is answered here, by exhaustive matches, so a
/// new kind is its reader's module, a variant here, and its flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum FileKind {
    /// A director's stemcell list: what `bosh stemcells --json` prints.
    DirectorStemcells,
    /// A `bosh create-env` state file (`bosh-state.json`).
    CreateEnvState,
}

impl FileKind {
    /// Every kind, in the order their files are read (and named in a plan's sources).
    pub const ALL: [FileKind; 2] = [FileKind::DirectorStemcells, FileKind::CreateEnvState];

    /// The flag that gives such a file, without `--` (also the kind a saved prune plan records
    /// for it).
    pub fn flag(self) -> &'static str {
        match self {
            FileKind::DirectorStemcells => "director-stemcells",
            FileKind::CreateEnvState => "create-env-state",
        }
    }

    /// The kind whose flag is `flag`.
    pub fn from_flag(flag: &str) -> Option<FileKind> {
        Self::ALL.into_iter().find(|k| k.flag() == flag)
    }

    /// The JSON `kind` of the cleanup reason a stemcell record of such a file gives.
    pub fn reason_kind(self) -> &'static str {
        match self {
            FileKind::DirectorStemcells => "director_holds",
            FileKind::CreateEnvState => "create_env_holds",
        }
    }

    /// Whether such a file may be given with whose records it holds (`HOLDER=FILE`): a director
    /// list does not name its director; a create-env state names its own (`director_id`).
    pub fn takes_holder(self) -> bool {
        match self {
            FileKind::DirectorStemcells => true,
            FileKind::CreateEnvState => false,
        }
    }

    /// Whether such a file is the answer to a query, saved by the operator, and so true only as
    /// of its modification time (`references prune --apply` refuses one saved too early or too
    /// long ago); otherwise it is the record itself, read as it is now.
    pub fn is_saved_answer(self) -> bool {
        match self {
            FileKind::DirectorStemcells => true,
            FileKind::CreateEnvState => false,
        }
    }

    /// The name of the source reading `path`: `director stemcells FILE[ of HOLDER]`,
    /// `create-env state FILE`.
    pub fn source_name(self, path: &Path, holder: Option<&str>) -> String {
        let label = match self {
            FileKind::DirectorStemcells => "director stemcells",
            FileKind::CreateEnvState => "create-env state",
        };
        match holder {
            Some(h) => format!("{label} {} of {h}", path.display()),
            None => format!("{label} {}", path.display()),
        }
    }

    /// How a reason names a file of this kind.
    fn record_label(self) -> &'static str {
        match self {
            FileKind::DirectorStemcells => "director list",
            FileKind::CreateEnvState => "create-env state",
        }
    }

    /// The claims of one stemcell record of `file` (read by the source named `source`): its
    /// name and version, and its CID when it has one, on one basis and one reason
    /// (`<file> holds stemcell <held>`, then `; <note>` when given).
    fn claims(
        self,
        source: &str,
        file: &str,
        held: HeldStemcell,
        note: Option<&str>,
    ) -> Vec<Claim> {
        let HeldStemcell { name, version, cid } = held;
        let shown = if cid.is_empty() {
            format!("{name} {version}")
        } else {
            format!("{cid} ({name} {version})")
        };
        let mut reason = format!("{} {file} holds stemcell {shown}", self.record_label());
        if let Some(note) = note {
            reason.push_str("; ");
            reason.push_str(note);
        }
        let basis = Basis::FileRecord {
            kind: self,
            file: file.to_string(),
            name: name.clone(),
            version: version.clone(),
            cid: cid.clone(),
        };
        let mut claims = vec![Claim {
            target: ClaimTarget::StemcellNameVersion { name, version },
            basis: basis.clone(),
            reason: reason.clone(),
            source: source.to_string(),
        }];
        if !cid.is_empty() {
            claims.push(Claim {
                target: ClaimTarget::Cid(cid),
                basis,
                reason,
                source: source.to_string(),
            });
        }
        claims
    }
}

/// One stemcell an evidence file holds, as BOSH spells it.
#[derive(Debug, Clone, PartialEq, Eq)]
struct HeldStemcell {
    name: String,
    /// E.g. `1.506`.
    version: String,
    /// `""` when the record has none.
    cid: String,
}

/// One evidence file given: its kind, its path, and whose records it holds when the operator
/// said (`--director-stemcells HOLDER=FILE`: `director:<uuid>` or a label, as reference records
/// name holders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvidenceFile {
    pub kind: FileKind,
    pub path: PathBuf,
    pub holder: Option<String>,
}

impl EvidenceFile {
    pub fn new(kind: FileKind, path: impl Into<PathBuf>) -> Self {
        EvidenceFile {
            kind,
            path: path.into(),
            holder: None,
        }
    }

    /// `[HOLDER=]FILE`, for a kind that [takes a holder](FileKind::takes_holder): a holder (a
    /// director UUID or a label) before the first `=`, when that part is a valid holder;
    /// otherwise (and for other kinds) the whole argument is the file.
    pub fn parse(kind: FileKind, arg: &str) -> Self {
        if let (true, Some((h, file))) = (kind.takes_holder(), arg.split_once('=')) {
            if let (Ok(holder), false) = (crate::gallery::record::holder_label(h), file.is_empty())
            {
                if !h.contains('/') {
                    return EvidenceFile {
                        kind,
                        path: PathBuf::from(file),
                        holder: Some(holder),
                    };
                }
            }
        }
        EvidenceFile::new(kind, arg)
    }

    /// The source that reads it.
    pub fn source(&self) -> Box<dyn UsageSource> {
        match self.kind {
            FileKind::DirectorStemcells => {
                Box::new(DirectorStemcellsFile::new(&self.path).with_holder(self.holder.clone()))
            }
            FileKind::CreateEnvState => Box::new(CreateEnvStateFile::new(&self.path)),
        }
    }
}

/// The evidence files a use case reads.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EvidenceFiles {
    files: Vec<EvidenceFile>,
}

impl EvidenceFiles {
    /// Add `paths`, files of `kind`.
    pub fn with(mut self, kind: FileKind, paths: impl IntoIterator<Item = PathBuf>) -> Self {
        self.files
            .extend(paths.into_iter().map(|p| EvidenceFile::new(kind, p)));
        self
    }

    pub fn is_empty(&self) -> bool {
        self.files.is_empty()
    }

    /// The files in the order they are read: kind by kind ([`FileKind::ALL`]), each kind's in
    /// the order given.
    pub fn iter(&self) -> impl Iterator<Item = &EvidenceFile> {
        FileKind::ALL
            .into_iter()
            .flat_map(move |k| self.files.iter().filter(move |f| f.kind == k))
    }

    /// The sources that read them, in [that order](Self::iter).
    pub fn sources(&self) -> Vec<Box<dyn UsageSource>> {
        self.iter().map(EvidenceFile::source).collect()
    }
}

impl FromIterator<EvidenceFile> for EvidenceFiles {
    fn from_iter<I: IntoIterator<Item = EvidenceFile>>(files: I) -> Self {
        EvidenceFiles {
            files: files.into_iter().collect(),
        }
    }
}

impl Extend<EvidenceFile> for EvidenceFiles {
    fn extend<I: IntoIterator<Item = EvidenceFile>>(&mut self, files: I) {
        self.files.extend(files);
    }
}

/// What a claim protects.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum ClaimTarget {
    /// One version, by its resource id (compared case-insensitively).
    VersionId(String),
    /// What a VM, scale set (model or instance) or disk protects through its image reference
    /// (any form), its region and its recorded exact version: the planner asks
    /// `gallery::latest::uses` for every definition the reference may name.
    ConsumerImage(Consumer),
    /// A stemcell by name and version (as BOSH spells it, e.g. `1.506`): protects that version key
    /// in every definition whose name starts with the stemcell name.
    StemcellNameVersion { name: String, version: String },
    /// A stemcell CID: protects every version whose references contain it.
    Cid(String),
}

/// Where a claim comes from, in typed form (the planner turns it into a typed reason).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Basis {
    /// References recorded on the version itself.
    Reference { refs: Vec<String> },
    /// A stemcell record of an evidence file (a row of `bosh stemcells --json`, a stemcell record
    /// of a create-env `bosh-state.json`).
    FileRecord {
        kind: FileKind,
        file: String,
        name: String,
        version: String,
        cid: String,
    },
    /// A VM, scale set (model or instance) or disk created from a gallery image.
    Consumer {
        kind: ConsumerKind,
        id: String,
        image_id: String,
    },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Claim {
    pub target: ClaimTarget,
    pub basis: Basis,
    /// Why, for the operator.
    pub reason: String,
    /// The source's name.
    pub source: String,
}

/// Everything one source said.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Evidence {
    pub source: String,
    pub claims: Vec<Claim>,
    /// Whose stemcells the source lists, when it says (`gallery::record::holder_label`): a
    /// create-env state's `director:<director_id>`, a director list given as `HOLDER=FILE`.
    /// `references prune` prunes a holder's references only against its own list.
    pub holder: Option<String>,
}

/// One source of evidence of use.
#[async_trait::async_trait]
pub trait UsageSource: Send + Sync {
    /// A name an operator recognises (it appears in reasons and errors).
    fn name(&self) -> String;
    async fn collect(&self) -> Result<Evidence, SourceError>;
}

/// Read every source (all of them, even after one failed). Any failure → `EvidenceIncomplete`
/// naming the first failed source (and listing the others).
pub async fn collect_all(sources: &[Box<dyn UsageSource>]) -> Result<Vec<Evidence>, CleanupError> {
    let results = futures::future::join_all(sources.iter().map(|s| s.collect())).await;
    let mut out = Vec::with_capacity(results.len());
    let mut failed: Vec<(String, SourceError)> = Vec::new();
    for (source, result) in sources.iter().zip(results) {
        match result {
            Ok(ev) => out.push(ev),
            Err(e) => failed.push((source.name(), e)),
        }
    }
    let mut failed = failed.into_iter();
    match failed.next() {
        None => Ok(out),
        Some((source_name, cause)) => Err(CleanupError::EvidenceIncomplete {
            source_name,
            cause,
            also_failed: failed.map(|(n, _)| n).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const UUID: &str = "0B1D2C3E-4F50-4A6B-8C7D-9E0F1A2B3C4D";

    #[test]
    fn a_holder_is_read_before_the_first_equals_only_for_kinds_that_take_one() {
        let d = FileKind::DirectorStemcells;
        let parsed = EvidenceFile::parse(d, &format!("{UUID}=lists/a.json"));
        assert_eq!(parsed.path, PathBuf::from("lists/a.json"));
        assert_eq!(
            parsed.holder.as_deref(),
            Some("director:0b1d2c3e-4f50-4a6b-8c7d-9e0f1a2b3c4d")
        );
        assert_eq!(
            EvidenceFile::parse(d, "ci-pipeline=a.json")
                .holder
                .as_deref(),
            Some("ci-pipeline")
        );
        // Not a holder before the `=` (a path, nothing after it, no `=` at all): all of it is
        // the file.
        let nothing_after = format!("{UUID}=");
        for whole in [
            "dir/x=a.json",
            "x y=a.json",
            nothing_after.as_str(),
            "a.json",
        ] {
            assert_eq!(
                EvidenceFile::parse(d, whole),
                EvidenceFile::new(d, whole),
                "{whole}"
            );
        }
        let c = FileKind::CreateEnvState;
        assert_eq!(
            EvidenceFile::parse(c, &format!("{UUID}=s.json")),
            EvidenceFile::new(c, format!("{UUID}=s.json"))
        );
    }

    #[test]
    fn files_are_read_kind_by_kind_in_the_order_given_and_named_by_their_kind() {
        let files: EvidenceFiles = [
            EvidenceFile::new(FileKind::CreateEnvState, "s1.json"),
            EvidenceFile::parse(FileKind::DirectorStemcells, "ci=d1.json"),
            EvidenceFile::new(FileKind::CreateEnvState, "s2.json"),
        ]
        .into_iter()
        .collect::<EvidenceFiles>()
        .with(FileKind::DirectorStemcells, [PathBuf::from("d2.json")]);
        let names: Vec<String> = files.sources().iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            vec![
                "director stemcells d1.json of ci",
                "director stemcells d2.json",
                "create-env state s1.json",
                "create-env state s2.json",
            ]
        );
        assert!(EvidenceFiles::default().is_empty());
        for kind in FileKind::ALL {
            assert_eq!(FileKind::from_flag(kind.flag()), Some(kind));
        }
    }
}
