//! The shard index: one `(offset, nbytes)` pair per inner chunk position, in C order of the
//! position's coordinates within the shard, encoded as uint64 values plus an optional CRC32C.

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::grid;

/// `offset = nbytes = u64::MAX` marks a chunk that is not stored (it reads as fill value).
pub const MISSING: u64 = u64::MAX;

/// Where the index sits in the shard file.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum IndexLocation {
    Start,
    #[default]
    End,
}

impl IndexLocation {
    pub fn as_str(self) -> &'static str {
        match self {
            IndexLocation::Start => "start",
            IndexLocation::End => "end",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Endian {
    Little,
    Big,
}

/// The index codec chains shardfs understands: `bytes` (either endianness), optionally
/// followed by `crc32c`. The chain the spec recommends, and the one every writer we know
/// uses, is `bytes(little)` + `crc32c`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexCodec {
    pub endian: Endian,
    pub crc32c: bool,
}

impl IndexCodec {
    /// `bytes(little)` + `crc32c`, what shardfs writes.
    pub const STANDARD: IndexCodec = IndexCodec {
        endian: Endian::Little,
        crc32c: true,
    };
}

/// The byte range of one stored chunk inside its shard file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct ChunkRange {
    pub offset: u64,
    pub nbytes: u64,
}

impl ChunkRange {
    pub fn end(&self) -> u64 {
        self.offset.saturating_add(self.nbytes)
    }
}

/// Everything needed to find, decode and encode the index of one array's shards.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IndexFormat {
    pub chunks_per_shard: Vec<u64>,
    pub codec: IndexCodec,
    pub location: IndexLocation,
}

/// A decoded index. Positions are linear C-order indices within the shard.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ShardIndex {
    entries: Vec<Option<ChunkRange>>,
}

/// The result of decoding index bytes whose checksum may be wrong: `inspect` still shows
/// what the index says, while everything that serves data insists on `crc_ok`.
#[derive(Clone, Debug)]
pub struct DecodedIndex {
    pub index: ShardIndex,
    pub crc_ok: bool,
}

#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum IndexError {
    #[error("unsupported index codecs: {0} (shardfs reads bytes, optionally followed by crc32c)")]
    UnsupportedCodecs(String),
    #[error("file is {file_len} bytes, shorter than its {index_len}-byte index")]
    FileTooShort { file_len: u64, index_len: u64 },
    #[error("index checksum mismatch: stored crc32c {stored:#010x}, computed {computed:#010x}")]
    CrcMismatch { stored: u32, computed: u32 },
    #[error("index entry for chunk {coords:?} is half missing (offset {offset}, nbytes {nbytes})")]
    HalfMissing {
        coords: Vec<u64>,
        offset: u64,
        nbytes: u64,
    },
    #[error(
        "chunk {coords:?} range {offset}..{end} lies past the end of the {file_len}-byte file",
        end = offset.saturating_add(*nbytes)
    )]
    RangePastEnd {
        coords: Vec<u64>,
        offset: u64,
        nbytes: u64,
        file_len: u64,
    },
    #[error("chunk {coords:?} range {offset}..{end} overlaps the index", end = offset.saturating_add(*nbytes))]
    RangeOverlapsIndex {
        coords: Vec<u64>,
        offset: u64,
        nbytes: u64,
    },
    #[error("chunks {first:?} and {second:?} have overlapping byte ranges")]
    Overlap { first: Vec<u64>, second: Vec<u64> },
}

impl IndexFormat {
    pub fn n_chunks(&self) -> usize {
        grid::count(&self.chunks_per_shard)
    }

    /// Size of the encoded index: 16 bytes per position, plus 4 for the checksum.
    pub fn encoded_len(&self) -> u64 {
        16 * self.n_chunks() as u64 + if self.codec.crc32c { 4 } else { 0 }
    }

    /// Byte offset of the index inside a shard file of `file_len` bytes.
    pub fn index_offset(&self, file_len: u64) -> Result<u64, IndexError> {
        let index_len = self.encoded_len();
        if file_len < index_len {
            return Err(IndexError::FileTooShort {
                file_len,
                index_len,
            });
        }
        Ok(match self.location {
            IndexLocation::Start => 0,
            IndexLocation::End => file_len - index_len,
        })
    }

