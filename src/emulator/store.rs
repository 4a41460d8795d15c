//! The emulator's persistent state: ARM resources, long-running operations, blob containers.
//!
//! Everything here is plain data (serde), so `--state FILE` can write it as one JSON document.
//! Page blobs keep only the pages that were written, in 64 KiB chunks with a bitmap of written
//! 512-byte pages, so a 2 GiB blob with a few written pages costs a few chunks.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub const PAGE: u64 = 512;
pub const CHUNK: u64 = 64 * 1024;
const PAGES_PER_CHUNK: u64 = CHUNK / PAGE; // 128: one u128 bitmap

/// The kinds of ARM resources the emulator knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Kind {
    Gallery,
    Image,
    Version,
    VirtualMachine,
    ScaleSet,
    ScaleSetVm,
    Disk,
    /// A managed image (`Microsoft.Compute/images`): the Azure CPI's pre-gallery image of a
    /// stemcell blob, `<cid>-<storage account type>-<location>` (REFERENCE.md "Pre-gallery
    /// stemcells"). Stored as sent, as the consumers are.
    ManagedImage,
    /// A soft-deleted gallery image version, as the soft-deleted list names it (the list is its
    /// only address; see `arm::soft_delete`).
    SoftDeletedVersion,
}

impl Kind {
    /// The ARM `type` of the resource.
    pub fn arm_type(self) -> &'static str {
        match self {
            Kind::Gallery => "Microsoft.Compute/galleries",
            Kind::Image => "Microsoft.Compute/galleries/images",
            Kind::Version => "Microsoft.Compute/galleries/images/versions",
            Kind::VirtualMachine => "Microsoft.Compute/virtualMachines",
            Kind::ScaleSet => "Microsoft.Compute/virtualMachineScaleSets",
            Kind::ScaleSetVm => "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
            Kind::Disk => "Microsoft.Compute/disks",
            Kind::ManagedImage => "Microsoft.Compute/images",
            Kind::SoftDeletedVersion => {
                "Microsoft.Compute/galleries/softDeletedArtifactTypes/artifacts/versions"
            }
        }
    }

    pub fn is_gallery_kind(self) -> bool {
        matches!(self, Kind::Gallery | Kind::Image | Kind::Version)
    }
}

/// One ARM resource. `body` is the resource as GET returns it (without `replicationStatus`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Resource {
    pub kind: Kind,
    /// Lower-cased id of the parent resource ("" for top-level resources).
    pub parent: String,
    /// Lower-cased `/subscriptions/{s}/resourcegroups/{rg}`.
    pub rg: String,
    /// Lower-cased `/subscriptions/{s}`.
    pub sub: String,
    pub body: Value,
    /// The operation in progress on this resource, if any.
    #[serde(default)]
    pub op: Option<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum OpAction {
    Put,
    Delete,
}

/// A long-running operation, as the operation-status endpoint reports it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Operation {
    pub id: String,
    /// Lower-cased key of the resource it works on.
    pub resource: String,
    pub action: OpAction,
    /// InProgress | Succeeded | Failed
    pub status: String,
    pub start_time: String,
    pub end_time: Option<String>,
    pub error: Option<Value>,
    pub polls: u32,
    /// Unix milliseconds when the operation started (for time-based completion).
    #[serde(default)]
    pub started_ms: i64,
    /// The operation does not complete before this many milliseconds after `started_ms` (the
    /// admin timing `version_write_ms`, for version PUT/PATCH), however often it is polled.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub min_ms: u64,
    /// An injected outcome (fault injection): end Failed, or never end.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fault: Option<OpFault>,
    /// `Retry-After` seconds on this operation's answers, when the timing sets one for it
    /// (version writes under `--timing azure`); else the emulator's `Options::retry_after`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u32>,
    /// A DELETE in a gallery with soft delete on: its completion keeps the version soft-deleted
    /// (in [`Data::soft_deleted`]) instead of dropping it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub soft_delete: bool,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// How a fault makes a long-running operation end.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpFault {
    /// End Failed with this error (a PUT leaves its resource Failed; a DELETE leaves it Failed).
    Failed { code: String, message: String },
    /// Stay InProgress forever (the resource stays Creating/Updating/Deleting).
    Never,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Data {
    pub resources: BTreeMap<String, Resource>,
    pub operations: BTreeMap<String, Operation>,
    pub containers: BTreeMap<String, Container>,
    /// Children whose DELETE completed recently: their parent still counts them as nested
    /// resources until `until_ms` (the delete lag; see `Timing::delete_lag_ms`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted_children: Vec<DeletedChild>,
    /// The storage accounts the emulator serves, as ARM bodies (`id`, `name`, `location`), from
    /// the world. Empty: the development account alone, in resource group
    /// [`DEV_ACCOUNT_RESOURCE_GROUP`] of whichever subscription is asked about.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub storage_accounts: Vec<Value>,
    /// Soft-deleted gallery image versions by their lower-cased id: gone from GET and the version
    /// list, restorable until their hard deletion (see `arm::soft_delete`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub soft_deleted: BTreeMap<String, SoftDeleted>,
    /// Management locks (`Microsoft.Authorization/locks`) by their lower-cased id
    /// (`{scope}/providers/microsoft.authorization/locks/{name}`; see `arm::locks`).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub locks: BTreeMap<String, Lock>,
}

