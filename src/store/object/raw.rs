//! Requests `object_store` does not make, made with its HTTP client and its signers:
//!
//! - a listing that survives keys `object_store` cannot name (`a//b`, `./c`, `x/../d`, a
//!   control character: its `Path` refuses them, and one such key fails the whole page).
//!   Other tools write such keys; the mount skips them, says so once, and shows the rest.
//! - a conditional DELETE (S3 `If-Match`, GCS `x-goog-if-generation-match`, Azure
//!   `If-Match`), which `object_store`'s `delete` cannot carry.
//!
//! Nothing here puts a URL in an error: an Azure SAS token travels in the query.

use std::sync::Arc;

use std::time::Duration;

use bytes::Bytes;
use object_store::aws::{AmazonS3, AwsAuthorizer};
use object_store::azure::{AzureAuthorizer, MicrosoftAzure};
use object_store::client::{HttpClient, HttpRequest, HttpRequestBody};
use object_store::gcp::GoogleCloudStorage;
use object_store::{Error, Result};

/// One provider's way to the bucket (container): where it is and how a request is signed.
#[derive(Debug)]
pub(super) enum Signer {
    S3 {
        store: Arc<AmazonS3>,
        region: String,
    },
    Gcs {
        store: Arc<GoogleCloudStorage>,
    },
    Azure {
        store: Arc<MicrosoftAzure>,
        account: String,
    },
}

#[derive(Debug)]
pub(super) struct Raw {
    client: HttpClient,
    /// The bucket's (container's) URL, without a trailing `/`.
    bucket_url: String,
    signer: Signer,
}

/// One page of a listing: names relative to the bucket, as the store has them.
#[derive(Debug, Default)]
pub(super) struct Page {
    pub objects: Vec<String>,
    pub prefixes: Vec<String>,
    pub next: Option<String>,
}

/// What a conditional DELETE found.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Deleted {
    Yes,
    /// No such object.
    Absent,
    /// Another version is there now.
    Conflict,
}

fn failed(what: &str, detail: impl std::fmt::Display) -> Error {
    Error::Generic {
        store: "shardfs",
        source: format!("{what}: {detail}").into(),
    }
}

/// `s` percent-encoded for a URL's query or path (all but the unreserved characters; `/`
/// kept in paths).
fn encode(s: &str, keep_slash: bool) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                out.push(b as char)
            }
            b'/' if keep_slash => out.push('/'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

/// `s` with its `%XX` escapes decoded (S3's `encoding-type=url` listing).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (b'+', _) => {
                out.push(b' ');
                i += 1;
            }
            (c, _) => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

impl Raw {
    pub(super) fn new(client: HttpClient, bucket_url: String, signer: Signer) -> Raw {
        Raw {
            client,
            bucket_url: bucket_url.trim_end_matches('/').to_string(),
            signer,
        }
    }

    /// Signs and sends `request`; the answer's status and body.
    async fn send(&self, request: HttpRequest) -> Result<(u16, Bytes)> {
        self.send_dated(request)
            .await
            .map(|(status, body, _)| (status, body))
    }

    /// The store's clock: the `Date` of its answer to a listing of one page (`None` when it
    /// sends none), and how long the request took.
    pub(super) async fn store_time(&self) -> Result<(Option<std::time::SystemTime>, Duration)> {
        let url = match self.signer {
            Signer::Azure { .. } => format!(
                "{}?restype=container&comp=list&maxresults=1",
                self.bucket_url
            ),
            _ => format!("{}?list-type=2&max-keys=1", self.bucket_url),
        };
        let sent = std::time::Instant::now();
        let (_, _, date) = self
            .send_dated(self.request(http::Method::GET, &url)?)
            .await?;
        Ok((date.as_deref().and_then(http_date), sent.elapsed()))
    }

    /// `send`, with the answer's `Date` header.
    async fn send_dated(&self, mut request: HttpRequest) -> Result<(u16, Bytes, Option<String>)> {
        match &self.signer {
            Signer::S3 { store, region } => {
                let credential = store.credentials().get_credential().await?;
                AwsAuthorizer::new(&credential, "s3", region).try_authorize(&mut request, None)?;
            }
            Signer::Gcs { store } => {
                let credential = store.credentials().get_credential().await?;
                if !credential.bearer.is_empty() {
                    let value = format!("Bearer {}", credential.bearer);
                    let value = value.parse().map_err(|e| failed("the credential", e))?;
                    request
                        .headers_mut()
                        .insert(http::header::AUTHORIZATION, value);
                }
            }
            Signer::Azure { store, account } => {
                let credential = store.credentials().get_credential().await?;
                AzureAuthorizer::new(&credential, account).try_authorize(&mut request)?;
            }
        }
        let answer = self
            .client
            .execute(request)
            .await
            .map_err(|e| failed("the request", e))?;
        let status = answer.status().as_u16();
        let date = answer
            .headers()
            .get(http::header::DATE)
            .and_then(|d| d.to_str().ok())
            .map(str::to_string);
        let body = answer
            .into_body()
            .bytes()
            .await
            .map_err(|e| failed("the answer", e))?;
        Ok((status, body, date))
    }

