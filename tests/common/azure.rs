//! A local Azure Blob Storage server for the tests: Azurite (npm `azurite`, installed by
//! `scripts/test.sh` at `$SHARDFS_AZURITE`), on 127.0.0.1 only, its blobs in memory,
//! stopped when the guard drops, test failing or not. It serves the well-known
//! development account `devstoreaccount1`, which `object_store` and the Azure SDKs reach
//! with `AZURE_STORAGE_USE_EMULATOR=true` and `AZURITE_BLOB_STORAGE_URL`.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};

/// The development account's published key (Azurite's documentation): not a secret.
const ACCOUNT_KEY: &str =
    "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw==";

pub struct Azurite {
    child: Child,
    pub port: u16,
}

/// Azurite's blob server, as `scripts/test.sh` installed it.
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

impl Azurite {
    /// Starts a server and makes `container`.
    pub fn start(container: &str) -> Azurite {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(azurite_blob())
            .args(["--blobHost", "127.0.0.1", "--blobPort", &port.to_string()])
            // Telemetry would reach for the internet; the tests' SDK may be newer.
            .args(["--inMemoryPersistence", "--disableTelemetry"])
            .args(["--skipApiVersionCheck", "--loose", "--silent"])
            // (Nothing is written with the blobs in memory; its cwd just in case.)
            .current_dir(std::env::temp_dir())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("Azurite starts");
        let mut server = Azurite { child, port };
        super::wait_listening(&mut server.child, port, "Azurite");
        server.python(&format!("service.create_container({container:?})"));
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a client of this server needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AZURE_STORAGE_USE_EMULATOR", "true".into()),
            ("AZURITE_BLOB_STORAGE_URL", self.endpoint()),
        ]
    }

    /// Runs Python `code` with `service`, an Azure SDK client of this server, and returns
    /// its stdout.
    pub fn python(&self, code: &str) -> String {
        let script = format!(
            "from azure.storage.blob import BlobServiceClient\n\
             service = BlobServiceClient.from_connection_string(\
             'DefaultEndpointsProtocol=http;AccountName=devstoreaccount1;AccountKey={ACCOUNT_KEY};\
             BlobEndpoint={}/devstoreaccount1;')\n{code}\n",
            self.endpoint()
        );
        super::python_stdout(&script, "the Azure SDK against Azurite")
    }

    /// The names of the blobs of `container` below `prefix`.
    pub fn blobs(&self, container: &str, prefix: &str) -> Vec<String> {
        self.python(&format!(
            "c = service.get_container_client({container:?})\n\
             print('\\n'.join(b.name for b in c.list_blobs(name_starts_with={prefix:?})))"
        ))
        .lines()
        .map(str::to_string)
        .filter(|l| !l.is_empty())
        .collect()
    }
}

impl Drop for Azurite {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
