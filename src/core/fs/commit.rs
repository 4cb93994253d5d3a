//! A `zarr.json` written through the mount. An unsharded array is stored sharded (keeping
//! the layout an existing array already has); a group's consolidated metadata is stored
//! with its entries sharded the same way; anything else is stored as written.

use crate::core::refusal::Rule;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use tracing::{info, warn};

use super::ShardFs;
use crate::backing::FileVersion;
use crate::core::array::ArrayName;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::{FileData, MemFile};
use crate::core::shards::WriteMode;
use crate::limits::MAX_FILE_BYTES;
use crate::shard::IndexLocation;
use crate::zarr::layout::{SHARDING_CODEC, fixed_chunk_bytes, regular_chunk_shape};
use crate::zarr::{
    ArrayMetadata, KeyNode, LayoutError, METADATA_FILE, Node, ShardLayout, sharded_with,
    shown_view, translate_consolidated, transparent,
};

impl ShardFs {
    /// Stores `bytes`, written as `dir/zarr.json`, in BACKING.
    pub(crate) fn commit_metadata(
        &self,
        dir: &Path,
        bytes: &[u8],
        made: Option<u64>,
    ) -> Result<(), FsError> {
        let doc = dir.join(METADATA_FILE);
        let shown = self.backing.path(&doc);
        let stored: Vec<u8> = match Node::parse(bytes) {
            // An array's or group's document is never replaced by garbage or by nothing:
            // its chunks would be left without the layout that reads them.
            Err(e) if self.holds_zarr_document(&doc)? => {
                return Err(FsError::refused(
                    &doc,
                    Rule::InvalidArrayMetadata,
                    format!("not Zarr v3 metadata ({e}); the document stays as it was"),
                ));
            }
            Err(e) => {
                warn!(file = %shown.display(),
                    "not Zarr v3 metadata ({e}): stored as written; the directory is not treated as an array");
                self.settle_layout(dir, None)?;
                bytes.to_vec()
            }
            Ok(Node::Array(meta)) => match self.array_document(dir, bytes, meta, made)? {
                Some(stored) => stored,
                None => return Ok(()),
            },
            Ok(Node::Group(group)) => {
                self.settle_layout(dir, None)?;
                if group.consolidated_entries().is_none() {
                    bytes.to_vec()
                } else {
                    self.consolidated_document(dir, &group)
                }
            }
        };
        // Whatever this document is, the array is no longer shown as its writer wrote it.
        self.classifier.show_as_written(dir, false);
        self.tree.write_whole(
            &doc,
            &[Bytes::from(stored)],
            true,
            self.held_maker(&doc),
            made,
        )?;
        // Names below may now be chunk keys (or no longer): the kernel's inodes for them
        // are decided again.
        self.inodes.bump_generation();
        Ok(())
    }

    /// Whether BACKING's `doc` is a Zarr v3 document now.
    pub(crate) fn holds_zarr_document(&self, doc: &Path) -> Result<bool, FsError> {
        let stored = self
            .backing
            .read_at_most(doc, crate::core::pending::memfile::MAX_METADATA_BYTES)?;
        Ok(stored.is_some_and(|b| Node::parse(&b).is_ok()))
    }