    /// Decodes index bytes (exactly `encoded_len` of them), reporting rather than failing
    /// on a checksum mismatch.
    pub fn decode_lenient(&self, bytes: &[u8]) -> Result<DecodedIndex, IndexError> {
        let n = self.n_chunks();
        if bytes.len() as u64 != self.encoded_len() {
            return Err(IndexError::FileTooShort {
                file_len: bytes.len() as u64,
                index_len: self.encoded_len(),
            });
        }
        let (body, crc) = bytes.split_at(16 * n);
        let crc_ok = !self.codec.crc32c || {
            let stored = u32::from_le_bytes([crc[0], crc[1], crc[2], crc[3]]);
            stored == crc32c::crc32c(body)
        };
        let read_u64 = |b: &[u8]| {
            let arr: [u8; 8] = b.try_into().unwrap_or([0; 8]);
            match self.codec.endian {
                Endian::Little => u64::from_le_bytes(arr),
                Endian::Big => u64::from_be_bytes(arr),
            }
        };
        let mut entries = Vec::with_capacity(n);
        for (pos, pair) in body.chunks_exact(16).enumerate() {
            let offset = read_u64(&pair[..8]);
            let nbytes = read_u64(&pair[8..]);
            entries.push(match (offset == MISSING, nbytes == MISSING) {
                (true, true) => None,
                (false, false) => Some(ChunkRange { offset, nbytes }),
                _ => {
                    return Err(IndexError::HalfMissing {
                        coords: grid::unravel(pos, &self.chunks_per_shard),
                        offset,
                        nbytes,
                    });
                }
            });
        }
        Ok(DecodedIndex {
            index: ShardIndex { entries },
            crc_ok,
        })
    }

    /// Decodes index bytes and insists on a matching checksum.
    pub fn decode(&self, bytes: &[u8]) -> Result<ShardIndex, IndexError> {
        let decoded = self.decode_lenient(bytes)?;
        if !decoded.crc_ok {
            let body = &bytes[..bytes.len() - 4];
            let tail = &bytes[bytes.len() - 4..];
            return Err(IndexError::CrcMismatch {
                stored: u32::from_le_bytes([tail[0], tail[1], tail[2], tail[3]]),
                computed: crc32c::crc32c(body),
            });
        }
        Ok(decoded.index)
    }

    pub fn encode(&self, index: &ShardIndex) -> Vec<u8> {
        debug_assert_eq!(index.entries.len(), self.n_chunks());
        let mut out = Vec::with_capacity(self.encoded_len() as usize);
        for entry in &index.entries {
            let (offset, nbytes) = entry.map_or((MISSING, MISSING), |r| (r.offset, r.nbytes));
            for v in [offset, nbytes] {
                out.extend_from_slice(&match self.codec.endian {
                    Endian::Little => v.to_le_bytes(),
                    Endian::Big => v.to_be_bytes(),
                });
            }
        }
        if self.codec.crc32c {
            let crc = crc32c::crc32c(&out);
            out.extend_from_slice(&crc.to_le_bytes());
        }
        out
    }

    /// Checks that every range lies inside the file, outside the index, and that no two
    /// ranges overlap. Zero-length ranges never overlap anything.
    pub fn validate(&self, index: &ShardIndex, file_len: u64) -> Result<(), IndexError> {
        let index_start = self.index_offset(file_len)?;
        let index_end = index_start + self.encoded_len();
        let coords = |pos: usize| grid::unravel(pos, &self.chunks_per_shard);
        let mut ranges: Vec<(usize, ChunkRange)> = index.present().collect();
        for &(pos, r) in &ranges {
            if r.offset
                .checked_add(r.nbytes)
                .is_none_or(|end| end > file_len)
            {
                return Err(IndexError::RangePastEnd {
                    coords: coords(pos),
                    offset: r.offset,
                    nbytes: r.nbytes,
                    file_len,
                });
            }
            if r.nbytes > 0 && r.offset < index_end && index_start < r.end() {
                return Err(IndexError::RangeOverlapsIndex {
                    coords: coords(pos),
                    offset: r.offset,
                    nbytes: r.nbytes,
                });
            }
        }
        ranges.retain(|(_, r)| r.nbytes > 0);
        ranges.sort_by_key(|(_, r)| r.offset);
        for pair in ranges.windows(2) {
            let ((a, ra), (b, rb)) = (pair[0], pair[1]);
            if rb.offset < ra.end() {
                return Err(IndexError::Overlap {
                    first: coords(a),
                    second: coords(b),
                });
            }
        }
        Ok(())
    }
}

impl ShardIndex {
    pub fn all_missing(n: usize) -> ShardIndex {
        ShardIndex {
            entries: vec![None; n],
        }
    }

