//! The journal's record format. Pure: bytes in, records out.
//!
//! A record is a 16-byte header and a payload:
//!
//! ```text
//! magic "SRJ1" (u32 le) | kind (u8) | 3 zero bytes | payload length (u32 le) | crc32c of payload (u32 le)
//! ```
//!
//! - kind 5, a layout: `id (u32) | path length (u32) | array path | instance length (u32) |
//!   instance | sharded zarr.json`. It names an array (its path, and which array was at that
//!   path: `ArrayState::instance`) and the layout its chunks were written under, once per
//!   segment file. Kind 1 is the same without the instance (journals of earlier versions).
//! - kind 6, a chunk: `layout id (u32) | ndim (u32) | record id (u64) | coords (u64 each) |
//!   was | at (u64) | the chunk's bytes`, where `was` is what the shard held at that
//!   position when the content was taken (a tag byte: 0 absent, 1 a crc32c of the stored
//!   chunk follows as u32, 2 unknown; and the crc) and `at` the wall-clock time it was
//!   written, in nanoseconds (records of one chunk in several journals replay in that
//!   order). Record ids grow through a journal. Kind 2 is the same without `was` and `at`.
//! - kind 3, a retirement: `count (u32) | record ids (u64 each)`: those chunks are durable
//!   in their shards (possibly overwritten since), and replay must not bring them back.
//! - kind 4, a removal: `layout id (u32) | ndim (u32) | record id (u64) | coords | was | at`:
//!   the chunk was deleted (or renamed away) after the records before it; replay deletes it.
//!
//! A record whose checksum does not hold is damage. At the end of a file, with no intact
//! record after it, it is the torn tail of a write whose fsync never returned (a crash tears
//! only the last write). Followed by an intact record where its header says it ends, it is
//! damage in the middle (the media, or someone writing into the file): reading goes on
//! there, and the damaged range is reported (`Decoded::damaged`). A damaged header ends the
//! file, as a torn tail does (`next_intact` says why).

use bytes::Bytes;

pub const MAGIC: u32 = u32::from_le_bytes(*b"SRJ1");
pub const HEADER: usize = 16;
const LAYOUT_V1: u8 = 1;
const CHUNK_V1: u8 = 2;
const RETIRE: u8 = 3;
const GONE: u8 = 4;
const LAYOUT: u8 = 5;
const CHUNK: u8 = 6;
/// No record is larger: a chunk is at most 4 GiB, a layout far less.
const MAX_PAYLOAD: u64 = (4 << 30) + (1 << 20);

/// What the shard held at a chunk's position when a record's content was taken: replay
/// applies the record only over that, never over what someone wrote after.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Was {
    /// No chunk there (or no shard).
    Absent,
    /// A chunk with this crc32c of its stored bytes.
    Crc(u32),
    /// Not known (a damaged shard, or a record of an earlier version): nothing to check.
    Unknown,
}

impl Was {
    /// The state of a position holding `bytes` (`None`: nothing).
    pub fn of(bytes: Option<&[u8]>) -> Was {
        match bytes {
            None => Was::Absent,
            Some(b) => Was::Crc(crc32c::crc32c(b)),
        }
    }

    fn encode(self, out: &mut Vec<u8>) {
        let (tag, crc) = match self {
            Was::Absent => (0u8, 0),
            Was::Crc(c) => (1, c),
            Was::Unknown => (2, 0),
        };
        out.push(tag);
        out.extend_from_slice(&crc.to_le_bytes());
    }

    fn decode(b: &[u8]) -> Option<Was> {
        Some(match (b.first()?, u32_at(b, 1)?) {
            (0, _) => Was::Absent,
            (1, crc) => Was::Crc(crc),
            (2, _) => Was::Unknown,
            _ => return None,
        })
    }
}

/// The bytes `Was` and the time take in a record.
const WAS_LEN: usize = 5;
const AT_LEN: usize = 8;

/// A decoded record.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Layout {
        id: u32,
        array: String,
        /// Which array was at that path (`None`: not recorded).
        instance: Option<String>,
        meta: Vec<u8>,
    },
    Chunk {
        layout: u32,
        id: u64,
        coords: Vec<u64>,
        was: Was,
        /// When it was written (ns since the epoch; 0: not known).
        at: u64,
        data: Bytes,
    },
    Retire {
        ids: Vec<u64>,
    },
    /// The chunk at `coords` is removed, as of record `id`.
    Gone {
        layout: u32,
        id: u64,
        coords: Vec<u64>,
        was: Was,
        at: u64,
    },
}

