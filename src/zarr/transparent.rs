//! Transparent zstd: an array created through a mount with `--compress` whose chunks are
//! raw (its codecs `bytes`, or `transpose` then `bytes`) is stored with `zstd` after
//! `bytes` in its inner codecs and an attribute, [`MARK`], that says shardfs added it. The
//! mount shows the writer's own document (no `zstd`, no attribute) and serves each chunk
//! as written; BACKING is an ordinary zstd array to every native reader.
//!
//! The attribute is what tells a transparent `zstd` (undone by the mount) from one a
//! writer chose (served as stored): without it, a mount could not know which document
//! the writer wrote. Pure: the codec works on bytes in memory.

use std::io::{self, Read, Write};

use bytes::Bytes;
use serde_json::{Value, json};

use super::{ArrayMetadata, NamedConfig};

/// The attribute of a stored array whose `zstd` the mount added (its value: `"zstd"`).
pub const MARK: &str = "shardfs:transparent";
const ZSTD: &str = "zstd";

/// Whether `codecs` leave chunks raw: an optional `transpose`, then `bytes`, nothing after
/// (a compressor or a checksum already there is the writer's choice, left as it is).
pub fn raw(codecs: &[NamedConfig]) -> bool {
    let names: Vec<&str> = codecs.iter().map(|c| c.name.as_str()).collect();
    matches!(names.as_slice(), ["bytes"] | ["transpose", "bytes"])
}

/// The unsharded array `meta` with its raw chunks compressed by zstd at `level`; `None`
/// when its chunks are not raw.
pub fn compressed(meta: &ArrayMetadata, level: i32) -> Option<ArrayMetadata> {
    if !raw(&meta.codecs) {
        return None;
    }
    let mut out = meta.clone();
    let config = json!({ "level": level, "checksum": false });
    out.codecs.push(NamedConfig::new(ZSTD, Some(config)));
    Some(out)
}

/// `compressed`, marked as the mount's doing: what a mount with `--compress` stores for a
/// writer's unsharded raw array (before sharding it).
pub fn marked(meta: &ArrayMetadata, level: i32) -> Option<ArrayMetadata> {
    let mut out = compressed(meta, level)?;
    let attributes = out
        .extra
        .entry("attributes")
        .or_insert_with(|| Value::Object(Default::default()));
    attributes.as_object_mut()?.insert(MARK.into(), json!(ZSTD));
    Some(out)
}

/// `meta` without the mark (a document from a writer, which the mark never comes from).
pub fn unmarked(meta: &ArrayMetadata) -> ArrayMetadata {
    let mut out = meta.clone();
    if let Some(Value::Object(a)) = out.extra.get_mut("attributes") {
        a.remove(MARK);
    }
    out
}

/// The level of the transparent zstd of `view` (a stored array's unsharded view), if the
/// mount added it: marked, and raw chunks under the `zstd`.
pub fn level_of(view: &ArrayMetadata) -> Option<i32> {
    let mark = view.attributes()?.get(MARK)?;
    let (last, rest) = view.codecs.split_last()?;
    (mark == ZSTD && last.name == ZSTD && raw(rest)).then(|| {
        last.config_value("level")
            .and_then(Value::as_i64)
            .unwrap_or(3) as i32
    })
}

/// The transparent zstd of the stored sharded array `meta`, if the mount added one.
pub fn of_stored(meta: &ArrayMetadata) -> Option<Zstd> {
    let view = super::unsharded_view(meta).ok()?;
    let level = level_of(&view)?;
    Some(Zstd {
        level,
        max: raw_chunk_bytes(&view).unwrap_or(crate::limits::MAX_FILE_BYTES),
    })
}

/// What a raw chunk of the unsharded array `view` holds: its elements times their size
/// (`transpose` and `bytes` change neither), within what a file may hold.
pub fn raw_chunk_bytes(view: &ArrayMetadata) -> Option<u64> {
    let shape = super::layout::regular_chunk_shape(view).ok()?;
    let elements = shape.iter().try_fold(1u64, |a, &b| a.checked_mul(b))?;
    let bytes = elements.checked_mul(view.item_size()?)?;
    Some(bytes.min(crate::limits::MAX_FILE_BYTES))
}

/// What the writer wrote, from the stored array's unsharded view: without the `zstd` and
/// the attribute the mount added (unchanged when it added none).
pub fn shown(mut view: ArrayMetadata) -> ArrayMetadata {
    if level_of(&view).is_none() {
        return view;
    }
    view.codecs.pop();
    if let Some(Value::Object(a)) = view.extra.get_mut("attributes") {
        a.remove(MARK);
    }
    view
}

/// The chunks of an array the mount compresses: zstd frames with their content size in
/// their header (as Zarr readers expect, and as `content_size` reads it back).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Zstd {
    pub level: i32,
    /// The most a chunk of the array holds (`raw_chunk_bytes`): what a write may make of
    /// one, and what a frame may decompress to. A frame that claims or gives more is
    /// damage (or a bomb placed in BACKING), never decompressed further.
    pub max: u64,
}

/// The most a zstd frame header takes (`ZSTD_FRAMEHEADERSIZE_MAX`): what `content_size`
/// needs of a stored chunk.
pub const HEADER_MAX: u64 = 18;

impl Zstd {
    /// The chunk made of `segments`, compressed as one frame (the segments are never
    /// joined first).
    pub fn encode(&self, segments: &[Bytes]) -> io::Result<Bytes> {
        if let [one] = segments {
            return zstd::bulk::compress(one, self.level).map(Bytes::from);
        }
        let total: u64 = segments.iter().map(|s| s.len() as u64).sum();
        let mut enc = zstd::stream::Encoder::new(Vec::new(), self.level)?;
        enc.include_contentsize(true)?;
        enc.set_pledged_src_size(Some(total))?;
        for s in segments {
            enc.write_all(s)?;
        }
        enc.finish().map(Bytes::from)
    }