    /// What to store for an array's `dir/zarr.json` written as `bytes` (`meta`): its
    /// sharded form, or the document as written when it shards itself or cannot be
    /// sharded. `None` when it is stored already (a new array, its chunk files imported).
    fn array_document(
        &self,
        dir: &Path,
        bytes: &[u8],
        meta: ArrayMetadata,
        made: Option<u64>,
    ) -> Result<Option<Vec<u8>>, FsError> {
        let doc = dir.join(METADATA_FILE);
        if meta.codecs.iter().any(|c| c.name == SHARDING_CODEC) {
            return self.commit_as_written(dir, bytes, made).map(|()| None);
        }
        let sharded = self.sharded_form(dir, &meta);
        if let Ok(new) = &sharded {
            self.settle_layout(dir, Some(new))?;
        }
        match sharded {
            Ok(sharded) if self.array_at(dir)?.is_none() => {
                let sharded = self.as_its_shards_are(dir, &meta, sharded);
                // Nothing new may appear in plain directories until the array exists, so
                // that every chunk file written before is imported.
                let _exclusive = self.plain_names.write().unwrap_or_else(|e| e.into_inner());
                let staged = self.import_plain_chunks(dir, &sharded)?;
                self.classifier.show_as_written(dir, false);
                let doc_bytes = Node::Array(sharded).to_json_bytes();
                let owner = self.held_maker(&doc);
                self.tree
                    .write_whole(&doc, &[Bytes::from(doc_bytes)], true, owner, made)?;
                // Only now, the array stored (its shards durable before it), may the chunk
                // files go: a crash before this finds them all again (`unstage`).
                for rel in &staged {
                    if let Err(e) = self.backing.remove_file(rel) {
                        warn!(file = %rel.display(), "imported chunk file not removed: {e}");
                    }
                }
                self.inodes.bump_generation();
                Ok(None)
            }
            Ok(sharded) => Ok(Some(Node::Array(sharded).to_json_bytes())),
            Err(e) if e.is_invalid_metadata() || matches!(e, LayoutError::Policy(_)) => Err(
                FsError::refused(&doc, Rule::InvalidArrayMetadata, e.to_string()),
            ),
            Err(e) => {
                info!(file = %self.backing.path(&doc).display(), "stored unsharded, as written: {e}");
                self.settle_layout(dir, None)?;
                Ok(Some(bytes.to_vec()))
            }
        }
    }

    /// A group's `zarr.json` with consolidated metadata: its array entries sharded as the
    /// arrays are (entries that cannot be are kept as written).
    fn consolidated_document(&self, dir: &Path, group: &crate::zarr::GroupMetadata) -> Vec<u8> {
        let (translated, refused) = translate_consolidated(group, |path, a| {
            if a.codecs.iter().any(|c| c.name == SHARDING_CODEC) {
                return Err(LayoutError::AlreadySharded);
            }
            self.sharded_form(&dir.join(path), a)
        });
        let shown = self.backing.path(&dir.join(METADATA_FILE));
        for (path, e) in refused {
            if e != LayoutError::AlreadySharded {
                info!(file = %shown.display(), entry = %path,
                    "consolidated entry stored as written: {e}");
            }
        }
        Node::Group(translated).to_json_bytes()
    }

    /// The sharded form of unsharded `meta` for the array at `dir`: with the chunks per
    /// shard and index location it already has when it is an existing sharded array with
    /// the same chunks, codecs and keys (a resize or an attribute update: its stored
    /// chunks stay readable), else from the mount's policy. Transparent compression: an
    /// existing array keeps the form its chunks are stored in whatever the document now
    /// says of them; a new one takes the mount's option.
    fn sharded_form(&self, dir: &Path, meta: &ArrayMetadata) -> Result<ArrayMetadata, LayoutError> {
        let chunk_shape = regular_chunk_shape(meta)?;
        // A writer's document never carries the mount's mark: a `zstd` it names is its own.
        let meta = &transparent::unmarked(meta);
        let existing = self.array_at(dir).ok().flatten();
        let kept = existing.as_ref().and_then(|a| {
            let view = shown_view(&a.meta).ok()?;
            let same = a.layout.chunk_shape == chunk_shape
                && view.codecs == meta.codecs
                && view.chunk_key_encoding == meta.chunk_key_encoding
                && view.ndim() == meta.ndim();
            same.then(|| {
                let cps = a.layout.chunks_per_shard().to_vec();
                (cps, a.layout.index.location, a.zstd.map(|z| z.level))
            })
        });
        let (cps, location, zstd) = match kept {
            Some(k) => k,
            None => {
                let cps = self.config.policy.chunks_per_shard(
                    &meta.shape,
                    &chunk_shape,
                    meta.item_size(),
                )?;
                // The chunks it holds stay in the form they have (on a plain file system
                // they keep their bytes): only a new array takes the mount's option.
                let zstd = match &existing {
                    Some(a) => a.zstd.map(|z| z.level),
                    None => self.config.compress,
                };
                (cps, IndexLocation::End, zstd)
            }
        };
        match zstd.and_then(|level| transparent::marked(meta, level)) {
            Some(stored) => sharded_with(&stored, &cps, location),
            None => sharded_with(meta, &cps, location),
        }
    }

