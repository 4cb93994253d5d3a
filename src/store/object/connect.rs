//! An object store opened from its URL: the provider's `object_store` builder, configured
//! as the provider's own tools are (the environment, and for S3 the shared AWS profile
//! files), then by what the command line gives (`--endpoint`), and the raw way to the
//! same bucket (`raw.rs`) for what `object_store` does not ask.

use std::io;
use std::sync::Arc;

use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::azure::{AzureConfigKey, MicrosoftAzureBuilder};
use object_store::client::{HttpClient, HttpConnector, ReqwestConnector};
use object_store::gcp::{GoogleCloudStorageBuilder, GoogleConfigKey};
use object_store::{BackoffConfig, ClientConfigKey, ClientOptions, ObjectStore, RetryConfig};
use tracing::warn;

use super::raw::{Raw, Signer};
use super::{REQUEST_BUDGET, parse_public, redacted, to_io};

pub(super) struct Connected {
    pub store: Arc<dyn ObjectStore>,
    pub raw: Raw,
}

/// Client settings every store gets (as configuration, so that those the environment
/// gave, allow_http or proxies, stay). A server that stops answering is found by the
/// budget of each request (`bounded`); the total timeout only bounds a transfer.
fn client_settings() -> Vec<(&'static str, String)> {
    vec![
        ("timeout", "1800s".into()),
        ("read_timeout", format!("{}s", REQUEST_BUDGET.as_secs())),
        ("connect_timeout", "3s".into()),
    ]
}

fn retry() -> RetryConfig {
    RetryConfig {
        backoff: BackoffConfig::default(),
        max_retries: 3,
        retry_timeout: REQUEST_BUDGET,
    }
}

/// The HTTP client of the raw requests, with the store's own `allow_http`.
fn http_client(allow_http: bool) -> io::Result<HttpClient> {
    let options = ClientOptions::new()
        .with_allow_http(allow_http)
        .with_connect_timeout(std::time::Duration::from_secs(3));
    ReqwestConnector::default().connect(&options).map_err(to_io)
}

/// Refuses an endpoint (from the environment, a profile or the command line) that carries
/// credentials: it is shown in errors, `stats` and the log. `what` names where it came
/// from.
fn public_endpoint(what: &str, value: Option<String>) -> io::Result<()> {
    match value {
        Some(v) => parse_public(&v, &format!("{what} ")).map(drop),
        None => Ok(()),
    }
}

fn truthy(v: Option<String>) -> bool {
    v.is_some_and(|v| matches!(v.to_ascii_lowercase().as_str(), "true" | "1" | "yes"))
}

/// The bucket (container) a URL names: its host. (`object_store` reads it from the URL
/// only when it builds the store.)
fn bucket_of(parsed: &url::Url) -> String {
    parsed.host_str().unwrap_or_default().to_string()
}

pub(super) fn connect(
    parsed: &url::Url,
    url: &str,
    config: &[(&str, &str)],
) -> io::Result<Connected> {
    let bucket = bucket_of(parsed);
    match parsed.scheme() {
        "s3" | "s3a" => s3(url, &bucket, config),
        "gs" => gcs(url, &bucket, config),
        "az" | "abfs" | "abfss" => azure(url, &bucket, config),
        other => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{}: no object store for the scheme {other}:", redacted(url)),
        )),
    }
}

/// `settings` then `config` into a builder, by `object_store`'s configuration keys.
macro_rules! configured {
    ($builder:expr, $settings:expr, $config:expr) => {{
        let mut b = $builder;
        for (key, value) in $settings {
            if let Ok(key) = key.parse() {
                b = b.with_config(key, value);
            }
        }
        for (key, value) in $config {
            if let Ok(key) = key.parse() {
                b = b.with_config(key, *value);
            }
        }
        b
    }};
}

/// What the shared AWS profile says that the environment (`from_env`) did not.
fn profile_settings(from_env: &AmazonS3Builder) -> io::Result<Vec<(&'static str, String)>> {
    let profile = super::profile::from_environment()?;
    let said = |key: AmazonS3ConfigKey| from_env.get_config_value(&key).is_some();
    let unset = |key: &str| match key {
        "access_key_id" | "secret_access_key" | "token" => !said(AmazonS3ConfigKey::AccessKeyId),
        "region" => !said(AmazonS3ConfigKey::Region),
        _ => !said(AmazonS3ConfigKey::Endpoint) && !said(AmazonS3ConfigKey::S3Endpoint),
    };
    if let Some(way) = &profile.unfollowed {
        warn!(
            "the AWS profile gets its credentials by {way}, which shardfs does not follow: \
             give keys in the environment or the profile, or run where web identity or \
             instance credentials apply"
        );
    }
    Ok(profile
        .settings
        .into_iter()
        .filter(|(k, _)| unset(k))
        .collect())
}

