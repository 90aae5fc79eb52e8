//! Where payloads that live outside workflow history keep their bytes: a directory on the
//! server's filesystem, or a bucket of an S3-compatible object store (`object_store` does the
//! talking). A stored object is named by a location URI (`file:///…`, `s3://bucket/key`) that the
//! store records; reading or deleting a location outside the configured root or bucket is refused,
//! so a changed policy never reads another store's objects by accident.
//!
//! Integrity (size, SHA-256) is the caller's: this crate moves bytes and reports I/O plainly.

pub use bytes::Bytes;
use object_store::aws::AmazonS3Builder;
use object_store::local::LocalFileSystem;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, PutPayload};
use serde_json::{Map, Value};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The drivers a namespace policy may name. `gcs` and `azure` policies are recorded (a DW
/// operator may have them) but have no driver in this build.
pub const KNOWN_DRIVERS: [&str; 4] = ["local", "s3", "gcs", "azure"];
/// The `config` keys a policy may carry, each a string.
pub const CONFIG_KEYS: [&str; 6] = ["uri", "bucket", "disk", "prefix", "region", "endpoint"];

#[derive(Debug, thiserror::Error)]
pub enum BlobError {
    /// The policy names a driver or setting this build cannot serve.
    #[error("{0}")]
    Unsupported(String),
    /// The location is not one of this store's objects.
    #[error("{0}")]
    Foreign(String),
    /// The object store could not be reached or refused the operation.
    #[error("{0}")]
    Unavailable(String),
}

pub type BlobResult<T> = Result<T, BlobError>;

/// One configured object store.
#[derive(Clone, Debug)]
pub struct BlobStore {
    store: Arc<dyn ObjectStore>,
    /// `file:///root` or `s3://bucket`: every location of this store starts with it and `/`.
    base: String,
    /// Object key prefix (no leading or trailing `/`), possibly empty.
    prefix: String,
    driver: &'static str,
    /// Where this store's root was before it was restored elsewhere (`file:///old/root`):
    /// locations recorded then still name its objects (see [`BlobStore::also_holding`]).
    former_bases: Vec<String>,
}

impl BlobStore {
    /// The store a namespace policy describes. `local` without `config.uri` uses `default_root`.
    pub fn from_policy(driver: &str, config: &Map<String, Value>, default_root: &Path) -> BlobResult<Self> {
        let setting = |key: &str| config.get(key).and_then(Value::as_str).filter(|s| !s.is_empty());
        let prefix = clean_prefix(setting("prefix").unwrap_or(""))?;
        match driver {
            "local" => {
                let root = match setting("uri") {
                    Some(uri) => local_root(uri)?,
                    None => default_root.to_path_buf(),
                };
                Self::local(&root, prefix)
            }
            "s3" => {
                let bucket = setting("bucket").ok_or_else(|| BlobError::Unsupported("An s3 policy needs config.bucket.".into()))?;
                Self::s3(bucket, prefix, setting("region"), setting("endpoint"))
            }
            other => Err(BlobError::Unsupported(format!(
                "The {other:?} storage driver is not available in this server (it serves local and s3)."
            ))),
        }
    }

    pub fn local(root: &Path, prefix: String) -> BlobResult<Self> {
        std::fs::create_dir_all(root).map_err(|e| BlobError::Unavailable(format!("cannot create {}: {e}", root.display())))?;
        let root = root
            .canonicalize()
            .map_err(|e| BlobError::Unavailable(format!("cannot resolve {}: {e}", root.display())))?;
        let store = LocalFileSystem::new_with_prefix(&root).map_err(unavailable)?;
        Ok(Self {
            store: Arc::new(store),
            base: format!("file://{}", root.display()),
            prefix,
            driver: "local",
            former_bases: Vec::new(),
        })
    }

    /// This local store, also answering for locations recorded under `former_roots`: the
    /// directories its objects lived in before a backup was restored into its root (history
    /// keeps each location as it was written).
    pub fn also_holding(mut self, former_roots: impl IntoIterator<Item = PathBuf>) -> Self {
        if self.driver == "local" {
            self.former_bases
                .extend(former_roots.into_iter().map(|root| format!("file://{}", root.display())));
        }
        self
    }

    /// Credentials come from the usual `AWS_*` environment variables.
    pub fn s3(bucket: &str, prefix: String, region: Option<&str>, endpoint: Option<&str>) -> BlobResult<Self> {
        let mut builder = AmazonS3Builder::from_env()
            .with_bucket_name(bucket)
            .with_region(region.unwrap_or("us-east-1"));
        if let Some(endpoint) = endpoint {
            builder = builder
                .with_endpoint(endpoint)
                .with_allow_http(endpoint.starts_with("http://"))
                .with_virtual_hosted_style_request(false);
        }
        let store = builder
            .build()
            .map_err(|e| BlobError::Unsupported(format!("The s3 policy is not usable: {e}")))?;
        Ok(Self {
            store: Arc::new(store),
            base: format!("s3://{bucket}"),
            prefix,
            driver: "s3",
            former_bases: Vec::new(),
        })
    }

    pub fn driver(&self) -> &'static str {
        self.driver
    }

    /// Stores `bytes` under `key` (below the prefix); the location to read them back by.
    pub async fn put(&self, key: &str, bytes: Bytes) -> BlobResult<String> {
        let path = self.object_path(key)?;
        self.store.put(&path, PutPayload::from_bytes(bytes)).await.map_err(unavailable)?;
        Ok(format!("{}/{}", self.base, path))
    }

    /// The bytes at a location of this store; `None` when the object is gone.
    pub async fn get(&self, location: &str) -> BlobResult<Option<Bytes>> {
        let path = self.path_of(location)?;
        match self.store.get(&path).await {
            Ok(result) => Ok(Some(result.bytes().await.map_err(unavailable)?)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Deletes the object at a location of this store (already gone is fine).
    pub async fn delete(&self, location: &str) -> BlobResult<()> {
        let path = self.path_of(location)?;
        match self.store.delete(&path).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
            Err(e) => Err(unavailable(e)),
        }
    }

    /// Whether a location names an object of this store.
    pub fn holds(&self, location: &str) -> bool {
        self.path_of(location).is_ok()
    }

    fn object_path(&self, key: &str) -> BlobResult<ObjectPath> {
        let full = if self.prefix.is_empty() {
            key.to_string()
        } else {
            format!("{}/{key}", self.prefix)
        };
        ObjectPath::parse(&full).map_err(|e| BlobError::Foreign(format!("invalid object key {full:?}: {e}")))
    }

    fn path_of(&self, location: &str) -> BlobResult<ObjectPath> {
        let foreign = || BlobError::Foreign(format!("{location} is not an object of the configured {} store", self.driver));
        let key = std::iter::once(&self.base)
            .chain(&self.former_bases)
            .find_map(|base| location.strip_prefix(base.as_str()).and_then(|rest| rest.strip_prefix('/')))
            .ok_or_else(foreign)?;
        let path = ObjectPath::parse(key).map_err(|_| foreign())?;
        if !self.prefix.is_empty() && !key.starts_with(&format!("{}/", self.prefix)) {
            return Err(foreign());
        }
        Ok(path)
    }
}

fn unavailable(error: object_store::Error) -> BlobError {
    BlobError::Unavailable(error.to_string())
}

fn local_root(uri: &str) -> BlobResult<PathBuf> {
    let path = uri.strip_prefix("file://").unwrap_or(uri);
    if path.is_empty() || !path.starts_with('/') {
        return Err(BlobError::Unsupported(
            "A local policy's config.uri must be an absolute path or a file:// URI.".into(),
        ));
    }
    Ok(PathBuf::from(path))
}

fn clean_prefix(prefix: &str) -> BlobResult<String> {
    let trimmed = prefix.trim_matches('/');
    if trimmed.split('/').any(|part| part == "." || part == "..") || trimmed.contains("//") {
        return Err(BlobError::Unsupported(format!("The prefix {prefix:?} has an unsafe path segment.")));
    }
    Ok(trimmed.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn local_objects_round_trip_and_other_locations_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let config = serde_json::json!({"prefix": "/runtime/"}).as_object().unwrap().clone();
        let store = BlobStore::from_policy("local", &config, dir.path()).unwrap();
        let location = store.put("default/ep_1", Bytes::from_static(b"bytes")).await.unwrap();
        assert!(
            location.starts_with("file:///") && location.ends_with("/runtime/default/ep_1"),
            "{location}"
        );
        assert_eq!(store.get(&location).await.unwrap().unwrap(), Bytes::from_static(b"bytes"));
        assert!(store.holds(&location));
        store.delete(&location).await.unwrap();
        assert_eq!(store.get(&location).await.unwrap(), None);
        store.delete(&location).await.unwrap();
        for foreign in [
            "file:///etc/passwd",
            "s3://bucket/runtime/x",
            &location.replace("/runtime/", "/other/"),
        ] {
            assert!(matches!(store.get(foreign).await, Err(BlobError::Foreign(_))), "{foreign}");
        }
    }

    #[tokio::test]
    async fn a_restored_store_answers_for_locations_written_under_its_former_root() {
        let (old, new) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
        let config = Map::new();
        let before = BlobStore::from_policy("local", &config, old.path()).unwrap();
        let location = before.put("default/ep_1", Bytes::from_static(b"kept")).await.unwrap();
        // The directory copied elsewhere, as a restore does.
        std::fs::create_dir_all(new.path().join("default")).unwrap();
        std::fs::copy(old.path().join("default/ep_1"), new.path().join("default/ep_1")).unwrap();
        let restored = BlobStore::from_policy("local", &config, new.path()).unwrap();
        assert!(matches!(restored.get(&location).await, Err(BlobError::Foreign(_))));
        let restored = restored.also_holding([old.path().canonicalize().unwrap()]);
        drop(old);
        assert_eq!(restored.get(&location).await.unwrap().unwrap(), Bytes::from_static(b"kept"));
        assert!(matches!(
            restored.get("file:///elsewhere/default/ep_1").await,
            Err(BlobError::Foreign(_))
        ));
    }

    #[test]
    fn policies_without_a_driver_here_or_with_unsafe_settings_are_refused() {
        let none = Map::new();
        let root = Path::new("/tmp");
        assert!(matches!(BlobStore::from_policy("gcs", &none, root), Err(BlobError::Unsupported(_))));
        assert!(matches!(BlobStore::from_policy("s3", &none, root), Err(BlobError::Unsupported(_))));
        let unsafe_prefix = serde_json::json!({"prefix": "a/../b"}).as_object().unwrap().clone();
        assert!(matches!(
            BlobStore::from_policy("local", &unsafe_prefix, root),
            Err(BlobError::Unsupported(_))
        ));
        let relative = serde_json::json!({"uri": "relative/dir"}).as_object().unwrap().clone();
        assert!(matches!(
            BlobStore::from_policy("local", &relative, root),
            Err(BlobError::Unsupported(_))
        ));
    }
}
