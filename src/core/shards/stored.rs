//! Shards as they are in the store: the decoded index of one version of a shard, and the
//! chunks it holds. Every read of a stored chunk goes through the pinned version its index
//! was read from (a descriptor, or an ETag), so a rewrite of the shard (by this mount,
//! another one, or anyone) can never pair one version's index with another version's bytes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::SystemTime;

use bytes::Bytes;
use tracing::warn;

use crate::core::error::FsError;
use crate::shard::{
    ChunkRange, IndexError, IndexFormat, IndexLocation, ShardFileError, ShardIndex,
    read_chunk_part, read_index,
};
use crate::store::{Blob, Store};
use crate::zarr::transparent;

/// The decoded index of one version of a shard, or why it could not be decoded. The shard
/// itself is not kept open: arrays have more shards than a process has descriptors.
#[derive(Clone, Debug)]
pub(crate) struct StoredIndex {
    pub format: IndexFormat,
    /// The store's tag of the version (`ObjectInfo::tag`).
    pub version: Arc<str>,
    pub mtime: SystemTime,
    pub index: Result<Arc<ShardIndex>, IndexError>,
    /// Its stamps (`shard::stamps`), read once per version, when first asked for.
    pub stamps: Arc<OnceLock<Option<Arc<Vec<u64>>>>>,
    /// For a version this mount wrote: the earlier versions (their tags, the last few) and
    /// the positions whose chunks it kept from each, byte for byte. A reader of one of
    /// them reads on in this one (`StoredChunk::same_content`), stamps or none (a shard a
    /// native writer made has none).
    pub kept: Lineage,
}

/// Earlier versions of a shard, and which of their chunks a later one kept as they were.
pub(crate) type Lineage =
    Arc<std::collections::BTreeMap<Arc<str>, Arc<std::collections::BTreeSet<usize>>>>;

/// How many earlier versions a lineage remembers.
const LINEAGE_KEPT: usize = 8;

impl StoredIndex {
    /// The lineage of a version written over `old` keeping the chunks at `kept`.
    pub fn lineage_after(old: &StoredIndex, kept: &std::collections::BTreeSet<usize>) -> Lineage {
        let mut lineage: std::collections::BTreeMap<_, _> = old
            .kept
            .iter()
            .map(|(tag, was)| {
                (
                    tag.clone(),
                    Arc::new(was.intersection(kept).copied().collect()),
                )
            })
            .collect();
        lineage.insert(old.version.clone(), Arc::new(kept.clone()));
        // The oldest go first (tags carry no order: any few will do).
        while lineage.len() > LINEAGE_KEPT {
            let drop = lineage.keys().next().cloned();
            if let Some(tag) = drop {
                lineage.remove(&tag);
            }
        }
        Arc::new(lineage)
    }
}

impl StoredIndex {
    /// What keeping it in memory costs, roughly.
    pub fn cost(&self) -> u64 {
        match &self.index {
            Ok(_) => 16 * self.format.n_chunks() as u64,
            Err(_) => 0,
        }
    }
}

/// One version of a shard, pinned, with its index.
#[derive(Clone, Debug)]
pub(crate) struct OpenShard {
    pub file: Arc<dyn Blob>,
    pub stored: StoredIndex,
}

impl OpenShard {
    /// When each position got what this version holds, if shardfs wrote it: read from the
    /// file the first time, then kept with the version's index.
    /// A time further ahead of this node's clock than `FUTURE_SLACK` is believed to be
    /// no time (0: older than any): a node whose clock runs fast, or a hostile shard, would
    /// otherwise have every later write of the chunk taken for an older one and dropped.
    pub fn stamps(&self) -> Option<Arc<Vec<u64>>> {
        let read = || {
            let index = self.stored.index.as_ref().ok()?;
            let len = self.file.info().size;
            let mut stamps =
                crate::shard::stamps::read(&*self.file, len, &self.stored.format, index)?;
            let limit = crate::core::pending::memfile::now_ns()
                .saturating_add(FUTURE_SLACK.as_nanos() as u64);
            let ahead = stamps.iter().filter(|&&t| t > limit).count();
            if ahead > 0 {
                warn!(
                    positions = ahead,
                    "a shard says chunks were written in the future (a node's clock ahead of this one's?): those times are not believed"
                );
                stamps
                    .iter_mut()
                    .filter(|t| **t > limit)
                    .for_each(|t| *t = 0);
            }
            Some(Arc::new(stamps))
        };
        self.stored.stamps.get_or_init(read).clone()
    }
}

