//! shardfs: a FUSE filesystem that shows Zarr v3 sharded arrays as plain unsharded chunk
//! files, so that writers that only know unsharded layouts produce sharded arrays.
//!
//! Data flows one way: kernel request -> `fuse` adapter -> `core` -> `backing`, with `zarr`
//! (metadata, keys, layout) and `shard` (the file format) as pure helpers.

/// Prints a line on stderr, as `eprintln!` does, but never panics: `mount` keeps SIGPIPE
/// ignored (its daemon must outlive the terminal it was started from), so a message of its
/// may meet a closed stderr, and a panic there would turn a refusal (exit 2) into a crash.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}

pub mod backing;
pub mod cli;
pub mod convert;
pub mod core;
pub mod daemon;
pub mod fuse;
pub mod grid;
pub mod journal;
pub mod limits;
pub mod logging;
pub mod mounts;
pub mod runtime;
pub mod shard;
pub mod store;
pub mod sync;
pub mod zarr;
