//! The shard registry on its own, without FUSE or the rest of the core: chunks held until
//! their shard is complete, the shard written once, chunks read back from it, deletions
//! counted as positions done, and a partial shard merged with what stays.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::{ChunkData, ShardRegistry, WriteMode};
use crate::backing::Backing;
use crate::core::array::ArrayState;
use crate::core::refusal::RefusalLog;
use crate::core::testing::FOUR_BYTES_TWO_PER_SHARD;
use crate::core::view::classify::{Classifier, DirClass};

struct Setup {
    _dir: tempfile::TempDir,
    backing: Backing,
    array: Arc<ArrayState>,
    reg: ShardRegistry,
}

fn setup() -> Setup {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("a")).unwrap();
    std::fs::write(dir.path().join("a/zarr.json"), FOUR_BYTES_TWO_PER_SHARD).unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    let DirClass::ShardedArray(array) = Classifier::default()
        .classify(&backing, Path::new("a"))
        .unwrap()
    else {
        panic!("a is not a sharded array");
    };
    let refusals = Arc::new(RefusalLog::new(dir.path().to_path_buf()));
    let store = Arc::new(backing.clone());
    let reg = ShardRegistry::new(1 << 20, store, true, &refusals);
    Setup {
        _dir: dir,
        backing,
        array,
        reg,
    }
}

impl Setup {
    /// Writes `byte` as chunk `i` and closes it, as a writer's FLUSH would.
    fn write_chunk(&self, i: u64, byte: u8) {
        let f = self
            .reg
            .open_for_write(&self.backing, &self.array, &[i], true)
            .unwrap();
        let delta = f.change(|d| d.write(0, Bytes::from(vec![byte]))).unwrap();
        self.reg.charge(delta);
        self.reg.settle(&self.backing, &self.array, &[i]).unwrap();
    }

    fn write_shard(&self, shard: u64, mode: WriteMode) {
        self.reg
            .write_shard(&self.backing, &self.array, &[shard], mode)
            .unwrap();
    }

    fn ready(&self, shard: u64) -> bool {
        self.reg
            .ready(&self.backing, &self.array, &[shard])
            .unwrap()
    }

    fn read(&self, i: u64) -> Option<Vec<u8>> {
        match self.reg.chunk(&self.backing, &self.array, &[i]).unwrap() {
            ChunkData::Absent => None,
            ChunkData::Stored(c) => Some(c.read().unwrap().to_vec()),
            ChunkData::Pending(f) => Some(f.read(0, f.len())),
            ChunkData::Damaged { reason, .. } => panic!("damaged: {reason}"),
        }
    }

    fn shard_file(&self, shard: u64) -> Option<Vec<u8>> {
        self.backing.read(&self.array.shard_rel(&[shard])).unwrap()
    }

    /// The chunks the shard file's index holds, each read from the file, after the index
    /// was checked as any reader checks it (checksum, ranges).
    fn stored_chunks(&self, shard: u64) -> Vec<Option<Vec<u8>>> {
        let file = self.shard_file(shard).expect("the shard file");
        let format = &self.array.layout.index;
        let index = crate::shard::file::read_index(&file[..], file.len() as u64, format).unwrap();
        (0..index.len())
            .map(|pos| {
                index
                    .get(pos)
                    .map(|r| file[r.offset as usize..(r.offset + r.nbytes) as usize].to_vec())
            })
            .collect()
    }

    fn written(&self) -> (u64, u64) {
        let s = self.reg.stats();
        (
            s.shards_written.load(Ordering::SeqCst),
            s.merges.load(Ordering::SeqCst),
        )
    }
}

#[test]
fn a_shard_is_written_once_when_every_position_is_closed_and_read_back_from_it() {
    let s = setup();
    s.write_chunk(0, b'x');
    assert!(!s.ready(0), "one of two positions closed");
    assert_eq!(s.read(0), Some(b"x".to_vec()), "a pending chunk reads back");
    assert!(s.reg.pending_bytes() > 0);
    s.write_chunk(1, b'y');
    assert!(s.ready(0));
    s.write_shard(0, WriteMode::Complete);
    assert_eq!(
        s.stored_chunks(0),
        [Some(b"x".to_vec()), Some(b"y".to_vec())]
    );
    assert_eq!(s.written(), (1, 0), "one shard write, no merge");
    assert!(s.reg.pending().is_empty());
    assert_eq!(s.reg.pending_bytes(), 0);
    assert_eq!(
        (s.read(0), s.read(1)),
        (Some(b"x".to_vec()), Some(b"y".to_vec()))
    );
    assert!(
        s.shard_file(1).is_none(),
        "the other shard was never touched"
    );
}

#[test]
fn a_deleted_position_counts_as_done_and_a_shard_of_deletions_goes() {
    let s = setup();
    s.write_chunk(2, b'p');
    s.write_chunk(3, b'q');
    s.write_shard(1, WriteMode::Complete);
    assert!(s.reg.delete(&s.backing, &s.array, &[2]).unwrap());
    assert!(!s.ready(1), "one position deleted, the other not rewritten");
    assert_eq!(s.read(2), None);
    assert!(s.reg.delete(&s.backing, &s.array, &[3]).unwrap());
    assert!(s.ready(1));
    s.write_shard(1, WriteMode::Complete);
    assert!(
        s.shard_file(1).is_none(),
        "a shard with no chunk left is removed"
    );
    assert_eq!((s.read(2), s.read(3)), (None, None));
    assert!(
        !s.reg.delete(&s.backing, &s.array, &[3]).unwrap(),
        "nothing left"
    );
}

#[test]
fn a_partial_write_keeps_the_chunks_already_in_the_shard() {
    let s = setup();
    s.write_chunk(0, b'x');
    s.write_chunk(1, b'y');
    s.write_shard(0, WriteMode::Complete);
    // One chunk rewritten: the shard is not complete in this round, so an idle write
    // merges it with the stored chunk that stays.
    s.write_chunk(1, b'z');
    assert!(!s.ready(0));
    s.write_shard(0, WriteMode::Settled);
    assert_eq!(s.written(), (2, 1), "the second write merged");
    assert_eq!(
        (s.read(0), s.read(1)),
        (Some(b"x".to_vec()), Some(b"z".to_vec()))
    );
    assert_eq!(
        s.stored_chunks(0),
        [Some(b"x".to_vec()), Some(b"z".to_vec())],
        "one shard with both"
    );
}

#[test]
fn a_chunk_outside_the_array_is_absent_and_a_pending_one_is_not_stored_yet() {
    let s = setup();
    assert_eq!(s.read(4), None, "outside the chunk grid");
    s.write_chunk(0, b'x');
    assert!(matches!(
        s.reg.chunk(&s.backing, &s.array, &[0]).unwrap(),
        ChunkData::Pending(_)
    ));
    assert!(
        s.shard_file(0).is_none(),
        "nothing written before the shard is"
    );
    let pending = s.reg.pending();
    assert_eq!(pending.len(), 1);
    assert_eq!(
        (pending[0].shard.as_slice(), pending[0].chunks),
        (&[0][..], 1)
    );
    assert!(pending[0].all_settled);
}
