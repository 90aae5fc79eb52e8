//! Which binaries may run against a database: the schema floor.
//!
//! Migrations only add (tables, columns with defaults, indexes), so a binary that knows fewer
//! migrations than a database holds can still run against it — what a rolling upgrade of a
//! cluster needs. A change older binaries cannot run against (a migration that removes or
//! reinterprets, a run document they cannot read) raises [`schema_floor`] to the lowest schema
//! version a binary must know; every binary stores the highest floor it has seen on opening,
//! and refuses a database whose floor is above the migrations it knows, with a message that
//! says what to do, instead of misreading it.

use crate::tx::Dialect;
use crate::{StoreError, StoreResult};

/// The lowest migration version a binary must know to run against what this binary writes,
/// per backend (their migrations are numbered apart). Raised by the kept run counts
/// (`run_counts`: an older binary would change runs without counting them), then by paused
/// runs (an older binary would dispatch a paused run's tasks), then by `runs.is_current` (an
/// older binary would continue a run as new and leave its predecessor listed).
pub fn schema_floor(dialect: Dialect) -> i64 {
    match dialect {
        Dialect::Sqlite | Dialect::Postgres => 37,
        Dialect::Mysql => 36,
    }
}

/// The table that holds a database's floor (one row). Created outside the numbered migrations,
/// so that every binary from this one on can read it before it migrates.
pub(crate) const CREATE_FLOOR_TABLE: &str =
    "CREATE TABLE IF NOT EXISTS schema_floor (id INTEGER PRIMARY KEY CHECK (id = 1), floor BIGINT NOT NULL)";
pub(crate) const READ_FLOOR: &str = "SELECT floor FROM schema_floor WHERE id = 1";

/// Whether a binary that knows migrations up to `known` may open a database whose highest
/// applied migration is `database` and whose floor is `floor`.
pub(crate) fn admit(known: i64, database: Option<i64>, floor: Option<i64>) -> StoreResult<()> {
    let floor = floor.unwrap_or(0);
    if floor > known {
        return Err(StoreError::Incompatible(format!(
            "the database was written by a newer Capstan (schema version {}, which binaries knowing \
             fewer than {floor} migrations cannot run against); this binary knows {known}. Run the \
             newer binary, or restore the backup taken before the upgrade.",
            database.unwrap_or(floor)
        )));
    }
    if let Some(database) = database.filter(|version| *version > known) {
        tracing::warn!(
            database,
            binary = known,
            floor,
            "the database has migrations this binary does not know; they are additive (the floor is within what it knows), so it runs against them"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_floor_above_what_a_binary_knows_refuses_it() {
        assert!(admit(23, Some(23), Some(1)).is_ok());
        assert!(admit(23, None, None).is_ok(), "a new database");
        assert!(admit(23, Some(25), Some(20)).is_ok(), "newer, additive: a rolling upgrade");
        let refused = admit(23, Some(25), Some(24)).unwrap_err().to_string();
        assert!(refused.contains("written by a newer Capstan (schema version 25"), "{refused}");
        assert!(refused.contains("this binary knows 23"), "{refused}");
    }
}
