//! Converting in place (`pack`, `unpack`, `reshard` without DST): an array gets its new
//! layout where it lies, and at every moment it reads correctly in its old layout or its
//! new one; a run killed anywhere (or stopped by a full disk) is finished by running the
//! command again, and nothing is lost.
//!
//! **The rule.** With the default key encoding a shard and a chunk share a key (`c/0/0`),
//! as do shards of two shapes, so the new objects cannot be written where the old ones are
//! while those are still needed. Instead the new objects are first written under keys of
//! the *other* key-encoding family (`0.0` for an array of `c/0/0` keys, `c/0/0` for an
//! array of `0.0` keys; the two families never share a key), and every step is durable
//! before the next begins:
//! 1. **stage**: a state file (`.shardfs-pack.json`: the original document and the target
//!    one) is written, then every new object under the other family's keys; the array
//!    still reads its old objects.
//! 2. **flip**: `zarr.json` is replaced (atomically) by the target metadata naming the
//!    other family: the array now reads the staged objects.
//! 3. **swap**: the old objects are removed, each staged one is copied to its key in the
//!    array's own family, and `zarr.json` is replaced by the target metadata in the
//!    array's own family: the array reads those.
//! 4. **clean**: the staged objects and the state file are removed.
//!
//! A group's consolidated metadata names its arrays' documents, which change meanwhile: it
//! is set aside first (kept in the group's state file, `consolidated_metadata: null` in
//! its document, so readers read each array's own document) and put back last, each entry
//! as its node's document then is.
//!
//! Where a rerun starts is read from `zarr.json` and the state file alone: the original
//! document with a state file (or without: a fresh start) is 1, the target in the other
//! family is 3, the target in its own family with a state file is 4. Each step may be
//! repeated whole. A rerun finishes what the state file names (the conversion, its shards
//! and compression), whichever command runs it, then does what it was asked.

use std::path::Path;

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::pack::{Packer, Progress, Work};
use super::plan::{Goal, plan_pack};
use super::{ConvertError, Options, Summary};
use crate::store::{Precondition, Store};
use crate::sync::lock;
use crate::zarr::{
    ArrayMetadata, ChunkKeyEncoding, GroupMetadata, METADATA_FILE, NamedConfig, Node,
};

/// The state file of an array being packed in place.
pub const STATE_FILE: &str = ".shardfs-pack.json";
/// The key held while a run works on an array (its lock file, `.shardfs-pack.__lock`,
/// exists only meanwhile).
const HOLD_KEY: &str = ".shardfs-pack";

/// What a state file says: an array being packed, or a group whose consolidated metadata
/// is set aside until every array below is packed.
#[derive(Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
enum State {
    Array {
        /// The array's document, as it was.
        original: serde_json::Value,
        /// What it becomes (in its own key family).
        #[serde(default)]
        target: Option<serde_json::Value>,
        /// What it becomes, as the first packs in place wrote it: sharded with these
        /// chunks per shard.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        chunks_per_shard: Option<Vec<u64>>,
        /// `zarr.json` names the staged shards (step 2 done): the original document must
        /// never be put back, the chunks may already be gone.
        #[serde(default)]
        flipped: bool,
    },
    Group {
        /// The group's document, consolidated metadata and all, as it was.
        original: serde_json::Value,
    },
}

/// Converts every array below the top of `store` that the goal concerns where it lies, and
/// finishes any earlier run that was stopped.
pub fn convert_in_place(
    store: &dyn Store,
    opts: &Options,
    progress: Progress,
) -> Result<Summary, ConvertError> {
    // Everything planned and looked at before anything changes (as `pack` does).
    let dry = Options {
        dry_run: true,
        ..opts.clone()
    };
    let planned = Packer::new(store, Some(store), &dry, progress, true);
    walk(&planned, Path::new(""), &mut Vec::new())?;
    if opts.dry_run {
        return Ok(planned.into_summary());
    }
    let packer = Packer::new(store, Some(store), opts, progress, true);
    // The groups whose consolidated metadata this run sets aside stay held until it is
    // put back: another run under them waits, so that none puts it back while another
    // still converts an array it names.
    let mut groups_held = Vec::new();
    walk(&packer, Path::new(""), &mut groups_held)?;
    consolidate_again(&packer)?;
    drop(groups_held);
    Ok(packer.into_summary())
}

