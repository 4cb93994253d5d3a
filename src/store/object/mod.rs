//! An object store (S3 and S3-compatible servers, and whatever else the `object_store` crate
//! reaches by URL) as a [`Store`]. The crate is async; each call here runs to completion on
//! a small runtime owned by the store, so the filesystem's request threads stay plain
//! threads.
//!
//! Versions are ETags: a pinned object's ranged reads carry `If-Match`, so a read after the
//! object was replaced fails instead of returning another version's bytes; writes carry
//! `If-Match` or `If-None-Match: *` as their precondition asks.

use std::fmt;
use std::io;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use object_store::path::Path as ObjectPath;
use object_store::{
    GetOptions, GetRange, ObjectMeta, ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload,
    UpdateVersion,
};
use tracing::warn;

use super::{Blob, Listing, ObjectInfo, Precondition, RequestCounts, Store, StoreError};

/// Above this an object goes up in parts: S3 takes at most 5 GiB in one PUT.
pub const DEFAULT_MULTIPART_ABOVE: u64 = 4 << 30;

/// The size of each part but the last (S3 wants at least 5 MiB).
pub const PART_BYTES: u64 = 16 << 20;

/// The most one PUT may carry (S3's limit).
pub const MOST_IN_ONE_PUT: u64 = 5 << 30;

/// How long one request may take, retries included, before it fails with EIO: a server
/// that is gone must not wedge the filesystem.
const REQUEST_BUDGET: Duration = Duration::from_secs(10);

/// The slowest transfer a request is given time for, beyond `REQUEST_BUDGET` (bytes a
/// second): a 1 GiB shard gets 17 minutes.
const SLOWEST_RATE: u64 = 1 << 20;

/// Runs one request (its retries included) on `runtime`, giving up after the budget for
/// `bytes`: a server that stops answering, before the first byte of its answer (which the
/// HTTP client's read timeout does not cover) or in the middle of it, fails the request
/// instead of holding the filesystem. A write given up on may still land: its next
/// attempt finds its version and merges over it.
fn bounded<T>(
    runtime: &tokio::runtime::Runtime,
    bytes: u64,
    request: impl std::future::Future<Output = object_store::Result<T>>,
) -> object_store::Result<T> {
    let budget = REQUEST_BUDGET + Duration::from_secs(bytes / SLOWEST_RATE);
    runtime.block_on(async {
        match tokio::time::timeout(budget, request).await {
            Ok(done) => done,
            Err(_) => Err(object_store::Error::Generic {
                store: "shardfs",
                source: format!("no answer within {} s", budget.as_secs()).into(),
            }),
        }
    })
}

mod blob;
mod connect;
mod profile;
mod raw;

use blob::{ObjectBlob, etag};

pub struct ObjectBacked {
    url: String,
    /// Versions are named by version id rather than ETag (`info_of`).
    by_version: bool,
    /// The store answers a GET of an object's last N bytes (Azure refuses one).
    suffix_ranges: bool,
    /// Objects larger than this go up as multipart uploads (`--multipart-above`).
    multipart_above: u64,
    store: Arc<dyn ObjectStore>,
    /// Requests `object_store` does not make (`raw.rs`).
    raw: raw::Raw,
    /// Keys skipped in listings, said once each.
    skipped: std::sync::Mutex<std::collections::HashSet<String>>,
    /// Key prefix inside the bucket ("" or ending without `/`).
    prefix: String,
    runtime: Arc<tokio::runtime::Runtime>,
    pub requests: Arc<RequestCounts>,
    /// When the bucket was last seen to be there (`confirm_absent`).
    bucket_seen: std::sync::Mutex<Option<std::time::Instant>>,
    /// The bucket was found gone while mounted: the store lost what it held.
    bucket_lost: std::sync::atomic::AtomicBool,
}

/// How long a bucket seen to be there is believed to be: "no such object" within that
/// time is an object's absence, not the bucket's.
const BUCKET_SEEN_FOR: Duration = Duration::from_secs(1);

impl fmt::Debug for ObjectBacked {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ObjectBacked")
            .field("url", &self.url)
            .finish()
    }
}

