//! The seam between the store's one transaction logic (`logic/`) and the two databases.
//!
//! Shared code writes each statement once, with PostgreSQL's `$n` placeholders, binds
//! [`Param`]s and reads owned [`Row`]s. A backend implements [`Tx`] on its open transaction:
//! SQLite on the writer thread (its futures are ready at once, so the writer drives the shared
//! logic with a trivial executor), PostgreSQL natively. Where the dialects differ the shared
//! code asks [`Tx::dialect`], and only there.

use crate::logic::run_counts::{CountKey, Recounts};
use crate::parked_polls::Delivery;
use crate::{Fact, StoreError, StoreResult, WakeKey};
use std::future::Future;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Dialect {
    Sqlite,
    Postgres,
    /// MySQL and MariaDB: the shared statements translated (`mysql/dialect.rs`).
    Mysql,
}

/// A statement's text where the dialects differ only in a row-lock clause: SQLite has one
/// writer and no row locks, PostgreSQL and MySQL append `FOR UPDATE …` (MySQL's translation
/// drops an `OF table` list MariaDB does not take). Built by [`locking!`].
#[derive(Clone, Copy, Debug)]
pub(crate) struct Locking {
    pub sqlite: &'static str,
    pub postgres: &'static str,
}

impl Locking {
    /// The statement without its lock clause: a plain read on either dialect.
    pub fn unlocked(&self) -> &'static str {
        self.sqlite
    }

    pub fn sql(&self, dialect: Dialect) -> &'static str {
        match dialect {
            Dialect::Sqlite => self.sqlite,
            Dialect::Postgres | Dialect::Mysql => self.postgres,
        }
    }
}

/// `locking!("SELECT … FROM runs WHERE …", "FOR UPDATE")`: the statement once, the lock clause
/// for PostgreSQL only.
macro_rules! locking {
    ($sql:literal, $lock:literal) => {
        $crate::tx::Locking {
            sqlite: $sql,
            postgres: concat!($sql, " ", $lock),
        }
    };
}
pub(crate) use locking;

/// A value bound to a statement parameter.
#[derive(Clone, Debug)]
pub enum Param<'a> {
    Int(Option<i64>),
    Real(Option<f64>),
    Text(Option<&'a str>),
}

impl From<i64> for Param<'_> {
    fn from(value: i64) -> Self {
        Param::Int(Some(value))
    }
}
impl From<Option<i64>> for Param<'_> {
    fn from(value: Option<i64>) -> Self {
        Param::Int(value)
    }
}
impl From<u32> for Param<'_> {
    fn from(value: u32) -> Self {
        Param::Int(Some(i64::from(value)))
    }
}
impl From<Option<f64>> for Param<'_> {
    fn from(value: Option<f64>) -> Self {
        Param::Real(value)
    }
}
impl<'a> From<&'a str> for Param<'a> {
    fn from(value: &'a str) -> Self {
        Param::Text(Some(value))
    }
}
impl<'a> From<&'a String> for Param<'a> {
    fn from(value: &'a String) -> Self {
        Param::Text(Some(value.as_str()))
    }
}
impl<'a> From<Option<&'a str>> for Param<'a> {
    fn from(value: Option<&'a str>) -> Self {
        Param::Text(value)
    }
}
impl<'a> From<&'a Option<String>> for Param<'a> {
    fn from(value: &'a Option<String>) -> Self {
        Param::Text(value.as_deref())
    }
}

/// `args![a, b, c]`: a statement's parameters, each converted with `Param::from`.
macro_rules! args {
    ($($value:expr),* $(,)?) => {
        [$($crate::tx::Param::from($value)),*]
    };
}
pub(crate) use args;

/// One column value of a result row.
#[derive(Clone, Debug, PartialEq)]
pub enum Cell {
    Null,
    Int(i64),
    Real(f64),
    Text(String),
}

/// A result row, owned, so shared code never sees a driver type.
#[derive(Clone, Debug, PartialEq)]
pub struct Row(pub Vec<Cell>);

impl Row {
    fn cell(&self, index: usize) -> StoreResult<&Cell> {
        self.0
            .get(index)
            .ok_or_else(|| StoreError::Storage(format!("result column {index} is missing")))
    }

    pub fn opt_str(&self, index: usize) -> StoreResult<Option<&str>> {
        match self.cell(index)? {
            Cell::Null => Ok(None),
            Cell::Text(text) => Ok(Some(text)),
            other => Err(StoreError::Storage(format!(
                "result column {index}: expected text, found {other:?}"
            ))),
        }
    }

    pub fn str(&self, index: usize) -> StoreResult<&str> {
        self.opt_str(index)?
            .ok_or_else(|| StoreError::Storage(format!("result column {index}: unexpected NULL")))
    }

    pub fn text(&self, index: usize) -> StoreResult<String> {
        self.str(index).map(str::to_string)
    }

    /// Moves a text column out of the row (no copy); the cell is left NULL.
    pub fn take_text(&mut self, index: usize) -> StoreResult<String> {
        match self.0.get_mut(index) {
            Some(Cell::Text(text)) => Ok(std::mem::take(text)),
            Some(other) => Err(StoreError::Storage(format!(
                "result column {index}: expected text, found {other:?}"
            ))),
            None => Err(StoreError::Storage(format!("result column {index} is missing"))),
        }
    }

