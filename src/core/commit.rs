//! A `zarr.json` written through the mount. An unsharded array is stored sharded (keeping
//! the layout an existing array already has); a group's consolidated metadata is stored
//! with its entries sharded the same way; anything else is stored as written.

use std::path::Path;

use bytes::Bytes;
use tracing::{info, warn};

use super::ShardFs;
use super::error::FsError;
use super::shards::WriteMode;
use crate::shard::IndexLocation;
use crate::zarr::layout::{SHARDING_CODEC, regular_chunk_shape};
use crate::zarr::{
    ArrayMetadata, LayoutError, METADATA_FILE, Node, sharded_with, translate_consolidated,
    unsharded_view,
};

impl ShardFs {
    /// Stores `bytes`, written as `dir/zarr.json`, in BACKING.
    pub(crate) fn commit_metadata(&self, dir: &Path, bytes: &[u8]) -> Result<(), FsError> {
        let doc = dir.join(METADATA_FILE);
        let shown = self.backing.path(&doc);
        let stored: Vec<u8> = match Node::parse(bytes) {
            Err(e) => {
                warn!(file = %shown.display(),
                    "not Zarr v3 metadata ({e}): stored as written; the directory is not treated as an array");
                self.flush_array_at(dir)?;
                bytes.to_vec()
            }
            Ok(Node::Array(meta)) => {
                if meta.codecs.iter().any(|c| c.name == SHARDING_CODEC) {
                    warn!(file = %shown.display(),
                        "refused: the metadata is already sharded; write the unsharded form \
                         through the mount and shardfs stores it sharded");
                    return Err(FsError::Invalid(
                        "sharded metadata written through the mount".into(),
                    ));
                }
                match self.sharded_form(dir, &meta) {
                    Ok(sharded) => Node::Array(sharded).to_json_bytes(),
                    Err(e) if e.is_invalid_metadata() || matches!(e, LayoutError::Policy(_)) => {
                        warn!(file = %shown.display(), "refused: {e}");
                        return Err(FsError::Invalid(e.to_string()));
                    }
                    Err(e) => {
                        info!(file = %shown.display(), "stored unsharded, as written: {e}");
                        self.flush_array_at(dir)?;
                        bytes.to_vec()
                    }
                }
            }
            Ok(Node::Group(group)) => {
                self.flush_array_at(dir)?;
                if group.consolidated_entries().is_none() {
                    bytes.to_vec()
                } else {
                    let (translated, refused) = translate_consolidated(&group, |path, a| {
                        if a.codecs.iter().any(|c| c.name == SHARDING_CODEC) {
                            return Err(LayoutError::AlreadySharded);
                        }
                        self.sharded_form(&dir.join(path), a)
                    });
                    for (path, e) in refused {
                        if e != LayoutError::AlreadySharded {
                            info!(file = %shown.display(), entry = %path,
                                "consolidated entry stored as written: {e}");
                        }
                    }
                    Node::Group(translated).to_json_bytes()
                }
            }
        };
        self.backing
            .write_atomic(&doc, &[Bytes::from(stored)], false)?;
        Ok(())
    }

    /// The sharded form of unsharded `meta` for the array at `dir`: with the chunks per
    /// shard and index location it already has when it is an existing sharded array with
    /// the same chunks, codecs and keys (a resize or an attribute update), else from the
    /// shard policy. Pending chunks of an existing array whose layout changes are written
    /// first, with the old layout.
    fn sharded_form(&self, dir: &Path, meta: &ArrayMetadata) -> Result<ArrayMetadata, LayoutError> {
        let chunk_shape = regular_chunk_shape(meta)?;
        let existing = self.array_at(dir).ok().flatten();
        let kept = existing.as_ref().and_then(|a| {
            let view = unsharded_view(&a.meta).ok()?;
            let same = a.layout.chunk_shape == chunk_shape
                && view.codecs == meta.codecs
                && view.chunk_key_encoding == meta.chunk_key_encoding
                && view.ndim() == meta.ndim();
            same.then(|| {
                (
                    a.layout.chunks_per_shard().to_vec(),
                    a.layout.index.location,
                )
            })
        });
        let (cps, location) = match kept {
            Some(k) => k,
            None => {
                if existing.is_some()
                    && let Err(e) = self.flush_array_at(dir)
                {
                    warn!(array = %dir.display(), "pending chunks of the old layout not written: {e}");
                }
                let cps = self.config.policy.chunks_per_shard(
                    &meta.shape,
                    &chunk_shape,
                    meta.item_size(),
                )?;
                (cps, IndexLocation::End)
            }
        };
        sharded_with(meta, &cps, location)
    }

    /// Writes every pending shard of the array at `dir`, if it is one.
    pub(crate) fn flush_array_at(&self, dir: &Path) -> Result<(), FsError> {
        let Some(array) = self.array_at(dir)? else {
            return Ok(());
        };
        let mut first_error = None;
        for p in self.shards.pending() {
            if p.array == array.rel
                && let Err(e) = self.shards.write_shard(
                    &self.backing,
                    &array,
                    &p.shard,
                    WriteMode::Everything,
                    false,
                )
            {
                first_error.get_or_insert(e);
            }
        }
        first_error.map_or(Ok(()), Err)
    }
}