    /// The chunk a stored frame holds, refused (EFBIG) past `max` bytes: a forged header
    /// or a bomb must not take the machine's memory. Damage is `InvalidData`.
    pub fn decode(stored: &[u8], max: u64) -> io::Result<Bytes> {
        let hint = content_size(stored).unwrap_or(0).min(max);
        let mut out = Vec::new();
        out.try_reserve_exact(hint as usize)
            .map_err(|_| io::Error::from_raw_os_error(libc::ENOMEM))?;
        let decoder = zstd::stream::read::Decoder::with_buffer(stored)?;
        decoder
            .take(max.saturating_add(1))
            .read_to_end(&mut out)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, e))?;
        if out.len() as u64 > max {
            return Err(io::Error::from_raw_os_error(libc::EFBIG));
        }
        Ok(Bytes::from(out))
    }
}

/// Whether stored chunks of an array (a shard's, read whole) are the mount's frames
/// rather than raw chunks: each one a complete zstd frame that declares its size and
/// decodes to exactly that, no more than `max` (the raw chunk size). Raw chunks are
/// exactly `max` bytes of anything; one that is also such a frame (crafted) would be
/// taken for one, which is why every chunk probed must be one.
pub fn are_frames(chunks: &[Bytes], max: u64) -> bool {
    !chunks.is_empty()
        && chunks.iter().all(|c| {
            let declared = content_size(&c[..c.len().min(HEADER_MAX as usize)]);
            declared.is_some_and(|n| n <= max)
                && Zstd::decode(c, max).is_ok_and(|d| Some(d.len() as u64) == declared)
        })
}

/// The decoded size a frame's header declares (`None`: not declared, or no frame).
pub fn content_size(head: &[u8]) -> Option<u64> {
    zstd::zstd_safe::get_frame_content_size(head).ok().flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn array(codecs: Value) -> ArrayMetadata {
        let doc = json!({"zarr_format": 3, "node_type": "array", "shape": [8],
            "data_type": "float32", "fill_value": 0,
            "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": [4]}},
            "chunk_key_encoding": {"name": "default"},
            "codecs": codecs, "attributes": {"units": "m"}});
        serde_json::from_value(doc).unwrap()
    }

    #[test]
    fn only_raw_chunks_are_marked_and_the_shown_document_is_the_writers() {
        let written = array(json!([{"name": "bytes", "configuration": {"endian": "little"}}]));
        let stored = marked(&written, 5).unwrap();
        assert_eq!(stored.codecs.len(), 2);
        assert_eq!(stored.attributes().unwrap()[MARK], "zstd");
        assert_eq!(level_of(&stored), Some(5));
        assert_eq!(shown(stored), written);
        // A writer's own zstd: no mark, nothing undone.
        let own = compressed(&written, 5).unwrap();
        assert_eq!(level_of(&own), None);
        assert_eq!(shown(own.clone()), own);
        assert!(marked(&own, 5).is_none(), "compressed already");
        // A mark over codecs the mount would not have made is not the mount's.
        let mut forged = own.clone();
        forged.codecs.insert(0, NamedConfig::new("crc32c", None));
        forged.extra["attributes"][MARK] = json!("zstd");
        assert_eq!(level_of(&forged), None);
    }

    #[test]
    fn frames_are_told_from_raw_chunks_by_what_they_are_not_by_their_size() {
        let z = Zstd { level: 3, max: 400 };
        let frame = z.encode(&[Bytes::from(vec![1u8; 400])]).unwrap();
        assert!(are_frames(std::slice::from_ref(&frame), 400));
        // Raw chunks, of the raw size or (written short) not.
        let raw = Bytes::from(vec![1u8; 400]);
        assert!(!are_frames(std::slice::from_ref(&raw), 400));
        assert!(!are_frames(&[Bytes::from_static(b"hi\n")], 400));
        // One raw chunk among frames: not the mount's.
        assert!(!are_frames(&[frame.clone(), raw], 400));
        // A frame of exactly the raw size is still a frame.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..400)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 32) as u8
            })
            .collect();
        let big = z.encode(&[Bytes::from(noise)]).unwrap();
        assert!(big.len() >= 400, "incompressible: {}", big.len());
        assert!(are_frames(&[big], 400));
        // A frame that decodes to more than a chunk holds is no chunk of this array.
        assert!(!are_frames(&[frame], 399));
        assert!(!are_frames(&[], 400));
    }

    #[test]
    fn chunks_come_back_as_written_and_bombs_are_refused() {
        let z = Zstd { level: 3, max: 0 };
        let parts = [Bytes::from(vec![7u8; 1000]), Bytes::from_static(b"tail")];
        let frame = z.encode(&parts).unwrap();
        assert_eq!(content_size(&frame[..HEADER_MAX as usize]), Some(1004));
        let back = Zstd::decode(&frame, 1 << 20).unwrap();
        assert_eq!(back.len(), 1004);
        assert_eq!(&back[1000..], b"tail");
        let one = z.encode(&parts[..1]).unwrap();
        assert_eq!(content_size(&one), Some(1000));
        assert_eq!(
            Zstd::decode(&frame, 1000).unwrap_err().raw_os_error(),
            Some(libc::EFBIG)
        );
        let err = Zstd::decode(&frame[..frame.len() - 3], 1 << 20).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        assert!(Zstd::decode(b"not a frame", 1 << 20).is_err());
        assert_eq!(Zstd::decode(&z.encode(&[]).unwrap(), 10).unwrap().len(), 0);
    }
}
