//! What lies below a directory of the key tree: the chunks that exist there, and the
//! entries of its listing. Questions are answered from the shards in memory and from
//! BACKING's shard files, walked lazily so that a question settled early reads little.

use std::collections::BTreeSet;
use std::ops::ControlFlow;

use super::{ShardRegistry, lock};
use crate::backing::Backing;
use crate::core::array::{ArrayState, KeyEntry};
use crate::core::error::FsError;
use crate::grid;
use crate::zarr::{ChunkKeyEncoding, KeyNode, Separator};
use std::sync::Arc;

impl ShardRegistry {
    /// Calls `f` with every chunk below `node` that exists (stored, not deleted, or
    /// pending), shard by shard, until `f` breaks. A damaged shard contributes every
    /// position of it inside the array, so that its chunks show up (and fail to read)
    /// rather than vanish. Shards in memory come first, then BACKING's shard files, walked
    /// lazily: a question answered by the first chunk found reads one directory per level
    /// and one index, whatever the array's size.
    fn for_each_chunk_below(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        node: &KeyNode,
        mut f: impl FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<(), FsError> {
        let prefix = node.prefix();
        let cps = array.layout.chunks_per_shard().to_vec();
        let shard_prefix: Vec<u64> = prefix.iter().zip(&cps).map(|(c, n)| c / n).collect();
        let in_memory = self.shards_in_memory(array, &shard_prefix);
        for shard in &in_memory {
            if self
                .visit_shard(backing, array, shard, prefix, &mut f)?
                .is_break()
            {
                return Ok(());
            }
        }
        let mut failed = None;
        array.walk_shard_files(&*self.store, &shard_prefix, &mut |shard| {
            if in_memory.contains(&shard) {
                return ControlFlow::Continue(());
            }
            self.visit_shard(backing, array, &shard, prefix, &mut f)
                .unwrap_or_else(|e| {
                    failed = Some(e);
                    ControlFlow::Break(())
                })
        })?;
        failed.map_or(Ok(()), Err)
    }

    /// Calls `f` with the chunks of one shard whose coordinates start with `prefix`.
    fn visit_shard(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        shard: &[u64],
        prefix: &[u64],
        f: &mut impl FnMut(Vec<u64>) -> ControlFlow<()>,
    ) -> Result<ControlFlow<()>, FsError> {
        let slot = self.slot(backing, array, shard)?;
        let visit = |positions: &BTreeSet<usize>,
                     f: &mut dyn FnMut(Vec<u64>) -> ControlFlow<()>| {
            for &pos in positions {
                let coords = array.layout.chunk_coords(shard, pos);
                if coords.starts_with(prefix) && array.chunk_inside(&coords) && f(coords).is_break()
                {
                    return ControlFlow::Break(());
                }
            }
            ControlFlow::Continue(())
        };
        // Chunks in memory first: a question they answer needs no read of the store (which
        // may be slow, or gone for a while).
        let pending: BTreeSet<usize> = lock(&slot.state).pending.keys().copied().collect();
        if visit(&pending, f).is_break() {
            return Ok(ControlFlow::Break(()));
        }
        let stored: BTreeSet<usize> = {
            let mut st = lock(&slot.state);
            // A listing is what attributes are: a shard confirmed a moment ago (by the
            // listing of the directory next to this one) is not looked at again.
            self.look_unless_shown(&slot, shard, &mut st)?;
            let mut positions: BTreeSet<usize> = match &st.stored {
                None => BTreeSet::new(),
                Some(stored) => match &stored.index {
                    Ok(index) => index.present().map(|(p, _)| p).collect(),
                    Err(_) => (0..grid::count(array.layout.chunks_per_shard())).collect(),
                },
            };
            positions.retain(|p| !st.deleted.contains(p) && !pending.contains(p));
            positions
        };
        Ok(visit(&stored, f))
    }

    pub fn has_chunks_below(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        node: &KeyNode,
    ) -> Result<bool, FsError> {
        let mut found = false;
        self.for_each_chunk_below(backing, array, node, |_| {
            found = true;
            ControlFlow::Break(())
        })?;
        Ok(found)
    }

    /// The entries of `node` that hold chunks, sorted by coordinates.
    ///
    /// The cost follows the listing, not the array: a directory whose entries are
    /// directories (`c/4` of a 3-d array) reads, for each of its entries, shards only until
    /// one holds a chunk below that entry. Only a directory of chunk files reads every shard
    /// that holds its chunks, one index each.
    pub fn list(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        node: &KeyNode,
    ) -> Result<Vec<KeyEntry>, FsError> {
        let encoding = array.layout.key_encoding;
        let depth = node.prefix().len();
        let slash = encoding.separator() == Separator::Slash;
        let mut children: BTreeSet<(Vec<u64>, KeyEntry)> = BTreeSet::new();
        let mut add = |coords: &[u64]| {
            let (name, child) = encoding.child_towards(node, coords);
            children.insert((child.prefix().to_vec(), KeyEntry { name, node: child }));
        };
        if slash && node == &KeyNode::Root && matches!(encoding, ChunkKeyEncoding::Default(_)) {
            // The one entry `c`: any chunk shows it.
            self.for_each_chunk_below(backing, array, node, |coords| {
                add(&coords);
                ControlFlow::Break(())
            })?;
        } else if slash && depth + 1 < array.layout.ndim() {
            self.children_by_group(backing, array, node, &mut |coords| add(coords))?;
        } else {
            self.for_each_chunk_below(backing, array, node, |coords| {
                add(&coords);
                ControlFlow::Continue(())
            })?;
        }
        Ok(children.into_iter().map(|(_, entry)| entry).collect())
    }

    /// Calls `add` with at least one chunk below each entry of the directory `node` (whose
    /// entries are directories of coordinate `depth`), stopping within each shard-index
    /// group of that coordinate as soon as every entry the group could hold is found.
    fn children_by_group(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        node: &KeyNode,
        add: &mut dyn FnMut(&[u64]),
    ) -> Result<(), FsError> {
        let prefix = node.prefix();
        let depth = prefix.len();
        let cps = array.layout.chunks_per_shard()[depth];
        let extent = array.layout.chunk_grid_shape()[depth];
        let shard_prefix: Vec<u64> = prefix
            .iter()
            .zip(array.layout.chunks_per_shard())
            .map(|(c, n)| c / n)
            .collect();
        let in_memory = self.shards_in_memory(array, &shard_prefix);
        let mut found = self.visit_all(backing, array, &in_memory, prefix, add)?;
        for s in array.shard_coords_below(&*self.store, &shard_prefix)? {
            // The entries shard index `s` of this coordinate can hold.
            let start = s.saturating_mul(cps);
            if start >= extent {
                continue; // a directory beyond the grid holds no shard
            }
            let entries = start..s.saturating_add(1).saturating_mul(cps).min(extent);
            let wanted = (entries.end - entries.start) as usize;
            let have = |found: &BTreeSet<u64>| found.range(entries.clone()).count();
            if have(&found) >= wanted {
                continue;
            }
            let mut group = shard_prefix.clone();
            group.push(s);
            let mut failed = None;
            array.walk_shard_files(&*self.store, &group, &mut |shard| {
                if in_memory.contains(&shard) {
                    return ControlFlow::Continue(());
                }
                let visited = self.visit_shard(backing, array, &shard, prefix, &mut |coords| {
                    if found.insert(coords[depth]) {
                        add(&coords);
                    }
                    ControlFlow::Continue(())
                });
                match visited {
                    Err(e) => {
                        failed = Some(e);
                        ControlFlow::Break(())
                    }
                    Ok(_) if have(&found) >= wanted => ControlFlow::Break(()),
                    Ok(_) => ControlFlow::Continue(()),
                }
            })?;
            if let Some(e) = failed {
                return Err(e);
            }
        }
        Ok(())
    }

    /// Visits the children of `prefix` in each of `shards`; returns the coordinates seen at
    /// its depth.
    fn visit_all(
        &self,
        backing: &Backing,
        array: &Arc<ArrayState>,
        shards: &BTreeSet<Vec<u64>>,
        prefix: &[u64],
        add: &mut dyn FnMut(&[u64]),
    ) -> Result<BTreeSet<u64>, FsError> {
        let mut found = BTreeSet::new();
        for shard in shards {
            let _all_visited = self.visit_shard(backing, array, shard, prefix, &mut |coords| {
                found.insert(coords[prefix.len()]);
                add(&coords);
                ControlFlow::Continue(())
            })?;
        }
        Ok(found)
    }

    /// The shards below `shard_prefix` that hold chunks in memory.
    fn shards_in_memory(&self, array: &ArrayState, shard_prefix: &[u64]) -> BTreeSet<Vec<u64>> {
        self.slots_below(&array.rel, shard_prefix)
            .into_iter()
            .filter(|slot| !lock(&slot.state).pending.is_empty())
            .map(|slot| slot.shard.clone())
            .collect()
    }
}
