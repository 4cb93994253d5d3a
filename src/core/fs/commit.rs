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

/// What an import of chunk files written before their document did (`import_plain_chunks`):
/// the chunk files moved aside (by their names) and the shards written, for its undoing.
#[derive(Default)]
struct Import {
    moved: Vec<PathBuf>,
    written: Vec<PathBuf>,
}

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
        if let Some(old) = self.array_at(dir)? {
            self.keeps_its_form(dir, &old, &meta)?;
        }
        let sharded = self.sharded_form(dir, &meta);
        if let Ok(new) = &sharded {
            self.settle_layout(dir, Some(new))?;
        }
        match sharded {
            Ok(sharded) if self.array_at(dir)?.is_none() => {
                let sharded = self.as_it_was_left(dir, &meta, sharded)?;
                // Nothing new may appear in plain directories until the array exists, so
                // that every chunk file written before is imported.
                let _exclusive = self.plain_names.write().unwrap_or_else(|e| e.into_inner());
                let import = self.import_plain_chunks(dir, &sharded)?;
                self.classifier.show_as_written(dir, false);
                let doc_bytes = Node::Array(sharded).to_json_bytes();
                let owner = self.held_maker(&doc);
                let stored =
                    self.tree
                        .write_whole(&doc, &[Bytes::from(doc_bytes)], true, owner, made);
                if let Err(e) = stored {
                    // (A full disk): nothing of the import stays, the chunk files are
                    // plain files again, as before the document came.
                    let e = FsError::from(e);
                    self.undo_import(dir, &import, &e);
                    return Err(e);
                }
                // Only now, the array stored (its shards durable before it), may the chunk
                // files go: a crash before this finds them all again (`unstage`).
                for rel in import.moved.iter().map(|rel| staged(rel)) {
                    if let Err(e) = self.backing.remove_file(&rel) {
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

    /// Refuses a document for an array the mount compresses, holding chunks, that would
    /// read them in another form: another compressor or checksum (the mount's `zstd` can
    /// only be undone under raw codecs), or another raw chunk size (every stored chunk
    /// would hold more, or less, than a chunk then holds).
    fn keeps_its_form(
        &self,
        dir: &Path,
        old: &ArrayState,
        meta: &ArrayMetadata,
    ) -> Result<(), FsError> {
        let Some(z) = old.zstd else {
            return Ok(());
        };
        let new = transparent::unmarked(meta);
        let raw_size = transparent::raw_chunk_bytes(&new);
        if transparent::raw(&new.codecs) && raw_size == Some(z.max) {
            return Ok(());
        }
        let pending = self.shards.pending().iter().any(|p| p.array.rel == dir);
        let mut probe = Probe::default();
        self.probe_shards(old, dir, &KeyNode::Root, &mut probe);
        if !pending && probe.chunks.is_none() {
            return Ok(());
        }
        Err(FsError::refused(
            &dir.join(METADATA_FILE),
            Rule::InvalidArrayMetadata,
            format!(
                "the mount stores this array's chunks compressed ({} bytes each, raw); a \
                 document with other codecs or another chunk size would read them in \
                 another form: remove the array (or its chunks) first",
                z.max
            ),
        ))
    }

    /// A new array's document over shards already in its directory (its `zarr.json` was
    /// removed, or moved away, and put back): laid out as those shards are. The layout the
    /// array had when its document went through this mount (`left.rs`), when the new
    /// document has its chunk grid and keys; else the mount's policy, refused when shard
    /// files are there and none reads under it (every chunk would read as damage, and
    /// new ones could not be written).
    fn as_it_was_left(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
        sharded: ArrayMetadata,
    ) -> Result<ArrayMetadata, FsError> {
        if let Some(old) = self.left.take(dir)
            && self.holds_shards(dir, &old)
        {
            // The document put back is held to what a rewrite of the array would be.
            let left = draft_array(
                dir,
                &old,
                self.backing.identify(dir)?.ok_or(FsError::NotFound)?,
            );
            if let Some(left) = &left {
                self.keeps_its_form(dir, left, meta)?;
            }
            if let Some(form) = laid_out_as(&old, meta) {
                return Ok(form);
            }
        }
        self.as_its_shards_are(dir, meta, sharded)
    }

    /// Whether any shard file of the array `sharded` would make of `dir` is there (an
    /// array removed whole and made anew at its path has none: it takes the policy).
    fn holds_shards(&self, dir: &Path, sharded: &ArrayMetadata) -> bool {
        let found = self.backing.identify(dir).ok().flatten();
        let Some(array) = found.and_then(|f| draft_array(dir, sharded, f)) else {
            return false;
        };
        let mut probe = Probe::default();
        self.probe_shards(&array, dir, &KeyNode::Root, &mut probe);
        probe.read > 0
    }

    /// Whether the mount compresses a new array put back over shards is what those
    /// shards' chunks are, whatever this mount's option, since they stay as they are:
    /// compressed when the first shard with chunks holds the mount's frames only
    /// (`transparent::are_frames`), raw otherwise (a raw chunk is any bytes, of any size
    /// a writer left).
    fn as_its_shards_are(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
        sharded: ArrayMetadata,
    ) -> Result<ArrayMetadata, FsError> {
        let meta = transparent::unmarked(meta);
        let Ok(Some(layout)) = ShardLayout::of(&sharded) else {
            return Ok(sharded);
        };
        let found = self.backing.identify(dir).ok().flatten();
        let Some(array) = found.and_then(|f| draft_array(dir, &sharded, f)) else {
            return Ok(sharded);
        };
        let mut probe = Probe::default();
        self.probe_shards(&array, dir, &KeyNode::Root, &mut probe);
        if probe.read == 0 && probe.unreadable > 0 {
            return Err(FsError::refused(
                &dir.join(METADATA_FILE),
                Rule::InvalidArrayMetadata,
                format!(
                    "the shard files in this directory do not read as shards of {:?} \
                     chunks: put back the document the array had in BACKING (sharded; \
                     the next mount shows it unsharded again), or move its shard files \
                     away first",
                    layout.chunks_per_shard()
                ),
            ));
        }
        let raw_size = match transparent::raw(&meta.codecs) {
            true => transparent::raw_chunk_bytes(&meta),
            false => None,
        };
        let (Some(raw_size), Some(chunks)) = (raw_size, probe.chunks) else {
            return Ok(sharded);
        };
        let compressed = transparent::are_frames(&chunks, raw_size);
        if compressed == array.zstd.is_some() {
            return Ok(sharded);
        }
        info!(array = %self.backing.path(dir).display(), compressed,
            "the array's shards decide whether the mount compresses it");
        let level = self.config.compress.unwrap_or(3);
        let form = match compressed {
            true => transparent::marked(&meta, level).unwrap_or(meta),
            false => meta,
        };
        Ok(
            sharded_with(&form, layout.chunks_per_shard(), layout.index.location)
                .unwrap_or(sharded),
        )
    }

    /// Looks at the shard files below `rel` (no more than `PROBED_FILES`) until one holds
    /// chunks: which read as shards of `array`, which do not, and that one's chunks.
    fn probe_shards(&self, array: &ArrayState, rel: &Path, node: &KeyNode, probe: &mut Probe) {
        let Ok(entries) = self.backing.list(rel) else {
            return;
        };
        for entry in entries {
            let Some(name) = entry.name.to_str() else {
                continue;
            };
            let path = rel.join(name);
            match (array.classify_name(node, name), entry.kind.is_dir()) {
                (ArrayName::Key(KeyNode::Chunk(coords)), false)
                    if crate::grid::inside(&coords, &array.layout.shard_grid_shape()) =>
                {
                    probe.files += 1;
                    match self.shard_chunks(array, &path) {
                        Ok(chunks) => {
                            probe.read += 1;
                            probe.chunks = chunks;
                        }
                        Err(()) => probe.unreadable += 1,
                    }
                }
                (ArrayName::Key(child @ KeyNode::Dir(_)), true) => {
                    self.probe_shards(array, &path, &child, probe);
                }
                _ => {}
            }
            if probe.chunks.is_some() || probe.files >= PROBED_FILES {
                return;
            }
        }
    }

    /// Up to `PROBED_CHUNKS` chunks of the shard file at `rel` (`None`: it holds none),
    /// or `Err` when it does not read as a shard of `array`. A chunk larger than any frame
    /// of a raw chunk's size can be is given as empty (it is no frame: `are_frames` says
    /// so) and not read.
    fn shard_chunks(&self, array: &ArrayState, rel: &Path) -> Result<Option<Vec<Bytes>>, ()> {
        use std::os::unix::fs::FileExt;
        let file = self.backing.open(rel).map_err(|_| ())?;
        let len = file.metadata().map_err(|_| ())?.len();
        let index = match crate::shard::read_index(&file, len, &array.layout.index) {
            Ok(index) => index,
            // A shard of another layout (an index with its checksum at the end), or no
            // shard at all (a chunk file written before the document): that is nothing.
            Err(_) => {
                return if shard_like(&file, len) {
                    Err(())
                } else {
                    Ok(None)
                };
            }
        };
        let raw = shown_view(&array.meta)
            .ok()
            .and_then(|v| transparent::raw_chunk_bytes(&v))
            .unwrap_or(0);
        let bound = zstd::zstd_safe::compress_bound(usize::try_from(raw).unwrap_or(0)) as u64;
        let mut chunks = Vec::new();
        for (_, r) in index.present().take(PROBED_CHUNKS) {
            if r.nbytes > bound {
                chunks.push(Bytes::new());
                continue;
            }
            let mut buf = vec![0u8; r.nbytes as usize];
            file.read_exact_at(&mut buf, r.offset).map_err(|_| ())?;
            chunks.push(Bytes::from(buf));
        }
        Ok((!chunks.is_empty()).then_some(chunks))
    }

    /// Writers that copy a tree (cp -r, rsync) may write an array's chunk files before its
    /// `zarr.json`: those landed in BACKING as plain files. When the metadata arrives they
    /// become chunks: read into their shards, the shards written (a chunk file's path may
    /// be the path of a shard, which then replaces it), the other chunk files removed, and
    /// only then the metadata stored. Directories on chunk-key paths stay visible.
    /// Returns what it did, to finish (the chunk files removed) once the metadata is stored, or undo.
    fn import_plain_chunks(&self, dir: &Path, sharded: &ArrayMetadata) -> Result<Import, FsError> {
        let Some(found) = self.backing.identify(dir)? else {
            return Ok(Import::default());
        };
        let Some(array) = draft_array(dir, sharded, found) else {
            return Ok(Import::default());
        };
        self.unstage(&array, dir, &KeyNode::Root)?;
        let mut chunk_files = Vec::new();
        let mut key_dirs = Vec::new();
        self.collect_chunk_files(&array, dir, &KeyNode::Root, &mut chunk_files, &mut key_dirs)?;
        self.none_passing_through(&chunk_files, true)?;
        for d in &key_dirs {
            self.temps.insert_dir(d);
        }
        self.import_held_chunks(&array, dir)?;
        if chunk_files.is_empty() {
            return Ok(Import::default());
        }
        // Moved aside first (the shards may need the paths), then taken in one shard at a
        // time, so that memory holds one shard's chunks, not the whole array's. If a shard
        // cannot be written, everything goes back as it was.
        let mut import = Import::default();
        let result = self
            .shard_chunk_files(&array, &chunk_files, &mut import)
            // Durable before the metadata that makes them the array's, and before the
            // chunk files go.
            .and_then(|()| self.shards.make_durable(&self.backing, |a, _, _| a == dir));
        if let Err(e) = result {
            self.undo_import(dir, &import, &e);
            return Err(e);
        }
        info!(array = %self.backing.path(dir).display(), chunks = chunk_files.len(),
            shards = import.written.len(), "chunk files written before the metadata moved into shards");
        Ok(import)
    }

    /// Puts everything an import did back as it was (its shards removed, the chunk files
    /// at their names again): a shard or the document could not be written.
    fn undo_import(&self, dir: &Path, import: &Import, e: &FsError) {
        for rel in &import.written {
            let _ = self.backing.remove_file(rel);
        }
        for rel in &import.moved {
            let _ = self.backing.rename(&staged(rel), rel);
        }
        self.shards.discard_array(dir);
        warn!(array = %self.backing.path(dir).display(),
            "chunk files could not be moved into shards, left as they were: {e}");
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
        import: &mut Import,
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
            import.moved.push(rel.clone());
        }
        // An open that started passing through since the first look: moved back (no
        // later open finds them by their names now).
        self.none_passing_through(chunk_files, false)?;
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
            import.written.push(array.shard_rel(shard));
        }
        Ok(())
    }

    /// EBUSY when one of the chunk files is open through passthrough (its later writes
    /// would land in the file its data left; by any of its names: hard links), after a
    /// short wait for closes on their way when `wait`.
    fn none_passing_through(
        &self,
        chunk_files: &[(Vec<u64>, PathBuf)],
        wait: bool,
    ) -> Result<(), FsError> {
        let busy = || self.chunk_file_passing_through(chunk_files, wait);
        let busy = if wait {
            crate::core::view::passthrough::after_closes_in_flight(busy)?
        } else {
            busy()?
        };
        match busy {
            None => Ok(()),
            Some(rel) => Err(FsError::Conflict(format!(
                "{} is open through FUSE passthrough: close it before its directory becomes \
                 an array (or mount with --no-passthrough)",
                rel.display()
            ))),
        }
    }

    /// The first of `chunk_files` (still at their names, or moved aside unless `at_names`)
    /// that a handle passes through to.
    fn chunk_file_passing_through<'a>(
        &self,
        chunk_files: &'a [(Vec<u64>, PathBuf)],
        at_names: bool,
    ) -> Result<Option<&'a PathBuf>, FsError> {
        use std::os::unix::fs::MetadataExt;
        let open = self.handles.passthrough_sources();
        if open.is_empty() {
            return Ok(None);
        }
        for (_, rel) in chunk_files {
            let at = if at_names { rel.clone() } else { staged(rel) };
            if let Some(m) = self.backing.stat(&at)?
                && open.contains(&(m.dev(), m.ino()))
            {
                return Ok(Some(rel));
            }
        }
        Ok(None)
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

/// What the shard files below a new array's directory are (`probe_shards`).
#[derive(Default)]
struct Probe {
    files: usize,
    read: usize,
    unreadable: usize,
    /// The chunks of the first that holds any.
    chunks: Option<Vec<Bytes>>,
}

/// Whether the file `file` (of `len` bytes) ends like a shard: an index of up to 65,536
/// entries and its crc32c.
fn shard_like(file: &std::fs::File, len: u64) -> bool {
    use std::os::unix::fs::FileExt;
    let take = len.min(16 * 65_536 + 4);
    let mut tail = vec![0u8; take as usize];
    file.read_exact_at(&mut tail, len - take).is_ok()
        && crate::shard::index::entries_before_crc(&tail, len).is_some()
}

/// The document of an array put back as `meta` over the shards it left, stored as `old`:
/// laid out as `old` (chunks per shard, index location, the mount's zstd), when `meta`
/// has `old`'s chunk grid and keys (else those shards hold other chunks).
fn laid_out_as(old: &ArrayMetadata, meta: &ArrayMetadata) -> Option<ArrayMetadata> {
    let meta = transparent::unmarked(meta);
    let view = shown_view(old).ok()?;
    let same = regular_chunk_shape(&view).ok()? == regular_chunk_shape(&meta).ok()?
        && view.chunk_key_encoding == meta.chunk_key_encoding
        && view.ndim() == meta.ndim();
    if !same {
        return None;
    }
    let layout = ShardLayout::of(old).ok().flatten()?;
    let form = match transparent::of_stored(old) {
        None => meta,
        // The same form or none: a put-back is held to what a rewrite is
        // (`keeps_its_form`), checked by the caller.
        Some(z) => transparent::marked(&meta, z.level)?,
    };
    sharded_with(&form, layout.chunks_per_shard(), layout.index.location).ok()
}

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