    pub fn from_entries(entries: Vec<Option<ChunkRange>>) -> ShardIndex {
        ShardIndex { entries }
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn get(&self, pos: usize) -> Option<ChunkRange> {
        self.entries.get(pos).copied().flatten()
    }

    pub fn set(&mut self, pos: usize, range: Option<ChunkRange>) {
        self.entries[pos] = range;
    }

    /// Present chunks as `(position, range)`, in position order.
    pub fn present(&self) -> impl Iterator<Item = (usize, ChunkRange)> + '_ {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(pos, e)| e.map(|r| (pos, r)))
    }
}

/// How many entries an index with a crc32c at the end of `tail` (the last bytes of a
/// file) would have: the fewest `n` whose `16 * n` bytes before the last 4 have that
/// checksum, if any does within `tail`. Tells a shard file laid out with another number
/// of chunks per shard from a file that is no shard at all (a chunk file).
pub fn entries_before_crc(tail: &[u8], file_len: u64) -> Option<usize> {
    let (body, crc) = tail.split_at(tail.len().checked_sub(4)?);
    let stored = u32::from_le_bytes(crc.try_into().ok()?);
    let mut computed = 0u32; // the crc32c of no bytes
    for n in 1..=body.len() / 16 {
        let entries = &body[body.len() - 16 * n..];
        let entry = &entries[..16];
        computed = crc32c::crc32c_combine(crc32c::crc32c(entry), computed, 16 * (n - 1));
        if computed == stored && plausible(entries, file_len - 16 * n as u64 - 4) {
            return Some(n);
        }
    }
    None
}

/// Whether `entries` read as an index of chunks in the first `data` bytes of a file: each
/// missing, or inside them, and at least one holding bytes. (A chunk file that ends with
/// a crc32c of its data, as the `crc32c` codec makes it, has one too: its data read as
/// entries points outside the file, or at nothing.)
fn plausible(entries: &[u8], data: u64) -> bool {
    let mut any = false;
    for e in entries.chunks_exact(16) {
        let offset = u64::from_le_bytes(e[..8].try_into().unwrap_or_default());
        let nbytes = u64::from_le_bytes(e[8..].try_into().unwrap_or_default());
        if offset == MISSING && nbytes == MISSING {
            continue;
        }
        if offset.checked_add(nbytes).is_none_or(|end| end > data) {
            return false;
        }
        any |= nbytes > 0;
    }
    any
}

#[cfg(test)]
mod tests {
    #[test]
    fn entries_before_a_crc_are_found_in_a_tail() {
        // A shard: 100 bytes of chunks, 27 entries (each chunk 3 bytes, some missing).
        let mut body = Vec::new();
        for i in 0..27u64 {
            let (offset, nbytes) = if i % 4 == 0 {
                (MISSING, MISSING)
            } else {
                (i * 3, 3)
            };
            body.extend_from_slice(&offset.to_le_bytes());
            body.extend_from_slice(&nbytes.to_le_bytes());
        }
        let mut file = vec![9u8; 100];
        file.extend_from_slice(&body);
        file.extend_from_slice(&crc32c::crc32c(&body).to_le_bytes());
        let len = file.len() as u64;
        assert_eq!(entries_before_crc(&file, len), Some(27));
        assert_eq!(entries_before_crc(&file[..file.len() - 1], len - 1), None);
        assert_eq!(entries_before_crc(&[0u8; 3], 3), None);
        // A chunk file of the crc32c codec: its data and their checksum, no index.
        for data in [(0..32u8).collect::<Vec<u8>>(), vec![0u8; 64]] {
            let mut chunk = data.clone();
            chunk.extend_from_slice(&crc32c::crc32c(&data).to_le_bytes());
            assert_eq!(entries_before_crc(&chunk, chunk.len() as u64), None);
        }
    }

    use super::*;

    fn format(cps: &[u64], location: IndexLocation) -> IndexFormat {
        IndexFormat {
            chunks_per_shard: cps.to_vec(),
            codec: IndexCodec::STANDARD,
            location,
        }
    }

    fn range(offset: u64, nbytes: u64) -> Option<ChunkRange> {
        Some(ChunkRange { offset, nbytes })
    }

    #[test]
    fn encode_decode_round_trip_with_missing_marker() {
        let f = format(&[2, 2], IndexLocation::End);
        let index = ShardIndex::from_entries(vec![range(0, 10), None, range(10, 5), None]);
        let bytes = f.encode(&index);
        assert_eq!(bytes.len() as u64, f.encoded_len());
        assert_eq!(bytes.len(), 16 * 4 + 4);
        assert_eq!(&bytes[16..32], &[0xff; 16]);
        assert_eq!(f.decode(&bytes).unwrap(), index);
    }

