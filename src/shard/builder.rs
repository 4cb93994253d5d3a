//! Assembles a shard file from chunks given as lists of `Bytes` segments. Segments are never
//! concatenated: the result is the list of buffers of the whole file, in order, ready for one
//! vectored write.

use std::io::{self, IoSlice, Write};

use bytes::Bytes;

use super::index::{ChunkRange, IndexError, IndexFormat, IndexLocation, ShardIndex};

/// The content of one chunk: its bytes, in order, as the segments they arrived in.
pub type Segments = Vec<Bytes>;

/// Chunks of one shard, position by position, on their way to a shard file.
#[derive(Debug)]
pub struct ShardBuilder {
    format: IndexFormat,
    chunks: Vec<Option<Segments>>,
    /// When each position got its content (`stamps`); all 0: no block is written.
    stamps: Vec<u64>,
    /// Written even with no chunk left, for its stamps (an index with every chunk missing).
    keep_empty: bool,
}

/// A whole shard file as an ordered list of buffers.
#[derive(Debug)]
pub struct EncodedShard {
    buffers: Vec<Bytes>,
    index: ShardIndex,
    len: u64,
}

impl ShardBuilder {
    pub fn new(format: IndexFormat) -> ShardBuilder {
        let n = format.n_chunks();
        ShardBuilder {
            format,
            chunks: vec![None; n],
            stamps: vec![0; n],
            keep_empty: false,
        }
    }

    /// Starts from an existing shard file: every chunk it holds is kept, as a slice of
    /// `file` (no copy), unless later replaced or removed. The index is validated against
    /// the file first.
    pub fn over_existing(
        format: IndexFormat,
        file: &Bytes,
        index: &ShardIndex,
    ) -> Result<ShardBuilder, IndexError> {
        if index.len() != format.n_chunks() {
            return Err(IndexError::FileTooShort {
                file_len: 16 * index.len() as u64,
                index_len: format.encoded_len(),
            });
        }
        format.validate(index, file.len() as u64)?;
        let mut builder = ShardBuilder::new(format);
        for (pos, range) in index.present() {
            let (start, end) = (range.offset as usize, range.end() as usize);
            builder.chunks[pos] = Some(vec![file.slice(start..end)]);
        }
        Ok(builder)
    }

    /// Sets the chunk at C-order position `pos`, replacing what was there.
    pub fn set(&mut self, pos: usize, segments: Segments) {
        self.chunks[pos] = Some(segments);
    }

    pub fn remove(&mut self, pos: usize) {
        self.chunks[pos] = None;
    }

    /// Position `pos` got what it holds (a content, or nothing) at `ns` (`stamps`).
    pub fn stamp(&mut self, pos: usize, ns: u64) {
        if let Some(s) = self.stamps.get_mut(pos) {
            *s = ns;
        }
    }

    /// The stamps an existing shard holds, for the positions kept from it.
    pub fn stamps_from(&mut self, stamps: &[u64]) {
        for (s, old) in self.stamps.iter_mut().zip(stamps) {
            *s = *old;
        }
    }

    pub fn holds_no_chunk(&self) -> bool {
        self.chunks.iter().all(Option::is_none)
    }

    /// A shard with no chunk left is still written, when it has stamps: its removals
    /// must be seen as later than an older record of them.
    pub fn keep_when_empty(&mut self) {
        self.keep_empty = true;
    }

    /// Lays out the shard: chunks in position order, index at the configured end.
    /// `None` when every chunk is missing, which means "no shard file".
    pub fn build(self) -> Option<EncodedShard> {
        let stamped = self.stamps.iter().any(|s| *s != 0);
        if self.chunks.iter().all(Option::is_none) && !(self.keep_empty && stamped) {
            return None;
        }
        let index_len = self.format.encoded_len();
        let data_start = data_start(&self.format);
        let sizes = self.chunks.iter().enumerate().filter_map(|(pos, chunk)| {
            let segments = chunk.as_ref()?;
            Some((pos, segments.iter().map(|s| s.len() as u64).sum()))
        });
        let (index, mut offset) = place(&self.format, sizes);
        let mut buffers = Vec::with_capacity(self.chunks.len() + 1);
        for segments in self.chunks.into_iter().flatten() {
            buffers.extend(segments.into_iter().filter(|s| !s.is_empty()));
        }
        if stamped {
            buffers.push(Bytes::from(super::stamps::encode(&self.stamps)));
            offset += super::stamps::block_len(self.stamps.len());
        }
        let encoded = Bytes::from(self.format.encode(&index));
        match self.format.location {
            IndexLocation::Start => buffers.insert(0, encoded),
            IndexLocation::End => buffers.push(encoded),
        }
        Some(EncodedShard {
            buffers,
            index,
            len: offset + if data_start == 0 { index_len } else { 0 },
        })
    }
}

/// Where the first chunk of a shard in `format` begins: after the index when it is at the
/// start.
fn data_start(format: &IndexFormat) -> u64 {
    match format.location {
        IndexLocation::Start => format.encoded_len(),
        IndexLocation::End => 0,
    }
}

