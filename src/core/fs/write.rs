//! Writing: data into chunk files and temporary files (held in memory) or BACKING files;
//! FLUSH, where a chunk's content becomes final and its shard may be complete; fsync, where
//! pending data is made durable; truncation and other attribute changes.

use crate::core::refusal::Rule;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::ShardFs;
use crate::backing::AttrChange;
use crate::core::array::ArrayState;
use crate::core::error::FsError;
use crate::core::pending::memfile::{MAX_METADATA_BYTES, MemFile};
use crate::core::shards::{ChunkData, WriteMode};
use crate::core::view::attr::Attr;
use crate::core::view::handle::Handle;
use crate::core::view::inode::{Ino, NodeInfo, NodeKind};
use crate::limits::MAX_FILE_BYTES;
use crate::zarr::{KeyNode, METADATA_FILE};

/// Attribute changes asked for by `setattr`.
#[derive(Clone, Debug, Default)]
pub struct SetAttr {
    pub change: AttrChange,
    pub fh: Option<u64>,
    /// Who asks (`Backing::change_attrs` checks them against the file found).
    pub by: crate::backing::Asker,
}

/// A truncation of what the mount shows translated (a document, a key directory, the
/// control file) is refused: it has no content of its own to cut.
fn refuse_truncation(rel: &Path, set: &SetAttr) -> Result<(), FsError> {
    match set.change.size {
        Some(_) => Err(FsError::refused(
            rel,
            Rule::TruncateTranslated,
            "a truncation of a document the mount translates",
        )),
        None => Ok(()),
    }
}

/// Applies `set` to an open BACKING file.
fn set_file_attr(file: &std::fs::File, set: &SetAttr) -> Result<(), FsError> {
    if let Some(size) = set.change.size {
        file.set_len(size)?;
    }
    if let Some(mode) = set.change.mode {
        let mode = mode & 0o7777;
        rustix::fs::fchmod(file, rustix::fs::Mode::from_raw_mode(mode))
            .map_err(std::io::Error::from)?;
    }
    if set.change.uid.is_some() || set.change.gid.is_some() {
        let uid = set.change.uid.map(rustix::fs::Uid::from_raw);
        let gid = set.change.gid.map(rustix::fs::Gid::from_raw);
        rustix::fs::fchown(file, uid, gid).map_err(std::io::Error::from)?;
    }
    if set.change.atime.is_some() || set.change.mtime.is_some() {
        let mut times = std::fs::FileTimes::new();
        if let Some(t) = set.change.atime {
            times = times.set_accessed(t);
        }
        if let Some(t) = set.change.mtime {
            times = times.set_modified(t);
        }
        file.set_times(times)?;
    }
    Ok(())
}

/// Refuses a file end past what a file in memory may hold (or past any number):
/// `MAX_FILE_BYTES`, or `MAX_METADATA_BYTES` for a `zarr.json`.
fn check_size(info: &crate::core::NodeInfo, end: Option<u64>) -> Result<(), FsError> {
    let rel = &info.rel;
    // A chunk of an array the mount compresses holds no more than its raw size: one of
    // more could be written, and never read back (`transparent::Zstd::max`).
    let (limit, what) = match &info.kind {
        _ if rel.file_name() == Some(METADATA_FILE.as_ref()) => (MAX_METADATA_BYTES, ""),
        NodeKind::Chunk { array, .. } if let Some(z) = array.zstd => (
            z.max,
            " (what a chunk of this array holds: its mount compresses it, and a chunk \
             can hold no more than its shape times its data type's size)",
        ),
        _ => (MAX_FILE_BYTES, ""),
    };
    match end {
        Some(end) if end <= limit => Ok(()),
        _ => Err(FsError::refused(
            rel,
            Rule::TooBig,
            match end {
                Some(end) => format!("an end at byte {end}, past the limit of {limit} bytes{what}"),
                None => format!("an end past any offset, the limit being {limit} bytes{what}"),
            },
        )),
    }
}