    /// A new array's document over shards already in its directory (its `zarr.json` was
    /// removed and put back, or moved away and back): whether the mount compresses it is
    /// what those shards' chunks are, whatever this mount's option, since they stay as
    /// they are: compressed when the first shard with chunks holds the mount's frames
    /// only (`transparent::are_frames`), raw otherwise (a raw chunk is any bytes, of any
    /// size a writer left).
    fn as_its_shards_are(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
        sharded: ArrayMetadata,
    ) -> ArrayMetadata {
        let meta = transparent::unmarked(meta);
        let raw_size = match transparent::raw(&meta.codecs) {
            true => transparent::raw_chunk_bytes(&meta),
            false => None,
        };
        let (Some(raw_size), Ok(Some(layout))) = (raw_size, ShardLayout::of(&sharded)) else {
            return sharded;
        };
        let found = self.backing.identify(dir).ok().flatten();
        let Some(array) = found.and_then(|f| draft_array(dir, &sharded, f)) else {
            return sharded;
        };
        let mut budget = PROBED_FILES;
        let Some(chunks) = self.first_shard_chunks(&array, dir, &KeyNode::Root, &mut budget) else {
            return sharded;
        };
        let compressed = transparent::are_frames(&chunks, raw_size);
        if compressed == array.zstd.is_some() {
            return sharded;
        }
        info!(array = %self.backing.path(dir).display(), compressed,
            "the array's shards decide whether the mount compresses it");
        let level = self.config.compress.unwrap_or(3);
        let form = match compressed {
            true => transparent::marked(&meta, level).unwrap_or(meta),
            false => meta,
        };
        sharded_with(&form, layout.chunks_per_shard(), layout.index.location).unwrap_or(sharded)
    }

    /// Chunks of the first shard file below `rel` that holds any (looking at no more than
    /// `budget` files).
    fn first_shard_chunks(
        &self,
        array: &ArrayState,
        rel: &Path,
        node: &KeyNode,
        budget: &mut usize,
    ) -> Option<Vec<Bytes>> {
        for entry in self.backing.list(rel).ok()? {
            let name = entry.name.to_str()?;
            let path = rel.join(name);
            match (array.classify_name(node, name), entry.kind.is_dir()) {
                (ArrayName::Key(KeyNode::Chunk(coords)), false) => {
                    if *budget == 0 {
                        return None;
                    }
                    *budget -= 1;
                    if let Some(chunks) = self.shard_chunks(array, &coords, &path) {
                        return Some(chunks);
                    }
                }
                (ArrayName::Key(child @ KeyNode::Dir(_)), true) => {
                    let found = self.first_shard_chunks(array, &path, &child, budget);
                    if found.is_some() || *budget == 0 {
                        return found;
                    }
                }
                _ => {}
            }
        }
        None
    }

    /// Up to `PROBED_CHUNKS` chunks of the file at `rel`, if it is a shard of `array`
    /// with any. A chunk larger than any frame of a raw chunk's size can be is given as
    /// empty (it is no frame: `are_frames` says so) and not read.
    fn shard_chunks(&self, array: &ArrayState, coords: &[u64], rel: &Path) -> Option<Vec<Bytes>> {
        use std::os::unix::fs::FileExt;
        if !crate::grid::inside(coords, &array.layout.shard_grid_shape()) {
            return None;
        }
        let raw = transparent::raw_chunk_bytes(&shown_view(&array.meta).ok()?)?;
        let bound = zstd::zstd_safe::compress_bound(usize::try_from(raw).ok()?) as u64;
        let file = self.backing.open(rel).ok()?;
        let len = file.metadata().ok()?.len();
        let index = crate::shard::read_index(&file, len, &array.layout.index).ok()?;
        let mut chunks = Vec::new();
        for (_, r) in index.present().take(PROBED_CHUNKS) {
            if r.nbytes > bound {
                chunks.push(Bytes::new());
                continue;
            }
            let mut buf = vec![0u8; r.nbytes as usize];
            file.read_exact_at(&mut buf, r.offset).ok()?;
            chunks.push(Bytes::from(buf));
        }
        (!chunks.is_empty()).then_some(chunks)
    }

