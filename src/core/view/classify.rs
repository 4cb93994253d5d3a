//! What a backing directory is (plain, sharded array, group), read from its `zarr.json` and
//! cached until that file changes.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use tracing::{info, warn};

use crate::backing::{Backing, FileVersion, mtime_of};
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::group::GroupView;
use crate::sync::lock;
use crate::zarr::{
    LayoutError, METADATA_FILE, Node, ShardLayout, translate_consolidated, unsharded_view,
};

#[derive(Clone, Debug)]
pub enum DirClass {
    /// No `zarr.json`, an unsharded or unshowable array, or unreadable metadata: shown as is.
    Plain,
    ShardedArray(Arc<ArrayState>),
    /// A group; `Some` when its consolidated metadata is translated.
    Group(Option<Arc<GroupView>>),
}

#[derive(Debug, Default)]
pub struct Classifier {
    cache: Mutex<HashMap<PathBuf, (FileVersion, DirClass)>>,
    /// Arrays whose sharded metadata was written through this mount by a writer that
    /// shards itself: shown as written (shard files and all) while this mount lives.
    as_written: Mutex<std::collections::HashSet<PathBuf>>,
}

impl Classifier {
    /// Shows the array at `dir` as written (`true`) or translated (`false`) from now on.
    pub fn show_as_written(&self, dir: &Path, yes: bool) {
        let mut set = lock(&self.as_written);
        if yes {
            set.insert(dir.to_path_buf());
        } else {
            set.remove(dir);
        }
    }

    pub fn classify(&self, backing: &Backing, dir: &Path) -> Result<DirClass, FsError> {
        if lock(&self.as_written).contains(dir) {
            return Ok(DirClass::Plain);
        }
        let doc = dir.join(METADATA_FILE);
        // The document is read in the directory identified (not by its path again): looks
        // apart could pair one directory's document with another directory, mid-swap.
        let found = backing.identify(dir)?;
        if found.is_none() {
            // No directory: a path that cannot be followed (a link on the way) is an error,
            // as looking up the document would say.
            backing.stat(&doc)?;
        }
        let opened = found.as_ref().and_then(|f| f.file_in(METADATA_FILE));
        let (Some(found), Some((file, meta))) = (found, opened) else {
            lock(&self.cache).remove(dir);
            return Ok(DirClass::Plain);
        };
        let version = FileVersion::of(&meta);
        // The same document in another directory (made anew at the path, the document
        // moved into it) is another array.
        if let Some((v, class)) = lock(&self.cache).get(dir)
            && *v == version
            && same_dir(class, backing, dir)
        {
            return Ok(class.clone());
        }
        // A document too large to be metadata is shown as it is, like garbage.
        let bytes = match read_bounded(
            file,
            &meta,
            crate::core::pending::memfile::MAX_METADATA_BYTES,
        ) {
            Ok(b) => b,
            Err(e) if e.raw_os_error() == Some(libc::EFBIG) => Vec::new(),
            Err(e) => return Err(e.into()),
        };
        let read = Read {
            version,
            mtime: mtime_of(&meta),
            found,
        };
        let class = classify_document(dir, &doc, &bytes, read, backing);
        lock(&self.cache).insert(dir.to_path_buf(), (version, class.clone()));
        Ok(class)
    }
}

/// Whether `class`, if an array, was read in the directory that is at `dir` now.
fn same_dir(class: &DirClass, backing: &Backing, dir: &Path) -> bool {
    match class {
        DirClass::ShardedArray(a) => match &a.dir {
            Some(held) => held.is_at(backing, dir),
            None => backing
                .dir_facts(dir)
                .is_some_and(|(id, instance, _)| Some(id) == a.dir_id && instance == a.instance),
        },
        _ => true,
    }
}

/// Where and as what a document was read.
struct Read {
    version: FileVersion,
    mtime: std::time::SystemTime,
    found: crate::backing::Identified,
}

/// The whole of `file` (described by `meta`), at most `limit` bytes (EFBIG past it).
fn read_bounded(
    mut file: std::fs::File,
    meta: &std::fs::Metadata,
    limit: u64,
) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    if meta.len() > limit {
        return Err(std::io::Error::from_raw_os_error(libc::EFBIG));
    }
    let mut out = Vec::with_capacity(meta.len() as usize);
    file.by_ref().take(limit).read_to_end(&mut out)?;
    Ok(out)
}

fn classify_document(
    dir: &Path,
    doc: &Path,
    bytes: &[u8],
    read: Read,
    backing: &Backing,
) -> DirClass {
    let shown = backing.path(doc);
    match Node::parse(bytes) {
        Err(e) => {
            warn!(file = %shown.display(), "not Zarr v3 metadata, shown as it is: {e}");
            DirClass::Plain
        }
        Ok(Node::Array(meta)) => match (ShardLayout::of(&meta), unsharded_view(&meta)) {
            (Ok(Some(layout)), Ok(view)) => DirClass::ShardedArray(Arc::new(ArrayState {
                rel: dir.to_path_buf(),
                meta,
                layout,
                view_json: Bytes::from(Node::Array(view).to_json_bytes()),
                meta_version: read.version,
                meta_mtime: read.mtime,
                instance: read.found.instance.clone(),
                dir_id: Some(read.found.id),
                // Identity, instance, document and the directory held from one look.
                dir: read.found.into_held().map(Arc::new),
            })),
            (Ok(None), _) => DirClass::Plain,
            (Err(e), _) | (_, Err(e)) => {
                info!(array = %shown.display(), "array shown as it is, not unsharded: {e}");
                DirClass::Plain
            }
        },
        Ok(Node::Group(group)) => {
            if group.consolidated_entries().is_none() {
                return DirClass::Group(None);
            }
            let (view, refused) = translate_consolidated(&group, |_, a| unsharded_view(a));
            for (path, e) in refused {
                if e != LayoutError::NotSharded {
                    info!(group = %shown.display(), entry = %path,
                        "consolidated entry shown as it is, not unsharded: {e}");
                }
            }
            if view == group {
                return DirClass::Group(None);
            }
            DirClass::Group(Some(Arc::new(GroupView {
                json: Bytes::from(Node::Group(view).to_json_bytes()),
                mtime: read.mtime,
            })))
        }
    }
}