impl ShardFs {
    /// Counts `delta` bytes for `file` when it is held by a name (not an orphan).
    pub(crate) fn charge_temp(&self, file: &Arc<MemFile>, delta: i64) {
        if delta != 0 && self.temps.holds(file) {
            self.shards.charge(delta);
        }
    }

    /// The in-memory file that writes to inode `info` go to, made if needed.
    pub(crate) fn write_target(&self, kind: &NodeKind) -> Result<Option<Arc<MemFile>>, FsError> {
        Ok(match kind {
            NodeKind::Temp(file) => {
                // A temporary name's content is in no shard: a retirement it carries is
                // from the chunk it was renamed from (`MemFile::unretire`).
                file.unretire();
                Some(file.clone())
            }
            NodeKind::Chunk { array, coords } => {
                Some(
                    self.shards
                        .open_for_write(&self.backing, array, coords, false)?,
                )
            }
            _ => None,
        })
    }

    /// Writes `data` at `offset`. Data for chunk and temporary files is copied once, from
    /// the request into a `Bytes` segment, and kept as that segment until its shard is
    /// written.
    pub fn write(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        // Room first: a writer over the memory limit waits here, or gets the error that
        // keeps the backing store from taking what is pending.
        self.relieve_memory()?;
        let written = {
            let _gate = self.gate.shared();
            self.write_gated(fh, offset, data)?
        };
        // And after: what this write added is relieved now, not at the next one.
        let _ = self.relieve_memory();
        Ok(written)
    }

    fn write_gated(&self, fh: u64, offset: u64, data: &[u8]) -> Result<u32, FsError> {
        let handle = self.handles.file(fh)?;
        let Handle::File(h) = handle.as_ref() else {
            return Err(FsError::IsDir);
        };
        if !h.writable {
            return Err(FsError::BadHandle);
        }
        let info = self.node(h.ino)?;
        // The data belongs to the inode: a BACKING file renamed into an array (now held in
        // memory) is written there, not to the file the handle opened.
        if let Some(file) = h.file()
            && matches!(info.kind, NodeKind::File)
        {
            file.write_all_at(data, offset)?;
            return Ok(data.len() as u32);
        }
        if matches!(info.kind, NodeKind::File) && h.as_chunk.load(Ordering::Relaxed) {
            // Its array is gone; whatever is at its path now is not this file.
            return Err(FsError::NotFound);
        }
        if matches!(info.kind, NodeKind::File) {
            // Never by its path: whatever is there now may be someone else's file.
            return Err(FsError::Stale);
        }
        // One open writes one array: the array at the path now, if another directory was
        // put there since the open checked the writer's permission, is not this one. A
        // file renamed into another array (by a caller who could write both) goes with
        // its writes, as on any file system.
        if let (NodeKind::Chunk { array, .. }, Some(opened)) = (&info.kind, h.array.get())
            && opened.rel == array.rel
            && !opened.same_directory(array)
        {
            return Err(FsError::Stale);
        }
        check_size(&info, offset.checked_add(data.len() as u64))?;
        self.inodes.changed_here(h.ino);
        let segment = Bytes::copy_from_slice(data);
        self.change_file(Some(h), &info.kind, |d| d.write(offset, segment.clone()))?;
        Ok(data.len() as u32)
    }

    /// Applies `f` to the in-memory file that inode `kind` writes to, as a change made
    /// through handle `h` (if any). A pending chunk can be retired (written into its shard)
    /// between finding it and changing it: it is then found again, made anew from the
    /// shard, and `f` applied to that.
    fn change_file(
        &self,
        h: Option<&crate::core::view::handle::FileHandle>,
        kind: &NodeKind,
        f: impl Fn(&mut crate::core::pending::memfile::FileData),
    ) -> Result<(), FsError> {
        for _ in 0..8 {
            let Some(target) = self.write_target(kind)? else {
                return Err(FsError::BadHandle);
            };
            if let Some(h) = h {
                h.mark_dirty(&target);
            }
            let Some(delta) = target.change(&f) else {
                continue;
            };
            match kind {
                NodeKind::Chunk { .. } => self.shards.charge(delta),
                _ => self.charge_temp(&target, delta),
            }
            return Ok(());
        }
        Err(FsError::Changed)
    }

