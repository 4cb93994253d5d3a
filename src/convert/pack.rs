//! `pack`: every unsharded Zarr v3 array below the source becomes a sharded array in the
//! destination, each shard built from the chunks' bytes as stored and written once; every
//! other object (groups, arrays already sharded, files that are no chunk) is copied as it
//! is. An array's `zarr.json` is written after its shards, so a destination holding an
//! array's sharded metadata holds all its shards.

use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;

use super::plan::{PackPlan, ShardPlan, plan_pack};
use super::v2;
use super::{ConvertError, Options, Summary};
use crate::limits::MAX_FILE_BYTES;
use crate::shard::ShardBuilder;
use crate::store::{Precondition, Store};
use crate::sync::lock;
use crate::zarr::layout::regular_chunk_shape;
use crate::zarr::{
    ArrayMetadata, ChunkKeyEncoding, GroupMetadata, LayoutError, METADATA_FILE, Node, ShardLayout,
    translate_consolidated,
};

/// Progress, as shards are written: (shards done, shards in all, chunk bytes copied).
pub type Progress<'a> = &'a (dyn Fn(u64, u64, u64) + Sync);

/// Packs everything below `src` into the empty `dst` (`None`: a dry run's destination
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

/// Packing's steps, shared by `pack` into a destination and `in_place.rs`.
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