/// `url` parsed, refused when it carries credentials or parameters: a URL (the store's,
/// or `--endpoint`) is seen by every local user (/proc/mounts, the command line) and
/// logged. `what` names it in the message.
fn parse_public(url: &str, what: &str) -> io::Result<url::Url> {
    let refuse = |why: String| io::Error::new(io::ErrorKind::InvalidInput, why);
    let parsed =
        url::Url::parse(url).map_err(|e| refuse(format!("{what}{}: {e}", redacted(url))))?;
    if !parsed.username().is_empty() || parsed.password().is_some() || parsed.query().is_some() {
        return Err(refuse(format!(
            "{what}{}: credentials or parameters inside the URL would be visible to every \
             local user (/proc/mounts, the command line, the log); give them in the \
             environment as the provider documents (AWS_ACCESS_KEY_ID, …)",
            redacted(url)
        )));
    }
    Ok(parsed)
}

/// `url` without what may be a secret: user and password, query and fragment.
fn redacted(url: &str) -> String {
    let url = url.split(['?', '#']).next().unwrap_or_default();
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            let host = authority.rsplit('@').next().unwrap_or_default();
            format!("{scheme}://{host}{path}")
        }
        None => url.to_string(),
    }
}

/// Whether `location` names an object store rather than a directory.
pub fn is_object_url(location: &str) -> bool {
    ["s3://", "s3a://", "gs://", "az://", "abfs://", "abfss://"]
        .iter()
        .any(|scheme| location.starts_with(scheme))
}

impl ObjectBacked {
    /// The store at `url` (`s3://BUCKET/PREFIX`, `gs://…`, `az://…`). Credentials, region
    /// and endpoint come from the environment as each provider documents it
    /// (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_REGION`,
    /// `AWS_ALLOW_HTTP=true` for a plain-HTTP endpoint).
    pub fn open(url: &str) -> io::Result<ObjectBacked> {
        ObjectBacked::open_with(url, &[])
    }

    /// As `open`, reaching the server at `endpoint` when one is given (`--endpoint`).
    pub fn open_at(url: &str, endpoint: Option<&str>) -> io::Result<ObjectBacked> {
        let Some(endpoint) = endpoint else {
            return ObjectBacked::open(url);
        };
        let parsed = parse_public(endpoint, "--endpoint ")?;
        let key = match url.split_once("://").map(|(scheme, _)| scheme) {
            Some("gs") => "base_url",
            _ => "endpoint",
        };
        let http = if parsed.scheme() == "http" {
            "true"
        } else {
            "false"
        };
        ObjectBacked::open_with(url, &[(key, endpoint), ("allow_http", http)])
    }