/// A layout record.
pub fn encode_layout(id: u32, array: &str, instance: &str, meta: &[u8]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(12 + array.len() + instance.len() + meta.len());
    payload.extend_from_slice(&id.to_le_bytes());
    for part in [array, instance] {
        payload.extend_from_slice(&(part.len() as u32).to_le_bytes());
        payload.extend_from_slice(part.as_bytes());
    }
    payload.extend_from_slice(meta);
    framed(LAYOUT, payload)
}

/// What a chunk or removal record says besides its layout, id, coordinates and bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub was: Was,
    /// Wall-clock nanoseconds since the epoch.
    pub at: u64,
}

/// The fixed part of a chunk or removal record: layout, ndim, id, coordinates, `was`, `at`.
fn chunk_head(layout: u32, id: u64, coords: &[u64], stamp: Stamp) -> Vec<u8> {
    let mut fixed = Vec::with_capacity(16 + 8 * coords.len() + WAS_LEN + AT_LEN);
    fixed.extend_from_slice(&layout.to_le_bytes());
    fixed.extend_from_slice(&(coords.len() as u32).to_le_bytes());
    fixed.extend_from_slice(&id.to_le_bytes());
    for c in coords {
        fixed.extend_from_slice(&c.to_le_bytes());
    }
    stamp.was.encode(&mut fixed);
    fixed.extend_from_slice(&stamp.at.to_le_bytes());
    fixed
}

/// A removal record: the chunk at `coords` is gone as of record `id`.
pub fn encode_gone(layout: u32, id: u64, coords: &[u64], stamp: Stamp) -> Vec<u8> {
    framed(GONE, chunk_head(layout, id, coords, stamp))
}

/// A chunk record as buffers: header and fixed part in the first, then `data` as it is
/// (the segments the kernel delivered, not joined).
pub fn encode_chunk(
    layout: u32,
    id: u64,
    coords: &[u64],
    stamp: Stamp,
    data: &[Bytes],
) -> Vec<Bytes> {
    let fixed = chunk_head(layout, id, coords, stamp);
    let mut crc = crc32c::crc32c(&fixed);
    let mut len = fixed.len() as u64;
    for d in data {
        crc = crc32c::crc32c_append(crc, d);
        len += d.len() as u64;
    }
    let mut first = header(CHUNK, len, crc);
    first.extend_from_slice(&fixed);
    let mut out = Vec::with_capacity(data.len() + 1);
    out.push(Bytes::from(first));
    out.extend(data.iter().filter(|d| !d.is_empty()).cloned());
    out
}

/// A retirement record for `ids`.
pub fn encode_retire(ids: &[u64]) -> Vec<u8> {
    let mut payload = Vec::with_capacity(4 + 8 * ids.len());
    payload.extend_from_slice(&(ids.len() as u32).to_le_bytes());
    for id in ids {
        payload.extend_from_slice(&id.to_le_bytes());
    }
    framed(RETIRE, payload)
}

/// A whole record: the header for `payload`, then the payload.
fn framed(kind: u8, payload: Vec<u8>) -> Vec<u8> {
    let mut out = header(kind, payload.len() as u64, crc32c::crc32c(&payload));
    out.extend_from_slice(&payload);
    out
}

fn header(kind: u8, len: u64, crc: u32) -> Vec<u8> {
    let mut h = Vec::with_capacity(HEADER);
    h.extend_from_slice(&MAGIC.to_le_bytes());
    h.extend_from_slice(&[kind, 0, 0, 0]);
    h.extend_from_slice(&(len as u32).to_le_bytes());
    h.extend_from_slice(&crc.to_le_bytes());
    h
}

/// The intact records of a segment (`decode_file`) and where the last of them ends.
#[cfg(test)]
pub fn decode_all(bytes: &Bytes) -> (Vec<Record>, usize) {
    let d = decode_file(bytes);
    (d.records, d.intact_end)
}

/// What a journal file holds: its intact records in order, where the last of them ends,
/// the damaged ranges between intact records, and the torn tail after the last one.
#[derive(Debug, Default)]
pub struct Decoded {
    pub records: Vec<Record>,
    /// The end of the last intact record (0: none).
    pub intact_end: usize,
    /// Damaged records, each followed by an intact one.
    pub damaged: Vec<Damage>,
}

/// Bytes in the middle of a journal file that hold no intact record.
#[derive(Debug, PartialEq, Eq)]
pub struct Damage {
    pub start: usize,
    pub end: usize,
    /// The kind its header names ("a chunk", "a retirement"…).
    pub kind: &'static str,
}

