//! The backing directory: every file operation on BACKING goes through here, by path relative
//! to its root. Shard files are replaced atomically (temporary file + rename).

use std::ffi::OsStr;
use std::fs::{self, File, Metadata};
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::SystemTime;

use bytes::Bytes;

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
    pub file_type: fs::FileType,
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
                file_type: entry.file_type()?,
                name: entry.file_name(),
            });
        }
        Ok(out)
    }

    /// The full path as a C string, for the calls std has no wrapper for.
    pub fn c_path(&self, rel: &Path) -> io::Result<std::ffi::CString> {
        std::ffi::CString::new(self.path(rel).into_os_string().into_encoded_bytes())
            .map_err(|_| io::Error::from(io::ErrorKind::InvalidInput))
    }

    pub fn read_link(&self, rel: &Path) -> io::Result<PathBuf> {
        fs::read_link(self.path(rel))
    }

    /// Replaces the file at `rel` with `buffers`, atomically: one vectored write (looped
    /// only on short writes) to a temporary file in the same directory, `fdatasync` so that
    /// a crash can never leave a torn file under the final name, then `rename`. With
    /// `durable`, the directory is synced too, making the rename itself durable. Returns
    /// the new file's metadata.
    pub fn write_atomic(
        &self,
        rel: &Path,
        buffers: &[Bytes],
        durable: bool,
    ) -> io::Result<Metadata> {
        let path = self.path(rel);
        let dir = path.parent().unwrap_or(&self.root).to_path_buf();
        fs::create_dir_all(&dir)?;
        let name = path.file_name().unwrap_or_default().to_string_lossy();
        let n = TEMP_COUNTER.fetch_add(1, Ordering::Relaxed);
        let tmp = dir.join(format!(".{name}.shardfs-{}-{n}", std::process::id()));
        let result = (|| {
            let open = || {
                fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o644)
                    .open(&tmp)
            };
            // Another writer may prune the directory between its making and our create.
            let mut file = match open() {
                Err(e) if e.kind() == io::ErrorKind::NotFound => {
                    fs::create_dir_all(&dir)?;
                    open()?
                }
                other => other?,
            };
            crate::shard::write_all_vectored(&mut file, buffers)?;
            file.sync_data()?;
            fs::rename(&tmp, &path)?;
            if durable {
                File::open(&dir)?.sync_all()?;
            }
            file.metadata()
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// Removes a file; `Ok(false)` when it was not there.
    pub fn remove_file(&self, rel: &Path) -> io::Result<bool> {
        match fs::remove_file(self.path(rel)) {
            Ok(()) => Ok(true),
            Err(e) if is_absent(&e) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Removes the empty directories from `rel` upwards, stopping before `stop` (which is
    /// kept) or at the first directory that is not empty.
    pub fn prune_empty_dirs(&self, rel: &Path, stop: &Path) {
        let mut dir = rel.to_path_buf();
        while dir.starts_with(stop) && dir != stop && !dir.as_os_str().is_empty() {
            if fs::remove_dir(self.path(&dir)).is_err() {
                return;
            }
            if !dir.pop() {
                return;
            }
        }
    }

    pub fn sync_dir(&self, rel: &Path) -> io::Result<()> {
        File::open(self.path(rel))?.sync_all()
    }
}

static TEMP_COUNTER: AtomicU64 = AtomicU64::new(0);

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
