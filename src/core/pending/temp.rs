//! Names that exist only in memory: temporary files created inside arrays (and `zarr.json`
//! documents being written), and chunk directories made with `mkdir` before any chunk lies
//! below them. Both are keyed by path; inodes that refer to a temporary file hold the file
//! itself, so an unlinked but open file keeps working.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::ops::Bound;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use super::memfile::MemFile;
use crate::sync::lock;

#[derive(Debug, Default)]
pub struct TempNames {
    files: Mutex<Files>,
    dirs: Mutex<BTreeSet<PathBuf>>,
}

/// Temporary files by path, and how many names each one has (by address), so that asking
/// whether a file is still named costs no scan.
#[derive(Debug, Default)]
struct Files {
    by_path: BTreeMap<PathBuf, Arc<MemFile>>,
    names: HashMap<usize, usize>,
}

impl Files {
    fn insert(&mut self, rel: &Path, file: Arc<MemFile>) -> Option<Arc<MemFile>> {
        *self.names.entry(addr(&file)).or_default() += 1;
        let old = self.by_path.insert(rel.to_path_buf(), file);
        if let Some(o) = &old {
            self.unname(o);
        }
        old
    }

    fn remove(&mut self, rel: &Path) -> Option<Arc<MemFile>> {
        let old = self.by_path.remove(rel);
        if let Some(o) = &old {
            self.unname(o);
        }
        old
    }

    fn unname(&mut self, file: &Arc<MemFile>) {
        if let Some(n) = self.names.get_mut(&addr(file)) {
            *n -= 1;
            if *n == 0 {
                self.names.remove(&addr(file));
            }
        }
    }
}

fn addr(file: &Arc<MemFile>) -> usize {
    Arc::as_ptr(file) as usize
}

/// The entries of an ordered map of paths that lie below `dir` (not `dir` itself): paths
/// order component by component, so they are the run that follows `dir`.
fn below<'a, V>(
    map: &'a BTreeMap<PathBuf, V>,
    dir: &'a Path,
) -> impl Iterator<Item = (&'a PathBuf, &'a V)> + 'a {
    map.range::<Path, _>((Bound::Excluded(dir), Bound::Unbounded))
        .take_while(move |(p, _)| p.starts_with(dir))
}

impl TempNames {
    pub fn file(&self, rel: &Path) -> Option<Arc<MemFile>> {
        lock(&self.files).by_path.get(rel).cloned()
    }

    pub fn insert_file(&self, rel: &Path, file: Arc<MemFile>) -> Option<Arc<MemFile>> {
        lock(&self.files).insert(rel, file)
    }

    pub fn remove_file(&self, rel: &Path) -> Option<Arc<MemFile>> {
        lock(&self.files).remove(rel)
    }

    /// Removes the name `rel` if it still holds `file`. Returns whether it did.
    pub fn remove_if(&self, rel: &Path, file: &Arc<MemFile>) -> bool {
        let mut files = lock(&self.files);
        if files.by_path.get(rel).is_some_and(|f| Arc::ptr_eq(f, file)) {
            files.remove(rel);
            return true;
        }
        false
    }

    /// Whether `file` is still reachable by a name (and so counts as pending memory).
    pub fn holds(&self, file: &Arc<MemFile>) -> bool {
        lock(&self.files).names.contains_key(&addr(file))
    }

    /// The temporary files directly inside `dir`.
    pub fn files_in(&self, dir: &Path) -> Vec<(String, Arc<MemFile>)> {
        let files = lock(&self.files);
        below(&files.by_path, dir)
            .filter(|(p, _)| p.parent() == Some(dir))
            .filter_map(|(p, f)| Some((p.file_name()?.to_str()?.to_string(), f.clone())))
            .collect()
    }

    /// Whether any temporary file or directory lies below `dir`.
    pub fn any_below(&self, dir: &Path) -> bool {
        let dir_below = lock(&self.dirs)
            .range::<Path, _>((Bound::Excluded(dir), Bound::Unbounded))
            .next()
            .is_some_and(|p| p.starts_with(dir));
        dir_below || {
            let files = lock(&self.files);
            below(&files.by_path, dir).next().is_some()
        }
    }

    pub fn all_files(&self) -> Vec<(PathBuf, Arc<MemFile>)> {
        lock(&self.files)
            .by_path
            .iter()
            .map(|(p, f)| (p.clone(), f.clone()))
            .collect()
    }

    pub fn count(&self) -> usize {
        lock(&self.files).by_path.len()
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
            .range::<Path, _>((Bound::Excluded(dir), Bound::Unbounded))
            .take_while(|p| p.starts_with(dir))
            .filter(|p| p.parent() == Some(dir))
            .filter_map(|p| Some(p.file_name()?.to_str()?.to_string()))
            .collect()
    }

    /// Forgets every marked directory below and at `dir` (the array is gone).
    pub fn forget_below(&self, dir: &Path) {
        lock(&self.dirs).retain(|p| !p.starts_with(dir));
    }
}
