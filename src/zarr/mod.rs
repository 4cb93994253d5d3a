//! The Zarr v3 metadata model, chunk keys, shard policy and the layout translation between
//! sharded arrays and their unsharded view. Pure: no I/O.

pub mod dtype;
pub mod exact;
pub mod key;
pub mod layout;
pub mod metadata;
pub mod policy;
pub mod transparent;
pub mod validate;

pub use dtype::{DataType, DataTypeError};
pub use key::{ChunkKeyEncoding, KeyError, KeyNode, Separator};
pub use layout::{
    ChunkLocation, LayoutError, ShardLayout, sharded_from, sharded_with, shown_view,
    takes_chunks_of, translate_consolidated, unsharded_view,
};
pub use metadata::{ArrayMetadata, GroupMetadata, MetadataError, NamedConfig, Node};
pub use policy::{ChunksPerShard, DEFAULT_TARGET_BYTES, PolicyError, ShardPolicy};

/// The metadata document's file name in every node directory.
pub const METADATA_FILE: &str = "zarr.json";
