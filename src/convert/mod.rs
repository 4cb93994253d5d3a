//! Bringing existing data in and out of shards (`shardfs pack`, `unpack`, `reshard`): the
//! chunks' encoded bytes move between chunk files and shards without being decoded, so a
//! conversion costs about one read and one write of the data.
//!
//! This part is being built (issue 22). `plan.rs`, pure: which chunk keys of an unsharded
//! array go into which shard, at which position, and the sharded metadata.

pub mod plan;
