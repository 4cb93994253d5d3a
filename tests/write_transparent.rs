//! Transparent zstd (`shardfs mount --compress`): raw arrays written through the mount by
//! zarr-python and tensorstore are stored with `zstd`, read back through the mount as
//! written (the writer's document, chunk files of their written size), read natively
//! from BACKING by both clients, and survive a crash through the journal; an array that
//! compresses already is stored as written; a mount without the option still undoes the
//! compression, and keeps it when the document is rewritten.

mod common;

use std::fs;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::time::Duration;

use common::mount::{Mounted, dirs};
use serde_json::{Value, json};

const LIMIT: Duration = Duration::from_secs(600);
const MARK: &str = "shardfs:transparent";
const RAW: [&str; 3] = ["zp_raw", "zp_3d", "ts_raw"];

fn script() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/transparent.py");
    p.to_str().unwrap().to_string()
}

fn py(cmd: &str, root: &Path, expected: &Path) {
    let (root, expected) = (root.to_str().unwrap(), expected.to_str().unwrap());
    common::python_run(&[&script(), cmd, root, expected], &format!("{cmd} {root}"));
}

fn doc(path: &Path) -> Value {
    let bytes = fs::read(path.join("zarr.json")).unwrap();
    serde_json::from_slice(&bytes).unwrap()
}

/// The codecs of a stored (sharded) array's chunks.
fn inner_codecs(stored: &Value) -> Vec<Value> {
    let sharding = &stored["codecs"][0];
    assert_eq!(sharding["name"], "sharding_indexed", "{stored}");
    sharding["configuration"]["codecs"]
        .as_array()
        .unwrap()
        .clone()
}

fn names(codecs: &[Value]) -> Vec<&str> {
    codecs.iter().map(|c| c["name"].as_str().unwrap()).collect()
}

fn files_size(dir: &Path) -> u64 {
    let mut total = 0;
    for e in fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let t = e.file_type().unwrap();
        if t.is_dir() {
            total += files_size(&e.path());
        } else if e.file_name() != "zarr.json" {
            total += e.metadata().unwrap().len();
        }
    }
    total
}

/// What the mount shows is what each writer wrote: no `zstd` it did not ask for, no
/// mark, chunk files of their raw size.
fn shown_as_written(m: &Mounted) {
    for a in RAW {
        let shown = doc(&m.path(a));
        assert_eq!(
            names(shown["codecs"].as_array().unwrap()),
            ["bytes"],
            "{a}: {shown}"
        );
        assert!(shown["attributes"].get(MARK).is_none(), "{a}: {shown}");
    }
    let own = doc(&m.path("zp_own"));
    assert_eq!(names(own["codecs"].as_array().unwrap()), ["bytes", "zstd"]);
    assert_eq!(own["codecs"][1]["configuration"]["level"], 1);
    // 16 x 16 float32: 1024 bytes written, whatever is stored.
    let len = fs::metadata(m.path("zp_raw/c/1/1")).unwrap().len();
    assert_eq!(len, 1024);
}

/// BACKING holds the raw arrays compressed and marked, the writer's own zstd untouched.
fn stored_compressed(backing: &Path) {
    for a in RAW {
        let stored = doc(&backing.join(a));
        let codecs = inner_codecs(&stored);
        assert_eq!(names(&codecs), ["bytes", "zstd"], "{a}: {stored}");
        assert_eq!(codecs[1]["configuration"]["level"], 3, "{a}");
        assert_eq!(stored["attributes"][MARK], "zstd", "{a}");
    }
    let own = doc(&backing.join("zp_own"));
    let codecs = inner_codecs(&own);
    assert_eq!(names(&codecs), ["bytes", "zstd"], "{own}");
    assert_eq!(codecs[1]["configuration"]["level"], 1);
    assert!(own["attributes"].get(MARK).is_none(), "{own}");
    // Smooth float32: zstd finds something (the raw chunks are 50 x 70 x 4 bytes).
    let stored = files_size(&backing.join("zp_raw"));
    assert!(stored < 50 * 70 * 4, "zp_raw stored in {stored} bytes");
}

/// Writes `data` to the chunk file at `path` and fsyncs it: acknowledged, durable.
fn write_synced(path: &Path, data: &[u8]) {
    fs::create_dir_all(path.parent().unwrap()).unwrap();
    let mut f = fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .open(path)
        .unwrap();
    f.write_all(data).unwrap();
    f.sync_all().unwrap();
}

