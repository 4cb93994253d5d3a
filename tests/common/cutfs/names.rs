//! The names a power cut keeps. A name made by create, mkdir, link, symlink or rename, and
//! a name's removal by unlink, rmdir or rename, reach the disk at once (so that the layer
//! above sees them) but are durable only once a directory they touch is fsynced: then that
//! change, and every earlier change that shares a directory with it, is kept (the order a
//! journaling file system commits in; a rename is one change, kept or lost whole). At the
//! cut the disk's tree is rebuilt from the kept names alone, as POSIX allows a power cut
//! to leave it. Files are found again by their inode: the layer keeps a hard link to every
//! file it has seen in an attic next to the disk, so that a file whose unlink is lost
//! comes back with what was synced into it.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::ffi::OsString;
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// What a name names.
#[derive(Clone, Debug)]
pub enum Node {
    /// A directory, with its permission bits.
    Dir(u32),
    File,
    Symlink(PathBuf),
}

/// One name of a directory (by the directory's inode) set or removed.
#[derive(Clone, Debug)]
enum Edit {
    Set(u64, OsString, u64, Node),
    Remove(u64, OsString),
}

/// The edits one operation made, kept or lost together.
struct Change {
    dirs: Vec<u64>,
    edits: Vec<Edit>,
}

pub struct Names {
    root: u64,
    attic: PathBuf,
    /// Every directory seen, held open: a removed directory's inode is then never reused
    /// for a new one, so that inodes name directories as they name files.
    dirs: Vec<fs::File>,
    /// Per directory inode, its durable names: (inode, what it is).
    kept: HashMap<u64, BTreeMap<OsString, (u64, Node)>>,
    pending: Vec<Change>,
}

/// The node `path` is now (not following a symlink), with its inode.
pub fn node_at(path: &Path) -> io::Result<(u64, Node)> {
    let m = fs::symlink_metadata(path)?;
    let node = if m.is_dir() {
        Node::Dir(m.mode() & 0o7777)
    } else if m.file_type().is_symlink() {
        Node::Symlink(fs::read_link(path)?)
    } else {
        Node::File
    };
    Ok((m.ino(), node))
}

/// The inode of directory `dir`.
pub fn ino(dir: &Path) -> io::Result<u64> {
    Ok(fs::symlink_metadata(dir)?.ino())
}

impl Names {
    /// Everything on `disk` now is durable; the attic (`<disk>.attic`) starts anew.
    pub fn snapshot(disk: &Path) -> io::Result<Names> {
        let mut attic = disk.as_os_str().to_owned();
        attic.push(".attic");
        let attic = PathBuf::from(attic);
        let _ = fs::remove_dir_all(&attic);
        fs::create_dir_all(&attic)?;
        let mut names = Names {
            root: ino(disk)?,
            attic,
            dirs: Vec::new(),
            kept: HashMap::new(),
            pending: Vec::new(),
        };
        names.walk(disk)?;
        Ok(names)
    }

    fn walk(&mut self, dir: &Path) -> io::Result<()> {
        self.dirs.push(fs::File::open(dir)?);
        let mut here = BTreeMap::new();
        for e in fs::read_dir(dir)? {
            let path = e?.path();
            let (ino, node) = node_at(&path)?;
            match node {
                Node::Dir(_) => self.walk(&path)?,
                Node::File => self.keep_file(&path, ino)?,
                Node::Symlink(_) => {}
            }
            here.insert(path.file_name().unwrap_or_default().to_owned(), (ino, node));
        }
        self.kept.insert(ino(dir)?, here);
        Ok(())
    }

    fn keep_file(&self, path: &Path, ino: u64) -> io::Result<()> {
        match fs::hard_link(path, self.attic.join(ino.to_string())) {
            Err(e) if e.kind() != io::ErrorKind::AlreadyExists => Err(e),
            _ => Ok(()),
        }
    }

    /// `name` in directory `dir` (at `dir_path`) now names what is there.
    pub fn set(&mut self, dir_path: &Path, name: &std::ffi::OsStr) -> io::Result<()> {
        let dir = ino(dir_path)?;
        let edit = self.set_edit(dir, dir_path, name)?;
        self.pending.push(Change {
            dirs: vec![dir],
            edits: vec![edit],
        });
        Ok(())
    }

