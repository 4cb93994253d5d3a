//! When each chunk of a shard got the content the shard holds: a block of one wall-clock
//! time per position (nanoseconds since the epoch; 0 for "not known"), written by shardfs
//! into the shard file where no index range points (just before an index at the end, or
//! at the file's end when the index is at the start). Zarr readers never look at bytes no
//! range names, so the shard stays a plain Zarr shard; shardfs reads the block to order a
//! dead mount's journal record against what other mounts wrote since (a chunk written
//! over and back to the same bytes looks unchanged otherwise).
//!
//! Layout: `n` little-endian u64 times, then a 16-byte footer: `n` (u32), the crc32c of
//! the times and `n` (u32), and the magic `shfsstmp`.

use super::file::ReadAt;
use super::index::{ChunkRange, IndexFormat, IndexLocation, ShardIndex};

const MAGIC: &[u8; 8] = b"shfsstmp";
const FOOTER: u64 = 16;

/// The bytes of a block of `n` positions.
pub fn block_len(n: usize) -> u64 {
    8 * n as u64 + FOOTER
}

pub fn encode(stamps: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(block_len(stamps.len()) as usize);
    for s in stamps {
        out.extend_from_slice(&s.to_le_bytes());
    }
    out.extend_from_slice(&(stamps.len() as u32).to_le_bytes());
    let crc = crc32c::crc32c(&out);
    out.extend_from_slice(&crc.to_le_bytes());
    out.extend_from_slice(MAGIC);
    out
}

/// The times of a block of exactly `block_len(n)` bytes, or `None` when it is not one.
pub fn decode(block: &[u8], n: usize) -> Option<Vec<u64>> {
    if block.len() as u64 != block_len(n) {
        return None;
    }
    let (body, footer) = block.split_at(block.len() - FOOTER as usize);
    let word = |b: &[u8]| u32::from_le_bytes([b[0], b[1], b[2], b[3]]);
    if &footer[8..] != MAGIC || word(&footer[..4]) as usize != n {
        return None;
    }
    if crc32c::crc32c(&block[..block.len() - 12]) != word(&footer[4..8]) {
        return None;
    }
    Some(
        body.chunks_exact(8)
            .map(|b| u64::from_le_bytes(b.try_into().unwrap_or([0; 8])))
            .collect(),
    )
}

/// Where the block ends in a shard file of `file_len` bytes.
fn block_end(format: &IndexFormat, file_len: u64) -> Option<u64> {
    match format.location {
        IndexLocation::End => file_len.checked_sub(format.encoded_len()),
        IndexLocation::Start => Some(file_len),
    }
}

/// The times a shard file holds, if shardfs wrote them (`None` for any other shard). Only
/// bytes that no range of `index` names can be a block: a chunk's own bytes (of a shard
/// another tool wrote) never pass for one, whatever they hold.
pub fn read<R: ReadAt + ?Sized>(
    file: &R,
    file_len: u64,
    format: &IndexFormat,
    index: &ShardIndex,
) -> Option<Vec<u64>> {
    let n = format.n_chunks();
    let end = block_end(format, file_len)?;
    let start = end.checked_sub(block_len(n))?;
    if matches!(format.location, IndexLocation::Start) && start < format.encoded_len() {
        return None;
    }
    let outside = |r: ChunkRange| r.nbytes == 0 || r.end() <= start || r.offset >= end;
    if !index.present().all(|(_, r)| outside(r)) {
        return None;
    }
    let mut buf = vec![0u8; block_len(n) as usize];
    file.read_exact_at(&mut buf, start).ok()?;
    decode(&buf, n)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_block_round_trips_and_damage_is_not_read() {
        let stamps = vec![0, 5, u64::MAX, 42];
        let block = encode(&stamps);
        assert_eq!(block.len() as u64, block_len(4));
        assert_eq!(decode(&block, 4), Some(stamps));
        assert_eq!(decode(&block, 3), None, "another count");
        let mut bad = block.clone();
        bad[3] ^= 1;
        assert_eq!(decode(&bad, 4), None, "a flipped bit");
        assert_eq!(decode(&block[1..], 4), None, "short");
    }
}