/// A key held by this run (`Store::hold`), until dropped.
type Held = Option<Box<dyn std::any::Any>>;

fn walk(p: &Packer, dir: &Path, groups_held: &mut Vec<Held>) -> Result<(), ConvertError> {
    let listing = p.list(dir)?;
    let has = |name: &str| listing.objects.iter().any(|o| o == name);
    let v2 = !has(METADATA_FILE) && (has(super::v2::ZARRAY) || has(super::v2::ZGROUP));
    if v2 && p.opts.goal == Goal::Pack {
        return Err(ConvertError::V2 {
            what: p.src.describe(dir),
            why: "a Zarr v2 tree is packed into a destination, not in place".into(),
        });
    }
    if has(STATE_FILE) && !has(METADATA_FILE) {
        return Err(ConvertError::Interrupted {
            what: p.src.describe(&dir.join(STATE_FILE)),
            why: "the zarr.json beside it is gone since: put it back (the state file holds the original document)".into(),
        });
    }
    if has(METADATA_FILE) {
        match p.node(dir)? {
            Node::Array(_) if p.opts.dry_run => return array(p, dir, &p.node_array(dir)?),
            Node::Array(_) => {
                // One run at a time on an array: another waits, then finds it as this one
                // left it (its document read again under the lock).
                let _held = p
                    .src
                    .hold(&dir.join(HOLD_KEY))
                    .map_err(|e| ConvertError::store(p.src, dir, e))?;
                return array(p, dir, &p.node_array(dir)?);
            }
            Node::Group(group) if p.opts.dry_run => set_aside_consolidated(p, dir, group)?,
            Node::Group(group) if has(STATE_FILE) || group.consolidated_entries().is_some() => {
                // Held first (another run may be putting it back), then read again.
                let held = p
                    .src
                    .hold(&dir.join(HOLD_KEY))
                    .map_err(|e| ConvertError::store(p.src, dir, e))?;
                groups_held.push(held);
                if let Node::Group(group) = p.node(dir)? {
                    set_aside_consolidated(p, dir, group)?;
                }
            }
            Node::Group(_) => {}
        }
    }
    for name in &listing.dirs {
        walk(p, &dir.join(name), groups_held)?;
    }
    Ok(())
}

/// What an array is and becomes: in its own key family and in the other one.
struct Plans {
    original: ArrayMetadata,
    target: ArrayMetadata,
    staging: ArrayMetadata,
    /// From the state file of a run that was stopped (`Some(flipped)`).
    resumed: Option<bool>,
}

/// Where an array's pack in place stands, by its `zarr.json` and its state file.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Step {
    Stage,
    Swap,
    Clean,
}

fn array(p: &Packer, dir: &Path, current: &ArrayMetadata) -> Result<(), ConvertError> {
    let Some(plans) = plans(p, dir, current)? else {
        return Ok(()); // as it should be, and no run of ours to finish
    };
    let step = step_of(p, dir, current, &plans)?;
    if p.opts.dry_run {
        // After the flip the array's own keys hold objects of both layouts: nothing is
        // read there until the swap has cleared them.
        if step == Step::Stage {
            staged_work(p, dir, &plans)?;
        }
        return Ok(());
    }
    if plans.resumed.is_some() {
        lock(&p.summary).resumed += 1;
    }
    let mut guard = None;
    if step == Step::Stage {
        let before = p.versions(dir, &plans.original)?;
        stage(p, dir, &plans)?;
        let mut now = unchanged_since(p, dir, &plans, &before)?;
        let flipped = flip(p, dir, &plans, &now)?;
        put_state(p, &dir.join(STATE_FILE), &plans.state(true))?;
        // A writer that still had the old layout may have written a chunk (or its own
        // document) between the last look and the flip: it would go with the old objects.
        // The flip is undone (unless the writer's document replaced it already).
        let after = p.versions(dir, &plans.original)?;
        let doc_now = after.get(METADATA_FILE).cloned().flatten();
        if after
            .iter()
            .any(|(k, v)| k != METADATA_FILE && now.get(k) != Some(v))
            || doc_now.as_deref() != Some(flipped.as_str())
        {
            if doc_now.as_deref() == Some(flipped.as_str()) {
                put_document(p, dir, &Node::Array(plans.original.clone()))?;
            }
            return Err(rolled_back(p, dir, &plans, 1)?);
        }
        now.insert(METADATA_FILE.to_string(), Some(flipped));
        guard = Some(now);
    }
    if step != Step::Clean {
        swap(p, dir, &plans, guard.as_ref())?;
        let target = Node::Array(plans.target.clone());
        match guard
            .as_ref()
            .and_then(|g| g.get(METADATA_FILE).cloned().flatten())
        {
            // Over the staging document only: a writer's own document is never overwritten.
            Some(tag) => {
                let key = dir.join(METADATA_FILE);
                put_durably_if(p, &key, node_bytes(&target), Precondition::Matches(tag))?;
            }
            None => put_document(p, dir, &target)?,
        }
    }
    clean(p, dir, &plans)?;
    lock(&p.packed).insert(dir.to_path_buf(), plans.target);
    if plans.resumed.is_some() {
        // A stopped run is finished as it began; then comes what this run is asked for
        // (the state file is gone: a fresh start, or nothing to do).
        return array(p, dir, &p.node_array(dir)?);
    }
    Ok(())
}

