//! FUSE passthrough for plain files (Linux 6.9+, the daemon as root): reads and writes of a
//! file outside every array go from the kernel straight to its BACKING file, never through
//! the daemon. The kernel holds one rule the mount must keep: while one open of an inode
//! passes through, every open of it must (to the same file), or fail with EIO; and none may
//! while it is open without. So a file passes through only where its data stays in its
//! BACKING file for as long as it is open:
//! - a plain file in a plain directory, not `zarr.json` (written through the mount's own
//!   document path) and not a lock file (`KEY.__lock`, renamed onto a key while open);
//! - not while the inode is open without it.
//!
//! A rename that would take the data out of such a file (into an array, onto a document)
//! while it is open through passthrough is refused with EBUSY after a short wait for
//! closes in flight (writes through the kernel after it would not follow the data), as is
//! an open of the inode that cannot pass through.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use tracing::warn;

use crate::sync::lock;

/// Whether the mount passes plain files through, and if not, why.
#[derive(Debug)]
pub struct Passthrough {
    on: AtomicBool,
    off_because: Mutex<String>,
    /// Held from deciding how an open goes to making its handle: two opens of one inode
    /// decide on the same handles.
    deciding: Mutex<()>,
}

impl Default for Passthrough {
    fn default() -> Self {
        Passthrough {
            on: AtomicBool::new(false),
            off_because: Mutex::new("not asked of the kernel".into()),
            deciding: Mutex::default(),
        }
    }
}

impl Passthrough {
    /// What the kernel agreed to at INIT.
    pub fn start(&self, on: bool, off_because: &str) {
        self.on.store(on, Ordering::Relaxed);
        *lock(&self.off_because) = off_because.to_string();
    }

    pub fn on(&self) -> bool {
        self.on.load(Ordering::Relaxed)
    }

    /// The kernel refused a file (not root, BACKING stacked too deep): every later open
    /// goes through the daemon, as without passthrough.
    pub fn refused(&self, why: &str) {
        if self.on.swap(false, Ordering::Relaxed) {
            warn!(
                "FUSE passthrough refused by the kernel, plain files go through the daemon: {why}"
            );
            *lock(&self.off_because) = why.to_string();
        }
    }

    pub fn deciding(&self) -> std::sync::MutexGuard<'_, ()> {
        lock(&self.deciding)
    }

    /// For `stats`: "on", or "off: why".
    pub fn describe(&self) -> String {
        if self.on() {
            "on".into()
        } else {
            format!("off: {}", lock(&self.off_because))
        }
    }
}

/// Waits up to 200 ms, while `busy()` says a file is still open through passthrough, for
/// closes already on their way (a RELEASE comes after close(2) returns, and a rename or a
/// document's commit may overtake it); returns what `busy()` says last.
pub fn after_closes_in_flight<T, E>(
    mut busy: impl FnMut() -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    for _ in 0..20 {
        match busy()? {
            None => return Ok(None),
            Some(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    busy()
}

/// Whether a file named `name` may start passing through (its other conditions aside).
pub fn name_fits(name: &std::ffi::OsStr) -> bool {
    name != crate::zarr::METADATA_FILE
        && !name
            .to_str()
            .is_some_and(|n| n.ends_with(crate::backing::lock::LOCK_SUFFIX))
}