    /// Writers that copy a tree (cp -r, rsync) may write an array's chunk files before its
    /// `zarr.json`: those landed in BACKING as plain files. When the metadata arrives they
    /// become chunks: read into their shards, the shards written (a chunk file's path may
    /// be the path of a shard, which then replaces it), the other chunk files removed, and
    /// only then the metadata stored. Directories on chunk-key paths stay visible.
    /// Returns the chunk files, moved aside, to remove once the metadata is stored.
    fn import_plain_chunks(
        &self,
        dir: &Path,
        sharded: &ArrayMetadata,
    ) -> Result<Vec<PathBuf>, FsError> {
        let Some(found) = self.backing.identify(dir)? else {
            return Ok(Vec::new());
        };
        let Some(array) = draft_array(dir, sharded, found) else {
            return Ok(Vec::new());
        };
        self.unstage(&array, dir, &KeyNode::Root)?;
        let mut chunk_files = Vec::new();
        let mut key_dirs = Vec::new();
        self.collect_chunk_files(&array, dir, &KeyNode::Root, &mut chunk_files, &mut key_dirs)?;
        for d in &key_dirs {
            self.temps.insert_dir(d);
        }
        self.import_held_chunks(&array, dir)?;
        if chunk_files.is_empty() {
            return Ok(Vec::new());
        }
        // Moved aside first (the shards may need the paths), then taken in one shard at a
        // time, so that memory holds one shard's chunks, not the whole array's. If a shard
        // cannot be written, everything goes back as it was.
        let mut moved = Vec::new();
        let mut written = Vec::new();
        let result = self.shard_chunk_files(&array, &chunk_files, &mut moved, &mut written);
        if let Err(e) = result {
            for rel in &written {
                let _ = self.backing.remove_file(rel);
            }
            for rel in &moved {
                let _ = self.backing.rename(&staged(rel), rel);
            }
            self.shards.discard_array(dir);
            warn!(array = %self.backing.path(dir).display(),
                "chunk files could not be moved into shards, left as they were: {e}");
            return Err(e);
        }
        // Durable before the metadata that makes them the array's, and before the chunk
        // files go.
        self.shards
            .make_durable(&self.backing, |a, _, _| a == dir)?;
        info!(array = %self.backing.path(dir).display(), chunks = chunk_files.len(),
            shards = written.len(), "chunk files written before the metadata moved into shards");
        Ok(chunk_files.iter().map(|(_, rel)| staged(rel)).collect())
    }

    /// Chunk files an import moved aside and never finished with (the daemon died before
    /// the metadata was stored) go back to their names, over whatever that import wrote
    /// there: they are what the writer wrote, and the import starts again from them.
    fn unstage(&self, array: &ArrayState, rel: &Path, node: &KeyNode) -> Result<(), FsError> {
        for entry in self.backing.list(rel)? {
            let Some(name) = entry.name.to_str() else {
                continue;
            };
            let path = rel.join(name);
            if entry.kind.is_dir() {
                if let ArrayName::Key(child @ KeyNode::Dir(_)) = array.classify_name(node, name) {
                    self.unstage(array, &path, &child)?;
                }
                continue;
            }
            let original = name
                .strip_prefix('.')
                .and_then(|n| n.strip_suffix(".shardfs-import"));
            if let Some(original) = original
                && let ArrayName::Key(KeyNode::Chunk(_)) = array.classify_name(node, original)
            {
                self.backing.rename(&path, &rel.join(original))?;
            }
        }
        Ok(())
    }

