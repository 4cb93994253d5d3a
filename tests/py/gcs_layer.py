"""Google Cloud Storage's XML API in front of fake-gcs-server, for the tests only.

    gcs_layer.py PORT UPSTREAM [--public-key PEM --issuer EMAIL]

`object_store`'s GCS client (the one shardfs uses) speaks the XML API: PUT /BUCKET/KEY
with `x-goog-if-generation-match`, GET and HEAD with `generation` and ranges, DELETE, list
(`list-type=2`), and multipart uploads. fake-gcs-server (UPSTREAM, its JSON API and part of
its XML API) serves GET, HEAD, ranges, generations and listings, but answers an XML PUT
with 400 "invalid uploadType" and ignores every precondition. This layer:

- turns an XML PUT (and a completed multipart upload) into a JSON media upload;
- keeps preconditions honest: `x-goog-if-generation-match` on PUT, DELETE and the multipart
  completion, `If-Match` / `If-None-Match` on GET and HEAD. Every write and every
  conditional read passes through here under one lock, so a check and the write it guards
  are one step, as on GCS itself;
- answers as GCS does where fake-gcs-server does not: 404 with `NoSuchBucket` or
  `NoSuchKey`, 412 `PreconditionFailed`, 204 for a DELETE;
- with --public-key, accepts only requests whose bearer token is a JWT of that key and
  --issuer (what `object_store` makes from a service-account file: a self-signed JWT).

What it cannot show is what only GCS itself does: its retry and throttling answers, its
consistency across regions, and the JSON API's own preconditions (shardfs does not use it).
Counts of requests by kind are at GET /_layer/requests.
"""

import base64
import http.client
import http.server
import json
import secrets
import sys
import threading
import urllib.parse
import xml.etree.ElementTree as ET

LOCK = threading.Lock()
UPLOADS = {}  # upload id -> {"bucket", "key", "parts": {number: bytes}}
COUNTS = {}


def xml_error(code, message):
    return (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
            f"<Message>{message}</Message></Error>").encode()


class Upstream:
    def __init__(self, address):
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def call(self, method, path, body=None, headers=None):
        conn = http.client.HTTPConnection(self.host, self.port, timeout=60)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            r = conn.getresponse()
            return r.status, r.getheaders(), r.read()
        finally:
            conn.close()

    def bucket_exists(self, bucket):
        status, _, _ = self.call("GET", f"/storage/v1/b/{q(bucket)}")
        return status == 200

    def meta(self, bucket, key):
        """The object's JSON metadata, or None."""
        status, _, body = self.call("GET", f"/storage/v1/b/{q(bucket)}/o/{q(key)}")
        return json.loads(body) if status == 200 else None

    def upload(self, bucket, key, data):
        path = (f"/upload/storage/v1/b/{q(bucket)}/o?uploadType=media&name="
                f"{urllib.parse.quote(key, safe='')}")
        status, _, body = self.call("POST", path, data,
                                    {"Content-Type": "application/octet-stream"})
        if status != 200:
            raise RuntimeError(f"upload of {key}: {status} {body[:200]!r}")
        return json.loads(body)


def q(s):
    return urllib.parse.quote(s, safe="")


def etag_of(meta):
    return f'"{meta["md5Hash"]}"'


