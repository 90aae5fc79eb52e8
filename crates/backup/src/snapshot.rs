//! `capstan backup` and its restore: an online, consistent copy of a SQLite server's database
//! (`VACUUM INTO`: one read transaction, so the running server keeps writing) beside its
//! external payload directory, in the layout of a data directory, so `capstan verify
//! --data-dir BACKUP` checks it and a restore is a copy.
//!
//! The database is copied first, the payloads after: a payload is written before the
//! transaction that refers to it commits, and payloads are never rewritten, so every reference
//! in the copied database finds its file.

use crate::{io, Error, Result};
use capstan_engine::Millis;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

pub const DATABASE: &str = "capstan.db";
pub const PAYLOADS: &str = "external-payloads";
pub const MANIFEST: &str = "backup.json";
/// In a payload directory: the directories it was restored from, one per line. History names
/// each payload by the location it was written at, so the server also answers for these.
pub const FORMER_ROOTS: &str = ".former-roots";

#[derive(Debug, Serialize, Deserialize)]
pub struct BackupManifest {
    pub format: u32,
    pub created_at_ms: Millis,
    /// The database file backed up.
    pub source: String,
    pub database_bytes: u64,
    pub payload_files: u64,
    pub payload_bytes: u64,
    /// The payload directory backed up (absolute), when there was one.
    #[serde(default)]
    pub payloads_source: Option<String>,
}

/// Backs up the database at `database` (a running server's, or one at rest) and the payload
/// directory `payloads` into `to`, which must not exist or be empty.
pub fn backup(database: &Path, payloads: &Path, to: &Path, now: Millis) -> Result<BackupManifest> {
    if !database.exists() {
        return Err(Error::Config(format!("no database at {}", database.display())));
    }
    if to.exists() && std::fs::read_dir(to).map_err(io(to))?.next().is_some() {
        return Err(Error::Config(format!(
            "{} is not empty; back up into a new directory",
            to.display()
        )));
    }
    std::fs::create_dir_all(to).map_err(io(to))?;
    let copy = to.join(DATABASE);
    let conn = rusqlite::Connection::open(database).map_err(|e| Error::Database(format!("open {}: {e}", database.display())))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| Error::Database(e.to_string()))?;
    let into = copy
        .to_str()
        .ok_or_else(|| Error::Config(format!("{} is not UTF-8", copy.display())))?;
    conn.execute("VACUUM INTO ?1", [into])
        .map_err(|e| Error::Database(format!("copy {}: {e}", database.display())))?;
    drop(conn);
    crate::restore::check_integrity(&copy)?;
    let (payload_files, payload_bytes) = if payloads.exists() {
        copy_tree(payloads, &to.join(PAYLOADS))?
    } else {
        (0, 0)
    };
    let payloads_source = payloads.canonicalize().ok().map(|p| p.display().to_string());
    let manifest = BackupManifest {
        format: 1,
        created_at_ms: now,
        source: database.display().to_string(),
        database_bytes: std::fs::metadata(&copy).map_err(io(&copy))?.len(),
        payload_files,
        payload_bytes,
        payloads_source,
    };
    let written = serde_json::to_vec_pretty(&manifest).expect("manifest");
    std::fs::write(to.join(MANIFEST), written).map_err(io(to))?;
    sync_dir(to)?;
    Ok(manifest)
}

/// Restores the backup at `from` into the database file `database` and the payload directory
/// `payloads`; neither may exist yet.
pub fn restore(from: &Path, database: &Path, payloads: &Path) -> Result<BackupManifest> {
    let manifest: BackupManifest = serde_json::from_slice(&std::fs::read(from.join(MANIFEST)).map_err(io(from))?)
        .map_err(|e| Error::Corrupt(format!("{}: {e}", from.join(MANIFEST).display())))?;
    if database.exists() {
        return Err(Error::Config(format!(
            "{} already exists; restore into a new data directory",
            database.display()
        )));
    }
    if payloads.exists() && std::fs::read_dir(payloads).map_err(io(payloads))?.next().is_some() {
        return Err(Error::Config(format!(
            "{} is not empty; restore into a new data directory",
            payloads.display()
        )));
    }
    if let Some(dir) = database.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(io(dir))?;
    }
    let source = from.join(DATABASE);
    crate::restore::check_integrity(&source)?;
    std::fs::copy(&source, database).map_err(io(database))?;
    std::fs::File::open(database).and_then(|f| f.sync_all()).map_err(io(database))?;
    if from.join(PAYLOADS).exists() {
        copy_tree(&from.join(PAYLOADS), payloads)?;
        if let Some(source) = &manifest.payloads_source {
            let record = payloads.join(FORMER_ROOTS);
            let mut roots = std::fs::read_to_string(&record).unwrap_or_default();
            roots.push_str(source);
            roots.push('\n');
            std::fs::write(&record, roots).map_err(io(&record))?;
        }
    }
    Ok(manifest)
}

/// The directories the payload directory `root` was restored from (see [`FORMER_ROOTS`]).
pub fn former_roots(root: &Path) -> Vec<PathBuf> {
    std::fs::read_to_string(root.join(FORMER_ROOTS))
        .map(|text| text.lines().filter(|l| !l.trim().is_empty()).map(PathBuf::from).collect())
        .unwrap_or_default()
}

/// Copies a directory tree, each file synced; how many files and bytes.
fn copy_tree(from: &Path, to: &Path) -> Result<(u64, u64)> {
    let (mut files, mut bytes) = (0, 0);
    let mut stack: Vec<(PathBuf, PathBuf)> = vec![(from.to_path_buf(), to.to_path_buf())];
    while let Some((source, target)) = stack.pop() {
        std::fs::create_dir_all(&target).map_err(io(&target))?;
        for entry in std::fs::read_dir(&source).map_err(io(&source))? {
            let entry = entry.map_err(io(&source))?;
            let kind = entry.file_type().map_err(io(&entry.path()))?;
            let destination = target.join(entry.file_name());
            if kind.is_dir() {
                stack.push((entry.path(), destination));
            } else if kind.is_file() {
                bytes += std::fs::copy(entry.path(), &destination).map_err(io(&destination))?;
                std::fs::File::open(&destination)
                    .and_then(|f| f.sync_all())
                    .map_err(io(&destination))?;
                files += 1;
            }
        }
        sync_dir(&target)?;
    }
    Ok((files, bytes))
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(io(dir))
}