const BYTES_1D: &str = r#"{"zarr_format":3,"node_type":"array","shape":[128],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},
"fill_value":0,"codecs":[{"name":"bytes"}],"attributes":{}}"#;

/// fsynced chunks of a compressed array come back after a SIGKILL: one in the body of a
/// shard not written yet, one over a shard that exists (a shared record).
fn fsynced_chunks_survive_a_crash(m: Mounted, args: &[&str]) -> Mounted {
    let dir = m.path("crash");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("zarr.json"), BYTES_1D).unwrap();
    fs::create_dir_all(dir.join("c")).unwrap();
    for k in 4..8u8 {
        fs::write(dir.join(format!("c/{k}")), [k; 16]).unwrap();
    }
    write_synced(&dir.join("c/0"), &[0xA0; 16]);
    write_synced(&dir.join("c/5"), &[0xB5; 16]);
    let m = m.crash_and_remount(args, LIMIT);
    let dir = m.path("crash");
    assert_eq!(fs::read(dir.join("c/0")).unwrap(), [0xA0; 16]);
    assert_eq!(fs::read(dir.join("c/5")).unwrap(), [0xB5; 16]);
    assert_eq!(fs::read(dir.join("c/6")).unwrap(), [6; 16]);
    m
}

#[test]
fn raw_chunks_are_stored_compressed_and_read_as_written() {
    let (_dir, backing, expected) = dirs();
    let args = ["--compress", "zstd:3", "--chunks-per-shard", "4"];
    let m = Mounted::new(&backing, &args, LIMIT);
    py("write", &m.mountpoint, &expected);
    shown_as_written(&m);
    py("check", &m.mountpoint, &expected);
    // Durable before the crash below (which takes what was not).
    let flushed = common::shardfs(&["flush", m.mountpoint.to_str().unwrap()]);
    common::assert_ok(&flushed, "flush");
    let m = fsynced_chunks_survive_a_crash(m, &args);
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);

    stored_compressed(&backing);
    py("check", &backing, &expected);
    let v = common::shardfs(&["verify", backing.to_str().unwrap()]);
    common::assert_ok(&v, "verify");
    let code = "import sys, zarr\nassert (zarr.open_array(sys.argv[1])[:16] == 0xA0).all()\n\
                assert (zarr.open_array(sys.argv[1])[80:96] == 0xB5).all()";
    common::mount::python_ok("native read", code, &[&backing.join("crash")]);

    // Without the option: still shown and read as written, and an attribute written
    // through the mount keeps the array compressed.
    let m = Mounted::new(&backing, &[], LIMIT);
    shown_as_written(&m);
    py("check", &m.mountpoint, &expected);
    let code = "import sys, zarr\nzarr.open_array(sys.argv[1]).attrs['units'] = 'm'";
    common::mount::python_ok("attribute", code, &[&m.path("zp_raw")]);
    shown_as_written(&m);
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    stored_compressed(&backing);
    assert_eq!(doc(&backing.join("zp_raw"))["attributes"]["units"], "m");
    py("check", &backing, &expected);
}

/// A writer's document is the writer's: a mark in it (copied from BACKING, or forged)
/// does not make the mount undo a `zstd` the writer's chunks really have.
#[test]
fn a_mark_in_a_writers_document_is_not_the_mounts() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--compress", "zstd"], LIMIT);
    let mut forged: Value = serde_json::from_str(BYTES_1D).unwrap();
    forged["codecs"] = json!([{"name": "bytes"}, {"name": "zstd", "configuration": {"level": 1, "checksum": false}}]);
    forged["attributes"] = json!({MARK: "zstd"});
    let dir = m.path("forged");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("zarr.json"), forged.to_string()).unwrap();
    let shown = doc(&dir);
    assert_eq!(
        names(shown["codecs"].as_array().unwrap()),
        ["bytes", "zstd"]
    );
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    let stored = doc(&backing.join("forged"));
    assert_eq!(names(&inner_codecs(&stored)), ["bytes", "zstd"], "{stored}");
    assert!(stored["attributes"].get(MARK).is_none(), "{stored}");
}