    /// [`take_text`](Self::take_text) for a column that may be NULL.
    pub fn take_opt_text(&mut self, index: usize) -> StoreResult<Option<String>> {
        match self.0.get(index) {
            Some(Cell::Null) => Ok(None),
            _ => self.take_text(index).map(Some),
        }
    }

    pub fn opt_int(&self, index: usize) -> StoreResult<Option<i64>> {
        match self.cell(index)? {
            Cell::Null => Ok(None),
            Cell::Int(value) => Ok(Some(*value)),
            other => Err(StoreError::Storage(format!(
                "result column {index}: expected an integer, found {other:?}"
            ))),
        }
    }

    pub fn int(&self, index: usize) -> StoreResult<i64> {
        self.opt_int(index)?
            .ok_or_else(|| StoreError::Storage(format!("result column {index}: unexpected NULL")))
    }
}

/// A statement of a batch: its text and parameters.
pub struct Statement<'a> {
    pub sql: &'a str,
    pub args: Vec<Param<'a>>,
}

/// An open transaction on one backend. Everything it runs commits or rolls back together; the
/// caller that opened it decides which.
pub trait Tx: Send {
    fn dialect(&self) -> Dialect;

    /// Runs one statement; the number of rows it changed.
    fn execute<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> impl Future<Output = StoreResult<u64>> + Send + 'a;

    /// Runs one query; every row.
    fn query<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> impl Future<Output = StoreResult<Vec<Row>>> + Send + 'a;

    /// Runs one query; its first row, if any.
    fn query_opt<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> impl Future<Output = StoreResult<Option<Row>>> + Send + 'a;

    /// Runs statements that do not depend on each other (PostgreSQL pipelines them: one round
    /// trip instead of one per statement).
    fn execute_all<'a>(&'a mut self, statements: &'a [Statement<'a>]) -> impl Future<Output = StoreResult<()>> + Send + 'a;

    /// Announces a task made ready on `(namespace, kind, queue)`; delivered to pollers only if
    /// this transaction commits.
    fn announce(&mut self, key: WakeKey) -> impl Future<Output = StoreResult<()>> + Send + '_;

    /// Records a fact for the store's observer; handed on only if this transaction commits.
    fn observe(&mut self, fact: Fact);

    /// A lease for a parked poll: answered only if this transaction commits, dropped (the poll
    /// looks again) if it does not.
    fn hand_off(&mut self, delivery: Delivery);

    /// Adds `delta` to a kept run count (`logic::run_counts`); the changes are summed and
    /// applied just before the transaction commits.
    fn recount(&mut self, key: CountKey, delta: i64);

    /// The kept counts' changes not yet applied, taken: the caller applies them.
    fn take_recounts(&mut self) -> Recounts;
}

/// `$n` placeholders as SQLite's `?n` (a bare `$n` is a *named* parameter there, numbered by
/// first appearance, which would bind out of order). Quoted text is left alone.
pub(crate) fn sqlite_placeholders(sql: &str) -> std::borrow::Cow<'_, str> {
    // Every statement passes here: bytes, not chars (`$`, `'` and digits are ASCII, so the
    // cuts fall on character boundaries), and copied in runs.
    let bytes = sql.as_bytes();
    if !bytes.contains(&b'$') {
        return std::borrow::Cow::Borrowed(sql);
    }
    let mut out = String::with_capacity(sql.len());
    let (mut quoted, mut copied) = (false, 0);
    for (at, byte) in bytes.iter().enumerate() {
        match byte {
            b'\'' => quoted = !quoted,
            b'$' if !quoted && bytes.get(at + 1).is_some_and(u8::is_ascii_digit) => {
                out.push_str(&sql[copied..at]);
                out.push('?');
                copied = at + 1;
            }
            _ => {}
        }
    }
    out.push_str(&sql[copied..]);
    std::borrow::Cow::Owned(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placeholders_become_numbered_for_sqlite() {
        assert_eq!(
            sqlite_placeholders("UPDATE t SET a = $2, b = '$1' WHERE id = $1 AND c = $10"),
            "UPDATE t SET a = ?2, b = '$1' WHERE id = ?1 AND c = ?10"
        );
    }

    #[test]
    fn a_lock_clause_is_postgres_only() {
        const L: Locking = locking!("SELECT state FROM runs WHERE run_id = $1", "FOR UPDATE");
        assert_eq!(L.sql(Dialect::Sqlite), "SELECT state FROM runs WHERE run_id = $1");
        assert_eq!(L.sql(Dialect::Postgres), "SELECT state FROM runs WHERE run_id = $1 FOR UPDATE");
    }

    #[test]
    fn rows_name_what_is_wrong() {
        let row = Row(vec![Cell::Text("a".into()), Cell::Null, Cell::Int(3)]);
        assert_eq!(row.str(0).unwrap(), "a");
        assert_eq!(row.opt_str(1).unwrap(), None);
        assert_eq!(row.int(2).unwrap(), 3);
        assert!(row.int(0).is_err());
        assert!(row.str(1).is_err());
        assert!(row.str(7).is_err());
    }
}