    fn set_edit(&mut self, dir: u64, dir_path: &Path, name: &std::ffi::OsStr) -> io::Result<Edit> {
        let path = dir_path.join(name);
        let (ino, node) = node_at(&path)?;
        match node {
            Node::File => self.keep_file(&path, ino)?,
            Node::Dir(_) => self.dirs.push(fs::File::open(&path)?),
            Node::Symlink(_) => {}
        }
        Ok(Edit::Set(dir, name.to_owned(), ino, node))
    }

    /// `name` is gone from directory `dir` (its inode).
    pub fn removed(&mut self, dir: u64, name: &std::ffi::OsStr) {
        self.pending.push(Change {
            dirs: vec![dir],
            edits: vec![Edit::Remove(dir, name.to_owned())],
        });
    }

    /// A rename done: from (directory inode, name) to a name in `to_dir`; with `exchange`
    /// both names stay, each naming what the other did.
    pub fn renamed(
        &mut self,
        from: (u64, &Path, &std::ffi::OsStr),
        to: (u64, &Path, &std::ffi::OsStr),
        exchange: bool,
    ) -> io::Result<()> {
        let mut edits = vec![self.set_edit(to.0, to.1, to.2)?];
        edits.push(match exchange {
            true => self.set_edit(from.0, from.1, from.2)?,
            false => Edit::Remove(from.0, from.2.to_owned()),
        });
        self.pending.push(Change {
            dirs: vec![from.0, to.0],
            edits,
        });
        Ok(())
    }

    /// Directory `dir` fsynced: its changes, and the earlier ones they depend on, are kept.
    pub fn synced(&mut self, dir: u64) {
        if std::env::var_os("CUTFS_DEBUG").is_some() {
            eprintln!("CUTFS sync dir {dir}");
        }
        let mut touched: HashSet<u64> = HashSet::from([dir]);
        let mut keep = vec![false; self.pending.len()];
        for (i, c) in self.pending.iter().enumerate().rev() {
            if c.dirs.iter().any(|d| touched.contains(d)) {
                keep[i] = true;
                touched.extend(c.dirs.iter().copied());
            }
        }
        let pending = std::mem::take(&mut self.pending);
        for (c, kept) in pending.into_iter().zip(keep) {
            if kept {
                c.edits.into_iter().for_each(|e| self.apply(e));
            } else {
                self.pending.push(c);
            }
        }
    }

    fn apply(&mut self, e: Edit) {
        if std::env::var_os("CUTFS_DEBUG").is_some() {
            eprintln!("CUTFS keep {e:?}");
        }
        match e {
            Edit::Set(dir, name, ino, node) => {
                self.kept.entry(dir).or_default().insert(name, (ino, node));
            }
            Edit::Remove(dir, name) => {
                self.kept.entry(dir).or_default().remove(&name);
            }
        }
    }

    /// The cut: `disk` holds the kept names only, each file with what was synced into it.
    pub fn restore(&self, disk: &Path) -> io::Result<()> {
        for e in fs::read_dir(disk)? {
            let path = e?.path();
            match fs::symlink_metadata(&path)?.is_dir() {
                true => fs::remove_dir_all(&path)?,
                false => fs::remove_file(&path)?,
            }
        }
        self.build(self.root, disk, &mut HashSet::new())?;
        // The disk stands alone now: its files have one name each again, as after a real
        // power cut (a mount refuses journal files with a second name).
        fs::remove_dir_all(&self.attic)
    }

    fn build(&self, dir: u64, at: &Path, seen: &mut HashSet<u64>) -> io::Result<()> {
        if !seen.insert(dir) {
            return Ok(());
        }
        let Some(names) = self.kept.get(&dir) else {
            return Ok(());
        };
        for (name, (ino, node)) in names {
            let path = at.join(name);
            match node {
                Node::Dir(mode) => {
                    fs::create_dir(&path)?;
                    fs::set_permissions(&path, fs::Permissions::from_mode(*mode))?;
                    self.build(*ino, &path, seen)?;
                }
                Node::File => fs::hard_link(self.attic.join(ino.to_string()), &path)?,
                Node::Symlink(target) => std::os::unix::fs::symlink(target, &path)?,
            }
        }
        Ok(())
    }
}