    /// As `open`, with `config` (keys as the environment variables' names, lower case
    /// and without the provider's prefix: `endpoint`, `access_key_id`, …) over what the
    /// environment says.
    pub fn open_with(url: &str, config: &[(&str, &str)]) -> io::Result<ObjectBacked> {
        let parsed = parse_public(url, "")?;
        let connect::Connected { store, raw } = connect::connect(&parsed, url, config)?;
        let prefix = ObjectPath::from_url_path(parsed.path())
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, format!("{url}: {e}")))?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shardfs-store")
            .enable_all()
            .build()?;
        Ok(ObjectBacked {
            url: url.to_string(),
            by_version: parsed.scheme() == "gs",
            suffix_ranges: !matches!(parsed.scheme(), "az" | "abfs" | "abfss"),
            multipart_above: DEFAULT_MULTIPART_ABOVE,
            store,
            raw,
            skipped: std::sync::Mutex::default(),
            prefix: prefix.as_ref().trim_end_matches('/').to_string(),
            runtime: Arc::new(runtime),
            requests: Arc::default(),
            bucket_seen: std::sync::Mutex::default(),
            bucket_lost: std::sync::atomic::AtomicBool::new(false),
        })
    }

    /// How far the store's clock runs ahead of this machine's, in ns (negative: behind),
    /// from the `Date` of one answer: good to about a second (the header's precision) and
    /// the request's time. `None` when the store sends no `Date`.
    pub fn clock_offset_ns(&self) -> io::Result<Option<i64>> {
        let before = std::time::SystemTime::now();
        let (date, took) = bounded(&self.runtime, 0, self.raw.store_time())
            .map_err(|e| io::Error::other(format!("{}: {e}", self.url)))?;
        let Some(date) = date else {
            return Ok(None);
        };
        // Dated while the request was under way, to the second below.
        let local = before + took / 2;
        let store = date + Duration::from_millis(500);
        let ns = |t: std::time::SystemTime| {
            t.duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos() as i64)
        };
        Ok(Some(ns(store) - ns(local)))
    }

    /// Makes sure that "no such object" means that: the bucket (or container) is there.
    /// A server that lost everything (restarted empty) answers 404 for every key, and its
    /// objects are not absent but lost: EIO, naming the URL. Asked once a second at most
    /// (a LIST of at most one page).
    fn confirm_absent(&self) -> Result<(), StoreError> {
        use futures::StreamExt;
        let recent = self
            .bucket_seen
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some_and(|at| at.elapsed() < BUCKET_SEEN_FOR);
        if recent {
            return Ok(());
        }
        self.count(&self.requests.list);
        let prefix = (!self.prefix.is_empty()).then(|| ObjectPath::from(self.prefix.as_str()));
        let first = bounded(&self.runtime, 0, async {
            self.store.list(prefix.as_ref()).next().await.transpose()
        })
        .transpose();
        match first {
            // (A key it cannot name: the listing was answered, the bucket is there.)
            Some(Err(e)) if !invalid_path(&e) => {
                let text = e.to_string();
                if bucket_missing(&text) {
                    self.bucket_lost.store(true, Relaxed);
                    return Err(io::Error::other(format!(
                        "{}: the bucket (or container) is gone: what it held is lost",
                        redacted(&self.url)
                    ))
                    .into());
                }
                Err(io::Error::other(format!("{}: {text}", redacted(&self.url))).into())
            }
            _ => {
                *self.bucket_seen.lock().unwrap_or_else(|e| e.into_inner()) =
                    Some(std::time::Instant::now());
                Ok(())
            }
        }
    }

    /// The tag of the version a write made, as `info_of` names versions.
    fn tag_of(&self, done: object_store::PutResult) -> String {
        match (done.e_tag, done.version) {
            (_, Some(version)) if self.by_version => format!("version:{version}"),
            (Some(etag), _) if !etag.is_empty() => etag,
            (_, Some(version)) => format!("version:{version}"),
            // Unknown: a tag no version has, so the next look reads the index again.
            _ => format!("modified:unknown:{:?}", std::time::SystemTime::now()),
        }
    }

    /// The current version of `key` (a HEAD), if `when` holds for it: the check an object
    /// store cannot make together with the write that follows (a DELETE, completing an
    /// upload).
    fn checked(
        &self,
        key: &Path,
        when: &Precondition,
    ) -> Result<Option<Arc<dyn Blob>>, StoreError> {
        let current = self.open(key, 0)?;
        if !when.holds(current.as_ref().map(|b| b.info().tag.as_str())) {
            return Err(StoreError::Conflict(self.describe(key)));
        }
        Ok(current)
    }

    /// Objects larger than `bytes` are written as multipart uploads (`bytes` is checked
    /// by the command line to lie between `PART_BYTES` and `MOST_IN_ONE_PUT`).
    pub fn with_multipart_above(mut self, bytes: u64) -> ObjectBacked {
        self.multipart_above = bytes.clamp(PART_BYTES, MOST_IN_ONE_PUT);
        self
    }

    /// A multipart upload of `parts`, grouped into parts of at least `PART_BYTES` without
    /// copying. `object_store` offers no precondition on the completion, so `when` is
    /// checked first with a HEAD: a write landing between the check and the completion is
    /// not detected (the README says so; the default threshold keeps shards of any usual
    /// size on conditional PUTs).
    fn put_in_parts(
        &self,
        key: &Path,
        parts: &[Bytes],
        when: &Precondition,
    ) -> Result<ObjectInfo, StoreError> {
        let _current = self.checked(key, when)?;
        let path = self.path(key)?;
        let mut groups: Vec<Vec<Bytes>> = vec![Vec::new()];
        let mut in_group = 0u64;
        for part in parts {
            if in_group >= PART_BYTES {
                groups.push(Vec::new());
                in_group = 0;
            }
            in_group += part.len() as u64;
            if let Some(group) = groups.last_mut() {
                group.push(part.clone());
            }
        }
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        self.requests
            .put
            .fetch_add(groups.len() as u64 + 2, Relaxed);
        let done = bounded(&self.runtime, size, async {
            let mut upload = self.store.put_multipart(&path).await?;
            for group in groups {
                let payload: PutPayload = group.into_iter().collect();
                if let Err(e) = upload.put_part(payload).await {
                    let _ = upload.abort().await;
                    return Err(e);
                }
            }
            upload.complete().await
        });
        match done {
            Ok(done) => Ok(ObjectInfo {
                size,
                tag: self.tag_of(done),
                mtime: std::time::SystemTime::now(),
            }),
            Err(e) => Err(to_io(e).into()),
        }
    }

    fn path(&self, key: &Path) -> Result<ObjectPath, StoreError> {
        let key = key.to_str().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("{}: an object key must be UTF-8", key.display()),
            )
        })?;
        // Parsed, not built with `from`: that would percent-encode names (`données`,
        // `a~b`) into keys other tools do not know.
        ObjectPath::parse(super::join_key(&self.prefix, key)).map_err(|e| {
            io::Error::new(io::ErrorKind::InvalidInput, format!("{}: {e}", key)).into()
        })
    }

    fn count(&self, which: &AtomicU64) {
        which.fetch_add(1, Relaxed);
    }
}