    #[test]
    fn crc_is_castagnoli_little_endian_over_the_body() {
        let f = format(&[1], IndexLocation::End);
        let bytes = f.encode(&ShardIndex::from_entries(vec![range(0, 3)]));
        let crc = crc32c::crc32c(&bytes[..16]);
        assert_eq!(&bytes[16..], &crc.to_le_bytes());
    }

    #[test]
    fn flipped_crc_byte_is_detected() {
        let f = format(&[2], IndexLocation::End);
        let mut bytes = f.encode(&ShardIndex::from_entries(vec![range(0, 1), None]));
        let last = bytes.len() - 1;
        bytes[last] ^= 0x40;
        assert!(matches!(
            f.decode(&bytes),
            Err(IndexError::CrcMismatch { .. })
        ));
        assert!(!f.decode_lenient(&bytes).unwrap().crc_ok);
    }

    #[test]
    fn half_missing_entry_is_an_error() {
        let f = format(&[2], IndexLocation::End);
        let mut bytes = f.encode(&ShardIndex::from_entries(vec![range(0, 1), None]));
        bytes[16..24].copy_from_slice(&5u64.to_le_bytes());
        let body_crc = crc32c::crc32c(&bytes[..32]);
        bytes[32..].copy_from_slice(&body_crc.to_le_bytes());
        assert!(matches!(
            f.decode(&bytes),
            Err(IndexError::HalfMissing { coords, .. }) if coords == vec![1]
        ));
    }

    #[test]
    fn big_endian_without_crc() {
        let f = IndexFormat {
            chunks_per_shard: vec![2],
            codec: IndexCodec {
                endian: Endian::Big,
                crc32c: false,
            },
            location: IndexLocation::Start,
        };
        let index = ShardIndex::from_entries(vec![None, range(32, 7)]);
        let bytes = f.encode(&index);
        assert_eq!(bytes.len(), 32);
        assert_eq!(&bytes[16..24], &32u64.to_be_bytes());
        assert_eq!(f.decode(&bytes).unwrap(), index);
    }

    #[test]
    fn validation_faults_each_have_their_own_error() {
        let end = format(&[3], IndexLocation::End);
        let idx_len = end.encoded_len();
        let ok = ShardIndex::from_entries(vec![range(0, 4), None, range(4, 4)]);
        assert_eq!(end.validate(&ok, 8 + idx_len), Ok(()));

        let into_index = ShardIndex::from_entries(vec![range(0, 4), None, range(4, 10)]);
        assert!(matches!(
            end.validate(&into_index, 8 + idx_len),
            Err(IndexError::RangeOverlapsIndex { .. })
        ));
        let past = ShardIndex::from_entries(vec![range(0, 4), None, range(4, 100)]);
        assert!(matches!(
            end.validate(&past, 8 + idx_len),
            Err(IndexError::RangePastEnd { .. })
        ));
        assert!(matches!(
            end.validate(&past, 8),
            Err(IndexError::FileTooShort { .. })
        ));
        let past = ShardIndex::from_entries(vec![range(0, 4), None, range(u64::MAX - 1, 4)]);
        assert!(matches!(
            end.validate(&past, 8 + idx_len),
            Err(IndexError::RangePastEnd { coords, .. }) if coords == vec![2]
        ));

        let overlap = ShardIndex::from_entries(vec![range(0, 5), None, range(4, 4)]);
        assert!(matches!(
            end.validate(&overlap, 8 + idx_len),
            Err(IndexError::Overlap { first, second }) if first == vec![0] && second == vec![2]
        ));

        let start = format(&[3], IndexLocation::Start);
        let in_index = ShardIndex::from_entries(vec![range(0, 4), None, None]);
        assert!(matches!(
            start.validate(&in_index, idx_len + 4),
            Err(IndexError::RangeOverlapsIndex { .. })
        ));
        let after_index = ShardIndex::from_entries(vec![range(idx_len, 4), None, None]);
        assert_eq!(start.validate(&after_index, idx_len + 4), Ok(()));
    }

    #[test]
    fn zero_length_ranges_do_not_overlap() {
        let f = format(&[3], IndexLocation::End);
        let idx = ShardIndex::from_entries(vec![range(0, 4), range(2, 0), range(4, 0)]);
        assert_eq!(f.validate(&idx, 4 + f.encoded_len()), Ok(()));
    }

    #[test]
    fn index_offset_by_location() {
        let f = format(&[1], IndexLocation::End);
        assert_eq!(f.index_offset(100).unwrap(), 100 - 20);
        let s = format(&[1], IndexLocation::Start);
        assert_eq!(s.index_offset(100).unwrap(), 0);
        assert!(matches!(
            s.index_offset(19),
            Err(IndexError::FileTooShort {
                file_len: 19,
                index_len: 20
            })
        ));
    }
}