    fn request(&self, method: http::Method, url: &str) -> Result<HttpRequest> {
        http::Request::builder()
            .method(method)
            .uri(url)
            .header(http::header::CONTENT_LENGTH, "0")
            .body(HttpRequestBody::from(Bytes::new()))
            .map_err(|e| failed("a request", e))
    }

    /// One page of the objects and prefixes directly below `prefix` (ending in `/`, or
    /// empty), from `token` on.
    pub(super) async fn list_page(&self, prefix: &str, token: Option<&str>) -> Result<Page> {
        let azure = matches!(self.signer, Signer::Azure { .. });
        let mut url = match azure {
            true => format!(
                "{}?restype=container&comp=list&delimiter=%2F&prefix={}",
                self.bucket_url,
                encode(prefix, false)
            ),
            false => format!(
                "{}?list-type=2&delimiter=%2F&encoding-type=url&prefix={}",
                self.bucket_url,
                encode(prefix, false)
            ),
        };
        if let Some(token) = token {
            let name = if azure {
                "marker"
            } else {
                "continuation-token"
            };
            url.push_str(&format!("&{name}={}", encode(token, false)));
        }
        let (status, body) = self.send(self.request(http::Method::GET, &url)?).await?;
        if status != 200 {
            return Err(failed(
                "a listing",
                format!("status {status}: {}", String::from_utf8_lossy(&body)),
            ));
        }
        parse_listing(&body, azure)
    }

    /// Removes `key` only if it is still the version `tag` names (an ETag, or a GCS
    /// generation given as `version:N`).
    pub(super) async fn delete_if(&self, key: &str, tag: &str) -> Result<Deleted> {
        let url = format!("{}/{}", self.bucket_url, encode(key, true));
        let mut request = self.request(http::Method::DELETE, &url)?;
        let (name, value) = match (&self.signer, tag.strip_prefix("version:")) {
            (Signer::Gcs { .. }, Some(generation)) => ("x-goog-if-generation-match", generation),
            _ => ("if-match", tag),
        };
        let value = value.parse().map_err(|e| failed("a version", e))?;
        request.headers_mut().insert(name, value);
        let (status, body) = self.send(request).await?;
        match status {
            200 | 202 | 204 => Ok(Deleted::Yes),
            404 => Ok(Deleted::Absent),
            409 | 412 => Ok(Deleted::Conflict),
            _ => Err(failed(
                "a removal",
                format!("status {status}: {}", String::from_utf8_lossy(&body)),
            )),
        }
    }
}

/// The names of an S3/GCS `ListBucketResult` or an Azure `EnumerationResults`. Names
/// come URL-encoded where the answer says so (S3's `EncodingType` url, which was asked
/// for; Azure's `Encoded="true"` on a name XML cannot carry).
/// An HTTP date (`Sun, 06 Nov 1994 08:49:37 GMT`, the form every server sends) as a time.
fn http_date(text: &str) -> Option<std::time::SystemTime> {
    let mut parts = text.split_whitespace().skip(1);
    let day: i64 = parts.next()?.parse().ok()?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let name = parts.next()?;
    let month = MONTHS.iter().position(|m| *m == name)? as i64 + 1;
    let year: i64 = parts.next()?.parse().ok()?;
    let hms: Vec<i64> = parts
        .next()?
        .split(':')
        .map(|n| n.parse().ok())
        .collect::<Option<_>>()?;
    let [h, m, s] = hms[..] else {
        return None;
    };
    // Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * ((month + 9) % 12) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146097 + doe - 719468;
    let secs = u64::try_from(days * 86400 + h * 3600 + m * 60 + s).ok()?;
    Some(std::time::UNIX_EPOCH + Duration::from_secs(secs))
}