/// A raw array of 4 chunks of 16 bytes per shard, through `m`, its chunks written.
fn small(m: &Mounted, name: &str, chunks: u8) -> std::path::PathBuf {
    let dir = m.path(name);
    fs::create_dir_all(dir.join("c")).unwrap();
    fs::write(dir.join("zarr.json"), BYTES_1D).unwrap();
    for k in 0..chunks {
        fs::write(dir.join(format!("c/{k}")), [k + 1; 16]).unwrap();
    }
    dir
}

fn chunks_read(dir: &Path, chunks: u8) {
    for k in 0..chunks {
        let got = fs::read(dir.join(format!("c/{k}"))).unwrap();
        assert_eq!(got, [k + 1; 16], "{}/c/{k}", dir.display());
    }
}

/// A `zarr.json` removed (or moved away) and put back makes an array anew over the shards
/// it had: they decide whether it is compressed, not the option of the mount that sees it
/// come back (else its chunks would be read in the wrong form, found by the attack).
#[test]
fn a_document_put_back_follows_its_shards() {
    let (_dir, backing, _) = dirs();
    let args = ["--compress", "zstd", "--chunks-per-shard", "4"];
    let m = Mounted::new(&backing, &args, LIMIT);
    small(&m, "marked", 8);
    small(&m, "moved", 8);
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    let m = Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    small(&m, "plain", 8);
    let shown = fs::read(m.path("marked/zarr.json")).unwrap();
    fs::remove_file(m.path("marked/zarr.json")).unwrap();
    fs::write(m.path("marked/zarr.json"), &shown).unwrap();
    fs::rename(m.path("moved/zarr.json"), m.path("moved/zarr.json.bak")).unwrap();
    fs::rename(m.path("moved/zarr.json.bak"), m.path("moved/zarr.json")).unwrap();
    for a in ["marked", "moved", "plain"] {
        chunks_read(&m.path(a), 8);
    }
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    // And the other way: an array of raw shards, its document put back through a mount
    // that compresses, stays raw.
    let m = Mounted::new(&backing, &args, LIMIT);
    let shown = fs::read(m.path("plain/zarr.json")).unwrap();
    fs::remove_file(m.path("plain/zarr.json")).unwrap();
    fs::write(m.path("plain/zarr.json"), &shown).unwrap();
    chunks_read(&m.path("plain"), 8);
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    for (a, compressed) in [("marked", true), ("moved", true), ("plain", false)] {
        let stored = doc(&backing.join(a));
        let codecs = names(&inner_codecs(&stored)).join(",");
        assert_eq!(codecs == "bytes,zstd", compressed, "{a}: {stored}");
        assert_eq!(stored["attributes"].get(MARK).is_some(), compressed, "{a}");
    }
    let code = "import sys, zarr, numpy as np\nfor p in sys.argv[1:]:\n    \
                assert (zarr.open_array(p)[:] == np.repeat(np.arange(1, 9), 16)[:128]).all(), p";
    let paths: Vec<_> = ["marked", "moved", "plain"]
        .map(|a| backing.join(a))
        .to_vec();
    let paths: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    common::mount::python_ok("native reads", code, &paths);
    common::assert_ok(
        &common::shardfs(&["verify", backing.to_str().unwrap()]),
        "verify",
    );
}

/// The shard of `dir` holding chunks 0..4 rebuilt natively with `frame` at position 0.
fn plant(dir: &Path, frame: Vec<u8>) {
    use shardfs::shard::{ShardBuilder, read_index};
    let meta = match shardfs::zarr::Node::parse(&fs::read(dir.join("zarr.json")).unwrap()) {
        Ok(shardfs::zarr::Node::Array(a)) => a,
        other => panic!("{other:?}"),
    };
    let layout = shardfs::zarr::ShardLayout::of(&meta).unwrap().unwrap();
    let path = dir.join("c/0");
    let old = fs::read(&path).unwrap();
    let file = fs::File::open(&path).unwrap();
    let index = read_index(&file, old.len() as u64, &layout.index).unwrap();
    let mut b = ShardBuilder::new(layout.index.clone());
    for (pos, r) in index.present() {
        let bytes = old[r.offset as usize..(r.offset + r.nbytes) as usize].to_vec();
        b.set(pos, vec![bytes.into()]);
    }
    b.set(0, vec![frame.into()]);
    fs::write(&path, b.build().unwrap().to_vec()).unwrap();
}