/// The step an array is at: its `zarr.json` must be one of the three documents its state
/// file implies (the original before the flip, never after; the staged; the target).
/// Anything else was changed by someone meanwhile, and is refused: resuming would put
/// back a document, or chunks, that are no longer the array's.
fn step_of(
    p: &Packer,
    dir: &Path,
    current: &ArrayMetadata,
    plans: &Plans,
) -> Result<Step, ConvertError> {
    let now = Node::Array(current.clone()).to_value();
    let is = |meta: &ArrayMetadata| Node::Array(meta.clone()).to_value() == now;
    if is(&plans.original) && plans.resumed == Some(true) {
        Err(ConvertError::Interrupted {
            what: p.src.describe(&dir.join(METADATA_FILE)),
            why: "its original document was put back after the flip, when its old objects may be gone already: put back the document naming the staged objects (the other key family), or check the array by hand".into(),
        })
    } else if is(&plans.original) {
        Ok(Step::Stage)
    } else if is(&plans.staging) {
        Ok(Step::Swap)
    } else if is(&plans.target) {
        Ok(Step::Clean)
    } else {
        Err(ConvertError::Changed(
            p.src.describe(&dir.join(METADATA_FILE)),
        ))
    }
}

/// The plans from the state file, or (an array the goal concerns, no state file) new
/// ones, with the state file written first. `None`: nothing to do here.
fn plans(p: &Packer, dir: &Path, current: &ArrayMetadata) -> Result<Option<Plans>, ConvertError> {
    let key = dir.join(STATE_FILE);
    let (original, target, resumed) = match p.get(p.src, &key)? {
        Some(bytes) => match read_state(p, &key, &bytes)? {
            State::Array {
                original,
                target,
                chunks_per_shard,
                flipped,
            } => {
                let original = array_of(p, &key, original)?;
                let target = match (target, chunks_per_shard) {
                    (Some(target), _) => array_of(p, &key, target)?,
                    (None, Some(cps)) => first_packs_target(p, &key, &original, &cps)?,
                    (None, None) => return Err(bad_state(p, &key, "it names no target")),
                };
                (original, target, Some(flipped))
            }
            State::Group { .. } => return Err(bad_state(p, &key, "it names a group")),
        },
        None => match p.target_of(dir, current)? {
            Some(target) => (current.clone(), target, None),
            None => {
                // Finished: only the state file's lock may be left, if the run was killed
                // as it removed the state file.
                p.src
                    .clear_stale_lock(&key)
                    .map_err(|e| ConvertError::store(p.src, &key, e))?;
                return Ok(None);
            }
        },
    };
    let staging = in_other_family(&target);
    let plans = Plans {
        original,
        target,
        staging,
        resumed,
    };
    if plans.resumed.is_none() {
        begin(p, dir, &plans)?;
    }
    Ok(Some(plans))
}

