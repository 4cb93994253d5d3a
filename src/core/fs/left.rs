//! The layouts of arrays whose `zarr.json` went (removed, or moved away) while their shard
//! files stayed: a document put back over them is laid out as they are, not by the mount's
//! shard policy of the moment (which, for an array resized since it was made, or a mount
//! with other options, would read every shard with the wrong index).
//!
//! Kept in memory for the life of the mount: a document put back through a later mount
//! is checked against the shards instead (`commit.rs`, refused when they do not read).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use crate::zarr::ArrayMetadata;

/// At most this many layouts are kept (one per array whose document went).
const MOST: usize = 4096;

#[derive(Debug, Default)]
pub(crate) struct LeftLayouts {
    by_dir: Mutex<HashMap<PathBuf, ArrayMetadata>>,
}

impl LeftLayouts {
    /// The array at `dir`, stored as `stored`, lost its document.
    pub(crate) fn left(&self, dir: &Path, stored: &ArrayMetadata) {
        let mut by_dir = crate::sync::lock(&self.by_dir);
        if by_dir.len() >= MOST && !by_dir.contains_key(dir) {
            // Any one: a document put back this late is checked against its shards.
            if let Some(k) = by_dir.keys().next().cloned() {
                by_dir.remove(&k);
            }
        }
        by_dir.insert(dir.to_path_buf(), stored.clone());
    }

    /// The directory `from` (and all below it) is at `to` now: what was left there goes
    /// with it.
    pub(crate) fn moved(&self, from: &Path, to: &Path) {
        let mut by_dir = crate::sync::lock(&self.by_dir);
        let below: Vec<PathBuf> = by_dir
            .keys()
            .filter(|k| k.starts_with(from))
            .cloned()
            .collect();
        for old in below {
            if let (Some(meta), Ok(rest)) = (by_dir.remove(&old), old.strip_prefix(from)) {
                by_dir.insert(to.join(rest), meta);
            }
        }
    }

    /// The stored document the array at `dir` had when its document went, taken.
    pub(crate) fn take(&self, dir: &Path) -> Option<ArrayMetadata> {
        crate::sync::lock(&self.by_dir).remove(dir)
    }
}