/// Whether a listing failed on a key `object_store` cannot name (as such, or wrapped in a
/// provider's error).
fn invalid_path(e: &object_store::Error) -> bool {
    matches!(e, object_store::Error::InvalidPath { .. })
        || e.to_string()
            .contains("Encountered object with invalid path")
}

/// Whether an error's text is a server's "no such bucket / container" (S3 and GCS:
/// `NoSuchBucket`; Azure: `ContainerNotFound`), or a listing's bare 404.
fn bucket_missing(text: &str) -> bool {
    ["NoSuchBucket", "ContainerNotFound", "404 Not Found"]
        .iter()
        .any(|code| text.contains(code))
}

fn to_io(e: object_store::Error) -> io::Error {
    match e {
        object_store::Error::NotFound { .. } => io::Error::from_raw_os_error(libc::ENOENT),
        other => io::Error::other(other.to_string()),
    }
}

/// The version of an object as the server describes it. A store that sends no ETag gets a
/// tag from its version id, or else from size and modification time, so that two versions
/// never share a tag (which would pair one version's index with another's bytes); such a
/// tag is never sent as `If-Match`.
///
/// With `by_version` (Google Cloud Storage, whose conditional updates name a generation,
/// not an ETag) the version id is the tag whenever there is one.
fn info_of(meta: &ObjectMeta, by_version: bool) -> ObjectInfo {
    let tag = match (&meta.e_tag, &meta.version) {
        (_, Some(version)) if by_version => format!("version:{version}"),
        (Some(etag), _) if !etag.is_empty() => etag.clone(),
        (_, Some(version)) => format!("version:{version}"),
        _ => format!(
            "modified:{}:{}",
            meta.size,
            meta.last_modified.timestamp_nanos_opt().unwrap_or_default()
        ),
    };
    ObjectInfo {
        size: meta.size,
        tag,
        mtime: meta.last_modified.into(),
    }
}

impl ObjectBacked {
    /// GET of `range` (all when `None`): the bytes and the object's version.
    fn get_range(
        &self,
        key: &Path,
        range: Option<GetRange>,
    ) -> Result<Option<(Bytes, ObjectInfo, Range<u64>)>, StoreError> {
        let options = GetOptions {
            range,
            ..GetOptions::default()
        };
        self.get_at_most(key, options, u64::MAX)
    }

    /// The HEAD of `key`: `None` when it is not there.
    fn head(&self, key: &Path) -> Result<Option<ObjectInfo>, StoreError> {
        self.count(&self.requests.head);
        match bounded(&self.runtime, 0, self.store.head(&self.path(key)?)) {
            Ok(meta) => Ok(Some(info_of(&meta, self.by_version))),
            Err(object_store::Error::NotFound { .. }) => self.confirm_absent().map(|_| None),
            Err(e) => Err(to_io(e).into()),
        }
    }

