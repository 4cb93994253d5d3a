//! Names that exist only in memory: temporary files created inside arrays (and `zarr.json`
//! documents being written), and chunk directories made with `mkdir` before any chunk lies
//! below them. Both are keyed by path; inodes that refer to a temporary file hold the file
//! itself, so an unlinked but open file keeps working.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::array::lock;
use super::memfile::MemFile;

#[derive(Debug, Default)]
pub struct TempNames {
    files: Mutex<BTreeMap<PathBuf, Arc<MemFile>>>,
    dirs: Mutex<BTreeSet<PathBuf>>,
}

impl TempNames {
    pub fn file(&self, rel: &Path) -> Option<Arc<MemFile>> {
        lock(&self.files).get(rel).cloned()
    }

    pub fn insert_file(&self, rel: &Path, file: Arc<MemFile>) -> Option<Arc<MemFile>> {
        lock(&self.files).insert(rel.to_path_buf(), file)
    }

    pub fn remove_file(&self, rel: &Path) -> Option<Arc<MemFile>> {
        lock(&self.files).remove(rel)
    }

    /// Removes the name `rel` if it still holds `file`. Returns whether it did.
    pub fn remove_if(&self, rel: &Path, file: &Arc<MemFile>) -> bool {
        let mut files = lock(&self.files);
        if files.get(rel).is_some_and(|f| Arc::ptr_eq(f, file)) {
            files.remove(rel);
            return true;
        }
        false
    }

    /// Whether `file` is still reachable by a name (and so counts as pending memory).
    pub fn holds(&self, file: &Arc<MemFile>) -> bool {
        lock(&self.files).values().any(|f| Arc::ptr_eq(f, file))
    }

    /// The temporary files directly inside `dir`.
    pub fn files_in(&self, dir: &Path) -> Vec<(String, Arc<MemFile>)> {
        lock(&self.files)
            .iter()
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, f)| Some((p.file_name()?.to_str()?.to_string(), f.clone())))
            .collect()
    }

    /// Whether any temporary file or directory lies below `dir`.
    pub fn any_below(&self, dir: &Path) -> bool {
        let below = |p: &PathBuf| p.starts_with(dir) && p != dir;
        lock(&self.files).keys().any(below) || lock(&self.dirs).iter().any(below)
    }

    pub fn all_files(&self) -> Vec<(PathBuf, Arc<MemFile>)> {
        lock(&self.files)
            .iter()
            .map(|(p, f)| (p.clone(), f.clone()))
            .collect()
    }

    pub fn count(&self) -> usize {
        lock(&self.files).len()
    }

    pub fn dir(&self, rel: &Path) -> bool {
        lock(&self.dirs).contains(rel)
    }

    pub fn insert_dir(&self, rel: &Path) -> bool {
        lock(&self.dirs).insert(rel.to_path_buf())
    }

    pub fn remove_dir(&self, rel: &Path) -> bool {
        lock(&self.dirs).remove(rel)
    }

    /// The marked directories directly inside `dir`.
    pub fn dirs_in(&self, dir: &Path) -> Vec<String> {
        lock(&self.dirs)
            .iter()
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| Some(p.file_name()?.to_str()?.to_string()))
            .collect()
    }

    /// Forgets every marked directory below and at `dir` (the array is gone).
    pub fn forget_below(&self, dir: &Path) {
        lock(&self.dirs).retain(|p| !p.starts_with(dir));
    }
}
