//! Refusals: requests the mount turns down on purpose because they break one of its rules
//! (a name that is no chunk key, a file too big to hold, a layout change while chunks are
//! pending, a read of a damaged shard...). Each carries the file, the rule and what to do,
//! so that the one log line it gets (`RefusalLog`) tells the user how to get going again;
//! its errno is part of the rule (`Rule::errno`).

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tracing::warn;

/// The rules a request can break.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Rule {
    /// A name in a key directory that is not a chunk key of the array, or lies outside
    /// its grid.
    NotAChunkKey,
    /// A file where the array's keys need a directory (`c`, `c/0`).
    FileAsKeyDirectory,
    /// A directory where the array's keys need a file (a chunk, `zarr.json`).
    DirectoryAsFile,
    /// A file inside an array, or a `zarr.json`, past what may be held in memory.
    TooBig,
    /// A new `zarr.json` moves chunks to other shards while chunks of the old layout
    /// could not be written.
    LayoutChangeWhilePending,
    /// A chunk of a shard whose index is damaged.
    DamagedShard,
    /// Chunks to be merged into a shard whose index is damaged.
    MergeIntoDamagedShard,
    /// A `zarr.json` that is not an array the mount can shard.
    InvalidArrayMetadata,
    /// Key directories belong to their array.
    KeyDirectoryMove,
    /// `RENAME_EXCHANGE` of names the mount translates.
    ExchangeOfTranslatedNames,
    /// Special files, hard links to directories, or symbolic links at chunk keys.
    SpecialFileInArray,
    /// shardfs's own files: the control file, `.shardfs` in BACKING.
    ShardfsOwnFile,
    /// A translated document (an array's `zarr.json` as shown, a key directory) truncated
    /// in place.
    TruncateTranslated,
    /// A chunk or key directory's owner and mode are its array's.
    ChunkOwnership,
    /// An object store's objects are written whole.
    ObjectStoreInPlaceChange,
    /// An object store renames no directory.
    ObjectStoreDirectoryRename,
}

impl Rule {
    /// The errno a request refused by the rule gets.
    pub fn errno(self) -> i32 {
        match self {
            Rule::NotAChunkKey
            | Rule::FileAsKeyDirectory
            | Rule::DirectoryAsFile
            | Rule::InvalidArrayMetadata
            | Rule::ExchangeOfTranslatedNames => libc::EINVAL,
            Rule::TooBig => libc::EFBIG,
            Rule::LayoutChangeWhilePending => libc::EBUSY,
            Rule::DamagedShard | Rule::MergeIntoDamagedShard => libc::EIO,
            Rule::KeyDirectoryMove | Rule::ObjectStoreDirectoryRename => libc::EXDEV,
            Rule::SpecialFileInArray
            | Rule::ShardfsOwnFile
            | Rule::TruncateTranslated
            | Rule::ChunkOwnership => libc::EPERM,
            Rule::ObjectStoreInPlaceChange => libc::EOPNOTSUPP,
        }
    }

