//! The Zarr v3 `sharding_indexed` shard file format: index codec, validation, and the builder
//! that lays out a shard from chunk segments. Knows nothing of Zarr metadata JSON.

pub mod builder;
pub mod file;
pub mod index;
pub mod stamps;

pub use builder::{EncodedShard, Segments, ShardBuilder, place, write_all_vectored};
pub use file::{
    ReadAt, ShardFileError, read_chunk_part, read_index, read_index_lenient, read_whole_chunk,
};
pub use index::{
    ChunkRange, DecodedIndex, Endian, IndexCodec, IndexError, IndexFormat, IndexLocation, MISSING,
    ShardIndex,
};