fn s3(url: &str, bucket: &str, config: &[(&str, &str)]) -> io::Result<Connected> {
    let from_env = AmazonS3Builder::from_env();
    let from_profile = profile_settings(&from_env)?;
    let settings = from_profile.into_iter().chain(client_settings());
    let b = configured!(from_env.with_url(url).with_retry(retry()), settings, config);
    for (what, key) in [
        ("the S3 endpoint", AmazonS3ConfigKey::Endpoint),
        ("the S3 endpoint", AmazonS3ConfigKey::S3Endpoint),
        ("the STS endpoint", AmazonS3ConfigKey::StsEndpoint),
        ("the metadata endpoint", AmazonS3ConfigKey::MetadataEndpoint),
    ] {
        public_endpoint(what, b.get_config_value(&key))?;
    }
    let region = b
        .get_config_value(&AmazonS3ConfigKey::Region)
        .unwrap_or_else(|| "us-east-1".into());
    let endpoint = b
        .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
        .or_else(|| b.get_config_value(&AmazonS3ConfigKey::Endpoint));
    let virtual_hosted = truthy(b.get_config_value(&AmazonS3ConfigKey::VirtualHostedStyleRequest));
    // As `object_store` builds it (path style unless asked).
    let bucket_url = match (endpoint, virtual_hosted) {
        (Some(e), true) => e,
        (Some(e), false) => format!("{}/{bucket}", e.trim_end_matches('/')),
        (None, true) => format!("https://{bucket}.s3.{region}.amazonaws.com"),
        (None, false) => format!("https://s3.{region}.amazonaws.com/{bucket}"),
    };
    let allow_http =
        truthy(b.get_config_value(&AmazonS3ConfigKey::Client(ClientConfigKey::AllowHttp)));
    let store = Arc::new(b.build().map_err(to_io)?);
    let raw = Raw::new(
        http_client(allow_http)?,
        bucket_url,
        Signer::S3 {
            store: store.clone(),
            region,
        },
    );
    Ok(Connected { store, raw })
}

fn gcs(url: &str, bucket: &str, config: &[(&str, &str)]) -> io::Result<Connected> {
    let b = configured!(
        GoogleCloudStorageBuilder::from_env()
            .with_url(url)
            .with_retry(retry()),
        client_settings(),
        config
    );
    public_endpoint(
        "the GCS base URL",
        b.get_config_value(&GoogleConfigKey::BaseUrl),
    )?;
    let base = b
        .get_config_value(&GoogleConfigKey::BaseUrl)
        .unwrap_or_else(|| "https://storage.googleapis.com".into());
    let allow_http =
        truthy(b.get_config_value(&GoogleConfigKey::Client(ClientConfigKey::AllowHttp)));
    let store = Arc::new(b.build().map_err(to_io)?);
    let raw = Raw::new(
        http_client(allow_http)?,
        format!("{}/{bucket}", base.trim_end_matches('/')),
        Signer::Gcs {
            store: store.clone(),
        },
    );
    Ok(Connected { store, raw })
}

fn azure(url: &str, container: &str, config: &[(&str, &str)]) -> io::Result<Connected> {
    let b = configured!(
        MicrosoftAzureBuilder::from_env()
            .with_url(url)
            .with_retry(retry()),
        client_settings(),
        config
    );
    public_endpoint(
        "the Azure endpoint",
        b.get_config_value(&AzureConfigKey::Endpoint),
    )?;
    public_endpoint(
        "AZURITE_BLOB_STORAGE_URL",
        std::env::var("AZURITE_BLOB_STORAGE_URL").ok(),
    )?;
    let emulator = truthy(b.get_config_value(&AzureConfigKey::UseEmulator));
    // As `object_store` builds it: the emulator's account is a path segment.
    let (account, container_url, allow_http) = if emulator {
        let account = b
            .get_config_value(&AzureConfigKey::AccountName)
            .unwrap_or_else(|| "devstoreaccount1".into());
        let base = std::env::var("AZURITE_BLOB_STORAGE_URL")
            .unwrap_or_else(|_| "http://127.0.0.1:10000".into());
        let url = format!("{}/{account}/{container}", base.trim_end_matches('/'));
        (account, url, true)
    } else {
        let account = b
            .get_config_value(&AzureConfigKey::AccountName)
            .unwrap_or_default();
        let base = b
            .get_config_value(&AzureConfigKey::Endpoint)
            .unwrap_or_else(|| format!("https://{account}.blob.core.windows.net"));
        let allow = truthy(b.get_config_value(&AzureConfigKey::Client(ClientConfigKey::AllowHttp)));
        let url = format!("{}/{container}", base.trim_end_matches('/'));
        (account, url, allow)
    };
    let store = Arc::new(b.build().map_err(to_io)?);
    let raw = Raw::new(
        http_client(allow_http)?,
        container_url,
        Signer::Azure {
            store: store.clone(),
            account,
        },
    );
    Ok(Connected { store, raw })
}
