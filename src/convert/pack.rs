//! Converting into a destination: every array below the source that the goal concerns
//! (`plan::target_of`: unsharded ones for `pack`, sharded ones for `unpack` and `reshard`)
//! is written in its new layout, each object (shard or chunk file) built from the chunks'
//! bytes as stored and written once; every other object (groups, arrays left as they are,
//! files that are no chunk) is copied as it is. An array's `zarr.json` is written after
//! its objects, so a destination holding an array's new metadata holds all of them.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;

use super::chunks::{ChunkAt, Conversion, Unit};
use super::plan::{Goal, target_of};
use super::v2;
use super::{ConvertError, Options, Summary};
use crate::limits::MAX_FILE_BYTES;
use crate::shard::{IndexLocation, place};
use crate::store::{Piece, Precondition, Store};
use crate::sync::lock;
use crate::zarr::layout::regular_chunk_shape;
use crate::zarr::{
    ArrayMetadata, ChunkKeyEncoding, GroupMetadata, LayoutError, METADATA_FILE, Node,
    translate_consolidated,
};

/// Progress of an array, as its objects are written: (objects done, objects in all, chunk
/// bytes copied); (0, all, 0) as it begins.
pub type Progress<'a> = &'a (dyn Fn(u64, u64, u64) + Sync);

/// Converts everything below `src` into the empty `dst` (`None`: a dry run's destination
/// that does not exist yet).
pub fn pack(
    src: &dyn Store,
    dst: Option<&dyn Store>,
    opts: &Options,
    progress: Progress,
) -> Result<Summary, ConvertError> {
    if let Some(dst) = dst {
        let top = dst
            .list(Path::new(""))
            .map_err(|e| ConvertError::store(dst, Path::new(""), e))?;
        if !(top.dirs.is_empty() && top.objects.is_empty() && top.unlisted.is_empty()) {
            return Err(ConvertError::NotEmpty(dst.describe(Path::new(""))));
        }
    }
    // Every array planned and every source object looked at before anything is written:
    // what cannot be packed is refused with DST still empty.
    let dry = Options {
        dry_run: true,
        ..opts.clone()
    };
    let planned = Packer::new(src, None, &dry, progress, false);
    planned.walk(Path::new(""))?;
    if opts.dry_run {
        return Ok(planned.into_summary());
    }
    let packer = Packer::new(src, dst, opts, progress, false);
    packer.walk(Path::new(""))?;
    packer.write_consolidated()?;
    if let Some(dst) = dst {
        dst.sync_all()
            .map_err(|e| ConvertError::store(dst, Path::new(""), e))?;
    }
    Ok(packer.into_summary())
}

/// A conversion's steps, shared by converting into a destination and `in_place.rs`.
pub(super) struct Packer<'a> {
    pub(super) src: &'a dyn Store,
    dst: Option<&'a dyn Store>,
    pub(super) opts: &'a Options,
    progress: Progress<'a>,
    /// Every write durable when it returns (in place: see `in_place.rs`).
    durable: bool,
    pub(super) summary: Mutex<Summary>,
    /// Arrays packed: directory → sharded metadata.
    pub(super) packed: Mutex<std::collections::BTreeMap<PathBuf, ArrayMetadata>>,
    /// Groups with consolidated metadata, written last (`write_consolidated`).
    pub(super) consolidated: Mutex<Vec<(PathBuf, GroupMetadata)>>,
}

/// The objects below an array's directory: its chunks by key, and everything else.
#[derive(Default)]
pub(super) struct ArrayFiles {
    /// Key → coordinates.
    pub(super) chunks: std::collections::BTreeMap<String, Vec<u64>>,
    pub(super) others: Vec<PathBuf>,
}

/// What converting one array writes.
pub(super) struct Work {
    conversion: Conversion,
    units: Vec<Unit>,
    /// The chunks moved.
    chunks: usize,
    /// What else lies below the array (copied as it is into a destination).
    others: Vec<PathBuf>,
}

