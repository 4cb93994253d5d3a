//! The shared AWS configuration files (`~/.aws/credentials` and `~/.aws/config`) and the
//! profile `AWS_PROFILE` names there, which the AWS tools read and `object_store` does
//! not. Read in the order the AWS SDKs read them: the environment's own keys first, then
//! the profile's static keys (the credentials file over the config file), then the rest
//! of `object_store`'s chain (web identity, the container's and the instance's
//! credentials).

use std::collections::HashMap;
use std::io;
use std::path::{Path, PathBuf};

/// What a profile says, of what shardfs takes from it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(super) struct Profile {
    /// (`object_store` configuration key, value): keys, region, endpoint.
    pub settings: Vec<(&'static str, String)>,
    /// A way of getting credentials the profile names that shardfs does not follow
    /// (`role_arn`, `credential_process`, `sso_…`), for the message.
    pub unfollowed: Option<String>,
}

/// The sections of an INI file: `[name]` → key → value.
fn sections(text: &str) -> HashMap<String, HashMap<String, String>> {
    let mut out: HashMap<String, HashMap<String, String>> = HashMap::new();
    let mut current = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            current = Some(name.trim().to_string());
            continue;
        }
        if let (Some(section), Some((k, v))) = (&current, line.split_once('=')) {
            out.entry(section.clone())
                .or_default()
                .insert(k.trim().to_ascii_lowercase(), v.trim().to_string());
        }
    }
    out
}

/// Where the AWS tools keep a file: `$var`, else `~/.aws/name`.
fn file_of(var: &str, name: &str) -> Option<PathBuf> {
    if let Some(p) = std::env::var_os(var) {
        return Some(PathBuf::from(p));
    }
    std::env::var_os("HOME").map(|h| Path::new(&h).join(".aws").join(name))
}

fn read_if_there(path: Option<PathBuf>) -> io::Result<String> {
    match path.map(std::fs::read_to_string) {
        Some(Ok(text)) => Ok(text),
        Some(Err(e)) if e.kind() == io::ErrorKind::NotFound => Ok(String::new()),
        Some(Err(e)) => Err(e),
        None => Ok(String::new()),
    }
}

/// The profile from the environment's files: `AWS_PROFILE` (refused when named but not
/// found), else `default` (nothing when absent).
pub(super) fn from_environment() -> io::Result<Profile> {
    let named = std::env::var("AWS_PROFILE").ok().filter(|p| !p.is_empty());
    let credentials = read_if_there(file_of("AWS_SHARED_CREDENTIALS_FILE", "credentials"))?;
    let config = read_if_there(file_of("AWS_CONFIG_FILE", "config"))?;
    let name = named.clone().unwrap_or_else(|| "default".into());
    match profile(&name, &credentials, &config) {
        None if named.is_some() => Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!(
                "AWS_PROFILE names the profile {name}, which neither ~/.aws/credentials nor \
                 ~/.aws/config (or AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE) holds"
            ),
        )),
        found => Ok(found.unwrap_or_default()),
    }
}

/// Profile `name` of the two files' texts; `None` when neither has it.
pub(super) fn profile(name: &str, credentials: &str, config: &str) -> Option<Profile> {
    let creds = sections(credentials);
    let conf = sections(config);
    let config_name = match name {
        "default" => "default".to_string(),
        other => format!("profile {other}"),
    };
    let in_creds = creds.get(name);
    let in_conf = conf.get(&config_name);
    if in_creds.is_none() && in_conf.is_none() {
        return None;
    }
    let get = |key: &str| {
        in_creds
            .and_then(|s| s.get(key))
            .or_else(|| in_conf.and_then(|s| s.get(key)))
            .cloned()
    };
    let mut settings = Vec::new();
    for (file_key, config_key) in [
        ("aws_access_key_id", "access_key_id"),
        ("aws_secret_access_key", "secret_access_key"),
        ("aws_session_token", "token"),
        ("region", "region"),
        ("endpoint_url", "endpoint"),
    ] {
        if let Some(v) = get(file_key) {
            settings.push((config_key, v));
        }
    }
    let has_keys = settings.iter().any(|(k, _)| *k == "access_key_id");
    let unfollowed = [
        "role_arn",
        "credential_process",
        "sso_session",
        "sso_start_url",
    ]
    .into_iter()
    .find(|k| get(k).is_some())
    .filter(|_| !has_keys)
    .map(str::to_string);
    Some(Profile {
        settings,
        unfollowed,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const CREDENTIALS: &str = "[default]\naws_access_key_id = AKIADEFAULT\n\
        aws_secret_access_key = s3cr3t\n\n[lab]\naws_access_key_id=AKIALAB\n\
        aws_secret_access_key=lab-secret\naws_session_token = tok\n";
    const CONFIG: &str = "[default]\nregion = eu-west-1\n\n[profile lab]\nregion = us-west-2\n\
        endpoint_url = https://minio.lab:9000\n\n[profile assumed]\nrole_arn = arn:aws:iam::1:role/x\n";

    #[test]
    fn a_profile_takes_keys_from_credentials_and_the_rest_from_config() {
        let lab = profile("lab", CREDENTIALS, CONFIG).unwrap();
        assert_eq!(
            lab.settings,
            vec![
                ("access_key_id", "AKIALAB".to_string()),
                ("secret_access_key", "lab-secret".to_string()),
                ("token", "tok".to_string()),
                ("region", "us-west-2".to_string()),
                ("endpoint", "https://minio.lab:9000".to_string()),
            ]
        );
        let default = profile("default", CREDENTIALS, CONFIG).unwrap();
        assert!(
            default
                .settings
                .contains(&("region", "eu-west-1".to_string()))
        );
        assert_eq!(default.unfollowed, None);
    }

    #[test]
    fn a_profile_that_assumes_a_role_is_named_not_followed() {
        let assumed = profile("assumed", CREDENTIALS, CONFIG).unwrap();
        assert!(assumed.settings.is_empty());
        assert_eq!(assumed.unfollowed.as_deref(), Some("role_arn"));
        assert_eq!(profile("nowhere", CREDENTIALS, CONFIG), None);
    }
}
