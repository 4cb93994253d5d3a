//! A local S3-compatible server for the tests: moto's server (from the venv of
//! `scripts/test.sh`), on 127.0.0.1 only, stopped when the guard drops, test failing or not.

use std::net::{TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};

use super::python;

pub struct S3Server {
    child: Child,
    pub port: u16,
}

impl S3Server {
    /// Starts a server and makes `bucket` with versioning on (each PUT is then a version
    /// the tests can count).
    pub fn start(bucket: &str) -> S3Server {
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new(python())
            .args([
                "-m",
                "moto.server",
                "-H",
                "127.0.0.1",
                "-p",
                &port.to_string(),
            ])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("moto's server starts (it is in scripts/requirements.txt)");
        let mut server = S3Server { child, port };
        super::wait_listening(&mut server.child, port, "moto's server");
        server.python(&format!(
            "s3.create_bucket(Bucket={bucket:?}); s3.put_bucket_versioning(Bucket={bucket:?}, \
             VersioningConfiguration={{'Status': 'Enabled'}})"
        ));
        server
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The environment a client of this server needs.
    pub fn env(&self) -> Vec<(&'static str, String)> {
        vec![
            ("AWS_ENDPOINT_URL", self.endpoint()),
            ("AWS_ACCESS_KEY_ID", "testing".into()),
            ("AWS_SECRET_ACCESS_KEY", "testing".into()),
            ("AWS_REGION", "us-east-1".into()),
            ("AWS_ALLOW_HTTP", "true".into()),
        ]
    }

    /// The configuration a store needs to reach this server (given explicitly: tests run
    /// in parallel, each with its own server, so the process environment cannot say).
    pub fn config(&self) -> Vec<(String, String)> {
        self.env()
            .into_iter()
            .map(|(k, v)| {
                let key = k.to_ascii_lowercase();
                (key.trim_start_matches("aws_").to_string(), v)
            })
            .collect()
    }

    /// Runs Python `code` with `s3`, a boto3 client of this server, and returns its stdout.
    pub fn python(&self, code: &str) -> String {
        let script = format!(
            "import boto3\ns3 = boto3.client('s3', endpoint_url={:?}, aws_access_key_id='testing', \
             aws_secret_access_key='testing', region_name='us-east-1')\n{code}\n",
            self.endpoint()
        );
        super::python_stdout(&script, "boto3 against moto")
    }

    /// How many versions of `key` the bucket holds: one per PUT that landed.
    pub fn versions(&self, bucket: &str, key: &str) -> usize {
        self.python(&format!(
            "r = s3.list_object_versions(Bucket={bucket:?}, Prefix={key:?})\n\
             print(sum(1 for v in r.get('Versions', []) if v['Key'] == {key:?}))"
        ))
        .trim()
        .parse()
        .unwrap()
    }

    /// Stops the server (as if it went away).
    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for S3Server {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A TCP proxy in front of a server that can be taken down and brought back: the server
/// keeps its objects, clients see it gone (connections refused and cut) meanwhile.
pub struct Proxy {
    pub port: u16,
    down: std::sync::Arc<std::sync::atomic::AtomicBool>,
    open: std::sync::Arc<std::sync::Mutex<Vec<TcpStream>>>,
    hold: Hold,
}

/// A request to hold back once: the first bytes sent to the server that contain
/// `pattern` wait until released, after `seen` is signalled.
type Hold = std::sync::Arc<std::sync::Mutex<Option<HeldRequest>>>;

struct HeldRequest {
    pattern: Vec<u8>,
    seen: std::sync::mpsc::Sender<()>,
    release: std::sync::mpsc::Receiver<()>,
}

/// Copies `from` to `to`; a buffer that matches the pattern held waits for its release.
fn forward(mut from: TcpStream, mut to: TcpStream, hold: Option<Hold>) {
    use std::io::{Read, Write};
    let mut buf = vec![0u8; 64 << 10];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        if let Some(h) = &hold {
            let mut held = h.lock().unwrap();
            let hit = held.as_ref().is_some_and(|r| {
                buf[..n]
                    .windows(r.pattern.len())
                    .any(|w| w == r.pattern.as_slice())
            });
            if hit && let Some(r) = held.take() {
                drop(held);
                let _ = r.seen.send(());
                let _ = r.release.recv();
            }
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(std::net::Shutdown::Both);
}

impl Proxy {
    pub fn start(target: u16) -> Proxy {
        use std::sync::atomic::Ordering::SeqCst;
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let down = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let open = std::sync::Arc::new(std::sync::Mutex::new(Vec::<TcpStream>::new()));
        let hold: Hold = std::sync::Arc::default();
        let (d, o, h) = (down.clone(), open.clone(), hold.clone());
        std::thread::spawn(move || {
            for client in listener.incoming().flatten() {
                if d.load(SeqCst) {
                    continue; // dropped: the client sees the connection closed
                }
                let Ok(server) = TcpStream::connect(("127.0.0.1", target)) else {
                    continue;
                };
                let mut held = o.lock().unwrap();
                held.push(client.try_clone().unwrap());
                held.push(server.try_clone().unwrap());
                drop(held);
                let (c, s) = (client.try_clone().unwrap(), server.try_clone().unwrap());
                let h = h.clone();
                std::thread::spawn(move || forward(c, s, Some(h)));
                std::thread::spawn(move || forward(server, client, None));
            }
        });
        Proxy {
            port,
            down,
            open,
            hold,
        }
    }

    /// Holds back, once, the first request whose bytes contain `pattern`. The returned
    /// receiver signals that it arrived; sending on the returned sender lets it through.
    pub fn hold_once(
        &self,
        pattern: &str,
    ) -> (std::sync::mpsc::Receiver<()>, std::sync::mpsc::Sender<()>) {
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let (release_tx, release_rx) = std::sync::mpsc::channel();
        *self.hold.lock().unwrap() = Some(HeldRequest {
            pattern: pattern.as_bytes().to_vec(),
            seen: seen_tx,
            release: release_rx,
        });
        (seen_rx, release_tx)
    }

    /// Takes the server away (open connections are cut) or brings it back.
    pub fn set_down(&self, down: bool) {
        self.down.store(down, std::sync::atomic::Ordering::SeqCst);
        if down {
            for s in self.open.lock().unwrap().drain(..) {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
        }
    }

    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }
}
