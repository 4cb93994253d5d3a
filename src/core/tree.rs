//! The tree: where the mount keeps what is not a shard (directories, `zarr.json`
//! documents, other files). Either a BACKING directory, or, for an object store, a local
//! mirror of the store's tree whose every change is published to the store first (the
//! store is the truth; `store::mirror`). The core asks this part what the tree allows and
//! has it write and remove whole files; it never asks which kind of tree it is.
//!
//! Owns: the publishing side of an object-store mount. Called by the core's request
//! handlers (creating, writing out, removing, renaming, opening documents).

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;

use super::error::FsError;
use super::refusal::Rule;
use crate::backing::{Backing, FileOwner};
use crate::store::mirror::Published;

#[derive(Debug)]
pub(crate) struct Tree {
    backing: Backing,
    /// For an object store: where changes to the mirror are published.
    published: Option<Arc<Published>>,
}

impl Tree {
    /// A tree that is BACKING itself.
    pub(crate) fn local(backing: Backing) -> Tree {
        Tree {
            backing,
            published: None,
        }
    }

    /// The same tree, now a mirror of an object store whose changes go to `published`.
    pub(crate) fn mirroring(self, published: Arc<Published>) -> Tree {
        Tree {
            published: Some(published),
            ..self
        }
    }

    /// Writes a whole file (atomically; `durable` syncs it and its name), in the store
    /// first when the tree mirrors one: a failure there fails the write (`made`: when the
    /// content was made, `Published::put`). Returns the file written, open.
    pub(crate) fn write_whole(
        &self,
        rel: &Path,
        parts: &[Bytes],
        durable: bool,
        owner: Option<FileOwner>,
        made: Option<u64>,
    ) -> Result<std::fs::File, FsError> {
        if let Some(published) = &self.published {
            published
                .put(&self.backing, rel, parts, made)
                .map_err(std::io::Error::from)?;
        }
        let (_, file) = self.backing.write_atomic(rel, parts, durable, owner)?;
        Ok(file)
    }

    /// Removes a file (from the store first, when mirrored). Returns whether it was there.
    pub(crate) fn remove_whole(&self, rel: &Path) -> Result<bool, FsError> {
        if let Some(published) = &self.published {
            published
                .delete(&self.backing, rel)
                .map_err(std::io::Error::from)?;
        }
        Ok(self.backing.remove_file(rel)?)
    }

    /// Whether files are changed in place, by descriptor (a directory); an object store
    /// takes whole objects only, so a new or opened file is held in memory and written
    /// out whole.
    pub(crate) fn changes_in_place(&self) -> bool {
        self.published.is_none()
    }

    /// Whether another node may change what is stored between two opens (an object
    /// store shared by nodes): reads then bypass the kernel's page cache.
    pub(crate) fn shared_by_nodes(&self) -> bool {
        self.published.is_some()
    }

    /// Refuses, where the tree takes no change in place, the change `what` asked of `rel`
    /// (a link, a special file: nothing an object store can hold).
    pub(crate) fn may_change_in_place(&self, rel: &Path, what: &str) -> Result<(), FsError> {
        match self.changes_in_place() {
            true => Ok(()),
            false => Err(FsError::refused(rel, Rule::ObjectStoreInPlaceChange, what)),
        }
    }

    /// On an object store, the document `rel` about to be opened is first compared with
    /// the store's (at most once a second; `Published::revalidate`): another node may
    /// have changed or removed it. Returns whether the mirror took another version.
    pub(crate) fn revalidate_document(&self, rel: &Path) -> bool {
        match &self.published {
            Some(published) => published.revalidate(&self.backing, rel),
            None => false,
        }
    }
}
