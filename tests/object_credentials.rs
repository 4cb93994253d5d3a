//! Credentials the way each cloud's users have them, and never a secret in what a mount
//! shows. Each mount here reaches its server through the fault proxy, which records the
//! `Authorization` header of every request: that tells which credentials signed it (moto
//! takes any S3 keys; the GCS layer checks the service account's signature; Azurite
//! checks shared keys and SAS signatures). The daemon's `HOME` is an empty directory, so
//! that nothing of the machine's own configuration counts.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::mount::{Mounted, run_timeout, shardfs_timeout};
use common::proxy::Seen;
use common::stores::{AZURITE_KEY, Kind, StoreServer};
use common::{LINE_ARRAY, assert_ok, stderr, stdout};

const LIMIT: Duration = Duration::from_secs(300);

/// A mount of `prefix` with exactly `env` (and `HOME`) for its credentials.
fn mount_env(
    server: &StoreServer,
    prefix: &str,
    env: &[(&str, String)],
    extra: &[&str],
) -> (Mounted, tempfile::TempDir) {
    let cache = tempfile::tempdir().unwrap();
    let mut args = vec!["--cache-dir", cache.path().to_str().unwrap()];
    args.extend_from_slice(extra);
    let url = server.url(prefix);
    (Mounted::with_env(Path::new(&url), &args, env, LIMIT), cache)
}

/// `shardfs mount` of `prefix` with `env` that must fail; its message.
fn refused_mount(server: &StoreServer, prefix: &str, env: &[(&str, String)]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let mountpoint = dir.path().join("mnt");
    std::fs::create_dir(&mountpoint).unwrap();
    let out = run_timeout(
        Command::new(common::shardfs_bin())
            .args(["mount", &server.url(prefix)])
            .arg(&mountpoint)
            .arg("--cache-dir")
            .arg(dir.path().join("cache"))
            .envs(env.iter().map(|(k, v)| (*k, v.as_str()))),
        Duration::from_secs(90),
    );
    assert!(!out.status.success(), "mounted: {}", stdout(&out));
    assert!(!common::mount::is_mounted(&mountpoint));
    stderr(&out)
}

/// Writes array `x` (8 chunks of 16 bytes) through `m`, unmounts, and reads it back
/// through a mount with the harness's own credentials. Returns the requests `m` made.
fn write_and_read_back(server: &StoreServer, m: Mounted, prefix: &str) -> Vec<Seen> {
    std::fs::create_dir_all(m.path("x/c")).unwrap();
    std::fs::write(m.path("x/zarr.json"), LINE_ARRAY).unwrap();
    for k in 0..8u8 {
        std::fs::write(m.path(&format!("x/c/{k}")), [k + 1; 16]).unwrap();
    }
    assert_ok(&m.unmount(&[]), "unmount");
    drop(m);
    let made = server.proxy.requests();
    let (r, _cache) = mount_env(server, prefix, &server.env(), &[]);
    for k in 0..8u8 {
        assert_eq!(
            std::fs::read(r.path(&format!("x/c/{k}"))).unwrap(),
            vec![k + 1; 16]
        );
    }
    assert_ok(&r.unmount(&[]), "unmount the reader");
    made
}

/// Those of `made` to the objects below `prefix` whose `Authorization` header does not
/// satisfy `ok`.
fn signed_otherwise(made: &[Seen], prefix: &str, ok: impl Fn(&str) -> bool) -> Vec<Seen> {
    made.iter()
        .filter(|r| r.path.contains(&format!("/{prefix}")))
        .filter(|r| !r.auth.as_deref().is_some_and(&ok))
        .cloned()
        .collect()
}

fn empty_home() -> tempfile::TempDir {
    tempfile::tempdir().unwrap()
}

fn home(dir: &tempfile::TempDir) -> (&'static str, String) {
    ("HOME", dir.path().display().to_string())
}

