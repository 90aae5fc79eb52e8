//! [`Tx`] on the SQLite writer's connection, inside the writer's open transaction. Every call
//! completes before it returns, so the futures it hands out are ready at once and the writer
//! drives the shared logic with [`drive`].

use crate::logic::run_counts::{self, CountKey, Recounts};
use crate::parked_polls::Delivery;
use crate::tx::{sqlite_placeholders, Cell, Dialect, Param, Row, Statement, Tx};
use crate::{Fact, StoreResult, WakeKey};
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::Connection;
use std::future::{ready, Future};

/// What a write job hands on once its batch has committed.
#[derive(Debug, PartialEq)]
pub enum Notice {
    /// A task made ready: wake the queue's pollers.
    Wake(WakeKey),
    /// A fact for the observer.
    Fact(Fact),
    /// A lease for a parked poll: answer it.
    HandOff(Box<Delivery>),
    /// A kept run count's change, applied before the job ends (`logic::run_counts::flush`).
    Recount(CountKey, i64),
}

pub struct SqliteTx<'c> {
    conn: &'c mut Connection,
    /// Where the writer collects a job's notices; `None` on a reader connection.
    announced: Option<&'c mut Vec<Notice>>,
}

impl<'c> SqliteTx<'c> {
    pub(crate) fn new(conn: &'c mut Connection, announced: &'c mut Vec<Notice>) -> Self {
        Self {
            conn,
            announced: Some(announced),
        }
    }

    /// A pooled reader connection: reads only (WAL readers never block the writer).
    pub(crate) fn reader(conn: &'c mut Connection) -> Self {
        Self { conn, announced: None }
    }

    /// The connection, for statements still written against rusqlite directly.
    pub(crate) fn connection(&self) -> &Connection {
        self.conn
    }

    fn run_execute(&self, sql: &str, args: &[Param<'_>]) -> StoreResult<u64> {
        let mut statement = self.conn.prepare_cached(&sqlite_placeholders(sql))?;
        Ok(statement.execute(rusqlite::params_from_iter(args.iter()))? as u64)
    }

    fn run_query(&self, sql: &str, args: &[Param<'_>], limit: usize) -> StoreResult<Vec<Row>> {
        let mut statement = self.conn.prepare_cached(&sqlite_placeholders(sql))?;
        let columns = statement.column_count();
        let mut rows = statement.query(rusqlite::params_from_iter(args.iter()))?;
        let mut out = Vec::new();
        while out.len() < limit {
            let Some(row) = rows.next()? else { break };
            let cells = (0..columns)
                .map(|index| {
                    Ok(match row.get_ref(index)? {
                        ValueRef::Null => Cell::Null,
                        ValueRef::Integer(value) => Cell::Int(value),
                        ValueRef::Real(value) => Cell::Real(value),
                        ValueRef::Text(bytes) | ValueRef::Blob(bytes) => Cell::Text(text_of(bytes)),
                    })
                })
                .collect::<rusqlite::Result<Vec<_>>>()?;
            out.push(Row(cells));
        }
        Ok(out)
    }
}

/// A text cell. Capstan writes only UTF-8, so the strict check (much faster than the lossy
/// one) nearly always succeeds; bytes another writer left behind are still read, lossily.
fn text_of(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(text) => text.to_owned(),
        Err(_) => String::from_utf8_lossy(bytes).into_owned(),
    }
}

impl Tx for SqliteTx<'_> {
    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    fn execute<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> impl Future<Output = StoreResult<u64>> + Send + 'a {
        ready(self.run_execute(sql, args))
    }

    fn query<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> impl Future<Output = StoreResult<Vec<Row>>> + Send + 'a {
        ready(self.run_query(sql, args, usize::MAX))
    }

    fn query_opt<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> impl Future<Output = StoreResult<Option<Row>>> + Send + 'a {
        ready(self.run_query(sql, args, 1).map(|rows| rows.into_iter().next()))
    }

    fn execute_all<'a>(&'a mut self, statements: &'a [Statement<'a>]) -> impl Future<Output = StoreResult<()>> + Send + 'a {
        ready(statements.iter().try_for_each(|s| self.run_execute(s.sql, &s.args).map(drop)))
    }

    fn announce(&mut self, key: WakeKey) -> impl Future<Output = StoreResult<()>> + Send + '_ {
        ready(match self.announced.as_mut() {
            Some(announced) => {
                announced.push(Notice::Wake(key));
                Ok(())
            }
            None => Err(crate::StoreError::Storage("a reader connection cannot announce a task".into())),
        })
    }

    fn observe(&mut self, fact: Fact) {
        // A reader writes nothing, so it has nothing to report.
        if let Some(announced) = self.announced.as_mut() {
            announced.push(Notice::Fact(fact));
        }
    }

    fn hand_off(&mut self, delivery: Delivery) {
        // Only the writer's transactions make tasks ready.
        if let Some(announced) = self.announced.as_mut() {
            announced.push(Notice::HandOff(Box::new(delivery)));
        }
    }

    fn recount(&mut self, key: CountKey, delta: i64) {
        // A reader changes no run.
        if let Some(announced) = self.announced.as_mut() {
            announced.push(Notice::Recount(key, delta));
        }
    }

    fn take_recounts(&mut self) -> Recounts {
        let mut recounts = Recounts::new();
        if let Some(announced) = self.announced.as_mut() {
            announced.retain(|notice| match notice {
                Notice::Recount(key, delta) => {
                    run_counts::add(&mut recounts, key.clone(), *delta);
                    false
                }
                _ => true,
            });
        }
        recounts
    }
}

impl rusqlite::ToSql for Param<'_> {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        Ok(match self {
            Param::Int(Some(value)) => ToSqlOutput::Borrowed(ValueRef::Integer(*value)),
            Param::Real(Some(value)) => ToSqlOutput::Borrowed(ValueRef::Real(*value)),
            Param::Text(Some(text)) => ToSqlOutput::Borrowed(ValueRef::Text(text.as_bytes())),
            Param::Int(None) | Param::Real(None) | Param::Text(None) => ToSqlOutput::Borrowed(ValueRef::Null),
        })
    }
}

/// Runs shared transaction logic to completion on the writer thread. Every [`SqliteTx`] future
/// is ready when created, so this never waits; a future that did would be a bug, and is refused
/// rather than spun on.
pub(crate) fn drive<T>(logic: impl Future<Output = StoreResult<T>>) -> StoreResult<T> {
    let mut logic = std::pin::pin!(logic);
    let mut context = std::task::Context::from_waker(std::task::Waker::noop());
    match logic.as_mut().poll(&mut context) {
        std::task::Poll::Ready(result) => result,
        std::task::Poll::Pending => Err(crate::StoreError::Storage(
            "a SQLite transaction step did not complete synchronously".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_that_is_not_ready_is_an_error_not_a_wait() {
        assert_eq!(drive(async { Ok::<_, crate::StoreError>(3) }).unwrap(), 3);
        let pending = drive(std::future::pending::<StoreResult<()>>());
        assert!(
            matches!(pending, Err(crate::StoreError::Storage(ref m)) if m.contains("synchronously")),
            "{pending:?}"
        );
    }
}