/// A chunk of a compressed array holds no more than its raw size: a write past it is
/// refused (EFBIG), and a frame placed in BACKING that claims or gives more (a bomb: a
/// few bytes that decompress to far more) reads as EIO, shown at the raw size, never
/// decompressed past it; the rest of the shard reads, the daemon lives, `verify` says which.
#[test]
fn a_compressed_chunk_never_holds_more_than_its_raw_size() {
    let (_dir, backing, _) = dirs();
    let args = ["--compress", "zstd", "--chunks-per-shard", "4"];
    let m = Mounted::new(&backing, &args, LIMIT);
    let dir = small(&m, "a", 8);
    let f = fs::OpenOptions::new()
        .write(true)
        .open(dir.join("c/2"))
        .unwrap();
    let too_long = std::os::unix::fs::FileExt::write_at(&f, &[9u8; 17], 0);
    assert_eq!(common::mount::errno_of(too_long), Some(libc::EFBIG));
    let too_long = f.set_len(17);
    assert_eq!(common::mount::errno_of(too_long), Some(libc::EFBIG));
    drop(f);
    chunks_read(&dir, 8);
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);

    let declared = zstd::bulk::compress(&vec![0u8; 64 << 20], 3).unwrap();
    let mut undeclared = zstd::stream::Encoder::new(Vec::new(), 3).unwrap();
    undeclared.include_contentsize(false).unwrap();
    undeclared.write_all(&vec![0u8; 64 << 20]).unwrap();
    let undeclared = undeclared.finish().unwrap();
    for bomb in [declared, undeclared] {
        plant(&backing.join("a"), bomb);
        let m = Mounted::new(&backing, &[], LIMIT);
        let c0 = m.path("a/c/0");
        assert_eq!(fs::metadata(&c0).unwrap().len(), 16, "shown at its most");
        assert_eq!(common::mount::errno_of(fs::read(&c0)), Some(libc::EIO));
        for k in 1..8u8 {
            assert_eq!(fs::read(m.path(&format!("a/c/{k}"))).unwrap(), [k + 1; 16]);
        }
        assert!(m.daemon_alive());
        common::assert_ok(&m.unmount(&[]), "unmount");
        drop(m);
        let v = common::shardfs(&["verify", backing.to_str().unwrap()]);
        assert_eq!(v.status.code(), Some(1), "{}", common::stdout(&v));
        assert!(common::stdout(&v).contains("not a zstd frame of 16 bytes"));
    }
}

/// A 2-D uint8 array document, 8x8 in 4x4 chunks, its chunks transposed or not (raw
/// either way; another codec chain, so not the same array's document rewritten).
fn doc_2d(transpose: bool) -> String {
    let mut codecs = vec![json!({"name": "bytes"})];
    if transpose {
        codecs.insert(
            0,
            json!({"name": "transpose", "configuration": {"order": [1, 0]}}),
        );
    }
    json!({"zarr_format": 3, "node_type": "array", "shape": [8, 8], "data_type": "uint8",
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4, 4]}},
        "chunk_key_encoding": {"name": "default"}, "fill_value": 0, "codecs": codecs})
    .to_string()
}

/// Chunks `c/0/0` .. `c/1/1` of a 4x4-chunked 2-D array, each 16 bytes of its own value.
fn four_chunks(dir: &Path) {
    fs::create_dir_all(dir.join("c/0")).unwrap();
    fs::create_dir_all(dir.join("c/1")).unwrap();
    fs::write(dir.join("zarr.json"), doc_2d(false)).unwrap();
    for (k, key) in ["0/0", "0/1", "1/0", "1/1"].iter().enumerate() {
        fs::write(dir.join(format!("c/{key}")), [k as u8 + 1; 16]).unwrap();
    }
}

/// Whether the stored document of `array` has the mount's zstd (and its mark).
fn stored_marked(array: &Path) -> bool {
    let stored = doc(array);
    let zstd = names(&inner_codecs(&stored)).contains(&"zstd");
    assert_eq!(zstd, stored["attributes"].get(MARK).is_some(), "{stored}");
    zstd
}

