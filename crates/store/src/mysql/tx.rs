//! [`Tx`] on a pooled MySQL or MariaDB connection, inside a transaction or not. Each shared
//! statement is translated once ([`dialect::translate`], cached) and prepared once per
//! connection (the driver's statement cache). MySQL has no `NOTIFY`: a ready task is announced
//! to this node's pollers when its transaction commits, and written to the wake-up log in the
//! transaction for the other nodes.

use super::dialect::{self, Translated};
use crate::logic::run_counts::{self, CountKey, Recounts};
use crate::parked_polls::Delivery;
use crate::shared::Committed;
use crate::tx::{Cell, Dialect, Param, Row, Statement, Tx};
use crate::{Fact, StoreError, StoreResult, WakeKey};
use mysql_async::consts::ColumnType;
use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Params, Value};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, OnceLock};

/// MySQL's "duplicate entry" error.
pub(super) const DUPLICATE_KEY: u16 = 1062;

/// A pooled connection the shared logic runs on; like `PgTx`, it owns the connection, and a
/// transaction dropped before COMMIT is rolled back before the connection is pooled again.
pub struct MyTx {
    /// `None` only while being dropped.
    conn: Option<Conn>,
    /// Inside `START TRANSACTION`, not yet committed or rolled back.
    open: bool,
    facts: Vec<Fact>,
    /// Counts the connection as in use until it is back in the pool.
    lent: Option<super::Lent>,
    /// This node's pollers (woken by what the transaction made ready once it commits) and the
    /// wake-up log.
    announcer: super::Announcer,
    announced: Vec<WakeKey>,
    /// Leases for parked polls, answered once the transaction commits.
    deliveries: Vec<Delivery>,
    /// Kept run counts' changes, applied just before COMMIT.
    recounts: Recounts,
}

impl MyTx {
    pub(super) fn autocommit(conn: Conn, lent: super::Lent, announcer: super::Announcer) -> Self {
        Self {
            conn: Some(conn),
            open: false,
            facts: Vec::new(),
            lent: Some(lent),
            announcer,
            announced: Vec::new(),
            deliveries: Vec::new(),
            recounts: Recounts::new(),
        }
    }

    pub(super) async fn begin(conn: Conn, lent: super::Lent, announcer: super::Announcer) -> StoreResult<Self> {
        let mut tx = Self::autocommit(conn, lent, announcer);
        tx.conn()?.query_drop("START TRANSACTION").await?;
        tx.open = true;
        Ok(tx)
    }

    fn conn(&mut self) -> StoreResult<&mut Conn> {
        self.conn
            .as_mut()
            .ok_or_else(|| StoreError::Storage("the connection is gone".into()))
    }

    /// Commits; the facts the transaction recorded. A refusal the database sent means nothing
    /// was applied; a connection lost before the answer leaves the outcome unknown.
    pub(crate) async fn commit(mut self) -> StoreResult<Committed> {
        self.open = false;
        match self.conn()?.query_drop("COMMIT").await {
            Ok(()) => {
                for key in self.announced.drain(..) {
                    let _ = self.announcer.local.send(key);
                }
                Ok(Committed {
                    facts: std::mem::take(&mut self.facts),
                    deliveries: std::mem::take(&mut self.deliveries),
                })
            }
            Err(error @ mysql_async::Error::Server(_)) => Err(error.into()),
            Err(error) => Err(StoreError::OutcomeUnknown(error.to_string())),
        }
    }

    /// Rolls back now, so the transaction's locks are gone before its caller answers (a drop
    /// rolls back too, but in the background). A connection that cannot roll back is closed.
    pub(crate) async fn rollback(mut self) {
        self.open = false;
        let failed = match self.conn.as_mut() {
            Some(conn) => conn.query_drop("ROLLBACK").await.is_err(),
            None => false,
        };
        if let (true, Some(conn)) = (failed, self.conn.take()) {
            let _ = conn.disconnect().await;
        }
    }

    /// Runs `sql` (a statement without parameters, e.g. a savepoint's) as it is.
    pub(crate) async fn batch(&mut self, sql: &str) -> StoreResult<()> {
        Ok(self.conn()?.query_drop(sql).await?)
    }

