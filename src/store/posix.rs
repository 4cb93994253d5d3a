//! A BACKING directory as a [`Store`]: a pinned version is an open descriptor (a rename
//! onto the name leaves it reading the old file), a conditional write is a check of the
//! current version made under the key lock of `backing::lock`, which every writer of the
//! lock protocol takes, so the check and the write are one step for all of them.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::{Blob, Listing, ObjectInfo, OnDurable, Piece, Precondition, Store, StoreError};
use crate::backing::lock::{Durability, LOCK_SUFFIX, Within, key_of_staged};
use crate::backing::{Backing, EntryKind, is_absent, mtime_of};
use crate::shard::ReadAt;

impl Store for Backing {
    fn open(&self, key: &Path, _tail: u64) -> Result<Option<Arc<dyn Blob>>, StoreError> {
        let file = match Backing::open(self, key) {
            Ok(f) => f,
            // EINVAL: not a regular file (the descriptor-only open refuses it).
            Err(e) if is_absent(&e) || e.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let info = file_info(&file)?;
        Ok(Some(Arc::new(FileBlob { file, info })))
    }

    fn get(&self, key: &Path, limit: u64) -> Result<Option<(Bytes, ObjectInfo)>, StoreError> {
        let Some(blob) = Store::open(self, key, 0)? else {
            return Ok(None);
        };
        let size = blob.info().size;
        if size > limit {
            return Err(io::Error::from_raw_os_error(libc::EFBIG).into());
        }
        let mut buf = vec![0u8; size as usize];
        blob.read_exact_at(&mut buf, 0)?;
        Ok(Some((Bytes::from(buf), blob.info().clone())))
    }

    fn put(
        &self,
        key: &Path,
        parts: &[Bytes],
        when: Precondition,
    ) -> Result<ObjectInfo, StoreError> {
        self.put_within(Within::path(Path::new("")), key, parts, when, None)
    }

    fn put_within(
        &self,
        within: Within,
        key: &Path,
        parts: &[Bytes],
        when: Precondition,
        on_durable: OnDurable,
    ) -> Result<ObjectInfo, StoreError> {
        let (lock, current) = locked_if(self, within, key, &when)?;
        let durability = if current.is_some() || on_durable.is_some() {
            Durability::DataBeforeRename
        } else {
            Durability::Later
        };
        let (meta, generation) = lock.replace(parts, durability)?;
        if let Some(then) = on_durable {
            self.sync_dir_chain(lock.dir_rel())?;
            then();
        }
        Ok(info_of(&meta, generation))
    }

    fn put_pieces(
        &self,
        key: &Path,
        pieces: &[Piece],
        durably: bool,
    ) -> Result<ObjectInfo, StoreError> {
        let (lock, current) =
            locked_if(self, Within::path(Path::new("")), key, &Precondition::None)?;
        let durability = match (durably, current.is_some()) {
            (true, _) => Durability::Now,
            (false, true) => Durability::DataBeforeRename,
            (false, false) => Durability::Later,
        };
        let (meta, generation) = lock.replace_with(|f| write_pieces(f, pieces), durability)?;
        Ok(info_of(&meta, generation))
    }

    fn put_durably(&self, key: &Path, parts: &[Bytes]) -> Result<ObjectInfo, StoreError> {
        let pieces: Vec<Piece> = parts.iter().cloned().map(Piece::Bytes).collect();
        self.put_pieces(key, &pieces, true)
    }

    fn hold(&self, key: &Path) -> Result<Option<Box<dyn std::any::Any>>, StoreError> {
        // Never renamed onto `key`: dropped, it leaves nothing behind.
        let held = self.lock_key_within(key, Within::path(Path::new("")))?;
        Ok(Some(Box::new(held)))
    }

    fn sync_all(&self) -> Result<(), StoreError> {
        let root = File::open(self.root())?;
        rustix::fs::syncfs(&root).map_err(|e| StoreError::Io(e.into()))
    }

    fn clear_stale_lock(&self, key: &Path) -> Result<(), StoreError> {
        let (Some(dir), Some(name)) = (key.parent(), key.file_name()) else {
            return Ok(());
        };
        Ok(self.remove_stale_lock(dir, &crate::backing::lock::lock_name(name))?)
    }

    fn clear_leftovers(&self, dir: &Path) -> Result<(), StoreError> {
        let mut stack = vec![dir.to_path_buf()];
        while let Some(d) = stack.pop() {
            for entry in Backing::list(self, &d)? {
                let name = entry.name.to_string_lossy();
                if entry.kind.is_dir() {
                    stack.push(d.join(&entry.name));
                } else if name.ends_with(LOCK_SUFFIX) {
                    self.remove_stale_lock(&d, &entry.name)?;
                } else if key_of_staged(&name).is_some() {
                    self.remove_stale_staged(&d, &entry.name)?;
                }
            }
        }
        Ok(())
    }

    fn delete(&self, key: &Path, when: Precondition) -> Result<bool, StoreError> {
        self.delete_within(Within::path(Path::new("")), key, when, None)
    }

    fn delete_within(
        &self,
        within: Within,
        key: &Path,
        when: Precondition,
        on_durable: OnDurable,
    ) -> Result<bool, StoreError> {
        let (lock, _) = locked_if(self, within, key, &when)?;
        let dir = lock.dir_rel().to_path_buf();
        let removed = lock.remove()?;
        if let Some(then) = on_durable {
            self.sync_dir_chain(&dir)?;
            then();
        }
        // The lock file goes first: the directory may be empty then.
        drop(lock);
        self.prune_empty_dirs(&dir, dir.ancestors().last().unwrap_or(&dir));
        Ok(removed)
    }

    fn list(&self, dir: &Path) -> Result<Listing, StoreError> {
        let mut listing = Listing::default();
        for entry in Backing::list(self, dir)? {
            let Some(name) = entry.name.to_str() else {
                // Not a key an object store could hold.
                let shown = self.describe(&dir.join(&entry.name));
                listing.unlisted.push(shown);
                continue;
            };
            if entry.kind.is_dir() {
                listing.dirs.push(name.to_string());
            } else if entry.kind == EntryKind::File
                && !name.ends_with(LOCK_SUFFIX)
                && key_of_staged(name).is_none()
            {
                listing.objects.push(name.to_string());
            } else if entry.kind != EntryKind::File {
                listing.unlisted.push(self.describe(&dir.join(name)));
            }
        }
        listing.dirs.sort();
        listing.objects.sort();
        Ok(listing)
    }

    fn describe(&self, key: &Path) -> String {
        self.path(key).display().to_string()
    }
}

/// The key lock of `key` in `backing` and its file as it is, if `when` holds for it:
/// under the lock nobody who follows the protocol changes it before the write that follows.
fn locked_if(
    backing: &Backing,
    within: Within,
    key: &Path,
    when: &Precondition,
) -> Result<(crate::backing::lock::KeyLock, Option<Metadata>), StoreError> {
    let lock = backing.lock_key_within(key, within)?;
    // In the locked directory: the one checked, whatever is at its path now.
    let file = lock.current()?;
    let current = file.as_ref().map(File::metadata).transpose()?;
    let tag = match &file {
        Some(f) => Some(file_info(f)?.tag),
        None => None,
    };
    if !when.holds(tag.as_deref()) {
        return Err(StoreError::Conflict(backing.describe(key)));
    }
    Ok((lock, current))
}

/// A file's version (also of shards this mount writes): a rewrite by rename changes the
/// inode, one in place the size or the times.
pub fn info_of(m: &Metadata, generation: Option<u64>) -> ObjectInfo {
    // The inode, size, modification and change times (to the nanosecond), and the inode's
    // generation where there is one: a file made anew on a reused inode number, of the
    // same size within one timestamp tick, still gets another tag.
    let mut tag = format!(
        "{}-{}-{}.{}-{}.{}",
        m.ino(),
        m.len(),
        m.mtime(),
        m.mtime_nsec(),
        m.ctime(),
        m.ctime_nsec()
    );
    if let Some(g) = generation {
        tag.push_str(&format!("-g{g}"));
    }
    ObjectInfo {
        size: m.len(),
        tag,
        mtime: mtime_of(m),
    }
}

/// `info_of` an open file.
pub fn file_info(file: &File) -> io::Result<ObjectInfo> {
    Ok(info_of(&file.metadata()?, crate::backing::generation(file)))
}

#[derive(Debug)]
struct FileBlob {
    file: File,
    info: ObjectInfo,
}

impl ReadAt for FileBlob {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        ReadAt::read_exact_at(&self.file, buf, offset)
    }
}