    /// The last `tail` bytes of `key` (all of a smaller object) and its version.
    fn get_tail(&self, key: &Path, tail: u64) -> Result<Option<(Bytes, ObjectInfo)>, StoreError> {
        if self.suffix_ranges {
            let got = self.get_range(key, Some(GetRange::Suffix(tail)));
            return got.map(|o| o.map(|(bytes, info, _)| (bytes, info)));
        }
        // Its size first, then a bounded range of the version that HEAD saw: a version
        // put in between fails the condition, and the HEAD is asked again.
        for _ in 0..3 {
            let Some(info) = self.head(key)? else {
                return Ok(None);
            };
            if info.size == 0 {
                return Ok(Some((Bytes::new(), info)));
            }
            let options = GetOptions {
                range: Some(GetRange::Bounded(info.size.saturating_sub(tail)..info.size)),
                if_match: etag(&info),
                version: info.tag.strip_prefix("version:").map(str::to_string),
                ..GetOptions::default()
            };
            match self.get_at_most(key, options, u64::MAX) {
                Err(StoreError::Io(e)) if e.raw_os_error() == Some(libc::ESTALE) => continue,
                got => return got.map(|o| o.map(|(bytes, info, _)| (bytes, info))),
            }
        }
        Err(io::Error::from_raw_os_error(libc::ESTALE).into())
    }

    /// A GET with `options`, refusing (EFBIG) before the body is read when more than
    /// `limit` bytes would come. A condition that fails is ESTALE.
    fn get_at_most(
        &self,
        key: &Path,
        options: GetOptions,
        limit: u64,
    ) -> Result<Option<(Bytes, ObjectInfo, Range<u64>)>, StoreError> {
        self.count(&self.requests.get);
        let path = self.path(key)?;
        let expected = match &options.range {
            Some(GetRange::Bounded(r)) => r.end - r.start,
            Some(GetRange::Suffix(n)) => *n,
            // (Whole objects read are documents and small files.)
            _ => limit.min(64 << 20),
        };
        let got = bounded(&self.runtime, expected, async {
            let r = self.store.get_opts(&path, options).await?;
            let (meta, range) = (r.meta.clone(), r.range.clone());
            if range.end - range.start > limit {
                return Ok(None);
            }
            Ok::<_, object_store::Error>(Some((r.bytes().await?, meta, range)))
        });
        match got {
            Ok(Some((bytes, meta, range))) => {
                Ok(Some((bytes, info_of(&meta, self.by_version), range)))
            }
            Ok(None) => Err(io::Error::from_raw_os_error(libc::EFBIG).into()),
            Err(object_store::Error::NotFound { .. }) => self.confirm_absent().map(|_| None),
            Err(object_store::Error::Precondition { .. }) => {
                Err(io::Error::from_raw_os_error(libc::ESTALE).into())
            }
            Err(e) => Err(to_io(e).into()),
        }
    }
}

impl ObjectBacked {
    /// `list` of a level holding a key that `object_store` cannot name (`a//b`, `./c`,
    /// `x/../d`, a control character), by raw requests: such keys are skipped, each said
    /// once, and the rest listed.
    fn list_raw(&self, dir: &Path, full: &ObjectPath) -> Result<Listing, StoreError> {
        let prefix = match full.as_ref() {
            "" => String::new(),
            p => format!("{p}/"),
        };
        let mut listing = Listing::default();
        let mut token = None;
        loop {
            self.count(&self.requests.list);
            let page = bounded(
                &self.runtime,
                0,
                self.raw.list_page(&prefix, token.as_deref()),
            )
            .map_err(|e| io::Error::other(format!("{}: {e}", self.describe(dir))))?;
            for key in &page.objects {
                if let Some(name) = self.named(&prefix, key, false) {
                    listing.objects.push(name);
                }
            }
            for key in &page.prefixes {
                if let Some(name) = self.named(&prefix, key, true) {
                    listing.dirs.push(name);
                }
            }
            match page.next {
                Some(next) => token = Some(next),
                None => break,
            }
        }
        listing.dirs.sort();
        listing.objects.sort();
        Ok(listing)
    }

