//! shardfs: a FUSE filesystem that shows Zarr v3 sharded arrays as plain unsharded chunk
//! files, so that writers that only know unsharded layouts produce sharded arrays.
//!
//! Data flows one way: kernel request -> `fuse` adapter -> `core` -> `backing`, with `zarr`
//! (metadata, keys, layout) and `shard` (the file format) as pure helpers.

pub mod backing;
pub mod cli;
pub mod core;
pub mod daemon;
pub mod fuse;
pub mod grid;
pub mod journal;
pub mod limits;
pub mod logging;
pub mod runtime;
pub mod shard;
pub mod store;
pub mod sync;
pub mod zarr;
