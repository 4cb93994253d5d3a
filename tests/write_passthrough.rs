//! FUSE passthrough of plain files: files outside arrays are read and written by the
//! kernel in BACKING, never through the daemon; the mount keeps the kernel's rule (every
//! open of an inode passing through, or none) and keeps data from being left behind in a
//! file that a rename took away.

mod common;

use std::fs::{self, File, OpenOptions};
use std::io::{Read, Seek, SeekFrom, Write};
use std::time::Duration;

use common::mount::{Mounted, dirs, stats};

const LIMIT: Duration = Duration::from_secs(240);
const MIB: usize = 1 << 20;

const ONE_D: &str = r#"{"zarr_format":3,"node_type":"array","shape":[64],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[16]}},
"chunk_key_encoding":{"name":"default"},"fill_value":0,"codecs":[{"name":"bytes"}]}"#;

fn requests_of(report: &serde_json::Value, kind: &str) -> u64 {
    report["fuse_requests"][kind]["count"].as_u64().unwrap_or(0)
}

/// Writes 8 MiB into a new plain file in 1 MiB writes, appends, truncates, reads it back
/// whole; returns the daemon's READ and WRITE requests meanwhile and the stats after.
fn plain_file_round(m: &Mounted) -> (u64, u64, serde_json::Value) {
    fs::create_dir_all(m.path("notes")).unwrap();
    let before = stats(m);
    let data: Vec<u8> = (0..8 * MIB).map(|i| (i * 7 % 251) as u8).collect();
    let mut f = File::create(m.path("notes/image.raw")).unwrap();
    for block in data.chunks(MIB) {
        f.write_all(block).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);
    // An open of the existing file, appending.
    let mut f = OpenOptions::new()
        .append(true)
        .open(m.path("notes/image.raw"))
        .unwrap();
    f.write_all(b"tail").unwrap();
    drop(f);
    let mut f = OpenOptions::new()
        .read(true)
        .write(true)
        .open(m.path("notes/image.raw"))
        .unwrap();
    f.set_len(4 * MIB as u64 + 4).unwrap();
    f.seek(SeekFrom::Start(4 * MIB as u64)).unwrap();
    f.write_all(b"TAIL").unwrap();
    let mut back = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut back).unwrap();
    drop(f);
    let mut want = data[..4 * MIB].to_vec();
    want.extend_from_slice(b"TAIL");
    assert!(back == want, "what was read back differs");
    let stored = fs::read(m.backing.join("notes/image.raw")).unwrap();
    assert!(stored == want, "what BACKING holds differs");
    let after = stats(m);
    let sent = |kind: &str| requests_of(&after, kind) - requests_of(&before, kind);
    (sent("read"), sent("write"), after)
}

/// Reads and writes of a plain file reach the daemon not once (the kernel does them in
/// BACKING); with --no-passthrough they all do. `stats` says which.
#[test]
fn plain_files_pass_through_the_kernel() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], LIMIT);
    let (reads, writes, after) = plain_file_round(&m);
    assert_eq!(after["passthrough"], "on", "{after}");
    assert_eq!(writes, 0, "{after}");
    // (Reading the stats is itself a read or two of the control file.)
    assert!(reads <= 2, "{after}");
    drop(m);

    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--no-passthrough"], LIMIT);
    let (reads, writes, after) = plain_file_round(&m);
    assert_eq!(after["passthrough"], "off: --no-passthrough", "{after}");
    assert!(writes >= 8, "{after}");
    assert!(reads >= 4, "{after}");
}