/// One management lock, at a subscription, a resource group or a resource.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Lock {
    /// The scope's id as the lock's PUT spelled it (`/subscriptions/S/resourceGroups/RG/...`).
    pub scope: String,
    /// Whether the scope is a resource (it goes when the resource goes); else a subscription or
    /// a resource group, which the emulator does not model and which never go.
    pub at_resource: bool,
    /// The lock's name as its first PUT spelled it.
    pub name: String,
    /// `CanNotDelete` or `ReadOnly`.
    pub level: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub notes: Option<String>,
    /// `[{"applicationId": "..."}]` as sent, when sent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owners: Option<Value>,
}

/// A gallery image version soft-deleted by a DELETE in a gallery with soft delete on.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SoftDeleted {
    /// The version as it was before its DELETE (tags, profiles), restored as is.
    pub resource: Resource,
    /// Lower-cased key of its gallery.
    pub gallery: String,
    /// RFC 3339 instants by the emulator's clock: the delete's completion, the end of its
    /// retention, and when it is gone for good.
    pub soft_deleted_time: String,
    pub consumption_end_time: String,
    pub hard_deletion_target_time: String,
}

/// A child resource that is gone (GET answers 404) but that its parent has not forgotten yet.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct DeletedChild {
    /// Lower-cased key of the parent.
    pub parent: String,
    /// The child's id, as Azure names nested resources in the 409 (`Microsoft.Compute/...`).
    pub id: String,
    /// Unix milliseconds until which the parent still refuses deletion.
    pub until_ms: i64,
}

/// The resource group the development account lives in when the world names none: the one
/// `--emulator` fills in by default (`cli::embedded::DEFAULT_RESOURCE_GROUP`).
pub const DEV_ACCOUNT_RESOURCE_GROUP: &str = "bosh-rg";

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Container {
    pub name: String,
    pub metadata: BTreeMap<String, String>,
    pub etag: String,
    pub last_modified: i64,
    pub blobs: BTreeMap<String, Blob>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum Content {
    Page {
        size: u64,
        chunks: BTreeMap<u64, Chunk>,
    },
    Block {
        #[serde(with = "b64")]
        data: Vec<u8>,
    },
}

/// 64 KiB of a page blob and which of its 128 pages were written.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Chunk {
    pub written: u128,
    #[serde(with = "b64")]
    pub data: Vec<u8>,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Lease {
    pub id: Option<String>,
    /// Unix seconds when the lease expires; None for an infinite lease.
    pub expires: Option<i64>,
    /// Unix seconds when a breaking lease becomes broken.
    pub breaking_until: Option<i64>,
    /// The lease was broken (and not re-acquired).
    pub broken: bool,
    /// A lease existed and ran out.
    pub expired: bool,
    pub infinite: bool,
    /// Seconds the lease was acquired for (-1: infinite).
    #[serde(default)]
    pub duration: i64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Blob {
    pub content: Content,
    pub metadata: BTreeMap<String, String>,
    pub content_type: String,
    pub etag: String,
    pub created: i64,
    pub last_modified: i64,
    pub sequence_number: u64,
    pub lease: Lease,
}

/// The lease state of a blob at `now` (unix seconds), after applying expiry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseState {
    Available,
    Leased { id: String },
    Breaking { id: String },
    Broken,
    Expired,
}

impl Lease {
    pub fn state(&self, now: i64) -> LeaseState {
        match &self.id {
            Some(id) => {
                if let Some(until) = self.breaking_until {
                    if now < until {
                        return LeaseState::Breaking { id: id.clone() };
                    }
                    return LeaseState::Broken;
                }
                match self.expires {
                    Some(t) if now >= t => LeaseState::Expired,
                    _ => LeaseState::Leased { id: id.clone() },
                }
            }
            None if self.broken => LeaseState::Broken,
            None if self.expired => LeaseState::Expired,
            None => LeaseState::Available,
        }
    }
}

impl Content {
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn len(&self) -> u64 {
        match self {
            Content::Page { size, .. } => *size,
            Content::Block { data } => data.len() as u64,
        }
    }

    /// Write whole pages at `offset` (512-aligned; caller checks bounds).
    pub fn write_pages(chunks: &mut BTreeMap<u64, Chunk>, offset: u64, data: &[u8]) {
        let mut pos = 0usize;
        while pos < data.len() {
            let abs = offset + pos as u64;
            let chunk_no = abs / CHUNK;
            let within = (abs % CHUNK) as usize;
            let n = (CHUNK as usize - within).min(data.len() - pos);
            let chunk = chunks.entry(chunk_no).or_insert_with(|| Chunk {
                written: 0,
                data: vec![0; CHUNK as usize],
            });
            chunk.data[within..within + n].copy_from_slice(&data[pos..pos + n]);
            let first = within as u64 / PAGE;
            let count = n as u64 / PAGE;
            chunk.written |= page_mask(first, count);
            pos += n;
        }
    }

    /// Clear whole pages in `[offset, offset+len)` (512-aligned).
    pub fn clear_pages(chunks: &mut BTreeMap<u64, Chunk>, offset: u64, len: u64) {
        let mut abs = offset;
        let end = offset + len;
        while abs < end {
            let chunk_no = abs / CHUNK;
            let within = abs % CHUNK;
            let n = (CHUNK - within).min(end - abs);
            if let Some(chunk) = chunks.get_mut(&chunk_no) {
                chunk.data[within as usize..(within + n) as usize].fill(0);
                chunk.written &= !page_mask(within / PAGE, n / PAGE);
                if chunk.written == 0 {
                    chunks.remove(&chunk_no);
                }
            }
            abs += n;
        }
    }

    /// Read `[start, end_inclusive]` (caller checks bounds).
    pub fn read(&self, start: u64, end_inclusive: u64) -> Vec<u8> {
        match self {
            Content::Block { data } => data[start as usize..=end_inclusive as usize].to_vec(),
            Content::Page { chunks, .. } => {
                let len = (end_inclusive - start + 1) as usize;
                let mut out = vec![0u8; len];
                let first_chunk = start / CHUNK;
                let last_chunk = end_inclusive / CHUNK;
                for (&no, chunk) in chunks.range(first_chunk..=last_chunk) {
                    let c_start = no * CHUNK;
                    let from = start.max(c_start);
                    let to = end_inclusive.min(c_start + CHUNK - 1);
                    out[(from - start) as usize..=(to - start) as usize].copy_from_slice(
                        &chunk.data[(from - c_start) as usize..=(to - c_start) as usize],
                    );
                }
                out
            }
        }
    }

    /// Written page ranges `(start, end_inclusive)` overlapping `[lo, hi]`, coalesced.
    pub fn page_ranges(&self, lo: u64, hi: u64) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        let Content::Page { chunks, .. } = self else {
            return out;
        };
        for (&no, chunk) in chunks.range(lo / CHUNK..=hi / CHUNK) {
            for p in 0..PAGES_PER_CHUNK {
                if chunk.written & (1u128 << p) == 0 {
                    continue;
                }
                let s = no * CHUNK + p * PAGE;
                let e = s + PAGE - 1;
                if e < lo || s > hi {
                    continue;
                }
                match out.last_mut() {
                    Some(last) if last.1 + 1 == s => last.1 = e,
                    _ => out.push((s, e)),
                }
            }
        }
        out
    }
}