    /// FLUSH, sent at every close: the content this handle wrote is final. A chunk whose
    /// writers are all done may complete its shard, which is then written before the close
    /// returns (so that the writer sees a failure); a `zarr.json` is committed.
    pub fn flush(&self, fh: u64) -> Result<(), FsError> {
        self.flush_handle(fh, false)
    }

    /// FLUSH, or with `last` the RELEASE of the handle's last close.
    fn flush_handle(&self, fh: u64, last: bool) -> Result<(), FsError> {
        let handle = self.handles.file(fh)?;
        let Handle::File(h) = handle.as_ref() else {
            return Ok(());
        };
        let Some(file) = h.take_dirty() else {
            return Ok(());
        };
        if !file.settled() {
            return Ok(());
        }
        let info = self.node(h.ino)?;
        match &info.kind {
            NodeKind::Chunk { array, coords } => {
                self.shards.settle(&self.backing, array, coords)?;
                self.complete_if_ready(array, coords, true)
            }
            NodeKind::Temp(f)
                if !info.detached && info.rel.file_name() == Some(METADATA_FILE.as_ref()) =>
            {
                // Empty is an interim state, not a document: a shell's `>` truncates and
                // closes a duplicate before anything is written. It is judged when content
                // arrives, or at the last close.
                if f.is_empty() && !last {
                    h.mark_dirty(f);
                    return Ok(());
                }
                self.commit_held_document(&info, f)
            }
            _ => Ok(()),
        }
    }

    /// A `zarr.json` held in memory, written at its close: committed as the array's or
    /// group's metadata. Stored or refused, the document leaves memory (a refused one is
    /// the writer's to fix, told by the error of this close, as is one another node
    /// replaced since this mount read it); one that could not be written stays, for a
    /// retry.
    fn commit_held_document(&self, info: &NodeInfo, f: &Arc<MemFile>) -> Result<(), FsError> {
        let _gate = self.gate.exclusive();
        self.still_where_made(f)?;
        let content = f.snapshot().data;
        let bytes: Vec<u8> = content.read(0, content.len());
        let dir = info.rel.parent().unwrap_or(Path::new("")).to_path_buf();
        let committed = self.commit_metadata(&dir, &bytes, Some(f.with(|s| s.changed)));
        if let Err(e) = committed {
            if matches!(&e, FsError::Refused(r) if r.rule == Rule::InvalidArrayMetadata)
                || e.lost_to_another_node()
            {
                self.drop_temp_if(&info.rel, f);
                // The name shows what it held before (a document kept), or nothing.
                match self.resolve_path(&info.rel) {
                    Ok(kind) => {
                        self.inodes.rekind_file(f, kind);
                    }
                    Err(_) => {
                        self.inodes.detach(info.parent, &info.name, None);
                    }
                }
            }
            return Err(e);
        }
        // Only this document: a newer one may have taken the name meanwhile.
        self.drop_temp_if(&info.rel, f);
        self.inodes.rekind_file(f, self.resolve_path(&info.rel)?);
        Ok(())
    }

    /// RELEASE: the last close of a handle. A handle that wrote and was never flushed (the
    /// kernel skips FLUSH in some paths) is flushed now.
    pub fn release(&self, fh: u64) -> Result<(), FsError> {
        let dirty = match self.handles.get(fh)?.as_ref() {
            Handle::File(f) => crate::sync::lock(&f.dirty).is_some(),
            Handle::Dir(_) => false,
        };
        let result = if dirty {
            self.flush_handle(fh, true)
        } else {
            Ok(())
        };
        self.handles.remove(fh);
        result
    }

