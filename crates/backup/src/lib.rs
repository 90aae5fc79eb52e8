//! Backups of an embedded (SQLite) Capstan: `capstan backup` (an online snapshot, [`snapshot`])
//! and the continuous replica of `capstan serve --replicate-to` ([`replicate`]: the WAL
//! shipped as it commits to a directory or S3-compatible storage, [`restore`]d to any retained
//! point in time). See docs/backup.md. PostgreSQL and MariaDB are backed up with their own
//! tools.

pub mod layout;
pub mod replicate;
pub mod restore;
pub mod snapshot;
pub mod target;
pub mod wal;

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(String),
    #[error("{0}")]
    Io(String),
    #[error("{0}")]
    Database(String),
    #[error("replica target: {0}")]
    Target(String),
    #[error("the replica lost the WAL's chain: {0}")]
    Chain(String),
    #[error("damaged: {0}")]
    Corrupt(String),
}

pub type Result<T> = std::result::Result<T, Error>;

/// An IO error, said with the path it happened on.
pub(crate) fn io(path: &std::path::Path) -> impl Fn(std::io::Error) -> Error + '_ {
    move |e| Error::Io(format!("{}: {e}", path.display()))
}
