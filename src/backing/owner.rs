//! Who owns what the mount writes into BACKING. A root daemon serves many users, so a file
//! must not become root's because the daemon wrote it: a file made through the mount
//! keeps its maker's user, group and mode (the kernel applied the umask); a file replaced
//! keeps the owner and mode it had; what the mount makes on its own (shards, key
//! directories) belongs to whoever owns the directory it is in, with that directory's
//! mode (without its execute bits, for a file). Ownership is given on the descriptor the
//! daemon holds, before the file has its name: never by a path that someone could have
//! pointed elsewhere meanwhile.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;

use rustix::fs::{Gid, Mode, Uid};

/// A file's user, group and permission bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileOwner {
    pub uid: u32,
    pub gid: u32,
    pub mode: u32,
}

impl FileOwner {
    /// The owner and mode of the file `m` describes.
    pub fn of(m: &Metadata) -> FileOwner {
        FileOwner {
            uid: m.uid(),
            gid: m.gid(),
            mode: m.mode() & 0o7777,
        }
    }

    /// What a file made in the directory `dir` takes: its owner, and its mode without the
    /// execute (search) and special bits.
    pub fn for_file_in(dir: &Metadata) -> FileOwner {
        FileOwner {
            mode: dir.mode() & 0o666,
            ..FileOwner::of(dir)
        }
    }

    /// What a directory made in `dir` takes: its owner and mode (set-group-ID included,
    /// as a set-group-ID directory passes it down).
    pub fn for_dir_in(dir: &Metadata) -> FileOwner {
        FileOwner::of(dir)
    }
}

/// Gives `fd` (a file or directory the daemon just made) to `owner`. A change of owner
/// needs root: a daemon of an ordinary user makes everything its own, as any process does.
/// A BACKING that refuses it (root squashed on NFS) leaves the file the daemon's: logged,
/// never failed, as the file exists by now. The mode is set after the owner, as chown
/// clears the set-user-ID and set-group-ID bits.
pub fn give(fd: &File, owner: FileOwner) -> io::Result<()> {
    let now = fd.metadata()?;
    if rustix::process::geteuid().is_root() && (now.uid(), now.gid()) != (owner.uid, owner.gid) {
        let to = (Uid::from_raw(owner.uid), Gid::from_raw(owner.gid));
        if let Err(e) = rustix::fs::fchown(fd, Some(to.0), Some(to.1)) {
            tracing::warn!(
                uid = owner.uid,
                gid = owner.gid,
                "BACKING refused a change of owner; the file stays the daemon's: {e}"
            );
        }
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(owner.mode))?;
    Ok(())
}
