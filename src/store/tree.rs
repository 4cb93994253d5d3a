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

/// An object store's tree, mirrored in `local` (the mount's cache), its changes published.
#[derive(Debug)]
pub struct Mirror {
    pub local: Backing,
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
        self.published.put(&self.local, rel, parts, made)?;
        Ok(self.local.write_atomic(rel, parts, durable, owner)?.1)
    }

    fn remove_whole(&self, rel: &Path) -> io::Result<bool> {
        self.published.delete(&self.local, rel)?;
        self.local.remove_file(rel)
    }

    fn changes_in_place(&self) -> bool {
        false
    }

    fn shared_by_nodes(&self) -> bool {
        true
    }

    fn revalidate_document(&self, rel: &Path) -> bool {
        self.published.revalidate(&self.local, rel)
    }
}