    /// The rule, as the log line states it.
    pub fn text(self) -> &'static str {
        match self {
            Rule::NotAChunkKey => {
                "inside an array's key directory every name is a chunk key of the array's \
                 chunk_key_encoding, inside its grid (shape / chunk shape)"
            }
            Rule::FileAsKeyDirectory => "the array's key directories (c, c/0...) hold chunks",
            Rule::DirectoryAsFile => "chunk keys and zarr.json name files, not directories",
            Rule::TooBig => {
                "files inside arrays and zarr.json documents are held in memory, up to a \
                 fixed size"
            }
            Rule::LayoutChangeWhilePending => {
                "a zarr.json that moves chunks to other shards first writes the chunks still \
                 pending under the old layout"
            }
            Rule::DamagedShard => {
                "a chunk in a shard whose index is damaged reads as EIO, never as wrong bytes"
            }
            Rule::MergeIntoDamagedShard => {
                "new chunks are not merged into a damaged shard, which would drop what it \
                 still holds"
            }
            Rule::InvalidArrayMetadata => {
                "an array's zarr.json is Zarr v3 metadata that the mount can shard"
            }
            Rule::KeyDirectoryMove => "key directories belong to their array and do not move",
            Rule::ExchangeOfTranslatedNames => {
                "RENAME_EXCHANGE swaps only plain files or directories"
            }
            Rule::SpecialFileInArray => {
                "arrays hold files and directories; no device files, FIFOs, sockets, hard \
                 links to directories or symbolic links at chunk keys"
            }
            Rule::ShardfsOwnFile => "shardfs's own files are not changed through the mount",
            Rule::TruncateTranslated => {
                "documents the mount translates (an array's zarr.json) change only by being \
                 written whole"
            }
            Rule::ChunkOwnership => {
                "a chunk or key directory has the owner and mode of its array directory (its \
                 shard takes them): a chmod may not close it to others on its own"
            }
            Rule::ObjectStoreInPlaceChange => {
                "an object store keeps whole objects: files are written new and whole, never \
                 changed in place or linked"
            }
            Rule::ObjectStoreDirectoryRename => "an object store has no directories to rename",
        }
    }

    /// What the user can do about it.
    pub fn fix(self) -> &'static str {
        match self {
            Rule::NotAChunkKey => {
                "write chunks at the keys the array's zarr.json defines; a key past the grid \
                 means the writer's shape differs, so resize the array (rewrite zarr.json) \
                 first"
            }
            Rule::FileAsKeyDirectory => "write each chunk at its full key below the directory",
            Rule::DirectoryAsFile => {
                "check that the writer uses the chunk_key_encoding (separator) of the array's \
                 zarr.json"
            }
            Rule::TooBig => {
                "keep big files other than chunks outside array directories; a chunk this big \
                 needs a smaller chunk shape"
            }
            Rule::LayoutChangeWhilePending => {
                "fix what fails the writes (shardfs stats names it: a full or unreachable \
                 store), then write zarr.json again"
            }
            Rule::DamagedShard | Rule::MergeIntoDamagedShard => {
                "run shardfs verify on the array in BACKING to see the damage; restore the \
                 shard from a copy, or delete it to read its chunks as the fill value"
            }
            Rule::InvalidArrayMetadata => {
                "correct the document and write it again (shardfs verify names the fault)"
            }
            Rule::KeyDirectoryMove => "move or copy the whole array directory",
            Rule::ExchangeOfTranslatedNames => "rename one name at a time",
            Rule::SpecialFileInArray => "keep such files outside array directories",
            Rule::ShardfsOwnFile => "use the shardfs commands (flush, stats, unmount)",
            Rule::TruncateTranslated => {
                "write the whole document: open it with O_TRUNC, or write a temporary file \
                 and rename it over"
            }
            Rule::ChunkOwnership => "chmod or chown the array directory instead",
            Rule::ObjectStoreInPlaceChange => {
                "write a new file and rename it over the old one, and copy instead of \
                 linking; links and special files are not kept in object stores"
            }
            Rule::ObjectStoreDirectoryRename => {
                "copy the tree and remove the old one (mv does this by itself on EXDEV)"
            }
        }
    }
}

/// A refused request: the file it named (relative to the mount's root; or a file of the
/// store itself, absolute or a URL), the rule it broke, and what exactly was wrong.
#[derive(Debug)]
pub struct Refusal {
    pub file: PathBuf,
    pub rule: Rule,
    pub detail: String,
    /// Logged and counted already: the same refusal may pass several places that note
    /// refusals (a shard write booked as failed, then the request that asked for it).
    noted: AtomicBool,
}

impl Refusal {
    pub fn new(file: &Path, rule: Rule, detail: impl Into<String>) -> Refusal {
        Refusal {
            file: file.to_path_buf(),
            rule,
            detail: detail.into(),
            noted: AtomicBool::new(false),
        }
    }
}

/// What a client's error message, `shardfs flush` or `stats` shows after the file: what
/// was wrong and what to do.
impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}. Fix: {}", self.detail, self.rule.fix())
    }
}

/// How long refusals of one rule in one directory stay quiet after their line.
const QUIET_FOR: Duration = Duration::from_secs(60);
/// (directory, rule) pairs remembered at most, so that a client naming endless bad files
/// grows neither the memory nor the log past this many lines a minute.
const REMEMBERED: usize = 1024;

/// When a pair was last logged, and how many of its refusals were not logged since.
#[derive(Debug)]
struct Quiet {
    logged: Instant,
    since: u64,
}

/// The symbolic name of the errno values refusals use, for log lines.
pub fn errno_name(errno: i32) -> &'static str {
    match errno {
        libc::EINVAL => "EINVAL",
        libc::EFBIG => "EFBIG",
        libc::EBUSY => "EBUSY",
        libc::EIO => "EIO",
        libc::EXDEV => "EXDEV",
        libc::EPERM => "EPERM",
        libc::EOPNOTSUPP => "EOPNOTSUPP",
        _ => "error",
    }
}