/// Which form an array's chunks are stored in is not the document's to change: a document
/// rewritten with other codecs (or another chunk shape) keeps the form (through a mount with or without
/// `--compress`), and one put back over shards is compressed only when those hold the
/// mount's frames, whatever their sizes (found by the attack: a raw array with one chunk
/// written short became "compressed"; frames of exactly the raw size were taken for raw).
#[test]
fn the_form_of_stored_chunks_stays_whatever_a_document_says() {
    let (_dir, backing, _) = dirs();
    let compress = ["--compress", "zstd", "--chunks-per-shard", "4"];
    let plain = ["--chunks-per-shard", "4"];
    let m = Mounted::new(&backing, &compress, LIMIT);
    four_chunks(&m.path("marked"));
    let exact = small_exact_frames(&m);
    drop_mount(m);
    let m = Mounted::new(&backing, &plain, LIMIT);
    four_chunks(&m.path("raw"));
    four_chunks(&m.path("short"));
    fs::write(m.path("short/c/0/1"), b"hi\n").unwrap();
    // Another codec chain (the same chunks), through a mount that does not compress.
    fs::write(m.path("marked/zarr.json"), doc_2d(true)).unwrap();
    drop_mount(m);
    let m = Mounted::new(&backing, &compress, LIMIT);
    fs::write(m.path("raw/zarr.json"), doc_2d(true)).unwrap();
    for a in ["short", "exact"] {
        let shown = fs::read(m.path(&format!("{a}/zarr.json"))).unwrap();
        fs::rename(m.path(&format!("{a}/zarr.json")), m.path("away.json")).unwrap();
        fs::write(m.path(&format!("{a}/zarr.json")), &shown).unwrap();
        fs::remove_file(m.path("away.json")).unwrap();
    }
    // Every chunk reads as written (a frame shown raw, or raw bytes taken for a frame,
    // would not).
    for a in ["marked", "raw"] {
        for (k, key) in ["0/0", "0/1", "1/0", "1/1"].iter().enumerate() {
            let got = fs::read(m.path(&format!("{a}/c/{key}"))).unwrap();
            assert_eq!(got, [k as u8 + 1; 16], "{a}/c/{key}");
        }
    }
    assert_eq!(fs::read(m.path("short/c/0/1")).unwrap(), b"hi\n");
    assert_eq!(fs::read(m.path("short/c/1/1")).unwrap(), [4u8; 16]);
    for (k, want) in exact.iter().enumerate() {
        assert_eq!(&fs::read(m.path(&format!("exact/c/{k}"))).unwrap(), want);
    }
    drop_mount(m);
    for (a, marked) in [
        ("marked", true),
        ("exact", true),
        ("raw", false),
        ("short", false),
    ] {
        assert_eq!(stored_marked(&backing.join(a)), marked, "{a}");
    }
    let code = "import sys, zarr\nfor p in sys.argv[1:]:\n    zarr.open_array(p)[:]";
    let paths: Vec<_> = ["marked", "raw", "exact"].map(|a| backing.join(a)).to_vec();
    let paths: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    common::mount::python_ok("native reads", code, &paths);
}

fn drop_mount(m: Mounted) {
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
}

/// A raw 1-D array `exact` of two 64-byte chunks through `m` (which compresses), each of
/// which zstd (level 3) makes a frame of exactly 64 bytes: returns the chunks.
fn small_exact_frames(m: &Mounted) -> Vec<Vec<u8>> {
    let mut found = Vec::new();
    'search: for seed in 1..5000u64 {
        let mut rng = common::Rng::new(seed);
        for random in 30..64usize {
            let mut chunk = vec![0u8; 64];
            for b in chunk.iter_mut().take(random) {
                *b = rng.next() as u8;
            }
            if zstd::bulk::compress(&chunk, 3).unwrap().len() == 64 {
                found.push(chunk);
                if found.len() == 2 {
                    break 'search;
                }
                continue 'search;
            }
        }
    }
    assert_eq!(found.len(), 2, "no chunk whose frame is exactly its size");
    let dir = m.path("exact");
    fs::create_dir_all(dir.join("c")).unwrap();
    let doc = BYTES_1D.replace("[16]", "[64]");
    fs::write(dir.join("zarr.json"), doc).unwrap();
    for (k, chunk) in found.iter().enumerate() {
        fs::write(dir.join(format!("c/{k}")), chunk).unwrap();
    }
    found
}

