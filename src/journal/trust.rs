//! Whose journal files a mount believes. A journal is replayed with the daemon's
//! privileges (often root's) into every array of BACKING, so a journal planted by another
//! user who can write BACKING would let them put any bytes into anyone's chunks. A mount
//! keeps its journal in directories that are its user's and closed to writes by others,
//! and replays only files that its user owns, that nobody else may write, and that have one
//! name (a hard link would make a file of someone else's look like ours).

use std::fs::Metadata;
use std::io::{self, Read};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

use crate::backing::Backing;

/// Mode bits that let someone other than the owner change a file or a directory.
const OTHERS_WRITE: u32 = 0o022;

fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// BACKING's root may not be open to writes by others unless sticky: whoever may rename
/// entries there may put a `.shardfs` of theirs in place of the mount's, and have their
/// journal replayed with the daemon's privileges.
pub(super) fn check_root(backing: &Backing) -> io::Result<()> {
    let meta = backing
        .stat(Path::new(""))?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let mode = meta.permissions().mode();
    if mode & OTHERS_WRITE != 0 && mode & libc::S_ISVTX == 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is writable by others (mode {:o}): anyone who may write it could swap \
                 .shardfs for a forged journal; chmod go-w (or +t) it",
                backing.root().display(),
                mode & 0o7777
            ),
        ));
    }
    Ok(())
}

/// Makes the directory `rel` (mode 0700) if it is not there, and checks it: a directory,
/// not a link, owned by this mount's user and not writable by anyone else.
pub(super) fn ensure_dir(backing: &Backing, rel: &Path) -> io::Result<()> {
    match backing.mkdir(rel, 0o700) {
        Err(e) if e.kind() != io::ErrorKind::AlreadyExists => return Err(e),
        _ => {}
    }
    let meta = backing
        .stat(rel)?
        .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
    let problem = if !meta.is_dir() {
        Some("is not a directory".to_string())
    } else {
        untrusted(&meta)
    };
    match problem {
        None => Ok(()),
        Some(why) => Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} {why}: a journal there could be forged by another user; make it owned \
                 by uid {} and not writable by others (or remove it)",
                backing.path(rel).display(),
                euid()
            ),
        )),
    }
}

/// Why a journal file (or directory) with `meta` is not to be believed, if it is not.
pub(super) fn untrusted(meta: &Metadata) -> Option<String> {
    if meta.uid() != euid() {
        return Some(format!("is owned by uid {}, not {}", meta.uid(), euid()));
    }
    if meta.permissions().mode() & OTHERS_WRITE != 0 {
        return Some(format!(
            "is writable by others (mode {:o})",
            meta.permissions().mode() & 0o7777
        ));
    }
    if !meta.is_dir() && meta.nlink() != 1 {
        return Some(format!("has {} names (hard links)", meta.nlink()));
    }
    None
}

/// An error saying that the journal file at `path` is not believed, and why.
pub(super) fn refused(path: &Path, why: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::PermissionDenied,
        format!("journal file {} {why}", path.display()),
    )
}

/// Reads a whole journal file of at most `limit` bytes, if it is one to believe: checked on
/// the descriptor read from, so that it cannot be swapped between the check and the read.
pub(super) fn read_trusted(backing: &Backing, rel: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let mut file = backing.open(rel)?;
    let meta = file.metadata()?;
    if let Some(why) = untrusted(&meta) {
        return Err(refused(&backing.path(rel), &why));
    }
    if meta.len() > limit {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.by_ref().take(limit).read_to_end(&mut out)?;
    Ok(out)
}