/// Decodes a whole journal file: past damage in the middle, up to a torn tail.
pub fn decode_file(bytes: &Bytes) -> Decoded {
    let mut out = Decoded::default();
    let mut at = 0;
    while at < bytes.len() {
        if let Some((record, len)) = decode_one(bytes, at) {
            out.records.push(record);
            at += len;
            out.intact_end = at;
            continue;
        }
        let Some(next) = next_intact(bytes, at) else {
            break; // a torn tail
        };
        out.damaged.push(Damage {
            start: at,
            end: next,
            kind: header_kind(bytes, at).unwrap_or("unknown"),
        });
        at = next;
    }
    out
}

/// Where the next intact record after damage at `at` begins, if one does: right after the
/// damaged record, by the length its header gives. Never by looking for the next magic
/// number: a chunk's bytes are anyone's to choose, and a record forged inside a chunk
/// written through the mount would be found in a torn tail and replayed with the daemon's
/// privileges. A damaged header (no length to trust) ends the file like a torn tail.
fn next_intact(bytes: &Bytes, at: usize) -> Option<usize> {
    header_kind(bytes, at)?;
    let len = u32_at(bytes.get(at..at + HEADER)?, 8)? as usize;
    let next = at.checked_add(HEADER)?.checked_add(len)?;
    decode_one(bytes, next).map(|_| next)
}

/// The kind a record header at `at` names, if the header looks whole.
fn header_kind(bytes: &Bytes, at: usize) -> Option<&'static str> {
    let h = bytes.get(at..at + HEADER)?;
    if u32_at(h, 0)? != MAGIC || h[5..8] != [0, 0, 0] {
        return None;
    }
    match h[4] {
        LAYOUT_V1 | LAYOUT => Some("a layout"),
        CHUNK_V1 | CHUNK => Some("a chunk"),
        GONE => Some("a removal"),
        RETIRE => Some("a retirement"),
        _ => None,
    }
}