/// Where chunks of these sizes (position, encoded size; in position order) lie in a shard
/// laid out as `ShardBuilder::build` lays it out: one after the other in position order,
/// after the index when it is at the start. Returns the index and where the chunks end.
pub fn place(
    format: &IndexFormat,
    sizes: impl IntoIterator<Item = (usize, u64)>,
) -> (ShardIndex, u64) {
    let mut index = ShardIndex::all_missing(format.n_chunks());
    let mut offset = data_start(format);
    for (pos, nbytes) in sizes {
        index.set(pos, Some(ChunkRange { offset, nbytes }));
        offset += nbytes;
    }
    (index, offset)
}

impl EncodedShard {
    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    pub fn index(&self) -> &ShardIndex {
        &self.index
    }

    pub fn buffers(&self) -> &[Bytes] {
        &self.buffers
    }

    pub fn io_slices(&self) -> Vec<IoSlice<'_>> {
        self.buffers.iter().map(|b| IoSlice::new(b)).collect()
    }

    /// Writes the whole shard with vectored writes: one `writev` unless the kernel takes
    /// less (IOV_MAX is 1024 buffers, and writes can be short), then the rest.
    pub fn write_all_to(&self, out: &mut impl Write) -> io::Result<()> {
        write_all_vectored(out, &self.buffers)
    }

    /// The file as one contiguous buffer; for tests and small tools, never the write path.
    pub fn to_vec(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(self.len as usize);
        for b in &self.buffers {
            v.extend_from_slice(b);
        }
        v
    }
}