    /// The name below `prefix` of a listed `key` (a common prefix when `dir`), if the
    /// mount can show it; a key it cannot is said once.
    fn named(&self, prefix: &str, key: &str, dir: bool) -> Option<String> {
        let rest = key.strip_prefix(prefix)?;
        let rest = if dir { rest.strip_suffix('/')? } else { rest };
        if !rest.is_empty() && !rest.contains('/') && ObjectPath::parse(key).is_ok() {
            return Some(rest.to_string());
        }
        if rest.is_empty() && !dir {
            return None; // a folder marker: the directory itself
        }
        let mut said = self.skipped.lock().unwrap_or_else(|e| e.into_inner());
        if said.len() < 10_000 && said.insert(key.to_string()) {
            warn!(key = ?key, store = %redacted(&self.url),
                "an object whose key the mount cannot name (an empty, '.' or '..' part, or a \
                 control character): not shown");
        }
        None
    }
}

impl Store for ObjectBacked {
    fn open(&self, key: &Path, tail: u64) -> Result<Option<Arc<dyn Blob>>, StoreError> {
        let (bytes, info) = if tail == 0 {
            match self.head(key)? {
                Some(info) => (Bytes::new(), info),
                None => return Ok(None),
            }
        } else {
            match self.get_tail(key, tail) {
                Ok(Some(got)) => got,
                Ok(None) => return Ok(None),
                // An empty object has no suffix to return: a HEAD tells. Any other failure
                // stands (never a GET of a whole shard in its place).
                Err(e) => match self.head(key) {
                    Ok(Some(info)) if info.size == 0 => (Bytes::new(), info),
                    Ok(None) => return Ok(None),
                    _ => return Err(e),
                },
            }
        };
        Ok(Some(Arc::new(ObjectBlob {
            info,
            tail: bytes,
            path: self.path(key)?,
            store: self.store.clone(),
            runtime: self.runtime.clone(),
            requests: self.requests.clone(),
        })))
    }

    fn get(&self, key: &Path, limit: u64) -> Result<Option<(Bytes, ObjectInfo)>, StoreError> {
        Ok(self
            .get_at_most(key, GetOptions::default(), limit)?
            .map(|(bytes, info, _)| (bytes, info)))
    }

    fn put(
        &self,
        key: &Path,
        parts: &[Bytes],
        when: Precondition,
    ) -> Result<ObjectInfo, StoreError> {
        let size: u64 = parts.iter().map(|p| p.len() as u64).sum();
        if size > self.multipart_above {
            return self.put_in_parts(key, parts, &when);
        }
        self.count(&self.requests.put);
        let mode = match &when {
            Precondition::None => PutMode::Overwrite,
            Precondition::Absent => PutMode::Create,
            Precondition::Matches(tag) => PutMode::Update(match tag.strip_prefix("version:") {
                Some(version) => UpdateVersion {
                    e_tag: None,
                    version: Some(version.to_string()),
                },
                None if tag.starts_with("modified:") => {
                    return Err(io::Error::other(format!(
                        "{}: the store gave this object neither an ETag nor a version, so it \
                         cannot be replaced conditionally",
                        self.describe(key)
                    ))
                    .into());
                }
                None => UpdateVersion {
                    e_tag: Some(tag.clone()),
                    version: None,
                },
            }),
        };
        let payload: PutPayload = parts.iter().cloned().collect();
        let size = payload.content_length() as u64;
        let path = self.path(key)?;
        let options = PutOptions {
            mode,
            ..PutOptions::default()
        };
        match bounded(
            &self.runtime,
            size,
            self.store.put_opts(&path, payload, options),
        ) {
            Ok(done) => Ok(ObjectInfo {
                size,
                tag: self.tag_of(done),
                mtime: std::time::SystemTime::now(),
            }),
            Err(
                object_store::Error::Precondition { .. }
                | object_store::Error::AlreadyExists { .. },
            ) => Err(StoreError::Conflict(self.describe(key))),
            Err(e) => Err(to_io(e).into()),
        }
    }