    /// Writes the shard holding `coords` when it is complete, durably (with its directory).
    /// With `sticky`, a failure of an earlier write of that shard is reported too (at
    /// close: the writer learns that its data is not in BACKING yet).
    pub(crate) fn complete_if_ready(
        &self,
        array: &Arc<ArrayState>,
        coords: &[u64],
        sticky: bool,
    ) -> Result<(), FsError> {
        let shard = array.layout.locate(coords).shard;
        if self.shards.ready(&self.backing, array, &shard)? {
            return self
                .shards
                .write_shard(&self.backing, array, &shard, WriteMode::Complete);
        }
        match self.shards.failure(array, &shard) {
            Some(f) if sticky => Err(FsError::Failed(f.message, f.errno)),
            _ => Ok(()),
        }
    }

    /// fsync of a file: its data is made durable. For a chunk, its shard is written now,
    /// merged over the shard file, and synced with its directory.
    pub fn fsync(&self, ino: Ino, fh: Option<u64>) -> Result<(), FsError> {
        let info = self.node(ino)?;
        match &info.kind {
            NodeKind::Chunk { array, coords } => self.fsync_chunk(array, coords),
            // A zarr.json being written: fsync commits it, once it is a document.
            NodeKind::Temp(f)
                if !info.detached && info.rel.file_name() == Some(METADATA_FILE.as_ref()) =>
            {
                self.fsync_document(&info.rel, f, fh)
            }
            // A lock file (tensorstore's `KEY.__lock`) is only ever a step towards a rename;
            // its durability comes with the chunk it becomes, by the fsync of that chunk or
            // of its directory (its name is not durable before either). That fsync must
            // include it even while it is still open: tensorstore renames, fsyncs the
            // directory, and closes last. An unlinked file has no name to be durable at.
            NodeKind::Temp(f) if info.detached || super::flush::is_lock_name(&info.rel) => {
                f.with(|s| s.fsynced = true);
                Ok(())
            }
            // Any other file held in memory is written to BACKING, synced: fsync means it.
            NodeKind::Temp(f) => {
                f.with(|s| s.fsynced = true);
                self.persist_temp_if_there(&info.rel, f, true)
            }
            NodeKind::File => {
                if let Some(Ok(h)) = fh.map(|fh| self.handles.get(fh))
                    && let Handle::File(f) = h.as_ref()
                    && let Some(file) = f.backing_file()
                {
                    file.sync_all()?;
                    return Ok(());
                }
                self.backing.open(&info.rel)?.sync_all()?;
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// fsync of a `zarr.json` being written: committed when it is a Zarr document; anything
    /// else (half written, say) is written to BACKING as it is, synced, and still judged
    /// when complete (its last close), never taken for its final form now.
    fn fsync_document(&self, rel: &Path, f: &Arc<MemFile>, fh: Option<u64>) -> Result<(), FsError> {
        let data = f.snapshot().data;
        let bytes = data.read(0, data.len());
        if crate::zarr::Node::parse(&bytes).is_ok() {
            return match fh {
                Some(fh) => self.flush(fh),
                None => Ok(()),
            };
        }
        let _gate = self.gate.exclusive();
        let dir = rel.parent().unwrap_or(Path::new(""));
        if self.holds_zarr_document(&dir.join(METADATA_FILE))? {
            // An array's document is never replaced by an incomplete one: it is judged
            // (and refused, if still not one) at its close.
            return Err(FsError::refused(
                rel,
                Rule::InvalidArrayMetadata,
                "an fsync of an incomplete document; the document stays as it was",
            ));
        }
        self.tree
            .write_whole(
                rel,
                &[Bytes::from(bytes)],
                true,
                self.held_maker(rel),
                Some(f.with(|s| s.changed)),
            )
            .map(drop)
            .map_err(FsError::from)
    }

    /// fsync of a directory: every pending chunk below it is made durable, and so is every
    /// file held in memory in it that its writer closed or fsynced (its name is what the
    /// directory's fsync makes durable; a chunk renamed onto such a name brought its
    /// content along).
    pub fn fsyncdir(&self, ino: Ino) -> Result<(), FsError> {
        let info = self.node(ino)?;
        for (name, file) in self.temps.files_in(&info.rel) {
            let rel = info.rel.join(&name);
            if name != METADATA_FILE
                && !super::flush::is_lock_name(&rel)
                && file.durable_on_request()
            {
                self.persist_temp_if_there(&rel, &file, true)?;
            }
        }
        match &info.kind {
            NodeKind::ArrayDir(array) => self.fsync_below(array, &KeyNode::Root),
            NodeKind::ChunkDir { array, node } => self.fsync_below(array, node),
            NodeKind::Dir => {
                self.backing.sync_dir(&info.rel)?;
                Ok(())
            }
            _ => Err(FsError::NotDir),
        }
    }

    pub fn setattr(&self, ino: Ino, set: &SetAttr) -> Result<Attr, FsError> {
        let _gate = self.gate.shared();
        let info = self.node(ino)?;
        match &info.kind {
            NodeKind::File
            | NodeKind::Dir
            | NodeKind::ArrayDir(_)
            | NodeKind::Symlink
            | NodeKind::Other
                if info.detached =>
            {
                // Unlinked while open: changed through its descriptor, never by a path.
                let file = self.handles.backing_file_of(ino).ok_or(FsError::Stale)?;
                set_file_attr(&file, set)?;
            }
            NodeKind::File
            | NodeKind::Dir
            | NodeKind::ArrayDir(_)
            | NodeKind::Symlink
            | NodeKind::Other => self.set_backing_attr(&info.rel, set)?,
            NodeKind::Temp(_) => self.set_held_attr(&info, set)?,
            NodeKind::Chunk { array, .. } => {
                self.same_owner(ino, &info.rel, set, Rule::ChunkOwnership)?;
                if set.change.size.is_some() {
                    // A truncation writes the chunk: checked as an open to write is.
                    self.may_write_array(array, super::namespace::Caller::asking(set.by))?;
                }
                self.set_held_attr(&info, set)?;
            }
            // A translated document is BACKING's file, shown with another content.
            NodeKind::ArrayMeta(_) | NodeKind::GroupMeta(_) => {
                refuse_truncation(&info.rel, set)?;
                if set.change.mode.is_some() || set.change.uid.is_some() || set.change.gid.is_some()
                {
                    self.may_change_in_place(&info.rel, "a change of owner or mode")?;
                }
                self.set_backing_attr(&info.rel, set)?;
            }
            NodeKind::ChunkDir { .. } => {
                refuse_truncation(&info.rel, set)?;
                self.same_owner(ino, &info.rel, set, Rule::ChunkOwnership)?;
            }
            NodeKind::Control => {
                refuse_truncation(&info.rel, set)?;
                self.same_owner(ino, &info.rel, set, Rule::ShardfsOwnFile)?;
            }
        }
        self.getattr(ino)
    }

    /// For `ino`, shown with the owner and mode of something else (a chunk: its array's):
    /// a chmod that would take a permission away is refused, since its maker would believe
    /// the file closed to others when it is not. One that takes none away changes nothing
    /// and is accepted, as is a chown: `tar -x` and `cp -a` set each file's mode and owner
    /// as they go, before the directory's own, and the array directory is what they end
    /// up setting.
    fn same_owner(&self, ino: Ino, rel: &Path, set: &SetAttr, rule: Rule) -> Result<(), FsError> {
        let now = self.getattr(ino)?;
        let narrows = set
            .change
            .mode
            .is_some_and(|m| now.perm as u32 & !m & 0o777 != 0);
        if narrows {
            return Err(FsError::refused(
                rel,
                rule,
                format!(
                    "a chmod to {:o} that would take permissions away from {:o}",
                    set.change.mode.unwrap_or(0) & 0o7777,
                    now.perm
                ),
            ));
        }
        Ok(())
    }

    /// Applies `set` to a file held in memory (a chunk or a temporary file): its size, and
    /// the permissions and times it reports.
    fn set_held_attr(&self, info: &crate::core::NodeInfo, set: &SetAttr) -> Result<(), FsError> {
        if let Some(size) = set.change.size {
            check_size(info, Some(size))?;
            if size == 0
                && let NodeKind::Chunk { array, coords } = &info.kind
            {
                // Truncation to nothing needs nothing of the stored chunk.
                self.shards
                    .open_for_write(&self.backing, array, coords, true)?;
            }
            self.inodes.changed_here(info.ino);
            // A truncation through an open handle counts as that handle's write.
            let handle = set.fh.and_then(|fh| self.handles.get(fh).ok());
            let writer = match handle.as_deref() {
                Some(Handle::File(f)) if f.writable => Some(&**f),
                _ => None,
            };
            self.change_file(writer, &info.kind, |d| d.truncate(size))?;
        }
        // Permissions and times of files in memory: kept for what they report.
        let file = match &info.kind {
            NodeKind::Temp(f) => Some(f.clone()),
            NodeKind::Chunk { array, coords } => {
                match self.shards.chunk(&self.backing, array, coords)? {
                    ChunkData::Pending(f) => Some(f),
                    _ => None,
                }
            }
            _ => None,
        };
        if let Some(f) = file {
            f.with(|s| {
                // A file's owner and mode go with it to BACKING (`MemFile::maker`); a
                // chunk's are its array's and stay (checked by `same_owner`).
                if let Some((uid, gid)) = s.owner.as_mut() {
                    if let Some(mode) = set.change.mode {
                        s.mode = mode & 0o7777;
                    }
                    *uid = set.change.uid.unwrap_or(*uid);
                    *gid = set.change.gid.unwrap_or(*gid);
                }
                if let Some(t) = set.change.mtime {
                    s.mtime = t;
                }
            });
        }
        Ok(())
    }

    /// Applies `set` to the BACKING file at `rel` itself: a symbolic link's own times and
    /// owner, never its target's. Through the caller's descriptor when it gave one (the
    /// file it opened); else on the inode at the path, the caller's permission checked
    /// against that inode (`Backing::change_attrs`: the kernel checked a cached view).
    fn set_backing_attr(&self, rel: &Path, set: &SetAttr) -> Result<(), FsError> {
        if set.change.size.is_some() {
            self.may_change_in_place(rel, "a truncation")?;
        }
        let opened = set.fh.and_then(|fh| self.handles.get(fh).ok());
        let file = opened.as_deref().and_then(|h| match h {
            Handle::File(f) => f.file().and_then(|f| f.try_clone().ok()),
            _ => None,
        });
        if let Some(file) = file {
            return set_file_attr(&file, set);
        }
        let change = AttrChange {
            mode: set.change.mode.map(|m| m & 0o7777),
            ..set.change
        };
        self.backing.change_attrs(rel, set.by, &change)?;
        Ok(())
    }

    /// What the name at `rel` is now, resolved name by name from the root without
    /// touching the inode table (for an inode whose file just moved).
    pub(crate) fn resolve_path(&self, rel: &Path) -> Result<NodeKind, FsError> {
        let mut info = self.node(crate::core::ROOT)?;
        for part in rel.components() {
            let name = part.as_os_str();
            let kind = self.resolve(&info, name)?;
            info = crate::core::view::inode::NodeInfo {
                ino: 0,
                rel: crate::backing::join_rel(&info.rel, name),
                kind,
                detached: false,
                parent: info.ino,
                name: name.to_os_string(),
                outdated: false,
            };
        }
        Ok(info.kind)
    }
}