impl<'a> Packer<'a> {
    pub(super) fn new(
        src: &'a dyn Store,
        dst: Option<&'a dyn Store>,
        opts: &'a Options,
        progress: Progress<'a>,
        durable: bool,
    ) -> Packer<'a> {
        Packer {
            src,
            dst,
            opts,
            progress,
            durable,
            summary: Mutex::default(),
            packed: Mutex::default(),
            consolidated: Mutex::default(),
        }
    }

    pub(super) fn into_summary(self) -> Summary {
        self.summary.into_inner().unwrap_or_else(|e| e.into_inner())
    }

    fn walk(&self, dir: &Path) -> Result<(), ConvertError> {
        let listing = self.list(dir)?;
        if listing
            .objects
            .iter()
            .any(|o| o == super::in_place::STATE_FILE)
        {
            return Err(ConvertError::Unfinished(self.src.describe(dir)));
        }
        let has = |name: &str| listing.objects.iter().any(|o| o == name);
        let v2 = !has(METADATA_FILE) && (has(v2::ZARRAY) || has(v2::ZGROUP));
        if v2 && self.opts.goal == Goal::Pack {
            return self.walk_v2(dir, &listing, has(v2::ZARRAY));
        }
        let mut copy_document = has(METADATA_FILE);
        if copy_document {
            match self.node(dir)? {
                Node::Array(meta) => {
                    if let Some(to) = self.target_of(dir, &meta)? {
                        return self.convert_array(dir, &meta, &to);
                    }
                }
                Node::Group(group) if group.consolidated_entries().is_some() => {
                    lock(&self.consolidated).push((dir.to_path_buf(), group));
                    copy_document = false;
                }
                _ => {}
            }
        }
        for name in listing.objects.iter().filter(|o| *o != METADATA_FILE) {
            self.copy(&dir.join(name))?;
        }
        for name in &listing.dirs {
            self.walk(&dir.join(name))?;
        }
        // Last: a node in DST with its document has everything below it.
        if copy_document {
            self.copy(&dir.join(METADATA_FILE))?;
        }
        Ok(())
    }

    /// A Zarr v2 node: an array is packed as the v3 array its `.zarray` describes (the
    /// chunk files are already named by its `v2` key encoding); a group gets a v3
    /// `zarr.json`. The v2 documents (and v2 consolidated metadata) are not copied.
    fn walk_v2(
        &self,
        dir: &Path,
        listing: &crate::store::Listing,
        is_array: bool,
    ) -> Result<(), ConvertError> {
        let read = |name: &str| self.get(self.src, &dir.join(name));
        let attrs = read(v2::ZATTRS)?;
        let v2_error = |why: String| ConvertError::V2 {
            what: self
                .src
                .describe(&dir.join(if is_array { v2::ZARRAY } else { v2::ZGROUP })),
            why,
        };
        if is_array {
            let zarray = read(v2::ZARRAY)?.unwrap_or_default();
            let meta = v2::array(&zarray, attrs.as_deref()).map_err(v2_error)?;
            return match self.target_of(dir, &meta)? {
                Some(to) => self.convert_array(dir, &meta, &to),
                None => Err(v2_error("it is not an unsharded array".into())),
            };
        }
        let group = v2::group(attrs.as_deref()).map_err(v2_error)?;
        let v2_names = [v2::ZGROUP, v2::ZATTRS, v2::ZMETADATA];
        for name in listing
            .objects
            .iter()
            .filter(|o| !v2_names.contains(&o.as_str()))
        {
            self.copy(&dir.join(name))?;
        }
        for name in &listing.dirs {
            self.walk(&dir.join(name))?;
        }
        lock(&self.summary).copied += 1;
        let doc = Node::Group(group).to_json_bytes();
        self.put(&dir.join(METADATA_FILE), &[Bytes::from(doc)])
    }

    /// What lies directly in `dir`; anything that cannot be packed is refused.
    pub(super) fn list(&self, dir: &Path) -> Result<crate::store::Listing, ConvertError> {
        let listing = self
            .src
            .list(dir)
            .map_err(|e| ConvertError::store(self.src, dir, e))?;
        match listing.unlisted.first() {
            Some(what) => Err(ConvertError::Unlisted(what.clone())),
            None => Ok(listing),
        }
    }

    /// The node whose document is in `dir`.
    pub(super) fn node(&self, dir: &Path) -> Result<Node, ConvertError> {
        let key = dir.join(METADATA_FILE);
        let bytes = self.get(self.src, &key)?.unwrap_or_default();
        Node::parse(&bytes).map_err(|source| ConvertError::Metadata {
            what: self.src.describe(&key),
            source,
        })
    }

    /// The array whose document is in `dir` (one that is no longer an array is refused).
    pub(super) fn node_array(&self, dir: &Path) -> Result<ArrayMetadata, ConvertError> {
        match self.node(dir)? {
            Node::Array(meta) => Ok(meta),
            Node::Group(_) => Err(ConvertError::Changed(
                self.src.describe(&dir.join(METADATA_FILE)),
            )),
        }
    }

    /// What the array at `dir` becomes (`None`: it stays as it is); one that cannot be
    /// read is refused.
    pub(super) fn target_of(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
    ) -> Result<Option<ArrayMetadata>, ConvertError> {
        let what = || self.src.describe(&dir.join(METADATA_FILE));
        target_of(self.opts.goal, meta, self.opts.compress, |plain| {
            self.chunks_per_shard(dir, plain)
        })
        .map_err(|e| match e {
            ConvertError::Layout { source, .. } => ConvertError::Layout {
                what: what(),
                source,
            },
            e => e,
        })
    }

    /// Writes the documents of groups with consolidated metadata, last (once every array
    /// below is in place), each packed array's entry replaced by its sharded metadata: a
    /// reader that trusts the consolidated metadata must not take shards for chunks.
    pub(super) fn write_consolidated(&self) -> Result<(), ConvertError> {
        let packed = lock(&self.packed);
        for (dir, group) in lock(&self.consolidated).iter().rev() {
            let (translated, _) = translate_consolidated(group, |path, _| {
                packed
                    .get(&dir.join(path))
                    .cloned()
                    .ok_or(LayoutError::NotSharded)
            });
            let doc = Node::Group(translated).to_json_bytes();
            lock(&self.summary).copied += 1;
            self.put(&dir.join(METADATA_FILE), &[Bytes::from(doc)])?;
        }
        Ok(())
    }

    fn convert_array(
        &self,
        dir: &Path,
        from: &ArrayMetadata,
        to: &ArrayMetadata,
    ) -> Result<(), ConvertError> {
        let work = self.work(dir, from, to)?;
        self.note_array(dir, &work);
        if self.opts.dry_run {
            return Ok(());
        }
        self.write_units(dir, &work)?;
        for other in &work.others {
            // A v2 array's own documents: its v3 `zarr.json` replaces them.
            let v2_document = [v2::ZARRAY, v2::ZATTRS]
                .iter()
                .any(|n| *other == dir.join(n));
            if !v2_document {
                self.copy(other)?;
            }
        }
        let doc = Node::Array(to.clone()).to_json_bytes();
        self.put(&dir.join(METADATA_FILE), &[Bytes::from(doc)])?;
        lock(&self.packed).insert(dir.to_path_buf(), to.clone());
        Ok(())
    }

    /// The objects to write to bring the array at `dir` from `from` to `to`, from the
    /// chunks there now.
    pub(super) fn work(
        &self,
        dir: &Path,
        from: &ArrayMetadata,
        to: &ArrayMetadata,
    ) -> Result<Work, ConvertError> {
        let conversion = Conversion::between(from, to).map_err(|source| ConvertError::Layout {
            what: self.src.describe(&dir.join(METADATA_FILE)),
            source,
        })?;
        let files = self.array_files(dir, from)?;
        let located = conversion.locate(self.src, dir, &files.chunks)?;
        let chunks = located.len();
        Ok(Work {
            units: conversion.units(located),
            conversion,
            chunks,
            others: files.others,
        })
    }

    /// The version of each chunk object of the array at `dir`, and of its `zarr.json` (its
    /// key and its store's tag):
    /// what a conversion in place compares before it switches the array's document, so that
    /// a chunk written meanwhile is never dropped with the old layout.
    pub(super) fn versions(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
    ) -> Result<std::collections::BTreeMap<String, Option<String>>, ConvertError> {
        let files = self.array_files(dir, meta)?;
        files
            .chunks
            .into_keys()
            .chain([METADATA_FILE.to_string()])
            .map(|k| {
                let key = dir.join(&k);
                let blob = self
                    .src
                    .open(&key, 0)
                    .map_err(|e| ConvertError::store(self.src, &key, e))?;
                Ok((k, blob.map(|b| b.info().tag.clone())))
            })
            .collect()
    }

    /// Counts an array converted (or planned) in the summary.
    pub(super) fn note_array(&self, dir: &Path, work: &Work) {
        let cps = work
            .conversion
            .to_shards()
            .map(|plan| plan.index_format().chunks_per_shard.clone())
            .unwrap_or_default();
        let written = match work.conversion.to_shards() {
            Some(_) => work.units.len(),
            None => work.chunks,
        };
        lock(&self.summary).arrays.push(super::PackedArray {
            dir: dir.to_path_buf(),
            chunks: work.chunks as u64,
            shards: written as u64,
            chunks_per_shard: cps,
        });
    }

    /// Chunks per shard of the unsharded array `plain` at `dir`, as the options say.
    fn chunks_per_shard(
        &self,
        dir: &Path,
        plain: &ArrayMetadata,
    ) -> Result<Vec<u64>, ConvertError> {
        let what = || self.src.describe(&dir.join(METADATA_FILE));
        let chunk_shape = regular_chunk_shape(plain).map_err(|source| ConvertError::Layout {
            what: what(),
            source,
        })?;
        match &self.opts.shard_shape {
            Some(shape) => {
                chunks_per_shard_of(shape, &chunk_shape).ok_or_else(|| ConvertError::ShardShape {
                    what: what(),
                    shape: shape.clone(),
                    chunks: chunk_shape.clone(),
                })
            }
            None => self
                .opts
                .policy
                .chunks_per_shard(&plain.shape, &chunk_shape, plain.item_size())
                .map_err(|source| ConvertError::Policy {
                    what: what(),
                    source,
                }),
        }
    }

    /// Every object below the array's directory, sorted into chunks and others.
    pub(super) fn array_files(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
    ) -> Result<ArrayFiles, ConvertError> {
        self.array_files_within(dir, meta, &[meta])
    }

    /// Every object below the array's directory, sorted into chunks (keys of `meta`'s key
    /// encoding inside the grid of any of `layouts`: a conversion in place stopped after
    /// its flip holds objects of two layouts) and others.
    pub(super) fn array_files_within(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
        layouts: &[&ArrayMetadata],
    ) -> Result<ArrayFiles, ConvertError> {
        let encoding = ChunkKeyEncoding::from_metadata(&meta.chunk_key_encoding).map_err(|e| {
            ConvertError::Layout {
                what: self.src.describe(&dir.join(METADATA_FILE)),
                source: crate::zarr::LayoutError::KeyEncoding(e),
            }
        })?;
        let grids: Vec<Vec<u64>> = layouts
            .iter()
            .map(|m| {
                m.shape
                    .iter()
                    .zip(regular_chunk_shape(m).unwrap_or_default())
                    .map(|(s, c)| crate::grid::ceil_div(*s, c.max(1)))
                    .collect()
            })
            .collect();
        let mut files = ArrayFiles::default();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            let here = dir.join(&rel);
            let listing = self.list(&here)?;
            stack.extend(listing.dirs.iter().map(|d| rel.join(d)));
            for name in listing.objects {
                let key = rel.join(&name);
                let text = key.to_string_lossy().into_owned();
                let chunk = encoding
                    .decode(&text, meta.ndim())
                    .ok()
                    .filter(|c| grids.iter().any(|g| crate::grid::inside(c, g)));
                match chunk {
                    Some(coords) => drop(files.chunks.insert(text, coords)),
                    None if key == Path::new(METADATA_FILE) => {}
                    None if looks_like_a_key(encoding, &text) => {
                        return Err(ConvertError::NotAChunk(self.src.describe(&dir.join(key))));
                    }
                    None => files.others.push(dir.join(key)),
                }
            }
        }
        Ok(files)
    }

    /// Builds and writes the objects of `work`, `opts.jobs` at once.
    pub(super) fn write_units(&self, dir: &Path, work: &Work) -> Result<(), ConvertError> {
        let units = &work.units;
        let next = AtomicUsize::new(0);
        let done = AtomicU64::new(0);
        let bytes = AtomicU64::new(0);
        let failed: Mutex<Option<ConvertError>> = Mutex::default();
        (self.progress)(0, units.len() as u64, 0);
        let run = || {
            while lock(&failed).is_none() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(unit) = units.get(i) else { break };
                match self.write_unit(dir, &work.conversion, unit) {
                    Ok(n) => {
                        bytes.fetch_add(n, Ordering::Relaxed);
                        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                        (self.progress)(d, units.len() as u64, bytes.load(Ordering::Relaxed));
                    }
                    Err(e) => *lock(&failed) = Some(e),
                }
            }
        };
        let result = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..self.opts.jobs.clamp(1, units.len().max(1)))
                .map(|_| scope.spawn(run))
                .collect();
            workers.into_iter().map(|w| w.join()).collect::<Vec<_>>()
        });
        if result.iter().any(Result::is_err) {
            return Err(ConvertError::Panicked(format!(
                "a worker converting {} panicked",
                self.src.describe(dir)
            )));
        }
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        lock(&self.summary).chunk_bytes += bytes.load(Ordering::Relaxed);
        Ok(())
    }

    /// Builds one object from its chunks as stored and writes it (chunk files: each).
    /// Returns the chunk bytes read.
    fn write_unit(
        &self,
        dir: &Path,
        conversion: &Conversion,
        unit: &Unit,
    ) -> Result<u64, ConvertError> {
        let wanted: Vec<&ChunkAt> = match unit {
            Unit::Shard { chunks, .. } => chunks.iter().map(|(_, at)| at).collect(),
            Unit::Chunks(chunks) => chunks.iter().map(|(_, at)| at).collect(),
        };
        let fetched = conversion.fetch(self.src, dir, &wanted)?;
        let read: u64 = fetched.iter().flatten().map(Piece::len).sum();
        let encode = |piece: Piece| -> Result<Piece, ConvertError> {
            let Some(level) = conversion.zstd else {
                return Ok(piece);
            };
            let io = |e: std::io::Error| ConvertError::store(self.src, dir, e.into());
            let bytes = piece.to_bytes().map_err(io)?;
            zstd_compress(&bytes, level).map(Piece::Bytes).map_err(io)
        };
        let mut written = 0;
        match unit {
            Unit::Shard { key, chunks } => {
                // Gone since it was listed: a missing chunk, as in any reader's view.
                let mut present = Vec::new();
                for ((pos, _), piece) in chunks.iter().zip(fetched) {
                    if let Some(piece) = piece {
                        present.push((*pos, encode(piece)?));
                    }
                }
                written = present.iter().map(|(_, p)| p.len()).sum();
                if let Some(shard) = assemble(conversion, present) {
                    self.put_pieces(&dir.join(key), &shard)?;
                }
            }
            Unit::Chunks(chunks) => {
                for ((key, _), piece) in chunks.iter().zip(fetched) {
                    if let Some(piece) = piece {
                        let piece = encode(piece)?;
                        written += piece.len();
                        self.put_pieces(&dir.join(key), &[piece])?;
                    }
                }
            }
        }
        lock(&self.summary).stored_bytes += written;
        Ok(read)
    }

    fn copy(&self, key: &Path) -> Result<(), ConvertError> {
        lock(&self.summary).copied += 1;
        if self.opts.dry_run {
            return Ok(());
        }
        if let Some(bytes) = self.get(self.src, key)? {
            self.put(key, &[bytes])?;
        }
        Ok(())
    }

    pub(super) fn get(&self, store: &dyn Store, key: &Path) -> Result<Option<Bytes>, ConvertError> {
        store
            .get(key, MAX_FILE_BYTES)
            .map(|o| o.map(|(b, _)| b))
            .map_err(|e| ConvertError::store(store, key, e))
    }

    fn put_pieces(&self, key: &Path, pieces: &[Piece]) -> Result<(), ConvertError> {
        let Some(dst) = self.dst.filter(|_| !self.opts.dry_run) else {
            return Ok(()); // a dry run writes nothing
        };
        dst.put_pieces(key, pieces, self.durable)
            .map(drop)
            .map_err(|e| ConvertError::store(dst, key, e))
    }

    pub(super) fn put(&self, key: &Path, parts: &[Bytes]) -> Result<(), ConvertError> {
        let Some(dst) = self.dst.filter(|_| !self.opts.dry_run) else {
            return Ok(()); // a dry run writes nothing
        };
        let put = match self.durable {
            true => dst.put_durably(key, parts),
            false => dst.put(key, parts, Precondition::None),
        };
        put.map(drop).map_err(|e| ConvertError::store(dst, key, e))
    }
}

