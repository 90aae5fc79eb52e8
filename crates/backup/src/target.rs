//! Where a replica lives: a directory (`file:///path` or a plain path) or a bucket of an
//! S3-compatible store (`s3://bucket/prefix`, with `?endpoint=URL&region=NAME` for a store other
//! than AWS; credentials from the usual `AWS_*` environment variables).

use crate::{Error, Result};
use bytes::Bytes;
use futures_util::TryStreamExt;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use std::sync::Arc;

#[derive(Clone)]
pub struct Target {
    store: Arc<dyn ObjectStore>,
    prefix: String,
    /// The location as given, for messages.
    pub shown: String,
}

impl Target {
    /// The replica's target, its directory made when missing.
    pub fn create(location: &str) -> Result<Self> {
        Self::open(location, true)
    }

    /// An existing replica, to restore from: a missing directory is refused, not made.
    pub fn existing(location: &str) -> Result<Self> {
        Self::open(location, false)
    }

    /// Whether `location` is well formed, touching nothing (`serve --check-config`).
    pub fn check(location: &str) -> Result<()> {
        if location.starts_with("s3://") {
            return Self::open(location, false).map(|_| ());
        }
        Self::local_dir(location).map(|_| ())
    }

    fn refusal(location: &str, why: &str) -> Error {
        Error::Config(format!(
            "replica location {location:?}: {why}; accepted: file:///DIR, a directory path, or s3://BUCKET/PREFIX[?endpoint=URL&region=NAME]"
        ))
    }

    fn local_dir(location: &str) -> Result<&str> {
        let dir = location.strip_prefix("file://").unwrap_or(location);
        if dir.is_empty() || dir.contains("://") {
            return Err(Self::refusal(location, "not a directory or an s3:// location"));
        }
        Ok(dir)
    }

    fn open(location: &str, create: bool) -> Result<Self> {
        let refuse = |why: &str| {
            Error::Config(format!("replica location {location:?}: {why}; accepted: file:///DIR, a directory path, or s3://BUCKET/PREFIX[?endpoint=URL&region=NAME]"))
        };
        if let Some(rest) = location.strip_prefix("s3://") {
            let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
            let (bucket, prefix) = path.split_once('/').unwrap_or((path, ""));
            if bucket.is_empty() {
                return Err(refuse("no bucket"));
            }
            let mut builder = AmazonS3Builder::from_env().with_bucket_name(bucket);
            let mut region = None;
            for pair in query.split('&').filter(|p| !p.is_empty()) {
                match pair.split_once('=') {
                    Some(("endpoint", endpoint)) => {
                        builder = builder
                            .with_endpoint(endpoint)
                            .with_allow_http(endpoint.starts_with("http://"))
                            .with_virtual_hosted_style_request(false);
                    }
                    Some(("region", name)) => region = Some(name.to_string()),
                    _ => return Err(refuse(&format!("unknown setting {pair:?} (endpoint, region)"))),
                }
            }
            if region.is_none() && std::env::var_os("AWS_REGION").is_none() && std::env::var_os("AWS_DEFAULT_REGION").is_none() {
                region = Some("us-east-1".into());
            }
            if let Some(region) = region {
                builder = builder.with_region(region);
            }
            let store = builder.build().map_err(|e| refuse(&e.to_string()))?;
            return Ok(Self {
                store: Arc::new(store),
                prefix: prefix.trim_matches('/').to_string(),
                shown: location.to_string(),
            });
        }
        let dir = Self::local_dir(location)?;
        if create {
            std::fs::create_dir_all(dir).map_err(|e| Error::Io(format!("create {dir}: {e}")))?;
        } else if !std::path::Path::new(dir).is_dir() {
            return Err(refuse("no such directory"));
        }
        let store = LocalFileSystem::new_with_prefix(dir).map_err(|e| refuse(&e.to_string()))?;
        Ok(Self {
            store: Arc::new(store),
            prefix: String::new(),
            shown: location.to_string(),
        })
    }

    fn path(&self, key: &str) -> ObjectPath {
        if self.prefix.is_empty() {
            ObjectPath::from(key)
        } else {
            ObjectPath::from(format!("{}/{key}", self.prefix))
        }
    }

    /// Writes the object whole (a reader never sees part of it).
    pub async fn put(&self, key: &str, bytes: Vec<u8>) -> Result<()> {
        self.store
            .put(&self.path(key), PutPayload::from(Bytes::from(bytes)))
            .await
            .map(|_| ())
            .map_err(|e| self.unavailable(key, e))
    }

    pub async fn get(&self, key: &str) -> Result<Vec<u8>> {
        let found = self.store.get(&self.path(key)).await.map_err(|e| self.unavailable(key, e))?;
        Ok(found.bytes().await.map_err(|e| self.unavailable(key, e))?.to_vec())
    }

    /// The keys below `dir` (relative to the replica's root), sorted.
    pub async fn list(&self, dir: &str) -> Result<Vec<String>> {
        let base = self.path(dir);
        let strip = if self.prefix.is_empty() {
            String::new()
        } else {
            format!("{}/", self.prefix)
        };
        let mut keys: Vec<String> = self
            .store
            .list(Some(&base))
            .map_ok(|meta| {
                meta.location
                    .as_ref()
                    .strip_prefix(&strip)
                    .unwrap_or(meta.location.as_ref())
                    .to_string()
            })
            .try_collect()
            .await
            .map_err(|e| self.unavailable(dir, e))?;
        keys.sort();
        Ok(keys)
    }

    pub async fn delete(&self, key: &str) -> Result<()> {
        match self.store.delete(&self.path(key)).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(self.unavailable(key, e)),
        }
    }

    fn unavailable(&self, key: &str, error: object_store::Error) -> Error {
        Error::Target(format!("{} ({key}): {error}", self.shown))
    }
}

impl Target {
    /// Streams the file at `path` into the object `key` (multipart on S3).
    pub async fn put_file(&self, key: &str, path: &std::path::Path) -> Result<()> {
        use tokio::io::AsyncWriteExt;
        let mut file = tokio::fs::File::open(path)
            .await
            .map_err(|e| Error::Io(format!("open {}: {e}", path.display())))?;
        let mut writer = object_store::buffered::BufWriter::new(self.store.clone(), self.path(key));
        let copied = tokio::io::copy(&mut file, &mut writer).await;
        let finished = match copied {
            Ok(_) => writer.shutdown().await,
            Err(error) => {
                let _ = writer.abort().await;
                Err(error)
            }
        };
        finished.map_err(|e| Error::Target(format!("{} ({key}): {e}", self.shown)))
    }
}