/// A file renamed or linked onto a chunk key of an array the mount compresses holds no
/// more than a chunk of it may: refused (EFBIG) as a write would be, the file left where
/// it was (found by the attack: it was taken, and after the shard write read as EIO).
#[test]
fn a_file_larger_than_a_compressed_chunk_cannot_become_one() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--compress", "zstd", "--chunks-per-shard", "4"],
        LIMIT,
    );
    let dir = small(&m, "t", 4);
    fs::write(m.path("loose.bin"), [9u8; 20]).unwrap();
    let moved = fs::rename(m.path("loose.bin"), dir.join("c/1"));
    assert_eq!(common::mount::errno_of(moved), Some(libc::EFBIG));
    let linked = fs::hard_link(m.path("loose.bin"), dir.join("c/5"));
    assert_eq!(common::mount::errno_of(linked), Some(libc::EFBIG));
    assert_eq!(fs::read(m.path("loose.bin")).unwrap(), [9u8; 20]);
    // One that fits is taken.
    fs::write(m.path("fits.bin"), [7u8; 16]).unwrap();
    fs::rename(m.path("fits.bin"), dir.join("c/1")).unwrap();
    drop_mount(m);
    let m = Mounted::new(&backing, &[], LIMIT);
    assert_eq!(fs::read(m.path("t/c/1")).unwrap(), [7u8; 16]);
    assert_eq!(fs::read(m.path("t/c/2")).unwrap(), [3u8; 16]);
    drop_mount(m);
    common::assert_ok(
        &common::shardfs(&["verify", backing.to_str().unwrap()]),
        "verify",
    );
}

/// Many readers of one compressed chunk share one decompressed copy of it (each open had
/// its own: 24 readers of a 16 MiB chunk took the daemon to 485 MB, found by the attack).
#[test]
fn readers_of_a_compressed_chunk_share_one_copy() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--compress", "zstd"], LIMIT);
    let dir = m.path("big");
    fs::create_dir_all(dir.join("c")).unwrap();
    let doc = BYTES_1D
        .replace("[128]", "[33554432]")
        .replace("[16]", "[16777216]");
    fs::write(dir.join("zarr.json"), doc).unwrap();
    let chunk: Vec<u8> = (0..16u32 << 20).map(|i| (i / 4096) as u8).collect();
    fs::write(dir.join("c/0"), &chunk).unwrap();
    drop_mount(m);
    let m = Mounted::new(&backing, &[], LIMIT);
    let before = rss_kib(m.pid);
    let mut handles = Vec::new();
    for i in 0..12u64 {
        let f = fs::File::open(m.path("big/c/0")).unwrap();
        let mut byte = [0u8; 1];
        let at = i * 1_300_000;
        std::os::unix::fs::FileExt::read_exact_at(&f, &mut byte, at).unwrap();
        assert_eq!(byte[0], chunk[at as usize]);
        handles.push(f);
    }
    let grown = rss_kib(m.pid).saturating_sub(before);
    assert!(
        grown < 64 << 10,
        "the daemon grew {grown} KiB for 12 readers of 16 MiB"
    );
    drop(handles);
    drop_mount(m);
}

/// The resident memory of process `pid`, in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Writes `bytes` to `path` and returns what its close said (`fs::write` ignores it, and
/// a `zarr.json` is judged at its close).
fn write_and_close(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::os::fd::IntoRawFd;
    let mut f = fs::File::create(path)?;
    f.write_all(bytes)?;
    let fd = f.into_raw_fd();
    match unsafe { libc::close(fd) } {
        0 => Ok(()),
        _ => Err(std::io::Error::last_os_error()),
    }
}