    fn delete(&self, key: &Path, when: Precondition) -> Result<bool, StoreError> {
        // S3 answers a delete of a missing key with success; a HEAD first tells them apart,
        // and checks the precondition. The DELETE then removes only the version the HEAD
        // saw (`If-Match`, or its generation): a write in between is a conflict, never
        // lost. (A server that ignores the condition, as some S3-compatible ones do,
        // removes whatever is there: see the README's table of stores.)
        let Some(current) = self.checked(key, &when)? else {
            return Ok(false);
        };
        self.count(&self.requests.delete);
        let tag = current.info().tag.clone();
        if tag.starts_with("modified:") {
            return match bounded(&self.runtime, 0, self.store.delete(&self.path(key)?)) {
                Ok(()) => Ok(true),
                Err(object_store::Error::NotFound { .. }) => Ok(false),
                Err(e) => Err(to_io(e).into()),
            };
        }
        let full = self.path(key)?;
        match bounded(&self.runtime, 0, self.raw.delete_if(full.as_ref(), &tag)) {
            Ok(raw::Deleted::Yes) => Ok(true),
            Ok(raw::Deleted::Absent) => Ok(false),
            Ok(raw::Deleted::Conflict) => Err(StoreError::Conflict(self.describe(key))),
            Err(e) => Err(io::Error::other(format!("{}: {e}", self.describe(key))).into()),
        }
    }

    fn list(&self, dir: &Path) -> Result<Listing, StoreError> {
        self.count(&self.requests.list);
        let full = self.path(dir)?;
        let prefix = (!full.as_ref().is_empty()).then_some(full.clone());
        let result = match bounded(
            &self.runtime,
            0,
            self.store.list_with_delimiter(prefix.as_ref()),
        ) {
            Ok(result) => result,
            // A key object_store cannot name fails the whole page: listed without it.
            Err(e) if invalid_path(&e) => return self.list_raw(dir, &full),
            Err(e) => return Err(to_io(e).into()),
        };
        // The one part below the listed prefix; a folder marker (`dir/`, which parses as
        // the prefix itself) has none and is not an object of the directory.
        let name = |p: &ObjectPath| {
            let base = prefix.clone().unwrap_or_default();
            let mut parts = p.prefix_match(&base)?;
            let first = parts.next()?;
            parts.next().is_none().then(|| first.as_ref().to_string())
        };
        let mut listing = Listing {
            dirs: result.common_prefixes.iter().filter_map(name).collect(),
            objects: result
                .objects
                .iter()
                .filter_map(|m| name(&m.location))
                .collect(),
            unlisted: Vec::new(),
        };
        listing.dirs.sort();
        listing.objects.sort();
        Ok(listing)
    }

    fn requests(&self) -> Option<std::collections::BTreeMap<String, u64>> {
        Some(
            self.requests
                .snapshot()
                .into_iter()
                .map(|(k, n)| (k.to_string(), n))
                .collect(),
        )
    }

    fn describe(&self, key: &Path) -> String {
        format!("{}/{}", self.url.trim_end_matches('/'), key.display())
    }

    fn lost(&self) -> bool {
        self.bucket_lost.load(Relaxed)
    }

    fn recovered(&self) {
        self.bucket_lost.store(false, Relaxed);
    }

    fn confirm_there(&self) -> Result<(), StoreError> {
        *self.bucket_seen.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.confirm_absent()
    }
}

#[cfg(test)]
mod url_tests {
    use super::*;

    /// Issue 18: an object-store URL is world-visible; one carrying credentials is refused,
    /// and the refusal does not repeat them.
    #[test]
    fn credentials_in_a_url_are_refused_and_never_repeated() {
        for url in [
            "s3://AKIA:s3cr3t@bucket/prefix",
            "s3://AKIA@bucket/prefix",
            "az://container/prefix?sv=2024&sig=s3cr3t",
        ] {
            let Err(err) = ObjectBacked::open(url) else {
                panic!("accepted");
            };
            let text = err.to_string();
            assert!(text.contains("credentials"), "{text}");
            assert!(!text.contains("s3cr3t") && !text.contains("AKIA"), "{text}");
        }
        assert_eq!(redacted("gs://u:p@b/x?y#z"), "gs://b/x");
    }
}