/// Logs refusals, each in one line: where (the path in the mount), the errno, what was
/// wrong, the rule and the fix. Within a minute, further refusals of the same rule in the
/// same directory (a writer with the wrong chunk shape, a reader of a damaged shard) are
/// counted, and the next line says how many there were.
#[derive(Debug, Default)]
pub struct RefusalLog {
    mountpoint: PathBuf,
    recent: Mutex<HashMap<(PathBuf, Rule), Quiet>>,
    /// Refusals so far, logged or not (`shardfs stats`).
    count: AtomicU64,
    /// Refusals not logged because the table was full of recent pairs.
    overflow: AtomicU64,
}

impl RefusalLog {
    pub fn new(mountpoint: PathBuf) -> RefusalLog {
        RefusalLog {
            mountpoint,
            ..RefusalLog::default()
        }
    }

    /// Refusals so far, logged or not.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    pub fn note(&self, r: &Refusal) {
        if r.noted.swap(true, Ordering::Relaxed) {
            return;
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        let Some(since) = self.due(r) else {
            return;
        };
        let overflow = self.overflow.swap(0, Ordering::Relaxed);
        let mut more = String::new();
        if since > 0 {
            more.push_str(&format!(" ({since} more like it in the last minute)"));
        }
        if overflow > 0 {
            more.push_str(&format!(" ({overflow} other refusals not logged)"));
        }
        let errno = errno_name(r.rule.errno());
        warn!(
            "{}: refused ({errno}): {}. Rule: {}. Fix: {}.{more}",
            self.shown(&r.file).display(),
            r.detail,
            r.rule.text(),
            r.rule.fix()
        );
    }

    /// Whether `r` is to be logged now, with the count of its pair's refusals not logged
    /// since the pair's last line.
    fn due(&self, r: &Refusal) -> Option<u64> {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let dir = r.file.parent().unwrap_or(&r.file).to_path_buf();
        let key = (dir, r.rule);
        if let Some(q) = recent.get_mut(&key) {
            if now.duration_since(q.logged) < QUIET_FOR {
                q.since += 1;
                return None;
            }
            let since = std::mem::take(&mut q.since);
            q.logged = now;
            return Some(since);
        }
        if recent.len() >= REMEMBERED {
            recent.retain(|_, q| now.duration_since(q.logged) < QUIET_FOR);
            if recent.len() >= REMEMBERED {
                self.overflow.fetch_add(1, Ordering::Relaxed);
                return None;
            }
        }
        recent.insert(
            key,
            Quiet {
                logged: now,
                since: 0,
            },
        );
        Some(0)
    }

    fn shown(&self, file: &Path) -> PathBuf {
        let of_store = file.is_absolute() || file.to_string_lossy().contains("://");
        if of_store || self.mountpoint.as_os_str().is_empty() {
            file.to_path_buf()
        } else {
            self.mountpoint.join(file)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_directory_and_rule_log_once_a_minute_and_the_memory_is_bounded() {
        let log = RefusalLog::new(PathBuf::from("/mnt"));
        let r = |file: &str, rule| Refusal::new(Path::new(file), rule, "x");
        assert_eq!(log.due(&r("a/c/9/9", Rule::NotAChunkKey)), Some(0));
        assert_eq!(log.due(&r("a/c/9/9", Rule::NotAChunkKey)), None, "quiet");
        assert_eq!(
            log.due(&r("a/c/9/8", Rule::NotAChunkKey)),
            None,
            "same directory"
        );
        assert_eq!(
            log.due(&r("a/c/9/9", Rule::TooBig)),
            Some(0),
            "another rule"
        );
        assert_eq!(
            log.due(&r("a/c/8/9", Rule::NotAChunkKey)),
            Some(0),
            "another directory"
        );
        for i in 0..REMEMBERED {
            log.due(&r(&format!("d{i}/f"), Rule::TooBig));
        }
        assert!(log.recent.lock().unwrap().len() <= REMEMBERED);
        assert!(log.overflow.load(Ordering::Relaxed) > 0);
    }

    #[test]
    fn a_refusal_is_counted_once_and_shown_where_it_is() {
        let log = RefusalLog::new(PathBuf::from("/mnt"));
        let refused = Refusal::new(Path::new("a/c/9"), Rule::NotAChunkKey, "outside");
        log.note(&refused);
        log.note(&refused);
        assert_eq!(log.count(), 1);
        assert_eq!(log.shown(Path::new("a/b")), PathBuf::from("/mnt/a/b"));
        assert_eq!(
            log.shown(Path::new("/data/a/c/0")),
            PathBuf::from("/data/a/c/0")
        );
        assert_eq!(
            log.shown(Path::new("s3://b/a/c/0")),
            PathBuf::from("s3://b/a/c/0")
        );
    }
}
