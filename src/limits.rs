//! Sizes the mount bounds itself by, shared by the part that holds files (the core) and
//! the part that reads them back after a crash (the journal), so both agree.

/// The largest file held in memory (a chunk file waiting for its shard, a temporary file
/// inside an array): writes and truncations past it fail with EFBIG. Far above any sensible
/// chunk, and low enough that the zeros of a hole can be written out.
pub const MAX_FILE_BYTES: u64 = 4 << 30;
