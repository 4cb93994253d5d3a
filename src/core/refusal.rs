//! Refusals: requests the mount turns down on purpose because they break one of its rules
//! (a name that is no chunk key, a file too big to hold, a layout change while chunks are
//! pending, a read of a damaged shard...). Each carries the file, the rule and what to do,
//! so that the one log line it gets (`RefusalLog`) tells the user how to get going again;
//! its errno is chosen in `crate::errno`.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
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
    /// An object store's objects are written whole.
    ObjectStoreInPlaceChange,
    /// An object store renames no directory.
    ObjectStoreDirectoryRename,
}

impl Rule {
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
            Rule::ObjectStoreInPlaceChange => {
                "write a new file and rename it over the old one, or copy instead of linking"
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
}

impl Refusal {
    pub fn new(file: &Path, rule: Rule, detail: impl Into<String>) -> Refusal {
        Refusal {
            file: file.to_path_buf(),
            rule,
            detail: detail.into(),
        }
    }
}

impl fmt::Display for Refusal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.file.display(), self.detail)
    }
}

/// How long a (file, rule) pair stays quiet after its line.
const QUIET_FOR: Duration = Duration::from_secs(60);
/// Pairs remembered at most: a client naming endless bad files cannot grow it, nor the log
/// past this many lines a minute.
const REMEMBERED: usize = 1024;

/// Logs each refusal in one line: where (the path in the mount), the errno, what was wrong,
/// the rule and the fix. A client retrying in a loop gets one line a minute per file and
/// rule.
#[derive(Debug, Default)]
pub struct RefusalLog {
    mountpoint: PathBuf,
    recent: Mutex<HashMap<(PathBuf, Rule), Instant>>,
    /// Refusals so far, logged or not (`shardfs stats`).
    pub count: AtomicU64,
    /// Refusals not logged because the log was full of recent ones.
    suppressed: AtomicU64,
}

impl RefusalLog {
    pub fn new(mountpoint: PathBuf) -> RefusalLog {
        RefusalLog {
            mountpoint,
            ..RefusalLog::default()
        }
    }

    pub fn note(&self, r: &Refusal, errno_name: &str) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if !self.due(r) {
            return;
        }
        let suppressed = self.suppressed.swap(0, Ordering::Relaxed);
        let more = if suppressed > 0 {
            format!(" ({suppressed} other refusals not logged)")
        } else {
            String::new()
        };
        warn!(
            "{}: refused ({errno_name}): {}. Rule: {}. Fix: {}.{more}",
            self.shown(&r.file).display(),
            r.detail,
            r.rule.text(),
            r.rule.fix()
        );
    }

    /// Whether the pair has not been logged in the last `QUIET_FOR`.
    fn due(&self, r: &Refusal) -> bool {
        let now = Instant::now();
        let mut recent = self.recent.lock().unwrap_or_else(|e| e.into_inner());
        let key = (r.file.clone(), r.rule);
        if recent
            .get(&key)
            .is_some_and(|t| now.duration_since(*t) < QUIET_FOR)
        {
            return false;
        }
        if recent.len() >= REMEMBERED {
            recent.retain(|_, t| now.duration_since(*t) < QUIET_FOR);
            if recent.len() >= REMEMBERED {
                self.suppressed.fetch_add(1, Ordering::Relaxed);
                return false;
            }
        }
        recent.insert(key, now);
        true
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
    fn a_pair_is_logged_once_a_minute_and_the_memory_is_bounded() {
        let log = RefusalLog::new(PathBuf::from("/mnt"));
        let r = Refusal::new(Path::new("a/c/9"), Rule::NotAChunkKey, "outside");
        assert!(log.due(&r));
        assert!(!log.due(&r), "the same pair again is quiet");
        let other = Refusal::new(Path::new("a/c/9"), Rule::TooBig, "big");
        assert!(log.due(&other), "another rule for the file is logged");
        for i in 0..REMEMBERED {
            log.due(&Refusal::new(Path::new(&format!("f{i}")), Rule::TooBig, ""));
        }
        assert!(log.recent.lock().unwrap().len() <= REMEMBERED);
        assert!(log.suppressed.load(Ordering::Relaxed) > 0);
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
