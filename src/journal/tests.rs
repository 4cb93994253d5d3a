//! The journal on its own, over a temporary BACKING: what a replay brings back.

use std::path::Path;

use bytes::Bytes;

use super::{Entry, Journal, RecordRef};
use crate::backing::Backing;

const META: &[u8] = b"{}";

fn entry<'a>(coords: &'a [u64], data: &'a [Bytes], id: u64) -> Entry<'a> {
    Entry {
        array: Path::new("a"),
        instance: "",
        meta: META,
        coords,
        was: super::record::Was::Unknown,
        data: Some(data),
        id,
    }
}

/// What a mount starting after `journal` died would replay: (coords, bytes) in order.
fn replay_after_crash(backing: &Backing, journal: Journal) -> Vec<(Vec<u64>, Bytes)> {
    // A crash: the journal's files stay, its lock goes with the process.
    drop(journal);
    let next = Journal::open(backing).unwrap();
    next.adopt_dead()
        .unwrap()
        .into_iter()
        .map(|r| (r.coords, r.data.unwrap_or_default()))
        .collect()
}

#[test]
fn an_abandoned_body_never_replays_a_retired_record() {
    let dir = tempfile::tempdir().unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    let j = Journal::open(&backing).unwrap();
    let body = j.begin_body(Path::new("a"), "", META).unwrap();
    let (x1, y1) = ([Bytes::from_static(b"x1")], [Bytes::from_static(b"y1")]);
    let first = j.reserve_ids(2);
    let chunks = j
        .append_body(
            &body,
            &[entry(&[0], &x1, first), entry(&[1], &y1, first + 1)],
        )
        .unwrap()
        .unwrap();
    // The shard was written another way (its file had appeared), with y still live.
    let finishing = j.finish_body(&body);
    j.body_abandoned(&finishing);
    drop(finishing);
    // x1 is durable in that shard; then x2 is fsynced, and made durable in the shard too.
    j.retire(std::slice::from_ref(&chunks[0].record));
    let x2 = [Bytes::from_static(b"x2")];
    let id = j.reserve_ids(1);
    let refs = j.append(&[entry(&[0], &x2, id)]).unwrap();
    j.retire(&refs);
    j.sync_all().unwrap();
    // Only y1 comes back: x1 would overwrite x2 in its shard.
    let got = replay_after_crash(&backing, j);
    assert_eq!(got, vec![(vec![1], Bytes::from_static(b"y1"))]);
}

#[test]
fn replay_applies_bodies_and_segments_in_the_order_ids_were_reserved() {
    let dir = tempfile::tempdir().unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    let j = Journal::open(&backing).unwrap();
    let (old, new) = ([Bytes::from_static(b"old")], [Bytes::from_static(b"new")]);
    // The older content's id was reserved first, though it is written last.
    let older = j.reserve_ids(1);
    let newer = j.reserve_ids(1);
    j.append(&[entry(&[3], &new, newer)]).unwrap();
    let body = j.begin_body(Path::new("a"), "", META).unwrap();
    j.append_body(&body, &[entry(&[3], &old, older)])
        .unwrap()
        .unwrap();
    let got = replay_after_crash(&backing, j);
    assert_eq!(
        got,
        vec![
            (vec![3], Bytes::from_static(b"old")),
            (vec![3], Bytes::from_static(b"new"))
        ]
    );
}

/// A journal with one body holding one chunk, taken by a shard write: `consumed` (it
/// became its shard) or abandoned (the shard was written another way). Returns the
/// chunk's record.
fn one_body_taken(backing: &Backing, consumed: bool) -> (Journal, RecordRef) {
    let j = Journal::open(backing).unwrap();
    let body = j.begin_body(Path::new("a"), "", META).unwrap();
    let x = [Bytes::from_static(b"x")];
    let id = j.reserve_ids(1);
    let chunks = j
        .append_body(&body, &[entry(&[0], &x, id)])
        .unwrap()
        .unwrap();
    let finishing = j.finish_body(&body);
    if consumed {
        j.body_consumed(&finishing);
    } else {
        j.body_abandoned(&finishing);
    }
    drop(finishing);
    (j, chunks[0].record.clone())
}

#[test]
fn a_body_removed_after_its_last_record_retires_is_not_replayed() {
    let dir = tempfile::tempdir().unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    let (j, record) = one_body_taken(&backing, false);
    assert!(backing.stat(&body_path(&j)).unwrap().is_some());
    j.retire(std::slice::from_ref(&record));
    assert!(backing.stat(&body_path(&j)).unwrap().is_none());
    assert_eq!(j.report().live_records, 0);
    assert!(replay_after_crash(&backing, j).is_empty());
}

fn body_path(j: &Journal) -> std::path::PathBuf {
    Path::new(super::JOURNAL_DIR).join(format!("{}.b000000.body", j.id))
}

#[test]
fn a_body_that_became_its_shard_needs_no_retirement_records() {
    let dir = tempfile::tempdir().unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    let (j, record) = one_body_taken(&backing, true);
    j.retire(std::slice::from_ref(&record));
    // Nothing was appended to the segments.
    assert_eq!(j.report().journal_bytes, 0);
    assert_eq!(j.report().live_records, 0);
}

/// One flipped byte in a record in the middle of a segment loses that record alone: the
/// intact records after it (fsyncs that returned) are replayed, not dropped as a torn end.
#[test]
fn damage_in_the_middle_of_a_segment_loses_only_the_damaged_record() {
    let dir = tempfile::tempdir().unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    let j = Journal::open(&backing).unwrap();
    let data: Vec<[Bytes; 1]> = [b"one", b"two", b"six"]
        .iter()
        .map(|d| [Bytes::from_static(*d)])
        .collect();
    for (i, d) in data.iter().enumerate() {
        let id = j.reserve_ids(1);
        j.append(&[entry(&[i as u64], d, id)]).unwrap();
    }
    // The segment: find the second chunk's bytes and flip one.
    let seg = std::fs::read_dir(dir.path().join(super::JOURNAL_DIR))
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|p| p.extension().is_some_and(|x| x == "seg"))
        .unwrap();
    let mut bytes = std::fs::read(&seg).unwrap();
    let at = bytes.windows(3).position(|w| w == b"two").unwrap();
    bytes[at] ^= 0x01;
    std::fs::write(&seg, bytes).unwrap();
    let got = replay_after_crash(&backing, j);
    assert_eq!(
        got,
        vec![
            (vec![0], Bytes::from_static(b"one")),
            (vec![2], Bytes::from_static(b"six"))
        ]
    );
}
