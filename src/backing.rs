//! The backing directory: every file operation on BACKING goes through here, by path relative
//! to its root. Shard files are replaced atomically (temporary file + rename).

use std::ffi::OsStr;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

/// What identifies one version of a file: a rewrite (new inode by rename, or new size or
/// mtime in place) changes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileVersion {
    pub ino: u64,
    pub size: u64,
    pub mtime_ns: i128,
}

impl FileVersion {
    pub fn of(m: &Metadata) -> FileVersion {
        FileVersion {
            ino: m.ino(),
            size: m.len(),
            mtime_ns: m.mtime() as i128 * 1_000_000_000 + m.mtime_nsec() as i128,
        }
    }
}

pub fn mtime_of(m: &Metadata) -> SystemTime {
    m.modified().unwrap_or(SystemTime::UNIX_EPOCH)
}

#[derive(Debug, Clone)]
pub struct Backing {
    root: PathBuf,
}

/// One entry of a backing directory.
#[derive(Debug, Clone)]
pub struct DirEntry {
    pub name: std::ffi::OsString,
    pub is_dir: bool,
}

impl Backing {
    pub fn new(root: PathBuf) -> Backing {
        Backing { root }
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn path(&self, rel: &Path) -> PathBuf {
        self.root.join(rel)
    }

    /// `lstat`: `Ok(None)` when nothing is there.
    pub fn stat(&self, rel: &Path) -> io::Result<Option<Metadata>> {
        match fs::symlink_metadata(self.path(rel)) {
            Ok(m) => Ok(Some(m)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn read(&self, rel: &Path) -> io::Result<Option<Vec<u8>>> {
        match fs::read(self.path(rel)) {
            Ok(b) => Ok(Some(b)),
            Err(e) if is_absent(&e) => Ok(None),
            Err(e) => Err(e),
        }
    }

    pub fn open(&self, rel: &Path) -> io::Result<File> {
        File::open(self.path(rel))
    }

    /// The entries of a directory; an absent directory has none.
    pub fn list(&self, rel: &Path) -> io::Result<Vec<DirEntry>> {
        let iter = match fs::read_dir(self.path(rel)) {
            Ok(it) => it,
            Err(e) if is_absent(&e) => return Ok(Vec::new()),
            Err(e) => return Err(e),
        };
        let mut out = Vec::new();
        for entry in iter {
            let entry = entry?;
            out.push(DirEntry {
                is_dir: entry.file_type()?.is_dir(),
                name: entry.file_name(),
            });
        }
        Ok(out)
    }

    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        fs::read_link(self.path(rel))
    }
}

/// ENOENT, or ENOTDIR from a path component that is a file: both mean "nothing there".
pub fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ENOTDIR)
}

pub fn join_rel(dir: &Path, name: &OsStr) -> PathBuf {
    if dir.as_os_str().is_empty() {
        PathBuf::from(name)
    } else {
        dir.join(name)
    }
}
