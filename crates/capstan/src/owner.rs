//! One process per SQLite database. The store is built around one writer thread, in-process
//! wake-ups and in-process leases; a second process on the same file would break all three
//! without a sound. So `serve` takes an exclusive lock on `<database>.lock` before anything is
//! written and holds it for its whole life; the kernel drops it when the process dies (a
//! `kill -9` included), so a restart never finds a stale owner. The file says who owns it.

use crate::StartupError;
use std::fs::{File, OpenOptions, TryLockError};
use std::io::{Read, Seek, Write};
use std::path::{Path, PathBuf};

/// The held lock; dropping it (or the process ending) releases the database.
pub struct Owner {
    _file: File,
}

/// The lock file beside `database`.
pub fn lock_path(database: &Path) -> PathBuf {
    let mut name = database.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".lock");
    database.with_file_name(name)
}

/// Takes the database for this process, or says which process has it.
pub fn claim(database: &Path, node: &str, now: capstan_engine::Millis) -> Result<Owner, StartupError> {
    if let Some(dir) = database.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|e| StartupError::new(format!("create {}: {e}", dir.display())))?;
    }
    let path = lock_path(database);
    let mut file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| StartupError::new(format!("open {}: {e}", path.display())))?;
    match file.try_lock() {
        Ok(()) => {}
        Err(TryLockError::WouldBlock) => {
            let mut owner = String::new();
            let _ = file.read_to_string(&mut owner);
            let owner = owner.trim();
            let owner = if owner.is_empty() { "owner unknown" } else { owner };
            return Err(StartupError::new(format!(
                "the SQLite database {} is already served by another process ({owner}); a SQLite database belongs to one \
                 process: stop that one, give this one its own --data-dir, or share a PostgreSQL database between nodes",
                database.display()
            )));
        }
        Err(TryLockError::Error(e)) => return Err(StartupError::new(format!("lock {}: {e}", path.display()))),
    }
    let record = format!(
        "pid {} node {} since {}\n",
        std::process::id(),
        node,
        capstan_engine::timefmt::iso8601(now)
    );
    let written = file
        .set_len(0)
        .and_then(|()| file.rewind())
        .and_then(|()| file.write_all(record.as_bytes()))
        .and_then(|()| file.sync_all());
    written.map_err(|e| StartupError::new(format!("write {}: {e}", path.display())))?;
    Ok(Owner { _file: file })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_claim_is_refused_naming_the_owner_and_the_first_release_frees_it() {
        let dir = tempfile::tempdir().unwrap();
        let database = dir.path().join("data").join("capstan.db");
        let first = claim(&database, "node-a", 0).unwrap_or_else(|e| panic!("{}", e.0));
        let refused = claim(&database, "node-b", 0).err().expect("a second owner is refused");
        assert!(refused.0.contains("already served by another process"), "{}", refused.0);
        assert!(refused.0.contains(&format!("pid {}", std::process::id())), "{}", refused.0);
        assert!(refused.0.contains("node node-a"), "{}", refused.0);
        drop(first);
        assert!(claim(&database, "node-b", 0).is_ok(), "released with its owner");
        assert_eq!(lock_path(&database), dir.path().join("data").join("capstan.db.lock"));
    }
}
