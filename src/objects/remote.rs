//! Remote object stores: where a store's objects live when it is created
//! with `forkfs init --remote URL` (S3 and S3-compatible services, GCS,
//! Azure, or a `file://` directory), through `object_store`.
//!
//! The URL and connection settings are part of the store's configuration;
//! credentials never are: they come from the usual environment variables
//! (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`,
//! `AWS_REGION`, `GOOGLE_SERVICE_ACCOUNT`, `AZURE_STORAGE_ACCOUNT_NAME`, ...,
//! as each builder's `from_env` reads them).

use crate::error::{Error, Result};
use object_store::ObjectStore;
use object_store::prefix::PrefixStore;
use serde::{Deserialize, Serialize};
use std::sync::Arc;
use std::time::Duration;

/// Where a store's objects live, and how to reach them.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct RemoteConfig {
    /// `s3://bucket/prefix`, `gs://bucket/prefix`, `az://container/prefix`
    /// or `file:///path`.
    pub url: String,
    /// An S3-compatible service's endpoint (MinIO, Ceph RGW, a test server).
    #[serde(default)]
    pub endpoint: Option<String>,
    /// Plain HTTP to the endpoint (loopback tests).
    #[serde(default)]
    pub allow_http: bool,
    #[serde(default)]
    pub region: Option<String>,
    /// How long a read may wait for the object store, retries included,
    /// before it fails (EIO to a client) instead of hanging. `None`: the
    /// default, [`DEFAULT_READ_DEADLINE`]. A process may override it
    /// ([`crate::config::Settings::read_deadline`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_deadline_ms: Option<u64>,
    /// Bytes that may wait on local disk for upload before writers wait
    /// (`--pending-limit`); `None`: [`DEFAULT_PENDING_LIMIT`]. A process
    /// may override it ([`crate::config::Settings::pending_limit`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pending_limit: Option<u64>,
}

pub const DEFAULT_PENDING_LIMIT: u64 = 8 << 30;

/// Pair it with the client's own timeout: a kernel NBD client's
/// dead-connection timeout must be longer, or clients see I/O errors from
/// their own side first.
pub const DEFAULT_READ_DEADLINE: Duration = Duration::from_secs(20);

impl RemoteConfig {
    /// The read deadline in force for a process with `settings`.
    pub fn read_deadline(&self, settings: &crate::config::Settings) -> Duration {
        let configured = self.read_deadline_ms.map_or(DEFAULT_READ_DEADLINE, Duration::from_millis);
        settings.read_deadline.unwrap_or(configured)
    }

    /// How long a sync waits for uploads that make no progress before it
    /// fails (they stay queued): the read deadline, at least 5 s.
    pub fn stall(&self, settings: &crate::config::Settings) -> Duration {
        stall(self.read_deadline(settings))
    }

    /// The pending-bytes limit in force for a process with `settings`.
    pub fn pending_limit(&self, settings: &crate::config::Settings) -> u64 {
        settings.pending_limit.unwrap_or(self.pending_limit.unwrap_or(DEFAULT_PENDING_LIMIT))
    }
}

/// How long uploads may make no progress before a sync gives up, for a
/// read deadline `d` (0: none): `d`, at least 5 s.
pub fn stall(d: Duration) -> Duration {
    if d.is_zero() { DEFAULT_READ_DEADLINE } else { d.max(Duration::from_secs(5)) }
}

/// A parsed remote URL.
#[derive(Debug, PartialEq, Eq)]
struct Parsed<'a> {
    scheme: &'a str,
    bucket: &'a str,
    prefix: &'a str,
}

fn parse(url: &str) -> Result<Parsed<'_>> {
    let bad = |why: &str| Error::invalid(format!("remote {url:?}: {why}"));
    let (scheme, rest) = url.split_once("://").ok_or_else(|| bad("not a URL"))?;
    if scheme == "file" {
        if !rest.starts_with('/') {
            return Err(bad("file:// needs an absolute path"));
        }
        return Ok(Parsed { scheme, bucket: "", prefix: rest });
    }
    if !matches!(scheme, "s3" | "gs" | "az") {
        return Err(bad("use s3://, gs://, az:// or file://"));
    }
    let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
    if bucket.is_empty() {
        return Err(bad("no bucket"));
    }
    Ok(Parsed { scheme, bucket, prefix: prefix.trim_matches('/') })
}

impl RemoteConfig {
    /// Checks the URL without connecting.
    pub fn validate(&self) -> Result<()> {
        parse(&self.url).map(|_| ())
    }

    /// The object store, with retries (backoff, bounded in time) and
    /// request timeouts. `Some(dir)` for `file://`: puts there must be
    /// fsynced by the caller.
    pub fn open(&self) -> Result<(Arc<dyn ObjectStore>, Option<std::path::PathBuf>)> {
        let p = parse(&self.url)?;
        let retry = object_store::RetryConfig {
            max_retries: 10,
            retry_timeout: Duration::from_secs(60),
            ..Default::default()
        };
        let client = object_store::ClientOptions::new()
            .with_allow_http(self.allow_http)
            .with_timeout(Duration::from_secs(30))
            .with_connect_timeout(Duration::from_secs(5));
        let store: Arc<dyn ObjectStore> = match p.scheme {
            "file" => {
                std::fs::create_dir_all(p.prefix)?;
                let fs = object_store::local::LocalFileSystem::new_with_prefix(p.prefix)?;
                return Ok((Arc::new(fs), Some(p.prefix.into())));
            }
            "s3" => {
                let mut b = object_store::aws::AmazonS3Builder::from_env()
                    .with_bucket_name(p.bucket)
                    .with_allow_http(self.allow_http)
                    .with_retry(retry)
                    .with_client_options(client)
                    // Heads and leases are updated with If-Match / If-None-Match.
                    .with_conditional_put(object_store::aws::S3ConditionalPut::ETagMatch);
                if let Some(e) = &self.endpoint {
                    b = b.with_endpoint(e);
                }
                if let Some(r) = &self.region {
                    b = b.with_region(r);
                }
                Arc::new(b.build()?)
            }
            "gs" => Arc::new(
                object_store::gcp::GoogleCloudStorageBuilder::from_env()
                    .with_bucket_name(p.bucket)
                    .with_retry(retry)
                    .with_client_options(client)
                    .build()?,
            ),
            "az" => {
                let mut b = object_store::azure::MicrosoftAzureBuilder::from_env()
                    .with_container_name(p.bucket)
                    .with_allow_http(self.allow_http)
                    .with_retry(retry)
                    .with_client_options(client);
                if let Some(e) = &self.endpoint {
                    b = b.with_endpoint(e.clone());
                }
                Arc::new(b.build()?)
            }
            _ => unreachable!("parse accepts only these"),
        };
        if p.prefix.is_empty() {
            return Ok((store, None));
        }
        Ok((Arc::new(PrefixStore::new(store, p.prefix)), None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_parse_or_fail_clearly() {
        assert_eq!(
            parse("s3://bkt/a/b/").unwrap(),
            Parsed { scheme: "s3", bucket: "bkt", prefix: "a/b" }
        );
        assert_eq!(parse("gs://bkt").unwrap(), Parsed { scheme: "gs", bucket: "bkt", prefix: "" });
        assert_eq!(parse("file:///x/y").unwrap().prefix, "/x/y");
        for bad in ["bkt", "s3://", "s3:///p", "http://h/b", "file://rel"] {
            let e = parse(bad).unwrap_err();
            assert_eq!(e.kind(), crate::error::ErrorKind::InvalidInput, "{bad}");
        }
    }
}