impl Blob for FileBlob {
    fn info(&self) -> &ObjectInfo {
        &self.info
    }

    fn file(&self) -> Option<&File> {
        Some(&self.file)
    }

    fn still_as_pinned(&self) -> io::Result<bool> {
        let now = self.file.metadata()?;
        Ok(now.len() == self.info.size && mtime_of(&now) == self.info.mtime)
    }
}

/// Writes `pieces` at `out`'s position: ranges of files copied inside the kernel
/// (`copy_file_range`, as `cp` does), through memory where the kernel cannot (another
/// file system on an old kernel).
fn write_pieces(out: &mut File, pieces: &[Piece]) -> io::Result<()> {
    for piece in pieces {
        match piece {
            Piece::Range { from, offset, len } => match from.file() {
                Some(src) => {
                    copy_range(src, *offset, *len, out)?;
                    // Checked after the copy: one written meanwhile may have given it
                    // part of each version.
                    if !from.still_as_pinned()? {
                        return Err(changed_meanwhile());
                    }
                }
                None => io::Write::write_all(out, &piece.to_bytes()?)?,
            },
            Piece::Bytes(bytes) => io::Write::write_all(out, bytes)?,
        }
    }
    Ok(())
}

/// A source written in place while it was being copied: nothing is written, the writer is
/// to run again.
fn changed_meanwhile() -> io::Error {
    io::Error::other(
        "a file it is made from changed while it was copied (written in place meanwhile); run again",
    )
}