/// A shard of `chunks` (by position, in order), laid out as the shard builder lays one
/// out (`shard::place`). `None`: no chunk, no shard.
fn assemble(conversion: &Conversion, chunks: Vec<(usize, Piece)>) -> Option<Vec<Piece>> {
    if chunks.is_empty() {
        return None;
    }
    let format = conversion.to_shards()?.index_format();
    let (index, _) = place(format, chunks.iter().map(|(pos, p)| (*pos, p.len())));
    let index = Piece::Bytes(Bytes::from(format.encode(&index)));
    let mut pieces: Vec<Piece> = chunks.into_iter().map(|(_, p)| p).collect();
    match format.location {
        IndexLocation::Start => pieces.insert(0, index),
        IndexLocation::End => pieces.push(index),
    }
    Some(pieces)
}

/// `bytes` compressed as one zstd frame (its content size in its header, as readers expect).
fn zstd_compress(bytes: &[u8], level: i32) -> std::io::Result<Bytes> {
    zstd::bulk::compress(bytes, level).map(Bytes::from)
}

/// Chunks per shard on each axis for shards of `shape` elements, if it is a non-zero
/// multiple of `chunks` of the same rank.
fn chunks_per_shard_of(shape: &[u64], chunks: &[u64]) -> Option<Vec<u64>> {
    (shape.len() == chunks.len())
        .then(|| {
            shape
                .iter()
                .zip(chunks)
                .map(|(&s, &c)| (c > 0 && s > 0 && s % c == 0).then_some(s / c))
                .collect()
        })
        .flatten()
}

/// Whether `key` (below an array's directory) lies where its chunks and shards are named:
/// there, anything but a chunk of the array would be taken for a shard, or collide with one.
fn looks_like_a_key(encoding: ChunkKeyEncoding, key: &str) -> bool {
    let first = key.split('/').next().unwrap_or("");
    match encoding {
        ChunkKeyEncoding::Default(sep) => {
            first == "c" || first.starts_with(&format!("c{}", sep.as_char()))
        }
        ChunkKeyEncoding::V2(_) => first.starts_with(|c: char| c.is_ascii_digit()),
    }
}