    /// The first row of a query without parameters, as text.
    pub(super) async fn settings(&mut self, sql: &str) -> StoreResult<Vec<String>> {
        let row: Option<mysql_async::Row> = self.conn()?.query_first(sql).await?;
        let Some(row) = row else { return Ok(Vec::new()) };
        Ok(row
            .unwrap()
            .into_iter()
            .map(|value| match value {
                Value::Bytes(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
                Value::NULL => String::new(),
                other => other.as_sql(true),
            })
            .collect())
    }

    /// A statement an atomic handler sent (`$n` or `?` placeholders, JSON parameters).
    pub(crate) async fn execute_raw(&mut self, sql: &str, params: Vec<Value>) -> Result<u64, String> {
        let (sql, params) = handler_statement(sql, params)?;
        let conn = self.conn().map_err(|e| e.to_string())?;
        conn.exec_drop(sql, params).await.map_err(|e| e.to_string())?;
        Ok(conn.affected_rows())
    }

    /// A query an atomic handler sent; every row's values.
    pub(crate) async fn query_raw(&mut self, sql: &str, params: Vec<Value>) -> Result<Vec<Vec<Value>>, String> {
        let (sql, params) = handler_statement(sql, params)?;
        let conn = self.conn().map_err(|e| e.to_string())?;
        let rows: Vec<mysql_async::Row> = conn.exec(sql, params).await.map_err(|e| e.to_string())?;
        Ok(rows.into_iter().map(mysql_async::Row::unwrap).collect())
    }
}

impl Drop for MyTx {
    fn drop(&mut self) {
        let (Some(mut conn), lent) = (self.conn.take(), self.lent.take()) else {
            return;
        };
        if !self.open {
            return;
        }
        // Rolled back before the connection is pooled again; a connection that cannot roll
        // back is closed, which ends the transaction as surely.
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            runtime.spawn(async move {
                if conn.query_drop("ROLLBACK").await.is_err() {
                    let _ = conn.disconnect().await;
                }
                drop(lent);
            });
        }
    }
}

