//! One version of an object, pinned: its tail (fetched when it was opened) in memory,
//! the rest read by ranged GETs that must find that very version (`If-Match`, or its
//! generation), so that reads never mix two versions.

use std::fmt;
use std::io;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{GetOptions, GetRange, ObjectStore};

use super::{bounded, to_io};
use crate::shard::ReadAt;
use crate::store::{Blob, ObjectInfo, RequestCounts};

/// The tag as an `If-Match` value, when it is an ETag.
pub(super) fn etag(info: &ObjectInfo) -> Option<String> {
    (!info.tag.starts_with("version:") && !info.tag.starts_with("modified:"))
        .then(|| info.tag.clone())
}

/// One version of an object: its tail (fetched with the open) in memory, the rest read by
/// ranged GETs that must match its ETag.
pub(super) struct ObjectBlob {
    pub(super) info: ObjectInfo,
    pub(super) tail: Bytes,
    pub(super) path: ObjectPath,
    pub(super) store: Arc<dyn ObjectStore>,
    pub(super) runtime: Arc<tokio::runtime::Runtime>,
    pub(super) requests: Arc<RequestCounts>,
}

impl fmt::Debug for ObjectBlob {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectBlob")
            .field("path", &self.path)
            .field("info", &self.info)
            .finish()
    }
}

impl ReadAt for ObjectBlob {
    fn read_exact_at(&self, buf: &mut [u8], offset: u64) -> io::Result<()> {
        let end = offset + buf.len() as u64;
        if end > self.info.size {
            return Err(io::Error::from(io::ErrorKind::UnexpectedEof));
        }
        let tail_start = self
            .info
            .size
            .checked_sub(self.tail.len() as u64)
            .ok_or_else(|| io::Error::other("the server sent more than the object holds"))?;
        if offset >= tail_start {
            let at = (offset - tail_start) as usize;
            buf.copy_from_slice(&self.tail[at..at + buf.len()]);
            return Ok(());
        }
        if buf.is_empty() {
            return Ok(());
        }
        self.requests.get.fetch_add(1, Relaxed);
        let options = GetOptions {
            range: Some(GetRange::Bounded(offset..end)),
            if_match: etag(&self.info),
            version: self.info.tag.strip_prefix("version:").map(str::to_string),
            ..GetOptions::default()
        };
        let bytes = bounded(&self.runtime, buf.len() as u64, async {
            self.store
                .get_opts(&self.path, options)
                .await?
                .bytes()
                .await
        });
        match bytes {
            Ok(b) if b.len() == buf.len() => {
                buf.copy_from_slice(&b);
                Ok(())
            }
            Ok(_) => Err(io::Error::from(io::ErrorKind::UnexpectedEof)),
            // The object was replaced or removed since it was pinned.
            Err(
                object_store::Error::Precondition { .. } | object_store::Error::NotFound { .. },
            ) => Err(io::Error::from_raw_os_error(libc::ESTALE)),
            Err(e) => Err(to_io(e)),
        }
    }
}

impl Blob for ObjectBlob {
    fn info(&self) -> &ObjectInfo {
        &self.info
    }
}
