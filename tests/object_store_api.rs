//! The store interface, run the same way against both implementations: a BACKING
//! directory, and a real S3-compatible server (moto's, started by the test on 127.0.0.1).

mod common;

use std::io;
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::s3::S3Server;
use shardfs::backing::Backing;
use shardfs::shard::{
    Endian, IndexCodec, IndexFormat, IndexLocation, ShardBuilder, read_chunk_part, read_index,
};
use shardfs::store::object::ObjectBacked;
use shardfs::store::{Precondition, Store, StoreError};

const BUCKET: &str = "shardfs-test";

fn format() -> IndexFormat {
    IndexFormat {
        chunks_per_shard: vec![2, 2],
        codec: IndexCodec {
            endian: Endian::Little,
            crc32c: true,
        },
        location: IndexLocation::End,
    }
}

/// A shard of four chunks, chunk `i` holding `i + 1` bytes of value `i`.
fn shard_parts() -> Vec<Bytes> {
    let mut b = ShardBuilder::new(format());
    for i in 0..4u8 {
        b.set(i as usize, vec![Bytes::from(vec![i; i as usize + 1])]);
    }
    b.build().unwrap().buffers().to_vec()
}

fn is_conflict<T: std::fmt::Debug>(r: Result<T, StoreError>) -> bool {
    matches!(r, Err(StoreError::Conflict(_)))
}

/// Conditional writes: create only when absent, replace only the version that was read.
fn conditional_writes(store: &dyn Store) {
    let one = [Bytes::from_static(b"one")];
    let v1 = store
        .put(Path::new("a/k"), &one, Precondition::Absent)
        .unwrap();
    assert!(is_conflict(store.put(
        Path::new("a/k"),
        &one,
        Precondition::Absent
    )));
    let v2 = store
        .put(
            Path::new("a/k"),
            &[Bytes::from_static(b"two")],
            Precondition::Matches(v1.tag.clone()),
        )
        .unwrap();
    assert_ne!(v1.tag, v2.tag);
    // A writer still holding the first version loses, and nothing is overwritten.
    let stale = Precondition::Matches(v1.tag.clone());
    assert!(is_conflict(store.put(
        Path::new("a/k"),
        &[Bytes::from_static(b"three")],
        stale
    )));
    let (bytes, info) = store.get(Path::new("a/k"), 100).unwrap().unwrap();
    assert_eq!(&bytes[..], b"two");
    assert_eq!(info.tag, v2.tag);
    assert!(is_conflict(store.put(
        Path::new("a/gone"),
        &one,
        Precondition::Matches(v2.tag)
    )));
}

/// A shard read as the mount reads one: its index from the pinned version's tail, a chunk
/// by its range; the version stays pinned when the object is replaced.
fn shard_reads(store: &dyn Store) {
    let parts = shard_parts();
    store
        .put(Path::new("arr/c/0/0"), &parts, Precondition::Absent)
        .unwrap();
    let tail = format().encoded_len();
    let blob = store.open(Path::new("arr/c/0/0"), tail).unwrap().unwrap();
    let size = blob.info().size;
    assert_eq!(size, parts.iter().map(|p| p.len() as u64).sum::<u64>());
    let index = read_index(&*blob, size, &format()).unwrap();
    for i in 0..4u8 {
        let range = index.get(i as usize).unwrap();
        let chunk = read_chunk_part(&*blob, range, 0, range.nbytes).unwrap();
        assert_eq!(chunk, vec![i; i as usize + 1]);
    }
    store
        .put(
            Path::new("arr/c/0/0"),
            &[Bytes::from_static(b"other")],
            Precondition::None,
        )
        .unwrap();
    let range = index.get(3).unwrap();
    match read_chunk_part(&*blob, range, 0, range.nbytes) {
        // A descriptor keeps reading the version it opened.
        Ok(chunk) => assert_eq!(chunk, vec![3u8; 4]),
        // An object store cannot: the read fails rather than mix two versions.
        Err(e) => assert_eq!(e.raw_os_error(), Some(libc::ESTALE), "{e}"),
    }
    assert!(store.open(Path::new("arr/c/9/9"), tail).unwrap().is_none());
}

/// One level of a listing: directories, then objects with their sizes.
fn listings(store: &dyn Store) {
    for key in ["l/x/1", "l/x/2", "l/y/z/3", "l/f"] {
        store
            .put(
                Path::new(key),
                &[Bytes::from_static(b"12345")],
                Precondition::None,
            )
            .unwrap();
    }
    let top = store.list(Path::new("l")).unwrap();
    assert_eq!(top.dirs, vec!["x", "y"]);
    assert_eq!(top.objects, vec!["f"]);
    assert_eq!(store.list(Path::new("l/y")).unwrap().dirs, vec!["z"]);
    assert!(
        store
            .list(Path::new("nothing/here"))
            .unwrap()
            .objects
            .is_empty()
    );
    let stale = Precondition::Matches("not-the-tag".into());
    assert!(is_conflict(store.delete(Path::new("l/f"), stale)));
    assert!(store.delete(Path::new("l/f"), Precondition::None).unwrap());
    assert!(!store.delete(Path::new("l/f"), Precondition::None).unwrap());
    assert!(store.list(Path::new("l")).unwrap().objects.is_empty());
    let big = store.get(Path::new("l/x/1"), 2);
    assert_eq!(
        io::Error::from(big.unwrap_err()).raw_os_error(),
        Some(libc::EFBIG)
    );
}

fn open(server: &S3Server, url: &str) -> ObjectBacked {
    let config = server.config();
    let pairs: Vec<(&str, &str)> = config
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    ObjectBacked::open_with(url, &pairs).unwrap()
}