/// `len` bytes of `src` from `offset`, appended at `out`'s position.
fn copy_range(src: &File, offset: u64, len: u64, out: &mut File) -> io::Result<()> {
    let (mut at, mut left) = (offset, len);
    while left > 0 {
        let step = usize::try_from(left).unwrap_or(usize::MAX);
        match rustix::fs::copy_file_range(src, Some(&mut at), &*out, None, step) {
            Ok(0) => return Err(io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => left -= n as u64,
            Err(rustix::io::Errno::XDEV | rustix::io::Errno::INVAL | rustix::io::Errno::NOSYS)
            | Err(rustix::io::Errno::OPNOTSUPP) => {
                let mut buf = vec![0u8; left as usize];
                ReadAt::read_exact_at(src, &mut buf, at)?;
                return io::Write::write_all(out, &buf);
            }
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_made_anew_on_the_same_path_gets_another_tag() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"same size").unwrap();
        let first = file_info(&File::open(&path).unwrap()).unwrap();
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, b"same size").unwrap();
        let second = file_info(&File::open(&path).unwrap()).unwrap();
        assert_ne!(first.tag, second.tag);
        // Where the file system keeps inode generations (ext4, xfs, btrfs), the tag
        // carries it: a reused inode number within one timestamp tick still differs.
        if crate::backing::generation(&File::open(&path).unwrap()).is_some() {
            assert!(second.tag.contains("-g"), "{}", second.tag);
        }
    }

    #[test]
    fn pieces_are_copied_exactly_and_a_source_written_meanwhile_fails_the_write() {
        let dir = tempfile::tempdir().unwrap();
        let store = Backing::new(dir.path().to_path_buf()).unwrap();
        let big: Vec<u8> = (0..300_000u32).map(|i| (i % 251) as u8).collect();
        std::fs::write(dir.path().join("src"), &big).unwrap();
        let blob = Store::open(&store, Path::new("src"), 0).unwrap().unwrap();
        let range = |offset, len| Piece::Range {
            from: blob.clone(),
            offset,
            len,
        };
        let pieces = [
            range(100, 200_000),
            Piece::Bytes(Bytes::from_static(b"index")),
        ];
        store.put_pieces(Path::new("out"), &pieces, false).unwrap();
        let out = std::fs::read(dir.path().join("out")).unwrap();
        assert_eq!(&out[..200_000], &big[100..200_100]);
        assert_eq!(&out[200_000..], b"index");
        // Grown in place after it was opened: neither copied nor read.
        let mut f = std::fs::OpenOptions::new()
            .append(true)
            .open(dir.path().join("src"))
            .unwrap();
        std::io::Write::write_all(&mut f, b"more").unwrap();
        let err = store.put_pieces(Path::new("out2"), &pieces, false);
        assert!(err.is_err(), "a source written meanwhile fails the write");
        assert!(!dir.path().join("out2").exists(), "and nothing lands");
        assert!(range(0, 10).to_bytes().is_err());
    }
}
