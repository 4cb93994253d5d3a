//! A local S3-compatible server for the tests: moto's server (from the venv of
//! `scripts/test.sh`), on 127.0.0.1 only, stopped when the guard drops, test failing or not.

use std::net::TcpListener;
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