/// How far ahead of this node's clock a shard's stamp may be and still be believed.
const FUTURE_SLACK: std::time::Duration = std::time::Duration::from_secs(60);

/// A stored chunk: which version of which shard holds it, where, and that version pinned.
#[derive(Clone, Debug)]
pub struct StoredChunk {
    pub rel: PathBuf,
    pub range: ChunkRange,
    pub mtime: SystemTime,
    pub file: Arc<dyn Blob>,
    /// Its position in the shard, and the shard version's index (for its stamp).
    pub(crate) pos: usize,
    pub(crate) shard: Arc<StoredIndex>,
    /// Stored compressed by the mount (`ArrayState::zstd`): read, it is decompressed, to
    /// no more than this many bytes.
    pub(crate) zstd: Option<u64>,
    /// The chunk decompressed, once read: shared by the clones a handle pins, so that a
    /// reader's many requests decompress it once.
    pub(crate) decoded: Arc<std::sync::Mutex<Option<Bytes>>>,
}

impl StoredChunk {
    /// Which version of the chunk's content this is: the shard's version and where in it.
    pub fn version(&self) -> Arc<str> {
        format!(
            "{}@{}+{}",
            self.file.info().tag,
            self.range.offset,
            self.range.nbytes
        )
        .into()
    }

    /// When the chunk got this content, if the shard says (shardfs wrote it). An object
    /// store's shard brings its stamps with its index (`open_shard`), so this needs no
    /// request even once the version is gone from the store.
    pub fn stamp(&self) -> Option<u64> {
        let open = OpenShard {
            file: self.file.clone(),
            stored: (*self.shard).clone(),
        };
        open.stamps()?.get(self.pos).copied().filter(|&t| t != 0)
    }

    /// Whether `other` (another version of its shard) holds the same content of the chunk:
    /// the same stamp and size. A shard rewritten for other chunks keeps this one's stamp.
    pub fn same_content(&self, other: &StoredChunk) -> bool {
        let kept = || {
            other
                .shard
                .kept
                .get(&self.shard.version)
                .is_some_and(|positions| positions.contains(&self.pos))
        };
        self.pos == other.pos
            && self.range.nbytes == other.range.nbytes
            && (kept() || self.stamp().is_some_and(|t| other.stamp() == Some(t)))
    }

    /// The whole chunk as written, in memory: refused (EFBIG) when its index (or its
    /// compressed frame) says more than a file may hold (`read_whole_chunk`).
    pub fn read(&self) -> Result<Bytes, FsError> {
        if self.zstd.is_some() {
            return self.decoded();
        }
        Ok(Bytes::from(crate::shard::read_whole_chunk(
            &self.file,
            self.range,
            crate::limits::MAX_FILE_BYTES,
        )?))
    }

    pub fn read_part(&self, offset: u64, size: u64) -> Result<Bytes, FsError> {
        if self.zstd.is_some() {
            let whole = self.decoded()?;
            let start = offset.min(whole.len() as u64) as usize;
            let end = offset.saturating_add(size).min(whole.len() as u64) as usize;
            return Ok(whole.slice(start..end));
        }
        Ok(Bytes::from(read_chunk_part(
            &self.file, self.range, offset, size,
        )?))
    }

    /// The chunk's size as written: a compressed one's frame says it in its header. A
    /// damaged one (a claim past what a chunk of its array holds, a frame that does not
    /// decompress) is shown at that most, so that a reader asks for it and gets EIO.
    pub fn size(&self) -> Result<u64, FsError> {
        let Some(max) = self.zstd else {
            return Ok(self.range.nbytes);
        };
        if let Some(b) = &*crate::sync::lock(&self.decoded) {
            return Ok(b.len() as u64);
        }
        let head = read_chunk_part(&self.file, self.range, 0, transparent::HEADER_MAX)?;
        match transparent::content_size(&head) {
            Some(n) if n > max => {
                warn!(shard = %self.rel.display(), declared = n, max,
                    "a compressed chunk claims more than a chunk of its array holds: read as EIO");
                Ok(max)
            }
            Some(n) => Ok(n),
            None => match self.decoded() {
                Ok(b) => Ok(b.len() as u64),
                Err(FsError::Io(e)) if e.raw_os_error() == Some(libc::EIO) => Ok(max),
                Err(e) => Err(e),
            },
        }
    }

    fn decoded(&self) -> Result<Bytes, FsError> {
        let mut cached = crate::sync::lock(&self.decoded);
        if let Some(b) = &*cached {
            return Ok(b.clone());
        }
        let stored =
            crate::shard::read_whole_chunk(&self.file, self.range, crate::limits::MAX_FILE_BYTES)?;
        let b = decode(&stored, &self.rel, self.zstd.unwrap_or(0))?;
        *cached = Some(b.clone());
        Ok(b)
    }
}