/// A plain file open through passthrough is not renamed into an array (its later writes
/// would land in the file the rename emptied): EBUSY while open, moved once closed. A lock
/// file, tensorstore's way to write a key, does not pass through and is renamed while
/// open, as tensorstore does.
#[test]
fn a_file_open_through_passthrough_stays_out_of_arrays_until_closed() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], LIMIT);
    fs::create_dir_all(m.path("a/c")).unwrap();
    fs::write(m.path("a/zarr.json"), ONE_D).unwrap();
    fs::create_dir(m.path("plain")).unwrap();

    let mut f = File::create(m.path("plain/x")).unwrap();
    f.write_all(&[5u8; 16]).unwrap();
    let busy = fs::rename(m.path("plain/x"), m.path("a/c/0")).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::EBUSY), "{busy}");
    // Onto a document, too.
    let busy = fs::rename(m.path("plain/x"), m.path("plain/zarr.json")).unwrap_err();
    assert_eq!(busy.raw_os_error(), Some(libc::EBUSY), "{busy}");
    f.write_all(&[6u8; 0]).unwrap();
    drop(f);
    fs::rename(m.path("plain/x"), m.path("a/c/0")).unwrap();
    assert_eq!(fs::read(m.path("a/c/0")).unwrap(), vec![5u8; 16]);

    let mut lock = File::create(m.path("plain/k.__lock")).unwrap();
    lock.write_all(&[9u8; 16]).unwrap();
    lock.sync_all().unwrap();
    fs::rename(m.path("plain/k.__lock"), m.path("a/c/1")).unwrap();
    drop(lock);
    assert_eq!(fs::read(m.path("a/c/1")).unwrap(), vec![9u8; 16]);
}

/// An inode open without passthrough (a chunk being read) and renamed out of its array
/// into a plain directory opens again through the daemon: the kernel fails an open that
/// passes through while another does not (EIO).
#[test]
fn an_inode_open_through_the_daemon_is_not_opened_through_the_kernel() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], LIMIT);
    fs::create_dir_all(m.path("a/c")).unwrap();
    fs::write(m.path("a/zarr.json"), ONE_D).unwrap();
    fs::write(m.path("a/c/2"), [4u8; 16]).unwrap();
    fs::create_dir(m.path("plain")).unwrap();

    let mut reader = File::open(m.path("a/c/2")).unwrap();
    let mut first = [0u8; 4];
    reader.read_exact(&mut first).unwrap();
    fs::rename(m.path("a/c/2"), m.path("plain/was-a-chunk")).unwrap();
    let again = fs::read(m.path("plain/was-a-chunk")).unwrap();
    assert_eq!(again, vec![4u8; 16]);
    let mut rest = Vec::new();
    reader.read_to_end(&mut rest).unwrap();
    assert_eq!(rest, vec![4u8; 12]);
    drop(reader);
    // Closed everywhere: from now on it passes through, and reads the same.
    std::thread::sleep(Duration::from_millis(200));
    let before = stats(&m);
    assert_eq!(
        fs::read(m.path("plain/was-a-chunk")).unwrap(),
        vec![4u8; 16]
    );
    let after = stats(&m);
    assert!(
        requests_of(&after, "read") - requests_of(&before, "read") <= 2,
        "{after}"
    );
}

/// A chunk file written before its array's `zarr.json` and still open through passthrough
/// (here by another name, a hard link) is not taken into a shard under the writer (its
/// later writes would be lost): the document's close meets EBUSY, the document is kept and
/// committed once the file is closed and the mount idle, with every byte written.
#[test]
fn a_directory_does_not_become_an_array_under_an_open_chunk_file() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &["--idle-flush", "0.3"], LIMIT);
    fs::create_dir_all(m.path("d/c")).unwrap();
    fs::create_dir(m.path("elsewhere")).unwrap();
    // Open by another name (a hard link): the same file.
    let mut f = File::create(m.path("elsewhere/x")).unwrap();
    fs::hard_link(m.path("elsewhere/x"), m.path("d/c/0")).unwrap();
    f.write_all(&[7u8; 16]).unwrap();
    // The document is committed at its close, which says EBUSY (and keeps it for later).
    let mut doc = File::create(m.path("d/zarr.json")).unwrap();
    doc.write_all(ONE_D.as_bytes()).unwrap();
    let fd = std::os::fd::IntoRawFd::into_raw_fd(doc);
    let closed = unsafe { libc::close(fd) };
    let busy = std::io::Error::last_os_error();
    assert_eq!(
        (closed, busy.raw_os_error()),
        (-1, Some(libc::EBUSY)),
        "{busy}"
    );
    assert!(!backing.join("d/zarr.json").exists());
    use std::os::unix::fs::FileExt;
    f.write_all_at(&[9u8; 16], 0).unwrap();
    f.sync_all().unwrap();
    drop(f);
    // Kept, and committed once the file is closed and the mount idle.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !backing.join("d/zarr.json").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(backing.join("d/zarr.json").exists(), "the kept document");
    assert_eq!(fs::read(m.path("d/c/0")).unwrap(), vec![9u8; 16]);
    assert!(
        fs::read_dir(backing.join("d/c")).unwrap().count() <= 1,
        "the chunk went into a shard"
    );
}