/// A document that would read an array's compressed chunks in another form (another
/// compressor, another chunk size) is refused while the array holds chunks, and taken
/// when it holds none (found by the attack: `gzip` dropped the mark, and the chunks showed
/// as frames for good).
#[test]
fn a_document_that_would_misread_compressed_chunks_is_refused() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--compress", "zstd", "--chunks-per-shard", "4"],
        LIMIT,
    );
    let dir = small(&m, "a", 8);
    let gzip = BYTES_1D.replace(
        r#"[{"name":"bytes"}]"#,
        r#"[{"name":"bytes"},{"name":"gzip","configuration":{"level":1}}]"#,
    );
    let int16 = BYTES_1D.replace("uint8", "uint16");
    for doc in [&gzip, &int16] {
        let refused = write_and_close(&dir.join("zarr.json"), doc.as_bytes());
        assert_eq!(
            common::mount::errno_of(refused),
            Some(libc::EINVAL),
            "{doc}"
        );
        chunks_read(&dir, 8);
    }
    // With no chunk, any document goes.
    let empty = m.path("empty");
    fs::create_dir(&empty).unwrap();
    fs::write(empty.join("zarr.json"), BYTES_1D).unwrap();
    write_and_close(&empty.join("zarr.json"), gzip.as_bytes()).unwrap();
    drop_mount(m);
    assert!(stored_marked(&backing.join("a")));
    assert!(!stored_marked(&backing.join("empty")));
}

/// A document put back over the shards its array left is laid out as they are: after a
/// resize (the policy would now choose other shards), through a mount with another
/// policy, and where nothing remembers them, refused when the shards do not read under
/// the policy (found by the attack: every chunk read as EIO, new ones never written).
#[test]
fn a_document_put_back_is_laid_out_as_its_shards_are() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "2"], LIMIT);
    for a in ["resized", "other", "forgotten"] {
        small(&m, a, 8);
    }
    drop_mount(m);
    let m = Mounted::new(&backing, &[], LIMIT);
    // Resized: the layout stays (2 chunks per shard), then the document goes and comes back.
    let resized = fs::read_to_string(m.path("resized/zarr.json")).unwrap();
    let bigger = resized.replacen("128", "1024", 1);
    fs::write(m.path("resized/zarr.json"), &bigger).unwrap();
    fs::rename(m.path("resized/zarr.json"), m.path("away.json")).unwrap();
    fs::rename(m.path("away.json"), m.path("resized/zarr.json")).unwrap();
    // Other: its document removed, its directory renamed, then the document put back.
    let other = fs::read(m.path("other/zarr.json")).unwrap();
    fs::remove_file(m.path("other/zarr.json")).unwrap();
    fs::rename(m.path("other"), m.path("other2")).unwrap();
    fs::write(m.path("other2/zarr.json"), &other).unwrap();
    for a in ["resized", "other2"] {
        chunks_read(&m.path(a), 8);
    }
    // An array removed whole and made anew at a path takes the mount's policy (here one
    // shard for the array), not the layout the one before it left.
    fs::remove_dir_all(m.path("resized")).unwrap();
    small(&m, "resized", 8);
    drop_mount(m);
    // Nothing remembers "forgotten": its document removed in BACKING, put back through a
    // mount whose policy would read its shards wrong.
    let stored = fs::read(backing.join("forgotten/zarr.json")).unwrap();
    fs::remove_file(backing.join("forgotten/zarr.json")).unwrap();
    let m = Mounted::new(&backing, &[], LIMIT);
    let refused = write_and_close(&m.path("forgotten/zarr.json"), BYTES_1D.as_bytes());
    assert_eq!(common::mount::errno_of(refused), Some(libc::EINVAL));
    // Its own (sharded) document puts it back as it was (shown as its writer wrote it,
    // sharded, until the next mount), written at once: the kernel still has the refused
    // name, and the write must not go into the refused document.
    fs::write(m.path("forgotten/zarr.json"), &stored).unwrap();
    drop_mount(m);
    let m = Mounted::new(&backing, &[], LIMIT);
    chunks_read(&m.path("forgotten"), 8);
    drop_mount(m);
    let remade = doc(&backing.join("resized"));
    let shard = &remade["chunk_grid"]["configuration"]["chunk_shape"];
    assert_eq!(shard, &json!([128]), "{remade}");
    common::assert_ok(
        &common::shardfs(&["verify", backing.to_str().unwrap()]),
        "verify",
    );
}