/// A fresh start: nothing may lie where a shard is staged (it would be overwritten, then
/// removed), and the state file is written before anything else.
fn begin(p: &Packer, dir: &Path, plans: &Plans) -> Result<(), ConvertError> {
    if let Some(key) = p.array_files(dir, &plans.staging)?.chunks.keys().next() {
        return Err(ConvertError::InTheWay(p.src.describe(&dir.join(key))));
    }
    if p.opts.dry_run {
        return Ok(());
    }
    put_state(p, &dir.join(STATE_FILE), &plans.state(false))
}

impl Plans {
    /// The state file's content for this pack.
    fn state(&self, flipped: bool) -> State {
        State::Array {
            original: Node::Array(self.original.clone()).to_value(),
            target: Some(Node::Array(self.target.clone()).to_value()),
            chunks_per_shard: None,
            flipped,
        }
    }
}

/// The target of a state file from the first packs in place: sharded with `cps`.
fn first_packs_target(
    p: &Packer,
    key: &Path,
    original: &ArrayMetadata,
    cps: &[u64],
) -> Result<ArrayMetadata, ConvertError> {
    plan_pack(original, cps)
        .map(|plan| plan.sharded)
        .map_err(|e| bad_state(p, key, &e.to_string()))
}

fn read_state(p: &Packer, key: &Path, bytes: &[u8]) -> Result<State, ConvertError> {
    serde_json::from_slice(bytes).map_err(|e| bad_state(p, key, &e.to_string()))
}

fn put_state(p: &Packer, key: &Path, state: &State) -> Result<(), ConvertError> {
    let bytes = serde_json::to_vec_pretty(state).unwrap_or_default();
    p.put(key, &[Bytes::from(bytes)])
}

fn bad_state(p: &Packer, key: &Path, why: &str) -> ConvertError {
    ConvertError::State {
        what: p.src.describe(key),
        why: why.to_string(),
    }
}

fn array_of(p: &Packer, key: &Path, doc: serde_json::Value) -> Result<ArrayMetadata, ConvertError> {
    match Node::from_value(doc) {
        Ok(Node::Array(meta)) => Ok(meta),
        Ok(Node::Group(_)) => Err(bad_state(p, key, "it names a group")),
        Err(e) => Err(bad_state(p, key, &e.to_string())),
    }
}

/// A group's consolidated metadata would name the arrays below as they were while they
/// change: before any of them does, it is set aside (kept in the group's state file, the
/// group's document without it), so that readers read each array's own document. Finds
/// the groups an earlier run set aside too.
fn set_aside_consolidated(
    p: &Packer,
    dir: &Path,
    group: GroupMetadata,
) -> Result<(), ConvertError> {
    let key = dir.join(STATE_FILE);
    let original = match p.get(p.src, &key)? {
        Some(bytes) => match read_state(p, &key, &bytes)? {
            State::Group { original } => match Node::from_value(original) {
                Ok(Node::Group(g)) => g,
                _ => return Err(bad_state(p, &key, "not a group's document")),
            },
            State::Array { .. } => return Err(bad_state(p, &key, "it names an array")),
        },
        None if group.consolidated_entries().is_some() => group,
        None => return Ok(()),
    };
    if !p.opts.dry_run {
        let state = State::Group {
            original: Node::Group(original.clone()).to_value(),
        };
        put_state(p, &key, &state)?;
        let mut bare = original.clone();
        bare.extra
            .insert("consolidated_metadata".into(), serde_json::Value::Null);
        put_document(p, dir, &Node::Group(bare))?;
    }
    lock(&p.consolidated).push((dir.to_path_buf(), original));
    Ok(())
}

/// Puts back every consolidated metadata set aside, deepest group first, each entry as
/// its node's document now is; then the group's state file goes.
fn consolidate_again(p: &Packer) -> Result<(), ConvertError> {
    let groups = std::mem::take(&mut *lock(&p.consolidated));
    for (dir, mut group) in groups.into_iter().rev() {
        if let Some(entries) = group.consolidated_entries_mut() {
            for (path, entry) in entries.iter_mut() {
                let key = dir.join(path).join(METADATA_FILE);
                let now = p.get(p.src, &key)?;
                if let Some(Ok(node)) = now.map(|b| Node::parse(&b)) {
                    *entry = node.to_value();
                }
            }
        }
        put_document(p, &dir, &Node::Group(group))?;
        lock(&p.summary).copied += 1;
        delete(p, &dir.join(STATE_FILE))?;
    }
    Ok(())
}