class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    upstream = None
    public_key = None
    issuer = None

    def log_message(self, *args):
        pass

    # --- plumbing -------------------------------------------------------------------

    def reply(self, status, body=b"", headers=()):
        self.send_response(status)
        sent = set()
        for k, v in headers:
            if k.lower() in ("transfer-encoding", "connection", "content-length", "date",
                             "server"):
                continue
            self.send_header(k, v)
            sent.add(k.lower())
        if body and "content-type" not in sent:
            self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD" and body:
            self.wfile.write(body)

    def body(self):
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def split(self):
        url = urllib.parse.urlsplit(self.path)
        query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
        parts = url.path.lstrip("/").split("/", 1)
        bucket = urllib.parse.unquote(parts[0])
        key = urllib.parse.unquote(parts[1]) if len(parts) > 1 else ""
        return bucket, key, query, url.query

    def authorized(self):
        if self.public_key is None:
            return True
        auth = self.headers.get("Authorization", "")
        if not auth.startswith("Bearer "):
            return False
        try:
            head, claims, sig = auth[len("Bearer "):].split(".")
            pad = lambda s: base64.urlsafe_b64decode(s + "=" * (-len(s) % 4))
            from cryptography.hazmat.primitives import hashes
            from cryptography.hazmat.primitives.asymmetric import padding
            self.public_key.verify(pad(sig), f"{head}.{claims}".encode(),
                                   padding.PKCS1v15(), hashes.SHA256())
            return json.loads(pad(claims)).get("iss") == self.issuer
        except Exception:
            return False

    def count(self, kind):
        with LOCK:
            COUNTS[kind] = COUNTS.get(kind, 0) + 1

    def route(self):
        if self.path.startswith("/_layer/requests"):
            return self.reply(200, json.dumps(COUNTS).encode(),
                              [("Content-Type", "application/json")])
        if not self.authorized():
            self.body()
            return self.reply(401, xml_error("AuthenticationRequired",
                                             "Authentication required."))
        bucket, key, query, raw = self.split()
        if not self.upstream.bucket_exists(bucket):
            self.body()
            return self.reply(404, xml_error("NoSuchBucket",
                                             "The specified bucket does not exist."))
        method = self.command
        self.count(method)
        if method == "GET" and not key:
            return self.list(bucket, raw)
        if method in ("GET", "HEAD"):
            return self.get(bucket, key, query)
        if method == "PUT" and "uploadId" in query:
            return self.put_part(query)
        if method == "PUT":
            return self.put(bucket, key)
        if method == "POST" and "uploads" in query:
            return self.initiate(bucket, key)
        if method == "POST" and "uploadId" in query:
            return self.complete(bucket, key, query)
        if method == "DELETE" and "uploadId" in query:
            with LOCK:
                UPLOADS.pop(query["uploadId"][0], None)
            return self.reply(204)
        if method == "DELETE":
            return self.delete(bucket, key)
        self.body()
        return self.reply(501, xml_error("NotImplemented", f"{method} {self.path}"))

    do_GET = do_HEAD = do_PUT = do_POST = do_DELETE = lambda self: self.route()

    # --- the calls ------------------------------------------------------------------

    def generation_holds(self, meta):
        """Whether `x-goog-if-generation-match` (if sent) holds for `meta`."""
        want = self.headers.get("x-goog-if-generation-match")
        if want is None:
            return True
        have = meta["generation"] if meta else "0"
        return str(want) == str(have)

    def precondition_failed(self):
        return self.reply(412, xml_error("PreconditionFailed",
                                         "At least one of the pre-conditions you specified "
                                         "did not hold."))

    def no_key(self):
        return self.reply(404, xml_error("NoSuchKey", "The specified key does not exist."))

    def written(self, meta, extra=b""):
        return self.reply(200, extra, [("ETag", etag_of(meta)),
                                       ("x-goog-generation", str(meta["generation"])),
                                       ("x-goog-metageneration", "1")])

    def put(self, bucket, key):
        data = self.body()
        if self.headers.get("x-goog-copy-source"):
            return self.reply(501, xml_error("NotImplemented", "copy"))
        with LOCK:
            if not self.generation_holds(self.upstream.meta(bucket, key)):
                return self.precondition_failed()
            meta = self.upstream.upload(bucket, key, data)
        return self.written(meta)

    def get(self, bucket, key, query):
        headers = {k: v for k, v in self.headers.items()
                   if k.lower() in ("range", "accept-encoding")}
        path = f"/{q(bucket)}/{urllib.parse.quote(key)}"
        if "generation" in query:
            path += f"?generation={q(query['generation'][0])}"
        with LOCK:
            meta = self.upstream.meta(bucket, key)
            if meta is None or ("generation" in query
                                and query["generation"][0] != str(meta["generation"])):
                # GCS without versioning keeps no other generation.
                return self.no_key()
            if_match = self.headers.get("If-Match")
            if if_match is not None and if_match not in (etag_of(meta), "*"):
                return self.precondition_failed()
            if_none = self.headers.get("If-None-Match")
            if if_none is not None and if_none in (etag_of(meta), "*"):
                return self.reply(304)
            if not self.generation_holds(meta):
                return self.precondition_failed()
            status, got, body = self.upstream.call(self.command, path, headers=headers)
        if status == 404:
            return self.no_key()
        got = [(k, v) for k, v in got if k.lower() != "etag"] + [("ETag", etag_of(meta))]
        return self.reply(status, body, got)

    def delete(self, bucket, key):
        self.body()
        with LOCK:
            meta = self.upstream.meta(bucket, key)
            if not self.generation_holds(meta):
                return self.precondition_failed()
            if meta is None:
                return self.no_key()
            status, _, body = self.upstream.call("DELETE",
                                                 f"/storage/v1/b/{q(bucket)}/o/{q(key)}")
        if status == 404:
            return self.no_key()
        if status >= 300:
            return self.reply(500, body)
        return self.reply(204)

    def list(self, bucket, raw):
        status, got, body = self.upstream.call("GET", f"/{q(bucket)}?{raw}")
        return self.reply(status, body, got)

    def initiate(self, bucket, key):
        self.body()
        upload = secrets.token_hex(16)
        with LOCK:
            UPLOADS[upload] = {"bucket": bucket, "key": key, "parts": {}}
        body = (f'<?xml version="1.0" encoding="UTF-8"?><InitiateMultipartUploadResult>'
                f"<Bucket>{bucket}</Bucket><Key>{key}</Key><UploadId>{upload}</UploadId>"
                f"</InitiateMultipartUploadResult>").encode()
        return self.reply(200, body)

    def put_part(self, query):
        data = self.body()
        with LOCK:
            upload = UPLOADS.get(query["uploadId"][0])
            if upload is None:
                return self.reply(404, xml_error("NoSuchUpload", "No such upload."))
            number = int(query["partNumber"][0])
            upload["parts"][number] = data
        import hashlib
        return self.reply(200, b"", [("ETag", f'"{hashlib.md5(data).hexdigest()}"')])

    def complete(self, bucket, key, query):
        listed = ET.fromstring(self.body() or b"<CompleteMultipartUpload/>")
        numbers = [int(p.findtext("PartNumber")) for p in listed.iter("Part")]
        with LOCK:
            upload = UPLOADS.get(query["uploadId"][0])
            if upload is None or any(n not in upload["parts"] for n in numbers):
                return self.reply(400, xml_error("InvalidPart", "A part is missing."))
            if not self.generation_holds(self.upstream.meta(bucket, key)):
                return self.precondition_failed()
            data = b"".join(upload["parts"][n] for n in numbers)
            meta = self.upstream.upload(bucket, key, data)
            del UPLOADS[query["uploadId"][0]]
        body = (f'<?xml version="1.0" encoding="UTF-8"?><CompleteMultipartUploadResult>'
                f"<Location>/{bucket}/{key}</Location><Bucket>{bucket}</Bucket>"
                f"<Key>{key}</Key><ETag>{etag_of(meta)}</ETag>"
                f"</CompleteMultipartUploadResult>").encode()
        return self.written(meta, body)


def main():
    port, upstream = int(sys.argv[1]), sys.argv[2]
    Handler.upstream = Upstream(upstream)
    args = sys.argv[3:]
    if "--public-key" in args:
        from cryptography.hazmat.primitives.serialization import load_pem_public_key
        with open(args[args.index("--public-key") + 1], "rb") as f:
            Handler.public_key = load_pem_public_key(f.read())
        Handler.issuer = args[args.index("--issuer") + 1]
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main()