/// A layout record's payload; `with_instance` for kind 5.
fn decode_layout(payload: &[u8], with_instance: bool) -> Option<Record> {
    let id = u32_at(payload, 0)?;
    let mut at = 4usize;
    let mut part = || -> Option<String> {
        let n = u32_at(payload, at)? as usize;
        let text = std::str::from_utf8(payload.get(at + 4..(at + 4).checked_add(n)?)?).ok()?;
        at += 4 + n;
        Some(text.to_string())
    };
    let array = part()?;
    let instance = if with_instance { Some(part()?) } else { None };
    Some(Record::Layout {
        id,
        array,
        instance,
        meta: payload.get(at..)?.to_vec(),
    })
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64s(b: &[u8]) -> Vec<u64> {
    b.chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
        .collect()
}

fn decode_one(bytes: &Bytes, at: usize) -> Option<(Record, usize)> {
    let h = bytes.get(at..at + HEADER)?;
    if u32_at(h, 0)? != MAGIC || h[5..8] != [0, 0, 0] {
        return None;
    }
    let len = u32_at(h, 8)? as usize;
    if len as u64 > MAX_PAYLOAD {
        return None;
    }
    let start = at + HEADER;
    let payload = bytes.get(start..start.checked_add(len)?)?;
    if crc32c::crc32c(payload) != u32_at(h, 12)? {
        return None;
    }
    let record = match h[4] {
        LAYOUT_V1 | LAYOUT => decode_layout(payload, h[4] == LAYOUT)?,
        CHUNK_V1 | CHUNK | GONE => {
            let layout = u32_at(payload, 0)?;
            let ndim = u32_at(payload, 4)? as usize;
            let id = u64::from_le_bytes(payload.get(8..16)?.try_into().ok()?);
            let end = 16usize.checked_add(ndim.checked_mul(8)?)?;
            let coords = u64s(payload.get(16..end)?);
            let (was, at, end) = match h[4] {
                CHUNK_V1 => (Was::Unknown, 0, end),
                _ => {
                    let was = Was::decode(payload.get(end..)?)?;
                    let t = end + WAS_LEN;
                    let at = u64::from_le_bytes(payload.get(t..t + AT_LEN)?.try_into().ok()?);
                    (was, at, t + AT_LEN)
                }
            };
            if h[4] == GONE {
                Record::Gone {
                    layout,
                    id,
                    coords,
                    was,
                    at,
                }
            } else {
                Record::Chunk {
                    layout,
                    id,
                    coords,
                    was,
                    at,
                    data: bytes.slice(start + end..start + len),
                }
            }
        }
        RETIRE => {
            let n = u32_at(payload, 0)? as usize;
            let ids = payload.get(4..4usize.checked_add(n.checked_mul(8)?)?)?;
            Record::Retire { ids: u64s(ids) }
        }
        _ => return None,
    };
    Some((record, HEADER + len))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stamp(was: Was) -> Stamp {
        Stamp { was, at: 77 }
    }

    fn join(parts: Vec<Bytes>) -> Vec<u8> {
        parts.iter().flat_map(|b| b.iter().copied()).collect()
    }

    #[test]
    fn records_round_trip_and_a_torn_tail_ends_the_segment() {
        let mut seg = encode_layout(7, "a/b", "12-34", br#"{"x":1}"#);
        let data = [Bytes::from_static(b"hello "), Bytes::from_static(b"world")];
        seg.extend(join(encode_chunk(7, 1, &[1, 2], stamp(Was::Crc(9)), &data)));
        seg.extend(join(encode_chunk(7, 2, &[], stamp(Was::Absent), &[])));
        seg.extend(encode_retire(&[1, 2]));
        seg.extend(encode_gone(7, 4, &[1, 2], stamp(Was::Unknown)));
        let whole = seg.len();
        // A torn record after the good ones: its checksum cannot hold.
        let mut torn = join(encode_chunk(
            7,
            3,
            &[3, 4],
            stamp(Was::Absent),
            &[Bytes::from_static(b"lost")],
        ));
        torn.truncate(torn.len() - 2);
        seg.extend(torn);
        let (records, valid) = decode_all(&Bytes::from(seg));
        assert_eq!(valid, whole);
        assert_eq!(
            records,
            vec![
                Record::Layout {
                    id: 7,
                    array: "a/b".into(),
                    instance: Some("12-34".into()),
                    meta: br#"{"x":1}"#.to_vec()
                },
                Record::Chunk {
                    layout: 7,
                    id: 1,
                    coords: vec![1, 2],
                    was: Was::Crc(9),
                    at: 77,
                    data: Bytes::from_static(b"hello world")
                },
                Record::Chunk {
                    layout: 7,
                    id: 2,
                    coords: vec![],
                    was: Was::Absent,
                    at: 77,
                    data: Bytes::new()
                },
                Record::Retire { ids: vec![1, 2] },
                Record::Gone {
                    layout: 7,
                    id: 4,
                    coords: vec![1, 2],
                    was: Was::Unknown,
                    at: 77
                },
            ]
        );
    }

    #[test]
    fn damage_in_the_middle_is_told_from_a_torn_tail_and_read_past() {
        let chunk = |id: u64, data: &'static [u8]| {
            join(encode_chunk(
                1,
                id,
                &[id],
                stamp(Was::Absent),
                &[Bytes::from_static(data)],
            ))
        };
        let (a, b, c) = (chunk(1, b"first"), chunk(2, b"second"), chunk(3, b"third"));
        let mut seg = [a.clone(), b.clone(), c.clone()].concat();
        // A flipped byte in the payload of the middle record.
        seg[a.len() + HEADER + 3] ^= 0x10;
        let d = decode_file(&Bytes::from(seg.clone()));
        let ids: Vec<u64> = d
            .records
            .iter()
            .map(|r| match r {
                Record::Chunk { id, .. } => *id,
                _ => 0,
            })
            .collect();
        assert_eq!(ids, [1, 3], "the records after the damage are read");
        assert_eq!(
            d.damaged,
            [Damage {
                start: a.len(),
                end: a.len() + b.len(),
                kind: "a chunk"
            }]
        );
        assert_eq!(d.intact_end, seg.len());
        // The same bytes torn at the end: no damage in the middle, the tail left out.
        let torn = [a.clone(), b[..b.len() - 3].to_vec()].concat();
        let d = decode_file(&Bytes::from(torn));
        assert_eq!(
            (d.records.len(), d.damaged.len(), d.intact_end),
            (1, 0, a.len())
        );
    }

    #[test]
    fn a_flipped_byte_anywhere_in_a_lone_record_leaves_nothing() {
        let rec = join(encode_chunk(
            1,
            9,
            &[5],
            stamp(Was::Absent),
            &[Bytes::from_static(b"abcdef")],
        ));
        for i in 0..rec.len() {
            let mut bad = rec.clone();
            bad[i] ^= 0x40;
            let (records, valid) = decode_all(&Bytes::from(bad));
            assert!(records.is_empty() && valid == 0, "byte {i}");
        }
    }
}