/// `meta` with its chunks named in the other key-encoding family.
fn in_other_family(meta: &ArrayMetadata) -> ArrayMetadata {
    let other = match ChunkKeyEncoding::from_metadata(&meta.chunk_key_encoding) {
        Ok(ChunkKeyEncoding::V2(_)) => ("default", "/"),
        _ => ("v2", "."),
    };
    let config = serde_json::json!({ "separator": other.1 });
    let mut out = meta.clone();
    out.chunk_key_encoding = NamedConfig::new(other.0, Some(config));
    out
}

/// Step 1: every new object under the other family's keys, durably. Objects a stopped run
/// staged go first: a chunk removed since must not come back from one.
fn stage(p: &Packer, dir: &Path, plans: &Plans) -> Result<(), ConvertError> {
    for staged in p.array_files(dir, &plans.staging)?.chunks.keys() {
        delete(p, &dir.join(staged))?;
    }
    let work = staged_work(p, dir, plans)?;
    p.write_units(dir, &work)
}

/// Before the flip: every chunk of the array is the version it was when staging began.
/// A writer's chunk written, replaced or removed meanwhile is in no staged shard (or in
/// one at its old version): flipping would drop it. Then the staged objects go (and the
/// state file, when this run began it) and the array stays as it is, its writes in it.
fn unchanged_since(
    p: &Packer,
    dir: &Path,
    plans: &Plans,
    before: &Versions,
) -> Result<Versions, ConvertError> {
    let now = p.versions(dir, &plans.original)?;
    let changed = before
        .keys()
        .chain(now.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| before.get(*k) != now.get(*k))
        .count();
    if changed == 0 {
        return Ok(now);
    }
    Err(rolled_back(p, dir, plans, changed)?)
}

/// The versions of an array's objects (`Packer::versions`).
type Versions = std::collections::BTreeMap<String, Option<String>>;

/// Undoes the stage of an array that was written meanwhile: the staged objects go (and the
/// state file, when this run began it). Returns the error that says so.
fn rolled_back(
    p: &Packer,
    dir: &Path,
    plans: &Plans,
    changed: usize,
) -> Result<ConvertError, ConvertError> {
    for staged in p.array_files(dir, &plans.staging)?.chunks.keys() {
        delete(p, &dir.join(staged))?;
    }
    if plans.resumed.is_none() {
        delete(p, &dir.join(STATE_FILE))?;
        p.src
            .clear_stale_lock(&dir.join(STATE_FILE))
            .map_err(|e| ConvertError::store(p.src, &dir.join(STATE_FILE), e))?;
    }
    Ok(ConvertError::WrittenMeanwhile {
        what: p.src.describe(dir),
        n: changed,
    })
}

/// Step 2, the flip: the staging document replaces `zarr.json` durably, only if that is
/// still the version `now` saw (a writer's new attributes are never overwritten).
fn flip(p: &Packer, dir: &Path, plans: &Plans, now: &Versions) -> Result<String, ConvertError> {
    let key = dir.join(METADATA_FILE);
    let Some(Some(tag)) = now.get(METADATA_FILE) else {
        return Err(rolled_back(p, dir, plans, 1)?);
    };
    let staging = node_bytes(&Node::Array(plans.staging.clone()));
    match put_durably_if(p, &key, staging, Precondition::Matches(tag.clone())) {
        // Changed since that look: nothing is switched, the stage is undone.
        Err(ConvertError::WrittenAfterSwitch(_)) => Err(rolled_back(p, dir, plans, 1)?),
        r => r,
    }
}

/// The objects to stage, from the objects there now, counted in the summary.
fn staged_work(p: &Packer, dir: &Path, plans: &Plans) -> Result<Work, ConvertError> {
    let work = p.work(dir, &plans.original, &plans.staging)?;
    p.note_array(dir, &work);
    Ok(work)
}

