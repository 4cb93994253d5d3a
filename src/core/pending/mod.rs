//! Files held in memory until they have a place: a chunk file being written (`MemFile`,
//! whose content goes to its shard), a temporary file inside an array (renamed onto a key,
//! or written to BACKING as it is), and the temporary names they live under (`temp.rs`).
//! Used by the shards (which hold chunk files) and the view (an inode of a held file).

pub mod memfile;
pub mod temp;