/// Writes every buffer with `writev`, looping only when the kernel takes less.
pub fn write_all_vectored(out: &mut impl Write, buffers: &[Bytes]) -> io::Result<()> {
    // Empty buffers are left out: a write of nothing returns 0, which would read as a
    // device that accepts no more (an empty file is a normal thing to write).
    let mut slices: Vec<IoSlice<'_>> = buffers
        .iter()
        .filter(|b| !b.is_empty())
        .map(|b| IoSlice::new(b))
        .collect();
    let mut rest: &mut [IoSlice<'_>] = &mut slices;
    while !rest.is_empty() {
        match out.write_vectored(rest) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shard::index::IndexCodec;

    fn format(location: IndexLocation) -> IndexFormat {
        IndexFormat {
            chunks_per_shard: vec![2, 2],
            codec: IndexCodec::STANDARD,
            location,
        }
    }

    #[test]
    fn empty_buffers_write_an_empty_file() {
        let mut out = Vec::new();
        write_all_vectored(&mut out, &[Bytes::new()]).unwrap();
        write_all_vectored(&mut out, &[]).unwrap();
        assert!(out.is_empty());
        write_all_vectored(
            &mut out,
            &[Bytes::new(), Bytes::from_static(b"ab"), Bytes::new()],
        )
        .unwrap();
        assert_eq!(out, b"ab");
    }

    fn segs(parts: &[&'static [u8]]) -> Segments {
        parts.iter().map(|p| Bytes::from_static(p)).collect()
    }

    fn chunk_bytes(file: &[u8], f: &IndexFormat, pos: usize) -> Option<Vec<u8>> {
        let off = f.index_offset(file.len() as u64).unwrap() as usize;
        let index = f
            .decode(&file[off..off + f.encoded_len() as usize])
            .unwrap();
        f.validate(&index, file.len() as u64).unwrap();
        index
            .get(pos)
            .map(|r| file[r.offset as usize..r.end() as usize].to_vec())
    }

    #[test]
    fn builds_a_valid_shard_from_segments_at_either_location() {
        for location in [IndexLocation::End, IndexLocation::Start] {
            let f = format(location);
            let mut b = ShardBuilder::new(f.clone());
            b.set(0, segs(&[b"ab", b"", b"cd"]));
            b.set(3, segs(&[b"xyz"]));
            let shard = b.build().unwrap();
            let file = shard.to_vec();
            assert_eq!(file.len() as u64, shard.len());
            assert_eq!(shard.len(), 7 + f.encoded_len());
            assert_eq!(chunk_bytes(&file, &f, 0).unwrap(), b"abcd");
            assert_eq!(chunk_bytes(&file, &f, 1), None);
            assert_eq!(chunk_bytes(&file, &f, 3).unwrap(), b"xyz");
            // Segments are handed over as they came: nothing was joined.
            assert_eq!(shard.buffers().len(), 4);
            let slices = shard.io_slices();
            assert_eq!(
                slices.iter().map(|s| s.len() as u64).sum::<u64>(),
                shard.len()
            );
            assert_eq!(
                slices
                    .iter()
                    .flat_map(|s| s.iter().copied())
                    .collect::<Vec<u8>>(),
                file
            );
        }
    }

    #[test]
    fn segments_are_shared_not_copied() {
        let data = Bytes::from(vec![7u8; 4096]);
        let mut b = ShardBuilder::new(format(IndexLocation::End));
        b.set(1, vec![data.slice(0..1000), data.slice(1000..)]);
        let shard = b.build().unwrap();
        assert_eq!(shard.buffers()[0].as_ptr(), data.as_ptr());
        assert_eq!(shard.buffers()[1].as_ptr(), data[1000..].as_ptr());
    }

    #[test]
    fn building_over_an_existing_shard_keeps_replaces_and_drops() {
        for location in [IndexLocation::End, IndexLocation::Start] {
            let f = format(location);
            let mut b = ShardBuilder::new(f.clone());
            b.set(0, segs(&[b"old0"]));
            b.set(1, segs(&[b"old1"]));
            b.set(2, segs(&[b"old2"]));
            let old = Bytes::from(b.build().unwrap().to_vec());
            let off = f.index_offset(old.len() as u64).unwrap() as usize;
            let index = f.decode(&old[off..off + f.encoded_len() as usize]).unwrap();

            let mut b = ShardBuilder::over_existing(f.clone(), &old, &index).unwrap();
            b.set(1, segs(&[b"new", b"1"]));
            b.remove(2);
            b.set(3, segs(&[b"new3"]));
            let file = b.build().unwrap().to_vec();
            assert_eq!(chunk_bytes(&file, &f, 0).unwrap(), b"old0");
            assert_eq!(chunk_bytes(&file, &f, 1).unwrap(), b"new1");
            assert_eq!(chunk_bytes(&file, &f, 2), None);
            assert_eq!(chunk_bytes(&file, &f, 3).unwrap(), b"new3");

            // An index that does not fit the file is refused, not trusted.
            let short = old.slice(..10);
            assert!(ShardBuilder::over_existing(f.clone(), &short, &index).is_err());
            let wrong_rank = ShardIndex::all_missing(3);
            assert!(ShardBuilder::over_existing(f, &old, &wrong_rank).is_err());
        }
    }

    #[test]
    fn every_chunk_missing_means_no_file() {
        let f = format(IndexLocation::End);
        assert!(ShardBuilder::new(f.clone()).build().is_none());
        let mut b = ShardBuilder::new(f);
        b.set(2, segs(&[b"x"]));
        b.remove(2);
        assert!(b.build().is_none());
    }

    #[test]
    fn vectored_write_survives_short_writes() {
        /// Takes at most 3 bytes per call, like a slow pipe.
        struct Dribble(Vec<u8>, usize);
        impl Write for Dribble {
            fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
                let n = buf.len().min(3);
                self.0.extend_from_slice(&buf[..n]);
                self.1 += 1;
                Ok(n)
            }
            fn flush(&mut self) -> io::Result<()> {
                Ok(())
            }
        }
        let mut b = ShardBuilder::new(format(IndexLocation::Start));
        b.set(0, segs(&[b"hello", b"world"]));
        let shard = b.build().unwrap();
        let mut out = Dribble(Vec::new(), 0);
        shard.write_all_to(&mut out).unwrap();
        assert_eq!(out.0, shard.to_vec());
    }
}

#[cfg(test)]
mod stamp_tests {
    use super::*;
    use crate::shard::{Endian, IndexCodec, read_index, stamps};

    #[test]
    fn stamps_lie_where_no_range_points_and_an_empty_stamped_shard_is_kept() {
        for location in [IndexLocation::End, IndexLocation::Start] {
            let format = IndexFormat {
                chunks_per_shard: vec![4],
                location,
                codec: IndexCodec {
                    endian: Endian::Little,
                    crc32c: true,
                },
            };
            let mut b = ShardBuilder::new(format.clone());
            b.set(1, vec![Bytes::from_static(b"abc")]);
            b.stamp(1, 11);
            b.stamp(2, 22);
            let file = b.build().unwrap().to_vec();
            let index = read_index(&file[..], file.len() as u64, &format).unwrap();
            let r = index.get(1).unwrap();
            assert_eq!(&file[r.offset as usize..r.end() as usize], b"abc");
            assert_eq!(
                stamps::read(&file[..], file.len() as u64, &format, &index),
                Some(vec![0, 11, 22, 0])
            );
            // A chunk whose own bytes end like a block is not taken for one.
            let forged = stamps::encode(&[9; 4]);
            let mut native = ShardBuilder::new(format.clone());
            native.set(3, vec![Bytes::from(forged)]);
            let file = native.build().unwrap().to_vec();
            let index = read_index(&file[..], file.len() as u64, &format).unwrap();
            assert_eq!(
                stamps::read(&file[..], file.len() as u64, &format, &index),
                None
            );
            let mut empty = ShardBuilder::new(format.clone());
            empty.stamp(0, 5);
            assert!(ShardBuilder::new(format.clone()).build().is_none());
            empty.keep_when_empty();
            let file = empty.build().unwrap().to_vec();
            let index = read_index(&file[..], file.len() as u64, &format).unwrap();
            assert_eq!(index.present().count(), 0);
        }
    }
}
