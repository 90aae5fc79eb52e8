//! What a continuous replica of the database file needs from the store: the file, the writer
//! parked between transactions while the replica copies the WAL's tail and checkpoints, and
//! checkpoints left to the replica alone (so the WAL never restarts under frames it has not
//! copied).

use super::writer::{Writer, WritesPaused};
use super::SqliteStore;
use crate::StoreResult;
use std::path::{Path, PathBuf};

pub struct Replication {
    path: PathBuf,
    writer: Writer,
}

impl SqliteStore {
    /// The handle a replica of this store's file works through.
    pub fn replication(&self) -> Replication {
        Replication {
            path: self.path.clone(),
            writer: self.writer.clone(),
        }
    }
}

impl Replication {
    /// The database file (its WAL is this path with `-wal` appended).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Parks the writer between transactions while the guard lives.
    pub async fn pause_writes(&self) -> WritesPaused {
        self.writer.pause().await
    }

    /// Turns off the writer's automatic checkpoints: from now on only the replica checkpoints,
    /// after it has copied every frame the checkpoint moves into the database file. (Reader
    /// connections never commit, so they never checkpoint.)
    pub async fn take_over_checkpoints(&self) -> StoreResult<()> {
        self.writer
            .configure(|conn| conn.pragma_update(None, "wal_autocheckpoint", 0))
            .await
    }
}