    /// Moves `chunk_files` aside (listed in `moved`) and writes them into their shards,
    /// one shard at a time (listed in `written`).
    fn shard_chunk_files(
        &self,
        array: &Arc<ArrayState>,
        chunk_files: &[(Vec<u64>, PathBuf)],
        moved: &mut Vec<PathBuf>,
        written: &mut Vec<PathBuf>,
    ) -> Result<(), FsError> {
        let mut by_shard: BTreeMap<Vec<u64>, Vec<(Vec<u64>, PathBuf)>> = BTreeMap::new();
        for (coords, rel) in chunk_files {
            let shard = array.layout.locate(coords).shard;
            by_shard
                .entry(shard)
                .or_default()
                .push((coords.clone(), staged(rel)));
        }
        for (_, rel) in chunk_files {
            self.backing.rename(rel, &staged(rel))?;
            moved.push(rel.clone());
        }
        for (shard, chunks) in &by_shard {
            for (coords, at) in chunks {
                let data = self
                    .backing
                    .read_at_most(at, MAX_FILE_BYTES)?
                    .unwrap_or_default();
                let file = Arc::new(MemFile::new(FileData::from_bytes(Bytes::from(data)), 0o644));
                self.shards.charge(file.len() as i64);
                self.shards.put(&self.backing, array, coords, file)?;
            }
            self.shards
                .write_shard(&self.backing, array, shard, WriteMode::Replace)?;
            written.push(array.shard_rel(shard));
        }
        Ok(())
    }

    /// Chunk files written before the metadata and held in memory (an object-store mount
    /// holds every new file so) become the array's pending chunks.
    fn import_held_chunks(&self, array: &Arc<ArrayState>, dir: &Path) -> Result<(), FsError> {
        for (rel, file) in self.temps.all_files() {
            let Some(coords) = chunk_key_below(array, dir, &rel) else {
                continue;
            };
            // Past what a chunk the mount compresses holds: it stays a file, as a chunk
            // file of another size does on disk (`not_a_chunk_file`).
            if array.zstd.is_some_and(|z| file.len() > z.max) {
                continue;
            }
            // Its memory stays counted: it moves from the temporary files to the chunks.
            self.shards
                .put(&self.backing, array, &coords, file.clone())?;
            self.temps.remove_if(&rel, &file);
        }
        Ok(())
    }