/// A plain file replaced in BACKING from outside while open through the mount: a new open
/// by its name reads the new file (the name gets a new inode), the old open the old one.
#[test]
fn a_file_replaced_outside_while_open_opens_anew() {
    let (_d, backing, _) = dirs();
    let m = Mounted::new(&backing, &[], LIMIT);
    fs::create_dir(m.path("p")).unwrap();
    fs::write(m.path("p/log"), b"old").unwrap();
    let mut held = File::open(m.path("p/log")).unwrap();
    fs::write(backing.join("p/log.new"), b"new content").unwrap();
    fs::rename(backing.join("p/log.new"), backing.join("p/log")).unwrap();
    for wait in [0, 1100] {
        std::thread::sleep(Duration::from_millis(wait));
        assert_eq!(
            fs::read(m.path("p/log")).unwrap(),
            b"new content",
            "{wait} ms"
        );
    }
    let mut old = Vec::new();
    held.read_to_end(&mut old).unwrap();
    assert_eq!(old, b"old");
}

/// A full disk between the shards of chunk files written before their document and the
/// document itself: nothing of the import stays (the chunk files are plain files again, at
/// their names, with their bytes; no shard, no file moved aside), and the document, kept,
/// is committed by the idle flusher once there is room.
#[test]
fn a_document_that_finds_the_disk_full_leaves_its_chunk_files_as_they_were() {
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("b");
    let _tmpfs = common::convert::Tmpfs::mount(&backing, "8m");
    let m = Mounted::new(&backing, &["--idle-flush", "0.5"], LIMIT);
    fs::create_dir_all(m.path("g/c/0")).unwrap();
    fs::write(m.path("g/c/0/0"), [6u8; 4]).unwrap();
    fs::write(m.path("g/c/0/1"), [8u8; 4]).unwrap();
    let mut filler = File::create(m.path("filler")).unwrap();
    while filler.write_all(&[1u8; 65536]).is_ok() {}
    drop(filler);
    // One page free: room for the shard, not for the document after it.
    let len = fs::metadata(backing.join("filler")).unwrap().len();
    File::options()
        .write(true)
        .open(backing.join("filler"))
        .unwrap()
        .set_len(len - 4096)
        .unwrap();
    let doc = r#"{"zarr_format":3,"node_type":"array","shape":[4,4],"data_type":"uint8",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[2,2]}},
"chunk_key_encoding":{"name":"default"},"fill_value":0,"codecs":[{"name":"bytes"}]}"#;
    let mut f = File::create(m.path("g/zarr.json")).unwrap();
    f.write_all(doc.as_bytes()).unwrap();
    let closed = unsafe { libc::close(std::os::fd::IntoRawFd::into_raw_fd(f)) };
    assert_eq!(closed, -1, "the document's close tells of the full disk");
    assert_eq!(fs::read(backing.join("g/c/0/0")).unwrap(), [6u8; 4]);
    assert_eq!(fs::read(backing.join("g/c/0/1")).unwrap(), [8u8; 4]);
    let names: Vec<String> = fs::read_dir(backing.join("g/c/0"))
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(names.len(), 2, "{names:?}");
    fs::remove_file(backing.join("filler")).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    while !backing.join("g/zarr.json").exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(backing.join("g/zarr.json").exists(), "the kept document");
    assert_eq!(fs::read(m.path("g/c/0/0")).unwrap(), [6u8; 4]);
    assert_eq!(fs::read(m.path("g/c/0/1")).unwrap(), [8u8; 4]);
}
