//! Making a directory, link or special file as the user who asked. A root daemon that made
//! it as root and gave it away by name afterwards could give away something else: whoever
//! may write the directory can swap another entry in at the name (`RENAME_EXCHANGE`)
//! between the two calls. Made with the caller's file-system identity, the entry is theirs
//! from the start (the kernel also checks their permission on the directory, and applies a
//! set-group-ID directory's group), and there is nothing to give.
//!
//! The file-system identity (`setfsuid`, `setfsgid`) and the supplementary groups (the raw
//! `setgroups` system call, which, unlike the C library's, changes only the calling
//! thread) are per thread: the other request threads keep the daemon's.

use std::io;

use super::Asker;

/// Runs `make` with `who`'s file-system identity on this thread, when the daemon is root
/// and `who` is someone else; as the daemon otherwise (a daemon of an ordinary user makes
/// everything its own, as any process does).
pub fn as_user<R, E: From<io::Error>>(
    who: Asker,
    make: impl FnOnce() -> Result<R, E>,
) -> Result<R, E> {
    let daemon = Asker {
        uid: rustix::process::geteuid().as_raw(),
        gid: rustix::process::getegid().as_raw(),
        pid: 0,
    };
    if daemon.uid != 0 || (who.uid, who.gid) == (daemon.uid, daemon.gid) {
        return make();
    }
    let acting = Acting::begin(who, daemon)?;
    let made = make();
    drop(acting);
    made
}

/// This thread acting as another user; the daemon's identity comes back on drop.
struct Acting {
    daemon: Asker,
    groups: Vec<libc::gid_t>,
}

impl Acting {
    fn begin(who: Asker, daemon: Asker) -> io::Result<Acting> {
        let acting = Acting {
            daemon,
            groups: current_groups()?,
        };
        // Groups and group first: changing them needs the capabilities that a change of
        // file-system user away from root takes from this thread.
        set_thread_groups(&super::pinned::groups_of(who))?;
        set_fs_ids(who.uid, who.gid)?;
        Ok(acting)
    }
}

impl Drop for Acting {
    fn drop(&mut self) {
        let back = set_fs_ids(self.daemon.uid, self.daemon.gid)
            .and_then(|()| set_thread_groups(&self.groups));
        // Root gets its own identity back whatever it asks; failing that, this thread
        // could not be trusted with another request.
        if let Err(e) = back {
            tracing::error!("a request thread could not take the daemon's identity back: {e}");
            std::process::abort();
        }
    }
}

/// Sets this thread's file-system user and group, and checks that they took (the calls
/// say only what was there before).
fn set_fs_ids(uid: u32, gid: u32) -> io::Result<()> {
    // SAFETY: plain system calls on this thread's credentials; -1 changes nothing and
    // returns the current value.
    let (now_uid, now_gid) = unsafe {
        libc::setfsgid(gid);
        libc::setfsuid(uid);
        (
            libc::setfsuid(u32::MAX) as u32,
            libc::setfsgid(u32::MAX) as u32,
        )
    };
    if (now_uid, now_gid) != (uid, gid) {
        return Err(io::Error::other(format!(
            "could not act as uid {uid} gid {gid} (this thread is {now_uid}:{now_gid})"
        )));
    }
    Ok(())
}

fn current_groups() -> io::Result<Vec<libc::gid_t>> {
    // SAFETY: a count query, then a buffer of that size.
    let n = unsafe { libc::getgroups(0, std::ptr::null_mut()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut groups = vec![0; n as usize];
    let n = unsafe { libc::getgroups(n, groups.as_mut_ptr()) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    groups.truncate(n as usize);
    Ok(groups)
}

/// `setgroups` for this thread alone.
fn set_thread_groups(groups: &[libc::gid_t]) -> io::Result<()> {
    // SAFETY: the raw system call with a valid buffer and its length.
    let r = unsafe { libc::syscall(libc::SYS_setgroups, groups.len(), groups.as_ptr()) };
    if r != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_thread_acts_as_the_user_and_comes_back() {
        if !rustix::process::geteuid().is_root() {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        std::fs::set_permissions(
            dir.path(),
            std::os::unix::fs::PermissionsExt::from_mode(0o777),
        )
        .unwrap();
        let who = Asker {
            uid: 4321,
            gid: 4322,
            pid: 0, // no process: no supplementary groups
        };
        let made = dir.path().join("d");
        as_user(who, || std::fs::create_dir(&made)).unwrap();
        let m = std::fs::symlink_metadata(&made).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!((m.uid(), m.gid()), (4321, 4322), "made as the user");
        // Back to root: root may make what the user may not.
        std::fs::create_dir(dir.path().join("d/x")).unwrap();
        assert_eq!(std::fs::metadata(dir.path().join("d/x")).unwrap().uid(), 0);
        // As the user, the kernel checks their permission.
        let closed = dir.path().join("closed");
        std::fs::create_dir(&closed).unwrap();
        let e = as_user(who, || std::fs::create_dir(closed.join("y"))).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EACCES));
    }
}