/// A document put back through the mount is held to what a rewrite would be: one that
/// would read the array's compressed chunks in another form is refused (found by the
/// attack: removed, then put back with `gzip`, the mount's zstd was dropped for good), and
/// the array's own document puts it back.
#[test]
fn a_document_put_back_keeps_the_form_of_compressed_chunks() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(
        &backing,
        &["--compress", "zstd", "--chunks-per-shard", "4"],
        LIMIT,
    );
    let dir = small(&m, "a", 8);
    let shown = fs::read(dir.join("zarr.json")).unwrap();
    fs::remove_file(dir.join("zarr.json")).unwrap();
    let gzip = BYTES_1D.replace(
        r#"[{"name":"bytes"}]"#,
        r#"[{"name":"bytes"},{"name":"gzip","configuration":{"level":1}}]"#,
    );
    let refused = write_and_close(&dir.join("zarr.json"), gzip.as_bytes());
    assert_eq!(common::mount::errno_of(refused), Some(libc::EINVAL));
    write_and_close(&dir.join("zarr.json"), &shown).unwrap();
    chunks_read(&dir, 8);
    drop_mount(m);
    assert!(stored_marked(&backing.join("a")));
}

/// Chunk files of the `crc32c` codec (data, then its checksum) copied in before their
/// `zarr.json` are chunks, not shards of another layout (found by the attack: `cp -r` in
/// that order was refused).
#[test]
fn crc32c_chunk_files_before_their_document_are_chunks() {
    let (_dir, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--chunks-per-shard", "4"], LIMIT);
    let dir = m.path("q");
    fs::create_dir_all(dir.join("c")).unwrap();
    let chunk = |k: u8| {
        let data: Vec<u8> = (0..16).map(|i| k * 16 + i).collect();
        let mut bytes = data.clone();
        bytes.extend_from_slice(&crc32c::crc32c(&data).to_le_bytes());
        bytes
    };
    for k in 0..8u8 {
        fs::write(dir.join(format!("c/{k}")), chunk(k)).unwrap();
    }
    let doc = BYTES_1D.replace(
        r#"[{"name":"bytes"}]"#,
        r#"[{"name":"bytes"},{"name":"crc32c"}]"#,
    );
    write_and_close(&dir.join("zarr.json"), doc.as_bytes()).unwrap();
    for k in 0..8u8 {
        assert_eq!(fs::read(dir.join(format!("c/{k}"))).unwrap(), chunk(k));
    }
    drop_mount(m);
    let code = "import sys, zarr, numpy as np\n\
                assert (zarr.open_array(sys.argv[1])[:] == np.arange(128)).all()";
    common::mount::python_ok("native read", code, &[&backing.join("q")]);
}

/// `tests/py/dtypes.py` with `args`.
fn dtypes(args: &[&str]) {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/dtypes.py");
    let mut all = vec![p.to_str().unwrap()];
    all.extend(args);
    common::python_run(&all, &format!("dtypes.py {args:?}"));
}

/// Every fixed-size data type zarr-python writes (datetime64, timedelta64, fixed-length
/// bytes and unicode, raw bytes and structured ones among them) goes through a compressing
/// mount whether its chunk files come before its `zarr.json` or after: it reads as written
/// through the mount and natively from the shards, and `verify` passes (the mount did not
/// know these types' sizes: chunk files first made the array unreadable, document first
/// made every chunk "not a zstd frame of 4294967296 bytes").
#[test]
fn every_data_type_goes_through_a_compressing_mount_in_either_order() {
    let (dir, backing, expected) = dirs();
    let src = dir.path().join("native");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    dtypes(&["write", &s(&src), &s(&expected)]);
    let m = Mounted::new(
        &backing,
        &["--compress", "zstd", "--chunks-per-shard", "4"],
        LIMIT,
    );
    for order in ["doc-first", "chunks-first"] {
        fs::create_dir(m.path(order)).unwrap();
        dtypes(&["copy", &s(&src), &s(&m.path(order)), order]);
        dtypes(&["check", &s(&m.path(order)), &s(&expected)]);
    }
    common::assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    for order in ["doc-first", "chunks-first"] {
        let stored = doc(&backing.join(order).join("datetime64"));
        // Types zarr-python 3.1 cannot take sharded stay as written (unsharded).
        for plain in ["void6", "structured"] {
            let stored = doc(&backing.join(order).join(plain));
            assert_eq!(stored["codecs"][0]["name"], "bytes", "{order}: {stored}");
        }
        assert_eq!(
            names(&inner_codecs(&stored)),
            ["bytes", "zstd"],
            "{order}: {stored}"
        );
        dtypes(&["check", &s(&backing.join(order)), &s(&expected)]);
    }
    let v = common::shardfs(&["verify", backing.to_str().unwrap()]);
    common::assert_ok(&v, "verify");
}