/// One decompressed copy of each stored compressed chunk being read, shared by every
/// handle that reads it: many readers of one chunk cost its size once, not once each.
/// Entries live as long as some handle pins the chunk.
#[derive(Debug, Default)]
pub(crate) struct DecodedChunks {
    live: std::sync::Mutex<std::collections::HashMap<String, Weak<Mutex<Option<Bytes>>>>>,
}

type Weak<T> = std::sync::Weak<T>;
type Mutex<T> = std::sync::Mutex<T>;

/// Past this many entries, those no handle pins any more are dropped.
const DECODED_PRUNE: usize = 1024;

impl DecodedChunks {
    /// The shared cell for the chunk at `range` of the shard version `file` of `rel`.
    pub(crate) fn cell(
        &self,
        rel: &Path,
        file: &dyn Blob,
        range: ChunkRange,
    ) -> Arc<Mutex<Option<Bytes>>> {
        let key = format!(
            "{}\0{}@{}+{}",
            rel.display(),
            file.info().tag,
            range.offset,
            range.nbytes
        );
        let mut live = crate::sync::lock(&self.live);
        if let Some(cell) = live.get(&key).and_then(Weak::upgrade) {
            return cell;
        }
        if live.len() >= DECODED_PRUNE {
            live.retain(|_, w| w.strong_count() > 0);
        }
        let cell = Arc::default();
        live.insert(key, Arc::downgrade(&cell));
        cell
    }
}

/// A chunk the mount compressed (`transparent::Zstd`), as written, of at most `max`
/// bytes; damage, or more than `max` (a bomb), is EIO, said with the shard's name.
pub(crate) fn decode(stored: &[u8], shard: &Path, max: u64) -> Result<Bytes, FsError> {
    transparent::Zstd::decode(stored, max).map_err(|e| {
        let bomb = e.raw_os_error() == Some(libc::EFBIG);
        if e.kind() == std::io::ErrorKind::InvalidData || bomb {
            warn!(shard = %shard.display(), max,
                "a compressed chunk does not decompress to at most {max} bytes: {e}");
            return FsError::Io(std::io::Error::from_raw_os_error(libc::EIO));
        }
        e.into()
    })
}

/// Opens the shard at `rel` and finds its index: `cached` when it describes the very
/// version opened, else decoded from that version (an index at the end comes with the
/// open). `Ok(None)`: no shard (or something that is not a regular file in its place).
pub(crate) fn open_shard(
    store: &dyn Store,
    rel: &Path,
    format: &IndexFormat,
    cached: Option<&StoredIndex>,
) -> Result<Option<OpenShard>, FsError> {
    // The stamps (`shard::stamps`) lie just before an index at the end: fetched with it,
    // they cost no request of their own.
    let tail = match format.location {
        IndexLocation::End => {
            format.encoded_len() + crate::shard::stamps::block_len(format.n_chunks())
        }
        IndexLocation::Start => 0,
    };
    let Some(file) = store.open(rel, tail).map_err(std::io::Error::from)? else {
        return Ok(None);
    };
    let info = file.info().clone();
    if let Some(c) = cached
        && *c.version == *info.tag
        && c.format == *format
    {
        return Ok(Some(OpenShard {
            file,
            stored: c.clone(),
        }));
    }
    let index = match read_index(&*file, info.size, format) {
        Ok(index) => Ok(Arc::new(index)),
        // Nothing at all: a new shard renamed into place before its data reached the disk,
        // then a power cut. It holds no chunk (and whatever was acknowledged of it is in
        // the journal); a write replaces it.
        Err(_) if info.size == 0 => {
            warn!(shard = %store.describe(rel), "empty shard file (a crash before it was synced?): read as holding no chunk");
            Ok(Arc::new(ShardIndex::all_missing(format.n_chunks())))
        }
        Err(ShardFileError::Index(e)) => {
            warn!(shard = %store.describe(rel), "damaged shard, its chunks read as EIO: {e}");
            Err(e)
        }
        Err(ShardFileError::Io(e)) => return Err(e.into()),
    };
    Ok(Some(OpenShard {
        file,
        stored: StoredIndex {
            format: format.clone(),
            version: info.tag.into(),
            mtime: info.mtime,
            index,
            stamps: Arc::default(),
            kept: Arc::default(),
        },
    }))
}