impl ArrayFiles {
    /// The shards of `plan` holding these chunks.
    pub(super) fn shards(&self, plan: &PackPlan) -> Vec<ShardPlan> {
        plan.shards_of(self.chunks.iter().map(|(k, c)| (c.clone(), k.clone())))
    }
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
        if !has(METADATA_FILE) && (has(v2::ZARRAY) || has(v2::ZGROUP)) {
            return self.walk_v2(dir, &listing, has(v2::ZARRAY));
        }
        let mut copy_document = has(METADATA_FILE);
        if copy_document {
            match self.node(dir)? {
                Node::Array(meta) if self.unsharded(dir, &meta)? => {
                    return self.pack_array(dir, &meta);
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
            return self.pack_array(dir, &meta);
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

    /// Whether the array at `dir` is unsharded (one that cannot be read is refused).
    pub(super) fn unsharded(&self, dir: &Path, meta: &ArrayMetadata) -> Result<bool, ConvertError> {
        let sharded = ShardLayout::of(meta).map_err(|source| ConvertError::Layout {
            what: self.src.describe(&dir.join(METADATA_FILE)),
            source,
        })?;
        Ok(sharded.is_none())
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

    fn pack_array(&self, dir: &Path, meta: &ArrayMetadata) -> Result<(), ConvertError> {
        let plan = self.plan(dir, meta)?;
        let files = self.array_files(dir, meta)?;
        let shards = files.shards(&plan);
        self.note_array(dir, &plan, files.chunks.len(), shards.len());
        if self.opts.dry_run {
            return Ok(());
        }
        self.write_shards(dir, &plan, &shards)?;
        for other in &files.others {
            // A v2 array's own documents: its v3 `zarr.json` replaces them.
            let v2_document = [v2::ZARRAY, v2::ZATTRS]
                .iter()
                .any(|n| *other == dir.join(n));
            if !v2_document {
                self.copy(other)?;
            }
        }
        let doc = Node::Array(plan.sharded.clone()).to_json_bytes();
        self.put(&dir.join(METADATA_FILE), &[Bytes::from(doc)])?;
        lock(&self.packed).insert(dir.to_path_buf(), plan.sharded);
        Ok(())
    }

    /// Counts an array packed (or planned) in the summary.
    pub(super) fn note_array(&self, dir: &Path, plan: &PackPlan, chunks: usize, shards: usize) {
        lock(&self.summary).arrays.push(super::PackedArray {
            dir: dir.to_path_buf(),
            chunks: chunks as u64,
            shards: shards as u64,
            chunks_per_shard: plan.index_format().chunks_per_shard.clone(),
        });
    }

    pub(super) fn plan(&self, dir: &Path, meta: &ArrayMetadata) -> Result<PackPlan, ConvertError> {
        let what = || self.src.describe(&dir.join(METADATA_FILE));
        let chunk_shape = regular_chunk_shape(meta).map_err(|source| ConvertError::Layout {
            what: what(),
            source,
        })?;
        let cps = match &self.opts.shard_shape {
            Some(shape) => chunks_per_shard_of(shape, &chunk_shape).ok_or_else(|| {
                ConvertError::ShardShape {
                    what: what(),
                    shape: shape.clone(),
                    chunks: chunk_shape.clone(),
                }
            })?,
            None => self
                .opts
                .policy
                .chunks_per_shard(&meta.shape, &chunk_shape, meta.item_size())
                .map_err(|source| ConvertError::Policy {
                    what: what(),
                    source,
                })?,
        };
        plan_pack(meta, &cps).map_err(|source| ConvertError::Layout {
            what: what(),
            source,
        })
    }

    /// Every object below the array's directory, sorted into chunks and others.
    pub(super) fn array_files(
        &self,
        dir: &Path,
        meta: &ArrayMetadata,
    ) -> Result<ArrayFiles, ConvertError> {
        let encoding = ChunkKeyEncoding::from_metadata(&meta.chunk_key_encoding).map_err(|e| {
            ConvertError::Layout {
                what: self.src.describe(&dir.join(METADATA_FILE)),
                source: crate::zarr::LayoutError::KeyEncoding(e),
            }
        })?;
        let grid: Vec<u64> = meta
            .shape
            .iter()
            .zip(regular_chunk_shape(meta).unwrap_or_default())
            .map(|(s, c)| crate::grid::ceil_div(*s, c.max(1)))
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
                    .filter(|c| crate::grid::inside(c, &grid));
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

    /// Builds and writes `shards`, `opts.jobs` at once.
    pub(super) fn write_shards(
        &self,
        dir: &Path,
        plan: &PackPlan,
        shards: &[ShardPlan],
    ) -> Result<(), ConvertError> {
        let next = AtomicUsize::new(0);
        let done = AtomicU64::new(0);
        let bytes = AtomicU64::new(0);
        let failed: Mutex<Option<ConvertError>> = Mutex::default();
        let work = || {
            while lock(&failed).is_none() {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(shard) = shards.get(i) else { break };
                match self.write_shard(dir, plan, shard) {
                    Ok(n) => {
                        bytes.fetch_add(n, Ordering::Relaxed);
                        let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                        (self.progress)(d, shards.len() as u64, bytes.load(Ordering::Relaxed));
                    }
                    Err(e) => *lock(&failed) = Some(e),
                }
            }
        };
        let result = std::thread::scope(|scope| {
            let workers: Vec<_> = (0..self.opts.jobs.clamp(1, shards.len().max(1)))
                .map(|_| scope.spawn(work))
                .collect();
            workers.into_iter().map(|w| w.join()).collect::<Vec<_>>()
        });
        if result.iter().any(Result::is_err) {
            return Err(ConvertError::Panicked(format!(
                "a worker packing {} panicked",
                self.src.describe(dir)
            )));
        }
        if let Some(e) = failed.into_inner().unwrap_or_else(|e| e.into_inner()) {
            return Err(e);
        }
        lock(&self.summary).chunk_bytes += bytes.load(Ordering::Relaxed);
        Ok(())
    }

    /// Builds one shard from its chunks as stored and writes it. Returns the chunk bytes.
    fn write_shard(
        &self,
        dir: &Path,
        plan: &PackPlan,
        shard: &ShardPlan,
    ) -> Result<u64, ConvertError> {
        let mut builder = ShardBuilder::new(plan.index_format().clone());
        let mut total = 0;
        for (pos, key) in &shard.chunks {
            // Gone since it was listed: a missing chunk, as in any reader's view.
            if let Some(bytes) = self.get(self.src, &dir.join(key))? {
                total += bytes.len() as u64;
                builder.set(*pos, vec![bytes]);
            }
        }
        if let Some(encoded) = builder.build() {
            self.put(&dir.join(&shard.key), encoded.buffers())?;
        }
        Ok(total)
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
