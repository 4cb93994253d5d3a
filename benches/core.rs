//! Micro-benchmarks (criterion): the pure parts (index decode and encode, shard assembly
//! from segments, chunk key parsing) and the core driven without FUSE (writing chunks,
//! looking chunks up in arrays of 10^2 and 10^4 shards). `cargo bench`; `cargo bench --
//! --quick` for a short run.

use std::ffi::OsStr;
use std::path::Path;

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use shardfs::backing::Backing;
use shardfs::core::fs::namespace::Caller;
use shardfs::core::{DaemonInfo, Ino, ROOT, ShardFs, WriteConfig};
use shardfs::shard::{
    ChunkRange, IndexCodec, IndexFormat, IndexLocation, ShardBuilder, ShardIndex,
};
use shardfs::zarr::{ChunkKeyEncoding, ChunksPerShard, Separator, ShardPolicy};

const ROOT_CALLER: Caller = Caller {
    uid: 0,
    gid: 0,
    pid: 0,
};

fn format(cps: u64) -> IndexFormat {
    IndexFormat {
        chunks_per_shard: vec![cps; 3],
        codec: IndexCodec::STANDARD,
        location: IndexLocation::End,
    }
}

fn index(n: usize) -> ShardIndex {
    ShardIndex::from_entries(
        (0..n as u64)
            .map(|i| {
                Some(ChunkRange {
                    offset: i * 4096,
                    nbytes: 4096,
                })
            })
            .collect(),
    )
}

fn pure(c: &mut Criterion) {
    let f = format(8);
    let idx = index(512);
    let bytes = f.encode(&idx);
    c.bench_function("index encode, 512 chunks", |b| b.iter(|| f.encode(&idx)));
    c.bench_function("index decode, 512 chunks", |b| {
        b.iter(|| f.decode(&bytes).unwrap())
    });
    let segments: Vec<Bytes> = (0..512).map(|_| Bytes::from(vec![7u8; 4096])).collect();
    let mut g = c.benchmark_group("shard assembly");
    g.throughput(Throughput::Bytes(512 * 4096));
    g.bench_function("512 chunks of 4 KiB, two segments each", |b| {
        b.iter(|| {
            let mut builder = ShardBuilder::new(f.clone());
            for (pos, s) in segments.iter().enumerate() {
                builder.set(pos, vec![s.slice(..2048), s.slice(2048..)]);
            }
            builder.build().unwrap()
        })
    });
    g.finish();
    let enc = ChunkKeyEncoding::Default(Separator::Slash);
    c.bench_function("chunk key parse, 3-d", |b| {
        b.iter(|| enc.decode("c/12/345/6789", 3).unwrap())
    });
}

/// A mount's core over a fresh BACKING with `cps` chunks per shard on every axis.
fn core(dir: &Path, cps: u64) -> ShardFs {
    let config = WriteConfig {
        policy: ShardPolicy::Explicit(ChunksPerShard::Uniform(cps)),
        ..WriteConfig::default()
    };
    ShardFs::with_config(
        Backing::new(dir.to_path_buf()).unwrap(),
        DaemonInfo::default(),
        config,
    )
}

fn lookup(fs: &ShardFs, parent: Ino, name: &str) -> Ino {
    fs.lookup(parent, OsStr::new(name)).unwrap().ino
}

fn mkdir(fs: &ShardFs, parent: Ino, name: &str) -> Ino {
    match fs.lookup(parent, OsStr::new(name)) {
        Ok(a) => a.ino,
        Err(_) => {
            fs.mkdir(parent, OsStr::new(name), 0o755, ROOT_CALLER)
                .unwrap()
                .ino
        }
    }
}

fn write_file(fs: &ShardFs, parent: Ino, name: &str, data: &[u8]) {
    let flags = libc::O_WRONLY | libc::O_CREAT | libc::O_TRUNC;
    let (_, opened) = fs
        .create(parent, OsStr::new(name), 0o644, flags, ROOT_CALLER)
        .unwrap();
    fs.write(opened.fh, 0, data).unwrap();
    fs.flush(opened.fh).unwrap();
    fs.release(opened.fh).unwrap();
}

