//! shardfs: a FUSE filesystem that shows Zarr v3 sharded arrays as plain unsharded chunk
//! files, so that writers that only know unsharded layouts produce sharded arrays.

pub mod cli;
pub mod grid;
pub mod shard;
pub mod zarr;
