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
    LayoutError, METADATA_FILE, Node, ShardLayout, shown_view, translate_consolidated,
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
        Ok(Node::Array(meta)) => match (ShardLayout::of(&meta), shown_view(&meta)) {
            (Ok(Some(layout)), Ok(view)) => DirClass::ShardedArray(Arc::new(ArrayState {
                rel: dir.to_path_buf(),
                zstd: crate::zarr::transparent::of_stored(&meta),
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
            let (view, refused) = translate_consolidated(&group, |_, a| shown_view(a));
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

#[cfg(test)]
mod tests {
    //! What a directory is, without FUSE: read from its document, cached until the
    //! document or the directory changes.

    use super::*;

    const SHARDED: &str = crate::core::testing::FOUR_BYTES_TWO_PER_SHARD;
    const UNSHARDED: &str = r#"{"zarr_format":3,"node_type":"array","shape":[4],"data_type":"uint8",
      "chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2]}},
      "chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
      "fill_value":0,"codecs":[{"name":"bytes"}]}"#;
    const GROUP: &str = r#"{"zarr_format":3,"node_type":"group","attributes":{}}"#;

    fn backing_with(docs: &[(&str, &[u8])]) -> (tempfile::TempDir, Backing) {
        let dir = tempfile::tempdir().unwrap();
        for (name, doc) in docs {
            std::fs::create_dir_all(dir.path().join(name)).unwrap();
            std::fs::write(dir.path().join(name).join(METADATA_FILE), doc).unwrap();
        }
        std::fs::create_dir(dir.path().join("plain")).unwrap();
        let backing = Backing::new(dir.path().to_path_buf()).unwrap();
        (dir, backing)
    }

    fn array(c: &Classifier, b: &Backing, dir: &str) -> Option<Arc<ArrayState>> {
        match c.classify(b, Path::new(dir)).unwrap() {
            DirClass::ShardedArray(a) => Some(a),
            _ => None,
        }
    }

    #[test]
    fn each_kind_of_directory_is_told_by_its_document() {
        let (_d, b) = backing_with(&[
            ("s", SHARDED.as_bytes()),
            ("u", UNSHARDED.as_bytes()),
            ("g", GROUP.as_bytes()),
            ("bad", b"{ not json"),
        ]);
        let c = Classifier::default();
        let s = array(&c, &b, "s").expect("a sharded array");
        assert_eq!(s.chunk_rel(&[3]), Path::new("s/c/3"));
        assert_eq!(s.shard_rel(&[1]), Path::new("s/c/1"));
        for plain in ["u", "bad", "plain"] {
            assert!(
                matches!(c.classify(&b, Path::new(plain)).unwrap(), DirClass::Plain),
                "{plain}"
            );
        }
        assert!(matches!(
            c.classify(&b, Path::new("g")).unwrap(),
            DirClass::Group(None)
        ));
        assert!(matches!(
            c.classify(&b, Path::new("missing")).unwrap(),
            DirClass::Plain
        ));
    }

    #[test]
    fn a_changed_document_is_read_again_and_an_unchanged_one_is_not() {
        let (d, b) = backing_with(&[("s", SHARDED.as_bytes())]);
        let c = Classifier::default();
        let first = array(&c, &b, "s").unwrap();
        let again = array(&c, &b, "s").unwrap();
        assert!(Arc::ptr_eq(&first, &again), "answered from the cache");
        std::fs::write(d.path().join("s").join(METADATA_FILE), UNSHARDED).unwrap();
        assert!(
            array(&c, &b, "s").is_none(),
            "rewritten unsharded: shown as it is"
        );
        std::fs::write(d.path().join("s").join(METADATA_FILE), SHARDED).unwrap();
        assert!(array(&c, &b, "s").is_some());
    }

    #[test]
    fn a_directory_made_anew_with_the_same_document_is_another_array() {
        let (d, b) = backing_with(&[("s", SHARDED.as_bytes())]);
        let c = Classifier::default();
        let old = array(&c, &b, "s").unwrap();
        // The same document, moved into a new directory at the same path.
        let doc = d.path().join("s").join(METADATA_FILE);
        std::fs::rename(&doc, d.path().join("doc")).unwrap();
        std::fs::remove_dir(d.path().join("s")).unwrap();
        std::fs::create_dir(d.path().join("s")).unwrap();
        std::fs::rename(d.path().join("doc"), &doc).unwrap();
        let new = array(&c, &b, "s").unwrap();
        assert!(!Arc::ptr_eq(&old, &new));
        assert!(!new.same_directory(&old));
    }

    #[test]
    fn an_array_shown_as_written_is_plain_until_shown_translated_again() {
        let (_d, b) = backing_with(&[("s", SHARDED.as_bytes())]);
        let c = Classifier::default();
        c.show_as_written(Path::new("s"), true);
        assert!(array(&c, &b, "s").is_none());
        c.show_as_written(Path::new("s"), false);
        assert!(array(&c, &b, "s").is_some());
    }

    #[test]
    fn a_document_too_large_to_be_metadata_is_shown_as_it_is() {
        let (d, b) = backing_with(&[("s", SHARDED.as_bytes())]);
        let f = std::fs::File::options()
            .append(true)
            .open(d.path().join("s").join(METADATA_FILE))
            .unwrap();
        f.set_len(crate::core::pending::memfile::MAX_METADATA_BYTES + 1)
            .unwrap();
        let c = Classifier::default();
        assert!(matches!(
            c.classify(&b, Path::new("s")).unwrap(),
            DirClass::Plain
        ));
    }
}