fn page_mask(first: u64, count: u64) -> u128 {
    if count >= 128 {
        return u128::MAX;
    }
    ((1u128 << count) - 1) << first
}

mod b64 {
    use base64::Engine;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(data: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&base64::engine::general_purpose::STANDARD.encode(data))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page_blob(size: u64) -> Content {
        Content::Page {
            size,
            chunks: BTreeMap::new(),
        }
    }

    #[test]
    fn written_pages_are_read_back_and_the_rest_reads_as_zeros() {
        let mut c = page_blob(4 * CHUNK);
        if let Content::Page { chunks, .. } = &mut c {
            Content::write_pages(chunks, CHUNK - 512, &[7u8; 1024]);
        }
        let data = c.read(CHUNK - 1024, CHUNK + 1023);
        assert_eq!(&data[..512], &[0u8; 512][..]);
        assert_eq!(&data[512..1536], &[7u8; 1024][..]);
        assert_eq!(&data[1536..], &[0u8; 512][..]);
        assert_eq!(c.page_ranges(0, u64::MAX), vec![(CHUNK - 512, CHUNK + 511)]);
    }

    #[test]
    fn clearing_pages_splits_ranges_and_frees_empty_chunks() {
        let mut c = page_blob(4 * CHUNK);
        if let Content::Page { chunks, .. } = &mut c {
            Content::write_pages(chunks, 0, &vec![1u8; 4096]);
            Content::clear_pages(chunks, 1024, 1024);
        }
        assert_eq!(c.page_ranges(0, u64::MAX), vec![(0, 1023), (2048, 4095)]);
        if let Content::Page { chunks, .. } = &mut c {
            Content::clear_pages(chunks, 0, 4096);
            assert!(chunks.is_empty(), "an emptied chunk is dropped");
        }
    }

    #[test]
    fn a_full_chunk_write_marks_all_its_pages() {
        let mut c = page_blob(2 * CHUNK);
        if let Content::Page { chunks, .. } = &mut c {
            Content::write_pages(chunks, 0, &vec![1u8; CHUNK as usize]);
        }
        assert_eq!(c.page_ranges(0, u64::MAX), vec![(0, CHUNK - 1)]);
    }

    #[test]
    fn lease_state_follows_time() {
        let lease = Lease {
            id: Some("l".into()),
            expires: Some(100),
            ..Default::default()
        };
        assert_eq!(lease.state(99), LeaseState::Leased { id: "l".into() });
        assert_eq!(lease.state(100), LeaseState::Expired);
    }
}
