//! A short fuzzing pass over everything shardfs parses from untrusted bytes, with the very
//! bodies the cargo-fuzz targets run (`fuzz/bodies.rs`): seeded mutations of valid inputs,
//! reproducible, a few seconds. The long runs use cargo-fuzz (see the README).

#![allow(dead_code)]

mod common;

include!("../fuzz/bodies.rs");

use common::Rng;

use shardfs::shard::{ChunkRange, ShardIndex};

/// A mutation of `seed`: flipped, inserted, removed or overwritten bytes, or a cut.
fn mutate(rng: &mut Rng, seed: &[u8]) -> Vec<u8> {
    let mut out = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let at = rng.below(out.len() + 1);
        match rng.below(6) {
            0 if at < out.len() => out[at] ^= 1 << rng.below(8),
            1 => out.insert(at, rng.next() as u8),
            2 if at < out.len() => {
                out.remove(at);
            }
            3 => out.truncate(at),
            4 if at + 8 <= out.len() => {
                out[at..at + 8].copy_from_slice(&rng.next().to_le_bytes());
            }
            _ => {
                let interesting: &[&[u8]] = &[
                    b"0",
                    b"-1",
                    b"18446744073709551615",
                    b"1e400",
                    b"\"",
                    b"[]",
                    b"{}",
                    b"null",
                    b"/",
                    b".",
                ];
                let s = interesting[rng.below(interesting.len())];
                out.splice(at..at, s.iter().copied());
            }
        }
    }
    out
}

fn run(name: &str, seeds: &[Vec<u8>], body: fn(&[u8]), rounds: usize) {
    let mut rng = Rng::new(0x5eed_0000 + name.len() as u64);
    for seed in seeds {
        body(seed);
    }
    for i in 0..rounds {
        let seed = &seeds[i % seeds.len()];
        let input = mutate(&mut rng, seed);
        let result = std::panic::catch_unwind(|| body(&input));
        assert!(result.is_ok(), "{name}: input {i} panicked: {input:?}");
    }
}

fn index_seeds() -> Vec<Vec<u8>> {
    let mut seeds = Vec::new();
    for (head, dims) in [
        (0u8, vec![1u8]),
        (1, vec![1, 2]),
        (0x12, vec![2, 2, 0]),
        (0x61, vec![3, 1]),
    ] {
        let ndim = (head % 3) as usize + 1;
        let dims = dims[..ndim.min(dims.len())].to_vec();
        if dims.len() < ndim {
            continue;
        }
        let format = IndexFormat {
            chunks_per_shard: dims.iter().map(|d| u64::from(*d % 6) + 1).collect(),
            codec: IndexCodec {
                endian: if head & 0x10 == 0 {
                    Endian::Little
                } else {
                    Endian::Big
                },
                crc32c: head & 0x20 == 0,
            },
            location: if head & 0x40 == 0 {
                IndexLocation::End
            } else {
                IndexLocation::Start
            },
        };
        let n = format.n_chunks();
        let ranges: Vec<Option<ChunkRange>> = (0..n)
            .map(|p| {
                (p % 2 == 0).then_some(ChunkRange {
                    offset: 100 * p as u64,
                    nbytes: 50,
                })
            })
            .collect();
        let index = ShardIndex::from_entries(ranges);
        let mut seed = vec![head];
        seed.extend(&dims);
        seed.extend(format.encode(&index));
        seeds.push(seed);
    }
    // Found by the long run: an empty range inside another one (legal).
    seeds.push(vec![
        0xf8, 0x01, 0, 0, 0, 0, 0, 0x20, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xc1,
        0, 0, 0, 0xe2, 0, 0x69, 0xc1, 0x69, 0xac, 0xdd,
    ]);
    seeds
}

const ARRAY: &str = r#"{"zarr_format":3,"node_type":"array","shape":[100,60],"data_type":"uint16",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[10,6]}},
"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},"fill_value":0,
"codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"zstd","configuration":{"level":0}}],
"attributes":{"a":[1,2]},"dimension_names":["y","x"]}"#;

const SHARDED: &str = r#"{"zarr_format":3,"node_type":"array","shape":[100],"data_type":"float32",
"chunk_grid":{"name":"regular","configuration":{"chunk_shape":[20]}},
"chunk_key_encoding":{"name":"v2","configuration":{"separator":"."}},"fill_value":"NaN",
"codecs":[{"name":"sharding_indexed","configuration":{"chunk_shape":[5],
"codecs":[{"name":"bytes","configuration":{"endian":"little"}}],
"index_codecs":[{"name":"bytes","configuration":{"endian":"little"}},{"name":"crc32c"}],
"index_location":"start"}}]}"#;

const GROUP: &str = r#"{"zarr_format":3,"node_type":"group","attributes":{},
"consolidated_metadata":{"kind":"inline","must_understand":false,"metadata":{"x":"#;

#[test]
fn shard_index_decoding_never_panics() {
    run("shard_index", &index_seeds(), shard_index, 30_000);
}

#[test]
fn chunk_key_parsing_never_panics() {
    let seeds: Vec<Vec<u8>> = [
        "c/1/22/3", "c.0.1", "0.1.2", "4/5", "c", "0", "c/01", "c//1",
    ]
    .iter()
    .map(|s| s.as_bytes().to_vec())
    .collect();
    run("chunk_key", &seeds, chunk_key, 30_000);
}

#[test]
fn metadata_parsing_and_translation_never_panic() {
    let group = format!("{GROUP}{SHARDED}}}}}}}");
    let seeds: Vec<Vec<u8>> = [ARRAY.to_string(), SHARDED.to_string(), group]
        .iter()
        .map(|s| s.as_bytes().to_vec())
        .collect();
    // Found by the long run: a float that drifted on each rewrite (inexact parsing).
    let mut seeds = seeds;
    seeds.push(
        br#"{"zarr_format":3,"node_type":"array","shape":[100,60],"data_type":"uint16","chunk_grid":{"name":"regular","configuration":{"chunk_shape":[10,6]}},"chunk_key_encoding":{"name":"default","configuration":{"separator":"/"}},"fill_value":5555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555,"codecs":[{"name":"bytes"}],"attributes":{"x":[0.1,1e-300,5555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555555.5]}}"#
            .to_vec(),
    );
    for s in &seeds {
        assert!(
            Node::parse(s).is_ok(),
            "seed does not parse: {}",
            String::from_utf8_lossy(s)
        );
    }
    run("metadata", &seeds, metadata, 20_000);
}
