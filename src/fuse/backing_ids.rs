//! The kernel's names for BACKING files that opens pass through to (FUSE_DEV_IOC_BACKING_OPEN).
//! Every open of an inode passing through at the same time must name the same backing id:
//! one is kept per inode while any of its handles is open, and closed with the last.

use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::sync::{Arc, Mutex, Weak};

use fuser::BackingId;

use crate::sync::lock;

/// Why an open cannot pass through.
pub enum Declined {
    /// The kernel refused the file: it will refuse the others (not root, BACKING stacked).
    Refused(io::Error),
    /// The inode passes through to another file (replaced outside the mount since).
    OtherFile,
}

/// A BACKING file's device and inode.
type Source = (u64, u64);

#[derive(Default)]
pub struct BackingIds {
    /// Each inode's backing id while a handle holds it, with the file's device and inode.
    by_ino: Mutex<HashMap<u64, (Weak<BackingId>, Source)>>,
    by_fh: Mutex<HashMap<u64, (u64, Arc<BackingId>)>>,
}

impl BackingIds {
    /// The backing id for handle `fh` of inode `ino`, whose file is `source`: the one the
    /// inode has, or a new one for `file()`, made by `register` (the reply's
    /// `open_backing`).
    pub fn for_open(
        &self,
        register: impl FnOnce(&File) -> io::Result<BackingId>,
        (ino, fh): (u64, u64),
        source: Source,
        file: impl FnOnce() -> io::Result<File>,
    ) -> Result<Arc<BackingId>, Declined> {
        let mut by_ino = lock(&self.by_ino);
        let held = by_ino
            .get(&ino)
            .and_then(|(weak, src)| Some((weak.upgrade()?, *src)));
        let id = match held {
            Some((_, src)) if src != source => return Err(Declined::OtherFile),
            Some((id, _)) => id,
            None => {
                let file = file().map_err(Declined::Refused)?;
                let id = Arc::new(register(&file).map_err(Declined::Refused)?);
                by_ino.insert(ino, (Arc::downgrade(&id), source));
                id
            }
        };
        lock(&self.by_fh).insert(fh, (ino, id.clone()));
        Ok(id)
    }

    /// Handle `fh` closed: its inode's backing id goes with its last handle.
    pub fn released(&self, fh: u64) {
        let Some((ino, id)) = lock(&self.by_fh).remove(&fh) else {
            return;
        };
        let mut by_ino = lock(&self.by_ino);
        drop(id);
        if by_ino
            .get(&ino)
            .is_some_and(|(weak, _)| weak.strong_count() == 0)
        {
            by_ino.remove(&ino);
        }
    }
}