fn parse_listing(body: &[u8], azure: bool) -> Result<Page> {
    let texts = element_texts(body)?;
    let url_encoded = texts
        .iter()
        .any(|t| t.name == b"EncodingType" && t.text == "url");
    let mut page = Page::default();
    for t in texts {
        let name = |s: String| match (azure && t.encoded) || (!azure && url_encoded) {
            true => decode(&s),
            false => s,
        };
        match [t.name.as_slice(), t.parent.as_slice()] {
            [b"Key", b"Contents"] | [b"Name", b"Blob"] => page.objects.push(name(t.text)),
            [b"Prefix", b"CommonPrefixes"] | [b"Name", b"BlobPrefix"] => {
                page.prefixes.push(name(t.text))
            }
            [b"NextContinuationToken", _] | [b"NextMarker", _] if !t.text.is_empty() => {
                page.next = Some(t.text)
            }
            _ => {}
        }
    }
    Ok(page)
}

/// The text of one element of an XML answer.
struct ElementText {
    name: Vec<u8>,
    parent: Vec<u8>,
    text: String,
    /// Marked `Encoded="true"` (Azure, for a name XML cannot carry).
    encoded: bool,
}

/// The text of every element with a parent, entities resolved (text comes in pieces
/// around each entity).
fn element_texts(body: &[u8]) -> Result<Vec<ElementText>> {
    use quick_xml::events::Event;
    let bad = |e: &dyn std::fmt::Display| failed("a listing", e);
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut path: Vec<Vec<u8>> = Vec::new();
    let mut out = Vec::new();
    let mut text = String::new();
    let mut encoded = false;
    let mut buf = Vec::new();
    loop {
        match reader.read_event_into(&mut buf).map_err(|e| bad(&e))? {
            Event::Start(e) => {
                encoded = e
                    .attributes()
                    .flatten()
                    .any(|a| a.key.as_ref() == b"Encoded" && a.value.as_ref() == b"true");
                path.push(e.name().as_ref().to_vec());
                text.clear();
            }
            Event::Text(t) => text.push_str(&t.decode().map_err(|e| bad(&e))?),
            Event::GeneralRef(r) => text.push_str(&resolved(&r).map_err(|e| bad(&e))?),
            Event::End(_) => {
                if let [.., parent, name] = path.as_slice() {
                    out.push(ElementText {
                        name: name.clone(),
                        parent: parent.clone(),
                        text: std::mem::take(&mut text),
                        encoded,
                    });
                }
                path.pop();
                encoded = false;
            }
            Event::Eof => return Ok(out),
            _ => {}
        }
        buf.clear();
    }
}

/// What an entity reference (`&amp;`, `&#9;`) stands for.
fn resolved(r: &quick_xml::events::BytesRef) -> std::result::Result<String, String> {
    if let Some(c) = r.resolve_char_ref().map_err(|e| e.to_string())? {
        return Ok(c.to_string());
    }
    let name = r.decode().map_err(|e| e.to_string())?;
    quick_xml::escape::unescape(&format!("&{name};"))
        .map(|s| s.into_owned())
        .map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_are_read() {
        let t = super::http_date("Sat, 05 Dec 2026 20:53:01 GMT").unwrap();
        let secs = t.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
        assert_eq!(secs, 1_796_503_981);
        assert_eq!(
            super::http_date("Thu, 01 Jan 1970 00:00:00 GMT"),
            Some(std::time::UNIX_EPOCH)
        );
        assert_eq!(super::http_date("yesterday"), None);
    }

    #[test]
    fn listings_of_each_provider_are_read() {
        let s3 = br#"<?xml version="1.0"?><ListBucketResult><EncodingType>url</EncodingType><Contents><Key>a/x%2F%2Fy</Key></Contents>
            <Contents><Key>a/%09t</Key></Contents><CommonPrefixes><Prefix>a/b%2F</Prefix></CommonPrefixes>
            <NextContinuationToken>tok</NextContinuationToken></ListBucketResult>"#;
        let page = parse_listing(s3, false).unwrap();
        assert_eq!(page.objects, vec!["a/x//y", "a/\tt"]);
        assert_eq!(page.prefixes, vec!["a/b/"]);
        assert_eq!(page.next.as_deref(), Some("tok"));
        let az = br#"<EnumerationResults><Blobs><Blob><Name>a/./c&amp;d</Name></Blob><Blob><Name Encoded="true">a/%01</Name></Blob>
            <BlobPrefix><Name>a//</Name></BlobPrefix></Blobs><NextMarker/></EnumerationResults>"#;
        let page = parse_listing(az, true).unwrap();
        assert_eq!(page.objects, vec!["a/./c&d", "a/\u{1}"]);
        assert_eq!(page.prefixes, vec!["a//"]);
        assert_eq!(page.next, None);
        assert_eq!(encode("a b/c", true), "a%20b/c");
        assert_eq!(decode("a%20b+c"), "a b c");
    }
}
