//! What the mount shows: the inodes and the names they stand for (`inode.rs`), their
//! attributes (`attr.rs`), what a directory of BACKING is to the mount (`classify.rs`:
//! plain, an array, a group; cached until its `zarr.json` changes), and the open handles
//! (`handle.rs`: a handle of a stored chunk holds its pinned version, `shards::StoredChunk`),
//! and which plain files the kernel reads and writes itself (`passthrough.rs`).
//! The orchestrator (`core::fs`) asks and updates them; they never write a shard and know
//! nothing of the journal.

pub mod attr;
pub mod classify;
pub mod handle;
pub mod inode;
pub mod passthrough;