/// A handler's statement in MySQL's spelling with its parameters in `?` order; one that would
/// commit Capstan's transaction implicitly is refused before it reaches the database.
fn handler_statement(sql: &str, params: Vec<Value>) -> Result<(String, Params), String> {
    if dialect::commits_implicitly(sql) {
        return Err(format!(
            "MySQL commits the transaction before this statement, which would break the action's atomicity: {}",
            sql.chars().take(80).collect::<String>()
        ));
    }
    let statement = dialect::translate(sql)?;
    if statement.order.is_empty() {
        // `?` placeholders (or none): the parameters in the order given.
        return Ok((statement.sql, positional(params)));
    }
    let ordered = statement
        .order
        .iter()
        .map(|&index| {
            params
                .get(index)
                .cloned()
                .ok_or_else(|| format!("parameter ${} is not bound", index + 1))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((statement.sql, positional(ordered)))
}

fn positional(values: Vec<Value>) -> Params {
    if values.is_empty() {
        Params::Empty
    } else {
        Params::Positional(values)
    }
}

/// The statement in MySQL's spelling, translated once per distinct text.
fn translated(sql: &str) -> StoreResult<Arc<Translated>> {
    static CACHE: OnceLock<Mutex<HashMap<String, Arc<Translated>>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let mut cache = cache.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some(found) = cache.get(sql) {
        return Ok(found.clone());
    }
    // Statements built at run time (filters, IN lists) vary; keep the cache bounded.
    if cache.len() >= 4096 {
        cache.clear();
    }
    let made = Arc::new(dialect::translate(sql).map_err(StoreError::Storage)?);
    cache.insert(sql.to_string(), made.clone());
    Ok(made)
}

fn value(param: &Param<'_>) -> Value {
    match param {
        Param::Int(Some(value)) => Value::Int(*value),
        Param::Real(Some(value)) => Value::Double(*value),
        Param::Text(Some(text)) => Value::Bytes(text.as_bytes().to_vec()),
        Param::Int(None) | Param::Real(None) | Param::Text(None) => Value::NULL,
    }
}

/// The arguments in the order the translated statement's `?`s bind them.
fn bind(statement: &Translated, args: &[Param<'_>]) -> StoreResult<Params> {
    let values = statement
        .order
        .iter()
        .map(|&index| {
            args.get(index)
                .map(value)
                .ok_or_else(|| StoreError::Storage(format!("statement parameter ${} is not bound", index + 1)))
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(positional(values))
}

fn cell(value: Value, column: &mysql_async::Column) -> StoreResult<Cell> {
    Ok(match value {
        Value::NULL => Cell::Null,
        Value::Int(value) => Cell::Int(value),
        Value::UInt(value) => Cell::Int(i64::try_from(value).map_err(|_| StoreError::Storage(format!("{value} does not fit an i64")))?),
        Value::Float(value) => Cell::Real(f64::from(value)),
        Value::Double(value) => Cell::Real(value),
        Value::Bytes(bytes) => {
            let text = String::from_utf8(bytes).map_err(|_| StoreError::Storage(format!("column {} is not UTF-8", column.name_str())))?;
            // Sums and averages come back as DECIMAL, in text.
            if matches!(
                column.column_type(),
                ColumnType::MYSQL_TYPE_NEWDECIMAL | ColumnType::MYSQL_TYPE_DECIMAL
            ) {
                match text.parse::<i64>() {
                    Ok(int) => Cell::Int(int),
                    Err(_) => Cell::Real(text.parse().map_err(|_| StoreError::Storage(format!("{text} is not a number")))?),
                }
            } else {
                Cell::Text(text)
            }
        }
        other => Cell::Text(other.as_sql(true)),
    })
}

fn row_of(row: mysql_async::Row) -> StoreResult<Row> {
    let columns = row.columns();
    let cells = row
        .unwrap()
        .into_iter()
        .zip(columns.iter())
        .map(|(value, column)| cell(value, column))
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Row(cells))
}

impl MyTx {
    async fn run(&mut self, sql: &str, args: &[Param<'_>]) -> StoreResult<u64> {
        let statement = translated(sql)?;
        let params = bind(&statement, args)?;
        let conn = self.conn()?;
        match conn.exec_drop(statement.sql.as_str(), params).await {
            Ok(()) => Ok(conn.affected_rows()),
            // `ON CONFLICT DO NOTHING`: the duplicate was the "nothing"; MySQL rolled back only
            // this statement.
            Err(mysql_async::Error::Server(error)) if statement.ignore_duplicates && error.code == DUPLICATE_KEY => Ok(0),
            Err(error) => Err(error.into()),
        }
    }

    async fn rows(&mut self, sql: &str, args: &[Param<'_>]) -> StoreResult<Vec<Row>> {
        let statement = translated(sql)?;
        let params = bind(&statement, args)?;
        let rows: Vec<mysql_async::Row> = self.conn()?.exec(statement.sql.as_str(), params).await?;
        rows.into_iter().map(row_of).collect()
    }
}

impl Tx for MyTx {
    fn dialect(&self) -> Dialect {
        Dialect::Mysql
    }

    async fn execute<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<u64> {
        self.run(sql, args).await
    }

    async fn query<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Vec<Row>> {
        self.rows(sql, args).await
    }

    async fn query_opt<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Option<Row>> {
        Ok(self.rows(sql, args).await?.into_iter().next())
    }

    async fn execute_all<'a>(&'a mut self, statements: &'a [Statement<'a>]) -> StoreResult<()> {
        for statement in statements {
            self.run(statement.sql, &statement.args).await?;
        }
        Ok(())
    }

    async fn announce(&mut self, key: WakeKey) -> StoreResult<()> {
        if self.announced.contains(&key) {
            return Ok(());
        }
        let (namespace, kind, queue) = &key;
        let origin = self.announcer.origin.clone();
        self.run(
            super::wake_log::APPEND,
            &[
                Param::from(&*origin),
                Param::from(namespace.as_str()),
                Param::from(kind.as_str()),
                Param::from(queue.as_str()),
            ],
        )
        .await?;
        if self.open {
            self.announced.push(key);
        } else {
            // Outside a transaction the write that made the task ready has committed already.
            let _ = self.announcer.local.send(key);
        }
        Ok(())
    }

    fn observe(&mut self, fact: Fact) {
        self.facts.push(fact);
    }

    fn hand_off(&mut self, delivery: Delivery) {
        self.deliveries.push(delivery);
    }

    fn recount(&mut self, key: CountKey, delta: i64) {
        run_counts::add(&mut self.recounts, key, delta);
    }

    fn take_recounts(&mut self) -> Recounts {
        std::mem::take(&mut self.recounts)
    }
}

impl From<mysql_async::Error> for StoreError {
    fn from(error: mysql_async::Error) -> Self {
        let mysql_async::Error::Server(server) = &error else {
            return StoreError::Storage(error.to_string());
        };
        let message = format!("{} (error {}, SQLSTATE {})", server.message, server.code, server.state);
        if server.code == DUPLICATE_KEY {
            // "Duplicate entry '…' for key 'name'": the key's name is the constraint.
            let constraint = server
                .message
                .rsplit("for key '")
                .next()
                .map(|rest| rest.trim_end_matches('\'').to_string())
                .unwrap_or_default();
            return StoreError::Conflict { constraint, message };
        }
        StoreError::Storage(message)
    }
}

impl From<mysql_async::UrlError> for StoreError {
    fn from(error: mysql_async::UrlError) -> Self {
        StoreError::Storage(format!("bad database URL: {error}"))
    }
}