    fn collect_chunk_files(
        &self,
        array: &ArrayState,
        rel: &Path,
        node: &KeyNode,
        files: &mut Vec<(Vec<u64>, PathBuf)>,
        dirs: &mut Vec<PathBuf>,
    ) -> Result<(), FsError> {
        for entry in self.backing.list(rel)? {
            let Some(name) = entry.name.to_str() else {
                continue;
            };
            let path = rel.join(name);
            match (array.classify_name(node, name), entry.kind.is_dir()) {
                (ArrayName::Key(KeyNode::Chunk(coords)), false)
                    if !self.not_a_chunk_file(array, &coords, &path) =>
                {
                    files.push((coords, path))
                }
                (ArrayName::Key(child @ KeyNode::Dir(_)), true) => {
                    dirs.push(path.clone());
                    self.collect_chunk_files(array, &path, &child, files, dirs)?;
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Whether the BACKING file at chunk key `coords` is no chunk file: a shard of `array`
    /// already (the array's `zarr.json` was removed and put back, and shard keys are
    /// chunk keys too), or of another size than the codecs give every chunk. Such a file
    /// stays where it is, read as a shard; it is never taken for a chunk.
    fn not_a_chunk_file(&self, array: &ArrayState, coords: &[u64], rel: &Path) -> bool {
        let Ok(file) = self.backing.open(rel) else {
            return false;
        };
        let Ok(len) = file.metadata().map(|m| m.len()) else {
            return false;
        };
        // A chunk file of an array the mount compresses is raw: its size is the raw size.
        let fixed = match array.zstd {
            Some(z) => Some(z.max),
            None => fixed_chunk_bytes(&array.meta),
        };
        if fixed.is_some_and(|size| size != len) {
            return true;
        }
        crate::grid::inside(coords, &array.layout.shard_grid_shape())
            && crate::shard::read_index(&file, len, &array.layout.index).is_ok()
    }

    /// A sharded `zarr.json` from a writer that shards itself: stored as written, and the
    /// array shown as written while this mount lives (its shard files are plain files to
    /// the mount, so the writer works as on a plain directory). A later mount shows it
    /// unsharded, like every sharded array.
    fn commit_as_written(
        &self,
        dir: &Path,
        bytes: &[u8],
        made: Option<u64>,
    ) -> Result<(), FsError> {
        self.settle_layout(dir, None)?;
        let doc = dir.join(METADATA_FILE);
        let owner = self.held_maker(&doc);
        self.tree
            .write_whole(&doc, &[Bytes::copy_from_slice(bytes)], true, owner, made)?;
        self.classifier.show_as_written(dir, true);
        info!(array = %self.backing.path(dir).display(),
            "sharded metadata written through the mount: stored and shown as written \
             until unmount");
        self.inodes.bump_generation();
        Ok(())
    }

    /// Before `dir/zarr.json` changes to `new` (`None`: no longer a sharded array): when
    /// chunks would land elsewhere under the new document, the pending ones are written
    /// under the layout they were written in. When that fails, the change is refused
    /// (EBUSY) and nothing changes.
    fn settle_layout(&self, dir: &Path, new: Option<&ArrayMetadata>) -> Result<(), FsError> {
        let Some(old) = self.array_at(dir)? else {
            return Ok(());
        };
        // Chunks written under the old document are written before a document that would
        // read them otherwise (another layout, data type or codecs) takes its place: on an
        // object store, where nothing tells this mount's own change from another node's
        // making the array again, they would wait for good.
        if new.is_some_and(|m| crate::zarr::takes_chunks_of(m, &old.meta)) {
            return Ok(());
        }
        self.flush_array_at(dir).map_err(|e| {
            FsError::refused(
                &dir.join(METADATA_FILE),
                Rule::LayoutChangeWhilePending,
                format!("pending chunks of the old layout could not be written: {e}"),
            )
        })
    }

    /// Writes every pending shard of the arrays at `dir` (whatever layout each chunk was
    /// written under).
    pub(crate) fn flush_array_at(&self, dir: &Path) -> Result<(), FsError> {
        self.write_pending_below(dir, &[])
    }
}

/// The chunk `rel` names, if it is a chunk key of `array` (whose directory is `dir`).
fn chunk_key_below(array: &ArrayState, dir: &Path, rel: &Path) -> Option<Vec<u64>> {
    let mut node = KeyNode::Root;
    for part in rel.strip_prefix(dir).ok()?.components() {
        node = match (
            &node,
            array.classify_name(&node, part.as_os_str().to_str()?),
        ) {
            (KeyNode::Chunk(_), _) => return None,
            (_, ArrayName::Key(child)) => child,
            _ => return None,
        };
    }
    match node {
        KeyNode::Chunk(coords) => Some(coords),
        _ => None,
    }
}

/// How many files at chunk keys a new array's document looks at for a shard
/// (`as_its_shards_are`): chunk files written before it are not shards, and a directory of
/// them is not read through for one.
const PROBED_FILES: usize = 64;

/// The chunks of that shard looked at (each read whole and decoded when it is a frame).
const PROBED_CHUNKS: usize = 8;

/// Where a chunk file written before its array's metadata waits while it is imported.
fn staged(rel: &Path) -> PathBuf {
    let name = rel.file_name().unwrap_or_default().to_string_lossy();
    rel.with_file_name(format!(".{name}.shardfs-import"))
}

/// The array `sharded` would make of `dir` (the directory `found`), before its
/// metadata is stored.
fn draft_array(
    dir: &Path,
    sharded: &ArrayMetadata,
    found: crate::backing::Identified,
) -> Option<Arc<ArrayState>> {
    let layout = ShardLayout::of(sharded).ok().flatten()?;
    let view = shown_view(sharded).ok()?;
    Some(Arc::new(ArrayState {
        rel: dir.to_path_buf(),
        zstd: transparent::of_stored(sharded),
        meta: sharded.clone(),
        layout,
        view_json: Bytes::from(Node::Array(view).to_json_bytes()),
        meta_version: FileVersion {
            ino: 0,
            size: 0,
            mtime_ns: 0,
        },
        meta_mtime: std::time::SystemTime::now(),
        instance: found.instance.clone(),
        dir_id: Some(found.id),
        dir: found.into_held().map(Arc::new),
    }))
}
