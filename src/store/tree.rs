//! The tree: what a mount keeps outside its shards (directories, `zarr.json` documents,
//! other files), behind one interface with two implementations. `Local` is a BACKING
//! directory itself. `Mirror` is an object store's tree mirrored in a local directory
//! (`mirror`): every change is published to the store first (the store is the truth, and
//! a failure there fails the change), and a document is compared with the store's before
//! it is opened. The core asks the tree what it allows and has it write and remove whole
//! files; it never asks which kind it is.

use std::fs::File;
use std::io;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::mirror::Published;
use crate::backing::{Backing, FileOwner};

pub trait Tree: Send + Sync + std::fmt::Debug {
    /// Writes a whole file atomically (`durable`: synced, with its name), made by `owner`
    /// when given; `made`: when its content was made (`Published::put` refuses a content
    /// older than a version the mount took from another node). Returns the file, open.
    fn write_whole(
        &self,
        rel: &Path,
        parts: &[Bytes],
        durable: bool,
        owner: Option<FileOwner>,
        made: Option<u64>,
    ) -> io::Result<File>;

    /// Removes a file. Returns whether it was there.
    fn remove_whole(&self, rel: &Path) -> io::Result<bool>;

    /// Whether files are changed in place, by descriptor: false where the tree takes whole
    /// objects only (a new or opened file is then held in memory and written out whole;
    /// no link, special file or directory rename).
    fn changes_in_place(&self) -> bool;

    /// Whether another node may change what is stored between two opens: reads then
    /// bypass the kernel's page cache.
    fn shared_by_nodes(&self) -> bool;

    /// Compares the document `rel` about to be opened with the truth (at most once a
    /// second); returns whether the local copy became another version.
    fn revalidate_document(&self, rel: &Path) -> bool;
}

/// A BACKING directory as the tree.
#[derive(Debug)]
pub struct Local(pub Backing);

impl Tree for Local {
    fn write_whole(
        &self,
        rel: &Path,
        parts: &[Bytes],
        durable: bool,
        owner: Option<FileOwner>,
        _made: Option<u64>,
    ) -> io::Result<File> {
        Ok(self.0.write_atomic(rel, parts, durable, owner)?.1)
    }

    fn remove_whole(&self, rel: &Path) -> io::Result<bool> {
        self.0.remove_file(rel)
    }

    fn changes_in_place(&self) -> bool {
        true
    }

    fn shared_by_nodes(&self) -> bool {
        false
    }

    fn revalidate_document(&self, _rel: &Path) -> bool {
        false
    }
}

/// An object store's tree, mirrored in `local` (the mount's cache), its changes published
/// first and then made locally as a `Local` tree makes them.
#[derive(Debug)]
pub struct Mirror {
    pub local: Local,
    pub published: Arc<Published>,
}

impl Tree for Mirror {
    fn write_whole(
        &self,
        rel: &Path,
        parts: &[Bytes],
        durable: bool,
        owner: Option<FileOwner>,
        made: Option<u64>,
    ) -> io::Result<File> {
        self.published.put(&self.local.0, rel, parts, made)?;
        self.local.write_whole(rel, parts, durable, owner, made)
    }

    fn remove_whole(&self, rel: &Path) -> io::Result<bool> {
        self.published.delete(&self.local.0, rel)?;
        self.local.remove_whole(rel)
    }

    fn changes_in_place(&self) -> bool {
        false
    }

    fn shared_by_nodes(&self) -> bool {
        true
    }

    fn revalidate_document(&self, rel: &Path) -> bool {
        self.published.revalidate(&self.local.0, rel)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::Store;

    fn dirs() -> (tempfile::TempDir, Backing, Backing) {
        let d = tempfile::tempdir().unwrap();
        let (local, store) = (d.path().join("local"), d.path().join("store"));
        std::fs::create_dir_all(&local).unwrap();
        std::fs::create_dir_all(&store).unwrap();
        (
            d,
            Backing::new(local).unwrap(),
            Backing::new(store).unwrap(),
        )
    }

    fn mirror(local: &Backing, store: &Backing) -> Mirror {
        let store: Arc<dyn Store> = Arc::new(store.clone());
        Mirror {
            local: Local(local.clone()),
            published: Arc::new(Published::new(store, Default::default())),
        }
    }

    fn read(b: &Backing, rel: &str) -> Option<Vec<u8>> {
        std::fs::read(b.root().join(rel)).ok()
    }

    #[test]
    fn a_local_tree_writes_and_removes_in_backing_and_allows_changes_in_place() {
        let (_d, local, _) = dirs();
        let tree = Local(local.clone());
        tree.write_whole(
            Path::new("a/zarr.json"),
            &[Bytes::from_static(b"{}")],
            true,
            None,
            None,
        )
        .unwrap();
        assert_eq!(read(&local, "a/zarr.json").as_deref(), Some(&b"{}"[..]));
        assert!(tree.remove_whole(Path::new("a/zarr.json")).unwrap());
        assert!(!tree.remove_whole(Path::new("a/zarr.json")).unwrap());
        assert!(tree.changes_in_place() && !tree.shared_by_nodes());
        assert!(!tree.revalidate_document(Path::new("a/zarr.json")));
    }

    /// The store is the truth: a write goes there first, and one the store refuses (a
    /// newer version another node put there) changes nothing locally and takes the
    /// store's version.
    #[test]
    fn a_mirror_publishes_first_and_never_overwrites_another_nodes_version() {
        let (_d, local, store) = dirs();
        let tree = mirror(&local, &store);
        let doc = Path::new("a/zarr.json");
        tree.write_whole(doc, &[Bytes::from_static(b"mine")], true, None, None)
            .unwrap();
        assert_eq!(read(&store, "a/zarr.json").as_deref(), Some(&b"mine"[..]));
        assert_eq!(read(&local, "a/zarr.json").as_deref(), Some(&b"mine"[..]));
        // Another node replaces it in the store.
        store
            .write_atomic(doc, &[Bytes::from_static(b"theirs!")], true, None)
            .unwrap();
        let lost = tree.write_whole(doc, &[Bytes::from_static(b"mine again")], true, None, None);
        assert!(lost.is_err(), "a write over another node's version");
        assert_eq!(
            read(&store, "a/zarr.json").as_deref(),
            Some(&b"theirs!"[..])
        );
        assert_eq!(
            read(&local, "a/zarr.json").as_deref(),
            Some(&b"theirs!"[..])
        );
        assert!(!tree.changes_in_place() && tree.shared_by_nodes());
    }

    /// A document changed in the store by another node is taken before it is opened; a
    /// removal goes to the store first.
    #[test]
    fn a_mirror_takes_another_nodes_document_and_removes_from_the_store() {
        let (_d, local, store) = dirs();
        let tree = mirror(&local, &store);
        let doc = Path::new("zarr.json");
        tree.write_whole(doc, &[Bytes::from_static(b"v1")], true, None, None)
            .unwrap();
        store
            .write_atomic(doc, &[Bytes::from_static(b"v2, longer")], true, None)
            .unwrap();
        assert!(tree.revalidate_document(doc));
        assert_eq!(
            read(&local, "zarr.json").as_deref(),
            Some(&b"v2, longer"[..])
        );
        assert!(!tree.revalidate_document(doc), "believed for a second");
        assert!(tree.remove_whole(doc).unwrap());
        assert_eq!(read(&store, "zarr.json"), None);
        assert_eq!(read(&local, "zarr.json"), None);
    }
}
