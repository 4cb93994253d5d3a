//! Bringing existing data into shards and out again (`shardfs pack`, `unpack`, `reshard`):
//! the chunks' encoded bytes move between chunk files and shards without being decoded, so
//! a conversion costs about one read and one write of the data. Source and destination are
//! [`Store`]s: a directory or an object store, on either side.
//!
//! `plan.rs` (pure): what each array becomes, and which chunks go into which shard at which
//! position. `chunks.rs`: where an array's chunks are now, and reading them. `pack.rs`:
//! walking a hierarchy and writing each array's new objects, in parallel. `in_place.rs`:
//! converting where the array lies, and its crash rule. `v2.rs` (pure): Zarr v2 metadata as
//! v3. Called by the command line (`cli/convert.rs`).

pub mod chunks;
pub mod in_place;
pub mod pack;
pub mod plan;
pub mod v2;

use std::path::PathBuf;

use thiserror::Error;

use crate::store::{Store, StoreError};
use crate::zarr::{LayoutError, MetadataError, PolicyError, ShardPolicy};

/// How to convert.
#[derive(Clone, Debug)]
pub struct Options {
    pub goal: plan::Goal,
    /// Raw chunks (no compressor in their codecs) are compressed with zstd at this level.
    pub compress: Option<i32>,
    /// Chunks per shard of each array packed.
    pub policy: ShardPolicy,
    /// Or the shards' shape in elements (a multiple of each array's chunk shape).
    pub shard_shape: Option<Vec<u64>>,
    /// Shards built and written at once.
    pub jobs: usize,
    /// Only say what would be done.
    pub dry_run: bool,
}

#[derive(Debug, Error)]
pub enum ConvertError {
    #[error("{what}: {source}")]
    Store { what: String, source: StoreError },
    #[error("{what}: not Zarr v3 metadata: {source}")]
    Metadata { what: String, source: MetadataError },
    #[error("{what}: this Zarr v2 node cannot become Zarr v3 without re-encoding: {why}")]
    V2 { what: String, why: String },
    #[error("{what}: cannot be sharded: {source}")]
    Layout { what: String, source: LayoutError },
    #[error("{what}: {source}")]
    Policy { what: String, source: PolicyError },
    #[error("{what}: --shard-shape {shape:?} is not a multiple of the chunk shape {chunks:?}")]
    ShardShape {
        what: String,
        shape: Vec<u64>,
        chunks: Vec<u64>,
    },
    #[error("{what}: a damaged shard ({why}); see `shardfs verify`")]
    Damaged { what: String, why: String },
    #[error(
        "{0}: only plain files and directories can be packed (a link, a special file, or a name that is not UTF-8); move it away first"
    )]
    Unlisted(String),
    #[error(
        "{0}: named like a chunk of its array but not one (outside its grid, or not a key of its encoding); move it away first"
    )]
    NotAChunk(String),
    #[error(
        "{0}: a pack in place writes a shard there for a while (see the README's in-place rule); move it away first"
    )]
    InTheWay(String),
    #[error(
        "{0}: a pack in place of it was stopped; finish it first (run `shardfs pack` on it again)"
    )]
    Unfinished(String),
    #[error(
        "{0}: changed while a pack in place of its array was stopped (it is none of the documents the pack writes); put it back as it was, or remove the array's .shardfs-pack.json and check the array by hand"
    )]
    Changed(String),
    #[error("{what}: a conversion in place was stopped here, and {why}")]
    Interrupted { what: String, why: String },
    #[error("{0} is not empty: pack writes into an empty destination")]
    NotEmpty(String),
    #[error(
        "{what}: the state of an earlier pack in place cannot be read ({why}); remove it only if that pack never got past writing it"
    )]
    State { what: String, why: String },
    #[error(
        "{what}: {n} of its chunks were written, replaced or removed while it was converted in place; nothing of theirs was lost (the array reads as before, with them) and nothing was converted: stop its writers and run again"
    )]
    WrittenMeanwhile { what: String, n: usize },
    #[error(
        "{0}: written by a writer that still had the array's old layout open after the array switched to its new one; kept, and the conversion stopped there (exit 1): stop the array's writers, look at that file (its content is in neither layout), then run again to finish"
    )]
    WrittenAfterSwitch(String),
    #[error("{0}")]
    Panicked(String),
}

impl ConvertError {
    pub(crate) fn store(
        store: &dyn Store,
        key: &std::path::Path,
        source: StoreError,
    ) -> ConvertError {
        ConvertError::Store {
            what: store.describe(key),
            source,
        }
    }
}

/// A layout error found before its place is known (`Packer::target_of` names it).
impl From<LayoutError> for ConvertError {
    fn from(source: LayoutError) -> ConvertError {
        ConvertError::Layout {
            what: String::new(),
            source,
        }
    }
}

/// What a conversion did (or, dry, would do).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub arrays: Vec<PackedArray>,
    /// Bytes of chunks copied (as read).
    pub chunk_bytes: u64,
    /// The same chunks' bytes as written (smaller when compressed on the way).
    pub stored_bytes: u64,
    /// Other objects copied as they are (metadata, sharded arrays, other files).
    pub copied: u64,
    /// Packs in place that were stopped and are now finished (with the chunks per shard
    /// they began with).
    pub resumed: u64,
}

impl Summary {
    /// Shards written, over every array.
    pub fn shards(&self) -> u64 {
        self.arrays.iter().map(|a| a.shards).sum()
    }

    /// Chunks packed, over every array.
    pub fn chunks(&self) -> u64 {
        self.arrays.iter().map(|a| a.chunks).sum()
    }
}

/// One array packed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedArray {
    /// Its directory, relative to the source's top.
    pub dir: PathBuf,
    pub chunks: u64,
    /// Objects written: shards (those holding at least one chunk), or chunk files.
    pub shards: u64,
    /// Of the array written; empty when it is unsharded.
    pub chunks_per_shard: Vec<u64>,
}