/// Step 3: the old objects go, and each staged one is copied to its own key.
/// `guard`, in the run that flipped: the versions of the old objects and of the document
/// as it left them; every old object goes only if still that version, every new one is
/// put only where nothing is, and the document must still be its own: a writer that kept
/// the old layout open and wrote meanwhile stops the run (exit 1, its write kept).
fn swap(
    p: &Packer,
    dir: &Path,
    plans: &Plans,
    guard: Option<&Versions>,
) -> Result<(), ConvertError> {
    // A rerun finds objects of both layouts under the array's own keys: the old ones, and
    // new ones copied before the stop (copied again below).
    let own = [&plans.original, &plans.target];
    for key in p
        .array_files_within(dir, &plans.original, &own)?
        .chunks
        .keys()
    {
        let when = match guard.map(|g| g.get(key.as_str())) {
            Some(Some(Some(tag))) => Precondition::Matches(tag.clone()),
            Some(_) => return Err(written_after_switch(p, &dir.join(key))),
            None => Precondition::None,
        };
        delete_if(p, &dir.join(key), when)?;
    }
    if let Some(g) = guard {
        let doc = p
            .versions(dir, &plans.original)?
            .remove(METADATA_FILE)
            .flatten();
        if doc != g.get(METADATA_FILE).cloned().flatten() {
            return Err(written_after_switch(p, &dir.join(METADATA_FILE)));
        }
    }
    let keys = ChunkKeyEncoding::from_metadata(&plans.target.chunk_key_encoding).map_err(|e| {
        ConvertError::State {
            what: p.src.describe(&dir.join(METADATA_FILE)),
            why: e.to_string(),
        }
    })?;
    for (staged, shard) in p.array_files(dir, &plans.staging)?.chunks {
        if let Some(bytes) = p.get(p.src, &dir.join(&staged))? {
            let key = dir.join(keys.encode(&shard));
            match guard {
                // Only where nothing is: something there is a writer's.
                Some(_) => drop(put_durably_if(p, &key, bytes, Precondition::Absent)?),
                None => p.put(&key, &[bytes])?,
            }
        }
    }
    Ok(())
}

/// A writer with the old layout wrote `key` after the array switched layouts.
fn written_after_switch(p: &Packer, key: &Path) -> ConvertError {
    ConvertError::WrittenAfterSwitch(p.src.describe(key))
}

/// Removes `key` if `when` holds; a newer version there is a writer's (`written_after_switch`).
fn delete_if(p: &Packer, key: &Path, when: Precondition) -> Result<(), ConvertError> {
    match p.src.delete(key, when) {
        Ok(_) => Ok(()),
        Err(crate::store::StoreError::Conflict(_)) => Err(written_after_switch(p, key)),
        Err(e) => Err(ConvertError::store(p.src, key, e)),
    }
}

/// Step 4: the staged objects and the state file go.
fn clean(p: &Packer, dir: &Path, plans: &Plans) -> Result<(), ConvertError> {
    for staged in p.array_files(dir, &plans.staging)?.chunks.keys() {
        delete(p, &dir.join(staged))?;
    }
    p.src
        .clear_leftovers(dir)
        .map_err(|e| ConvertError::store(p.src, dir, e))?;
    let state = dir.join(STATE_FILE);
    delete(p, &state)?;
    p.src
        .clear_stale_lock(&state)
        .map_err(|e| ConvertError::store(p.src, &state, e))
}

/// Puts `bytes` at `key` durably if `when` holds; a conflict is a writer's doing
/// (`written_after_switch`). Returns the version put.
fn put_durably_if(
    p: &Packer,
    key: &Path,
    bytes: Bytes,
    when: Precondition,
) -> Result<String, ConvertError> {
    let mut durable = || {};
    let put = p.src.put_within(
        crate::backing::lock::Within::path(Path::new("")),
        key,
        &[bytes],
        when,
        Some(&mut durable),
    );
    match put {
        Ok(info) => Ok(info.tag),
        Err(crate::store::StoreError::Conflict(_)) => Err(written_after_switch(p, key)),
        Err(e) => Err(ConvertError::store(p.src, key, e)),
    }
}

fn node_bytes(node: &Node) -> Bytes {
    Bytes::from(node.to_json_bytes())
}

fn put_document(p: &Packer, dir: &Path, node: &Node) -> Result<(), ConvertError> {
    let doc = node.to_json_bytes();
    p.put(&dir.join(METADATA_FILE), &[Bytes::from(doc)])
}

fn delete(p: &Packer, key: &Path) -> Result<(), ConvertError> {
    p.src
        .delete(key, Precondition::None)
        .map(drop)
        .map_err(|e| ConvertError::store(p.src, key, e))
}
