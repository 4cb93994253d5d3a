//! Reading shards: the index, validated, and chunk byte ranges, from anything that reads at
//! a position (a file on disk, one version of an object in a store).

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

use thiserror::Error;

use super::index::{ChunkRange, DecodedIndex, IndexError, IndexFormat, ShardIndex};

/// Positioned reads from one version of a shard.
pub trait ReadAt {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()>;
}

impl ReadAt for File {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        FileExt::read_exact_at(self, buf, offset)
    }
}

/// A shard in memory.
impl ReadAt for [u8] {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let start = usize::try_from(offset).unwrap_or(usize::MAX);
        let end = start.saturating_add(buf.len());
        let src = self
            .get(start..end)
            .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof))?;
        buf.copy_from_slice(src);
        Ok(())
    }
}

impl<T: ReadAt + ?Sized> ReadAt for std::sync::Arc<T> {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        (**self).read_exact_at(buf, offset)
    }
}

#[derive(Debug, Error)]
pub enum ShardFileError {
    #[error("{0}")]
    Io(#[from] io::Error),
    #[error("{0}")]
    Index(#[from] IndexError),
}

/// The index bytes of a shard file of `file_len` bytes.
fn index_bytes<R: ReadAt + ?Sized>(
    file: &R,
    file_len: u64,
    format: &IndexFormat,
) -> Result<Vec<u8>, ShardFileError> {
    let offset = format.index_offset(file_len)?;
    let mut buf = vec![0u8; format.encoded_len() as usize];
    file.read_exact_at(&mut buf, offset)?;
    Ok(buf)
}

/// Reads and decodes the index of a shard file of `file_len` bytes without judging it:
/// the checksum verdict is returned, the ranges are not checked.
pub fn read_index_lenient<R: ReadAt + ?Sized>(
    file: &R,
    file_len: u64,
    format: &IndexFormat,
) -> Result<DecodedIndex, ShardFileError> {
    Ok(format.decode_lenient(&index_bytes(file, file_len, format)?)?)
}

/// Reads the index and checks everything: checksum, ranges inside the file and outside the
/// index, no overlaps.
pub fn read_index<R: ReadAt + ?Sized>(
    file: &R,
    file_len: u64,
    format: &IndexFormat,
) -> Result<ShardIndex, ShardFileError> {
    let index = format.decode(&index_bytes(file, file_len, format)?)?;
    format.validate(&index, file_len)?;
    Ok(index)
}

/// Reads one whole chunk into memory, if it is at most `max` bytes: its size comes from
/// an index anyone who can write BACKING may have forged (a sparse file declaring a 1 TiB
/// chunk), so it is never allocated blindly. EFBIG otherwise.
pub fn read_whole_chunk<R: ReadAt + ?Sized>(
    file: &R,
    range: ChunkRange,
    max: u64,
) -> io::Result<Vec<u8>> {
    if range.nbytes > max {
        return Err(io::Error::from_raw_os_error(libc::EFBIG));
    }
    read_chunk_part(file, range, 0, range.nbytes)
}

/// Reads part of one chunk: `len` bytes from `start` within the chunk, clipped to the chunk.
pub fn read_chunk_part<R: ReadAt + ?Sized>(
    file: &R,
    range: ChunkRange,
    start: u64,
    len: u64,
) -> io::Result<Vec<u8>> {
    let start = start.min(range.nbytes);
    let len = len.min(range.nbytes - start) as usize;
    let mut buf = vec![0u8; len];
    file.read_exact_at(&mut buf, range.offset + start)?;
    Ok(buf)
}