/// Names as users give them (non-ASCII, `~`) are keys as they are, and an empty object
/// opens like any other.
fn odd_names(store: &dyn Store) {
    let key = Path::new("données/a~b");
    store
        .put(key, &[Bytes::from_static(b"x")], Precondition::Absent)
        .unwrap();
    let listing = store.list(Path::new("données")).unwrap();
    assert_eq!(listing.objects.len(), 1);
    assert_eq!(listing.objects[0], "a~b");
    assert_eq!(
        store.get(key, 10).unwrap().unwrap().0,
        Bytes::from_static(b"x")
    );
    assert!(
        store
            .list(Path::new(""))
            .unwrap()
            .dirs
            .contains(&"données".to_string())
    );
    store
        .put(Path::new("empty"), &[], Precondition::None)
        .unwrap();
    let blob = store.open(Path::new("empty"), 16).unwrap().unwrap();
    assert_eq!(blob.info().size, 0);
}

fn all(store: &dyn Store) {
    conditional_writes(store);
    shard_reads(store);
    listings(store);
    odd_names(store);
}

#[test]
fn a_backing_directory_keeps_the_store_rules() {
    let dir = tempfile::tempdir().unwrap();
    let backing = Backing::new(dir.path().to_path_buf()).unwrap();
    all(&backing);
}

#[test]
fn an_s3_server_keeps_the_store_rules() {
    let server = S3Server::start(BUCKET);
    let store = open(&server, &format!("s3://{BUCKET}/some/prefix"));
    all(&store);
    // Everything lives below the prefix.
    let keys = server.python(&format!(
        "print(sorted({{v['Key'] for v in s3.list_object_versions(Bucket={BUCKET:?})['Versions']}}))"
    ));
    assert!(keys.contains("'some/prefix/arr/c/0/0'"), "{keys}");
    assert!(keys.contains("'some/prefix/données/a~b'"), "{keys}");
    assert!(!keys.contains("'arr/"), "{keys}");
    // The index came with the open: one GET for it, one per chunk.
    let before = store.requests.get.load(Relaxed);
    let blob = store.open(Path::new("arr/c/0/0"), 5).unwrap().unwrap();
    let mut tail = [0u8; 5];
    blob.read_exact_at(&mut tail, blob.info().size - 5).unwrap();
    assert_eq!(&tail, b"other");
    assert_eq!(store.requests.get.load(Relaxed) - before, 1);
    // Each PUT that landed is one version at the server; refused ones are none.
    assert_eq!(server.versions(BUCKET, "some/prefix/a/k"), 2);
}

#[test]
fn a_store_that_went_away_fails_in_bounded_time() {
    let mut server = S3Server::start(BUCKET);
    let store = open(&server, &format!("s3://{BUCKET}"));
    store
        .put(
            Path::new("k"),
            &[Bytes::from_static(b"x")],
            Precondition::None,
        )
        .unwrap();
    server.stop();
    put_fails_within(&store, Duration::from_secs(30));
    assert!(store.open(Path::new("k"), 0).is_err());
}

#[test]
fn a_server_that_never_answers_fails_in_bounded_time() {
    // Accepts connections and never answers: a hung server, not a gone one.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let endpoint = format!("http://{}", listener.local_addr().unwrap());
    let _held = std::thread::spawn(move || {
        let mut open = Vec::new();
        for conn in listener.incoming().flatten() {
            open.push(conn);
        }
    });
    let config = [
        ("endpoint", endpoint.as_str()),
        ("access_key_id", "testing"),
        ("secret_access_key", "testing"),
        ("region", "us-east-1"),
        ("allow_http", "true"),
    ];
    let store = ObjectBacked::open_with(&format!("s3://{BUCKET}"), &config).unwrap();
    put_fails_within(&store, Duration::from_secs(45));
}

#[test]
fn a_large_object_goes_up_in_parts_taken_from_its_segments() {
    let server = S3Server::start(BUCKET);
    let store = open(&server, &format!("s3://{BUCKET}/big")).with_multipart_above(16 << 20);
    // 40 MiB in 1 MiB segments, each distinct: three parts of at least 16 MiB.
    let parts: Vec<Bytes> = (0..40u8).map(|i| Bytes::from(vec![i; 1 << 20])).collect();
    let key = Path::new("arr/c/0/0");
    let info = store.put(key, &parts, Precondition::Absent).unwrap();
    // A multipart upload's ETag says how many parts it had.
    assert!(info.tag.ends_with("-3\""), "{}", info.tag);
    let (bytes, got) = store.get(key, 64 << 20).unwrap().unwrap();
    assert_eq!(bytes, Bytes::from(parts.concat()));
    assert_eq!(got.tag, info.tag);
    // Its precondition is still checked (before the upload starts).
    assert!(is_conflict(store.put(key, &parts, Precondition::Absent)));
    let stale = Precondition::Matches("\"not-it\"".into());
    assert!(is_conflict(store.put(key, &parts, stale)));
    store
        .put(key, &parts[..20], Precondition::Matches(info.tag))
        .unwrap();
    assert_eq!(store.get(key, 64 << 20).unwrap().unwrap().0.len(), 20 << 20);
}

/// A PUT to `store` fails with an I/O error (not a conflict) within `limit`.
fn put_fails_within(store: &ObjectBacked, limit: Duration) {
    let start = Instant::now();
    let err = store
        .put(
            Path::new("k"),
            &[Bytes::from_static(b"y")],
            Precondition::None,
        )
        .unwrap_err();
    assert!(matches!(err, StoreError::Io(_)), "{err:?}");
    assert!(start.elapsed() < limit, "{:?}", start.elapsed());
}
