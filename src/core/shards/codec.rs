//! The one place where chunk bytes change form on their way into BACKING: an array the
//! mount compresses (`ArrayState::zstd`) has each chunk compressed where it enters a
//! journal record or a shard (`encode`), and decompressed where it leaves one (a read of
//! a stored chunk, a write into one, a replay: `stored::decode`). In memory a chunk is
//! always what its writer wrote.

use std::num::NonZeroUsize;

use bytes::Bytes;

use crate::zarr::transparent::Zstd;

/// The contents (each a list of segments), as the array stores them: unchanged without a
/// codec, else each compressed to one segment, spread over the machine's cores (a
/// complete shard is hundreds of chunks).
pub(super) fn encode(
    zstd: Option<Zstd>,
    contents: &[&[Bytes]],
) -> std::io::Result<Vec<Vec<Bytes>>> {
    let Some(z) = zstd else {
        return Ok(contents.iter().map(|c| c.to_vec()).collect());
    };
    let workers = std::thread::available_parallelism()
        .map_or(1, NonZeroUsize::get)
        .min(contents.len())
        .max(1);
    if workers == 1 {
        return contents
            .iter()
            .map(|c| z.encode(c).map(|b| vec![b]))
            .collect();
    }
    let per = contents.len().div_ceil(workers);
    std::thread::scope(|s| {
        let parts: Vec<_> = contents
            .chunks(per)
            .map(|part| {
                s.spawn(move || {
                    part.iter()
                        .map(|c| z.encode(c).map(|b| vec![b]))
                        .collect::<std::io::Result<Vec<_>>>()
                })
            })
            .collect();
        let mut out = Vec::with_capacity(contents.len());
        for p in parts {
            let done = p
                .join()
                .map_err(|_| std::io::Error::other("a compression worker panicked"))??;
            out.extend(done);
        }
        Ok(out)
    })
}