/// Writes an unsharded 3-d uint8 array's metadata through the core: stored sharded.
fn array(fs: &ShardFs, n: u64, chunk: u64) -> Ino {
    let a = mkdir(fs, ROOT, "a");
    let meta = format!(
        r#"{{"zarr_format":3,"node_type":"array","shape":[{n},{n},{n}],"data_type":"uint8",
        "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[{chunk},{chunk},{chunk}]}}}},
        "chunk_key_encoding":{{"name":"default","configuration":{{"separator":"/"}}}},
        "fill_value":0,"codecs":[{{"name":"bytes"}}],"attributes":{{}}}}"#
    );
    write_file(fs, a, "zarr.json", meta.as_bytes());
    a
}

fn write_path(c: &mut Criterion) {
    let dir = tempfile::tempdir().unwrap();
    let fs = core(dir.path(), 2);
    // 64^3 chunks of 8^3 bytes; 2x2x2 chunks per shard: every 8th chunk completes a shard.
    let a = array(&fs, 512, 8);
    let c_dir = mkdir(&fs, a, "c");
    let data = vec![5u8; 512];
    let mut next = 0u64;
    let mut g = c.benchmark_group("core write path");
    g.throughput(Throughput::Elements(1));
    g.bench_function("one 512-byte chunk: mkdirs, create, write, close", |b| {
        b.iter(|| {
            // C order within 2x2x2 blocks, so that shards complete as they go.
            let k = next % (64 * 64 * 64);
            next += 1;
            let (block, within) = (k / 8, k % 8);
            let (bi, bj, bk) = (block / (32 * 32), block / 32 % 32, block % 32);
            let (i, j, l) = (
                bi * 2 + within / 4,
                bj * 2 + within / 2 % 2,
                bk * 2 + within % 2,
            );
            let di = mkdir(&fs, c_dir, &i.to_string());
            let dj = mkdir(&fs, di, &j.to_string());
            write_file(&fs, dj, &l.to_string(), &data);
        })
    });
    g.finish();
}

/// An array of `shards` shards (2-D, 2x2 chunks of 8x8 uint8 per shard) written natively:
/// one shard file made by the core, copied to every key.
fn native_array(dir: &Path, shards: u64) -> (u64, u64) {
    let cols = shards.min(100);
    let rows = shards / cols;
    let src = tempfile::tempdir().unwrap();
    let fs = core(src.path(), 2);
    let a = mkdir(&fs, ROOT, "a");
    let meta = format!(
        r#"{{"zarr_format":3,"node_type":"array","shape":[{},{}],"data_type":"uint8",
        "chunk_grid":{{"name":"regular","configuration":{{"chunk_shape":[8,8]}}}},
        "chunk_key_encoding":{{"name":"default","configuration":{{"separator":"/"}}}},
        "fill_value":0,"codecs":[{{"name":"bytes"}}],"attributes":{{}}}}"#,
        rows * 16,
        cols * 16
    );
    write_file(&fs, a, "zarr.json", meta.as_bytes());
    let c_dir = mkdir(&fs, a, "c");
    for i in 0..2 {
        let d = mkdir(&fs, c_dir, &i.to_string());
        for j in 0..2 {
            write_file(&fs, d, &j.to_string(), &[1u8; 64]);
        }
    }
    drop(fs);
    let one = std::fs::read(src.path().join("a/c/0/0")).unwrap();
    std::fs::create_dir_all(dir.join("a")).unwrap();
    std::fs::copy(src.path().join("a/zarr.json"), dir.join("a/zarr.json")).unwrap();
    for i in 0..rows {
        let d = dir.join(format!("a/c/{i}"));
        std::fs::create_dir_all(&d).unwrap();
        for j in 0..cols {
            std::fs::write(d.join(j.to_string()), &one).unwrap();
        }
    }
    (rows * 2, cols * 2)
}

fn lookups(c: &mut Criterion) {
    let mut g = c.benchmark_group("chunk lookup (key directory and chunk), by shards in the array");
    for shards in [100u64, 10_000] {
        let dir = tempfile::tempdir().unwrap();
        let (rows, cols) = native_array(dir.path(), shards);
        let fs = core(dir.path(), 2);
        let a = lookup(&fs, ROOT, "a");
        let c_dir = lookup(&fs, a, "c");
        let mut k = 0u64;
        g.bench_with_input(BenchmarkId::from_parameter(shards), &shards, |b, _| {
            b.iter(|| {
                k = (k + 7919) % (rows * cols);
                let d = lookup(&fs, c_dir, &(k / cols).to_string());
                lookup(&fs, d, &(k % cols).to_string())
            })
        });
    }
    g.finish();
}

criterion_group!(benches, pure, write_path, lookups);
criterion_main!(benches);