#[test]
fn s3_keys_come_from_the_profile_aws_profile_names() {
    let server = StoreServer::start(Kind::S3);
    let home_dir = empty_home();
    let aws = home_dir.path().join(".aws");
    std::fs::create_dir(&aws).unwrap();
    std::fs::write(
        aws.join("credentials"),
        "[default]\naws_access_key_id = AKIADEFAULTTEST\naws_secret_access_key = d\n\n\
         [lab]\naws_access_key_id = AKIALABTEST\naws_secret_access_key = lab-secret\n",
    )
    .unwrap();
    // The endpoint too, from the profile (as the AWS CLI takes it).
    std::fs::write(
        aws.join("config"),
        format!(
            "[profile lab]\nregion = us-east-1\nendpoint_url = {}\n",
            server.proxy.endpoint()
        ),
    )
    .unwrap();
    let env = vec![
        home(&home_dir),
        ("AWS_PROFILE", "lab".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    let (m, _cache) = mount_env(&server, "prof", &env, &[]);
    let made = write_and_read_back(&server, m, "prof");
    let other = signed_otherwise(&made, "prof", |a| a.contains("Credential=AKIALABTEST/"));
    assert!(other.is_empty(), "{other:?}");
    // A profile named and missing is refused, naming it.
    let env = vec![home(&home_dir), ("AWS_PROFILE", "nowhere".to_string())];
    let message = refused_mount(&server, "prof", &env);
    assert!(message.contains("nowhere"), "{message}");
}

/// A service of `tests/py/aws_identity.py`, stopped with the guard.
struct Identity(std::process::Child);

impl Identity {
    fn start(args: &[&str], port: u16) -> Identity {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/py/aws_identity.py");
        let mut child = Command::new(common::python())
            .arg(script)
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        common::wait_listening(&mut child, port, "the identity service");
        Identity(child)
    }
}

impl Drop for Identity {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Keys from STS for a web identity token (a pod's service account, a CI job's OIDC
/// token): `AWS_WEB_IDENTITY_TOKEN_FILE` and `AWS_ROLE_ARN`. The STS endpoint is HTTPS
/// only; its certificate is made by the test (`AWS_ALLOW_INVALID_CERTIFICATES`).
#[test]
fn s3_keys_come_from_web_identity() {
    let server = StoreServer::start(Kind::S3);
    let port = free_port();
    let token_text = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJzaGFyZGZzIn0.";
    let _sts = Identity::start(
        &[
            "sts",
            &port.to_string(),
            "ASIAWEBIDTEST",
            "wid-secret",
            token_text,
        ],
        port,
    );
    let home_dir = empty_home();
    let token = home_dir.path().join("token");
    std::fs::write(&token, token_text).unwrap();
    let env = vec![
        home(&home_dir),
        ("AWS_WEB_IDENTITY_TOKEN_FILE", token.display().to_string()),
        (
            "AWS_ROLE_ARN",
            "arn:aws:iam::123456789012:role/shardfs".to_string(),
        ),
        ("AWS_ENDPOINT_URL_STS", format!("https://127.0.0.1:{port}")),
        ("AWS_ALLOW_INVALID_CERTIFICATES", "true".to_string()),
        ("AWS_ENDPOINT_URL", server.proxy.endpoint()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    let (m, _cache) = mount_env(&server, "wid", &env, &[]);
    let made = write_and_read_back(&server, m, "wid");
    let other = signed_otherwise(&made, "wid", |a| a.contains("Credential=ASIAWEBIDTEST/"));
    assert!(other.is_empty(), "{other:?}");
}

#[test]
fn s3_keys_come_from_the_instance_metadata_service() {
    let server = StoreServer::start(Kind::S3);
    let port = free_port();
    let _imds = Identity::start(
        &["imds", &port.to_string(), "ASIAIMDSTEST", "imds-secret"],
        port,
    );
    let home_dir = empty_home();
    let env = vec![
        home(&home_dir),
        ("AWS_METADATA_ENDPOINT", format!("http://127.0.0.1:{port}")),
        ("AWS_ENDPOINT_URL", server.proxy.endpoint()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    let (m, _cache) = mount_env(&server, "imds", &env, &[]);
    let made = write_and_read_back(&server, m, "imds");
    let other = signed_otherwise(&made, "imds", |a| a.contains("Credential=ASIAIMDSTEST/"));
    assert!(other.is_empty(), "{other:?}");
}

/// `--endpoint` names the server (an S3-compatible store's, here), over the environment,
/// which has none.
#[test]
fn an_endpoint_on_the_command_line_reaches_an_s3_compatible_store() {
    let server = StoreServer::start(Kind::S3);
    let home_dir = empty_home();
    let env = vec![
        home(&home_dir),
        ("AWS_ACCESS_KEY_ID", "AKIAENDPOINT".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "e".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
    ];
    let endpoint = server.proxy.endpoint();
    let (m, _cache) = mount_env(&server, "ep", &env, &["--endpoint", &endpoint]);
    let made = write_and_read_back(&server, m, "ep");
    let other = signed_otherwise(&made, "ep", |a| a.contains("Credential=AKIAENDPOINT/"));
    assert!(other.is_empty(), "{other:?}");
}

#[test]
fn gcs_credentials_are_application_default_credentials() {
    let server = StoreServer::start(Kind::Gcs);
    let home_dir = empty_home();
    let base = [home(&home_dir), ("GOOGLE_ALLOW_HTTP", "true".to_string())];
    // GOOGLE_APPLICATION_CREDENTIALS naming a service account's key file, and the server
    // given by --endpoint.
    let mut env = base.to_vec();
    env.push((
        "GOOGLE_APPLICATION_CREDENTIALS",
        server.service_account().display().to_string(),
    ));
    let endpoint = server.proxy.endpoint();
    let (m, _cache) = mount_env(&server, "adc", &env, &["--endpoint", &endpoint]);
    write_and_read_back(&server, m, "adc");
    // The file where `gcloud auth application-default login` puts them.
    let gcloud = home_dir.path().join(".config/gcloud");
    std::fs::create_dir_all(&gcloud).unwrap();
    std::fs::copy(
        server.service_account(),
        gcloud.join("application_default_credentials.json"),
    )
    .unwrap();
    let mut env = base.to_vec();
    env.push(("GOOGLE_BASE_URL", server.proxy.endpoint()));
    let (m, _cache) = mount_env(&server, "adc2", &env, &[]);
    write_and_read_back(&server, m, "adc2");
    // Every request bore a token the layer checked (it answers 401 otherwise).
    let refused: Vec<_> = server
        .proxy
        .requests()
        .into_iter()
        .filter(|r| r.status == Some(401))
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
    // A key the server does not know is refused.
    let mut env = base.to_vec();
    env.push(("GOOGLE_BASE_URL", server.proxy.endpoint()));
    let untrusted = server.untrusted_service_account();
    env.push(("GOOGLE_SERVICE_ACCOUNT", untrusted.display().to_string()));
    let message = refused_mount(&server, "adc", &env);
    assert!(message.contains("401"), "{message}");
}

#[test]
fn azure_credentials_are_an_account_key_or_a_sas_token() {
    let server = StoreServer::start(Kind::Azure);
    let home_dir = empty_home();
    // The account's name and key, the server by --endpoint (the account in its path, as
    // Azurite names it).
    let env = vec![
        home(&home_dir),
        ("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1".to_string()),
        ("AZURE_STORAGE_ACCOUNT_KEY", AZURITE_KEY.to_string()),
    ];
    let endpoint = format!("{}/devstoreaccount1", server.proxy.endpoint());
    let (m, _cache) = mount_env(&server, "key", &env, &["--endpoint", &endpoint]);
    let made = write_and_read_back(&server, m, "key");
    let other = signed_otherwise(&made, "key", |a| {
        a.starts_with("SharedKey devstoreaccount1:")
    });
    assert!(other.is_empty(), "{other:?}");
    // A SAS token for the container: no Authorization, the signature in each query.
    let sas = container_sas(&server);
    let env = vec![
        home(&home_dir),
        ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
        ("AZURITE_BLOB_STORAGE_URL", server.proxy.endpoint()),
        ("AZURE_STORAGE_SAS_KEY", sas.clone()),
    ];
    let (m, _cache) = mount_env(&server, "sas", &env, &[]);
    let made = write_and_read_back(&server, m, "sas");
    let sas_requests: Vec<_> = made
        .into_iter()
        .filter(|r| r.path.contains("/sas"))
        .collect();
    assert!(!sas_requests.is_empty());
    for r in &sas_requests {
        if r.auth.is_none() {
            assert!(r.path.contains("sig="), "{r:?}");
        }
    }
    assert!(
        sas_requests.iter().any(|r| r.auth.is_none()),
        "{sas_requests:?}"
    );
    // A SAS whose signature is not the account's is refused.
    let forged = sas.replace("sig=", "sig=AAAA");
    let env = vec![
        home(&home_dir),
        ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
        ("AZURITE_BLOB_STORAGE_URL", server.proxy.endpoint()),
        ("AZURE_STORAGE_SAS_KEY", forged),
    ];
    let message = refused_mount(&server, "sas", &env);
    assert!(message.contains("403"), "{message}");
}

/// A SAS token for the test container: read, write, delete, list, for an hour.
fn container_sas(server: &StoreServer) -> String {
    server
        .python(&format!(
            "import datetime\n\
             from azure.storage.blob import generate_container_sas, ContainerSasPermissions\n\
             print(generate_container_sas('devstoreaccount1', 'shardfs-test', \
             account_key={AZURITE_KEY:?}, permission=ContainerSasPermissions(read=True, \
             write=True, delete=True, list=True, add=True, create=True), \
             expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1)))"
        ))
        .trim()
        .to_string()
}

/// `shardfs stats`, `flush` and the control file of `m`, as text.
fn what_a_mount_shows(m: &Mounted) -> String {
    let mp = m.mountpoint.to_str().unwrap();
    let mut shown = String::new();
    for args in [
        vec!["stats", mp],
        vec!["stats", mp, "--json"],
        vec!["flush", mp],
    ] {
        let out = shardfs_timeout(&args, Duration::from_secs(120));
        shown.push_str(&stdout(&out));
        shown.push_str(&stderr(&out));
    }
    shown.push_str(&std::fs::read_to_string(m.path(".shardfs-control")).unwrap_or_default());
    shown.push_str(
        &std::fs::read_to_string(format!("/proc/{}/cmdline", m.pid))
            .unwrap_or_default()
            .replace('\0', " "),
    );
    shown
}

every_store!(no_secret_shows_in_anything_a_mount_prints_or_logs);

/// Secrets each store's credentials carry, planted with the debug log on, through a
/// mount's whole life: mounting, writing, stats, a flush while the store is gone (errors
/// naming URLs), the store back, the unmount, the status file. None may appear.
fn no_secret_shows_in_anything_a_mount_prints_or_logs(kind: Kind) {
    let server = StoreServer::start(kind);
    let home_dir = empty_home();
    let mut env = vec![home(&home_dir), ("SHARDFS_LOG", "debug".to_string())];
    let secrets: Vec<String> = match kind {
        Kind::S3 => {
            env.extend([
                ("AWS_ENDPOINT_URL", server.proxy.endpoint()),
                ("AWS_ACCESS_KEY_ID", "AKIASECRETTEST".to_string()),
                ("AWS_SECRET_ACCESS_KEY", "S3CR3T-s3-key-x9q".to_string()),
                ("AWS_SESSION_TOKEN", "T0K3N-s3-session-x9q".to_string()),
                ("AWS_REGION", "us-east-1".to_string()),
                ("AWS_ALLOW_HTTP", "true".to_string()),
            ]);
            vec!["S3CR3T-s3-key-x9q".into(), "T0K3N-s3-session-x9q".into()]
        }
        Kind::Gcs => {
            env.extend(server.env());
            let account: serde_json::Value =
                serde_json::from_slice(&std::fs::read(server.service_account()).unwrap()).unwrap();
            let pem = account["private_key"].as_str().unwrap();
            // A line of the key's body.
            vec![pem.lines().nth(3).unwrap().to_string()]
        }
        Kind::Azure => {
            let sas = container_sas(&server);
            env.extend([
                ("AZURE_STORAGE_USE_EMULATOR", "true".to_string()),
                ("AZURITE_BLOB_STORAGE_URL", server.proxy.endpoint()),
                ("AZURE_STORAGE_SAS_KEY", sas.clone()),
            ]);
            let sig = sas
                .split('&')
                .find_map(|p| p.strip_prefix("sig="))
                .unwrap()
                .to_string();
            vec![sig.clone(), common::mount::url_decoded(&sig)]
        }
    };
    let (m, _cache) = mount_env(&server, "sec", &env, &["--chunks-per-shard", "4"]);
    let mut shown = m.mount_output.clone();
    std::fs::create_dir_all(m.path("x/c")).unwrap();
    std::fs::write(m.path("x/zarr.json"), LINE_ARRAY).unwrap();
    for k in 0..6u8 {
        std::fs::write(m.path(&format!("x/c/{k}")), [k + 1; 16]).unwrap();
    }
    shown.push_str(&what_a_mount_shows(&m));
    std::fs::write(m.path("x/c/6"), [7; 16]).unwrap();
    // The store gone: flushes and the unmount fail, naming what they could not write.
    server.proxy.set_down(true);
    shown.push_str(&what_a_mount_shows(&m));
    let refused = m.unmount(&[]);
    shown.push_str(&stdout(&refused));
    shown.push_str(&stderr(&refused));
    server.proxy.set_down(false);
    let done = m.unmount(&[]);
    shown.push_str(&stdout(&done));
    shown.push_str(&stderr(&done));
    assert_ok(&done, "unmount");
    m.wait_daemon_gone(Duration::from_secs(30));
    shown.push_str(&m.log_text());
    for status in std::fs::read_dir(common::mount::runtime_dir())
        .into_iter()
        .flatten()
    {
        let path = status.unwrap().path();
        if path.extension().is_some_and(|e| e == "status") {
            shown.push_str(&std::fs::read_to_string(&path).unwrap_or_default());
        }
    }
    // Bearer tokens made from the credentials are secrets too (GCS's signed JWT).
    let mut secrets = secrets;
    for r in server.proxy.requests() {
        if let Some(token) = r.auth.as_deref().and_then(|a| a.strip_prefix("Bearer ")) {
            secrets.push(token.to_string());
        }
    }
    assert!(shown.len() > 1000, "too little was shown to judge: {shown}");
    assert!(
        shown.contains("sec/x/c/"),
        "the failure was not named: {shown}"
    );
    for secret in &secrets {
        assert!(!secret.is_empty());
        assert!(
            !shown.contains(secret.as_str()),
            "{secret:?} shown:\n{shown}"
        );
    }
}

/// An endpoint carrying credentials is refused wherever it comes from (the environment, a
/// profile, the command line), without repeating them: it would be shown in errors,
/// `stats` and the log.
#[test]
fn an_endpoint_carrying_credentials_is_refused_wherever_it_comes_from() {
    let server = StoreServer::start(Kind::S3);
    let home_dir = empty_home();
    let with_secret = format!("http://AKIA:Se3cretX@127.0.0.1:{}", server.proxy.port);
    let keys = [
        home(&home_dir),
        ("AWS_ACCESS_KEY_ID", "AKIATEST".to_string()),
        ("AWS_SECRET_ACCESS_KEY", "t".to_string()),
        ("AWS_REGION", "us-east-1".to_string()),
        ("AWS_ALLOW_HTTP", "true".to_string()),
    ];
    let mut env = keys.to_vec();
    env.push(("AWS_ENDPOINT_URL", with_secret.clone()));
    let message = refused_mount(&server, "cred", &env);
    assert!(message.contains("credentials"), "{message}");
    assert!(!message.contains("Se3cretX"), "{message}");
    // From a profile.
    let aws = home_dir.path().join(".aws");
    std::fs::create_dir(&aws).unwrap();
    std::fs::write(
        aws.join("config"),
        format!("[default]\nendpoint_url = {with_secret}\n"),
    )
    .unwrap();
    let message = refused_mount(&server, "cred", &keys);
    assert!(message.contains("credentials"), "{message}");
    assert!(!message.contains("Se3cretX"), "{message}");
    // On the command line.
    let dir = tempfile::tempdir().unwrap();
    let out = run_timeout(
        Command::new(common::shardfs_bin())
            .args(["mount", &server.url("cred")])
            .arg(dir.path())
            .args(["--endpoint", &with_secret])
            .envs(keys.iter().map(|(k, v)| (*k, v.as_str()))),
        Duration::from_secs(60),
    );
    assert!(!out.status.success());
    assert!(!stderr(&out).contains("Se3cretX"), "{}", stderr(&out));
}
