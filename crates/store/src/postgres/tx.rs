//! [`Tx`] on a pooled PostgreSQL connection, inside a transaction or not. Statements are
//! prepared once per pooled connection (`prepare_cached`); independent ones are pipelined;
//! ready tasks are announced with `pg_notify`, which PostgreSQL delivers only when the
//! transaction commits.

use crate::logic::run_counts::{self, CountKey, Recounts};
use crate::parked_polls::Delivery;
use crate::shared::Committed;
use crate::tx::{Cell, Dialect, Param, Row, Statement, Tx};
use crate::{Fact, StoreError, StoreResult, WakeKey};
use deadpool_postgres::Object;
use std::sync::Arc;
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

/// A pooled connection the shared logic runs on. It owns the connection, so a transaction is
/// a value that can be handed around; one dropped before COMMIT is rolled back before its
/// connection goes back to the pool.
pub struct PgTx {
    /// `None` only while being dropped.
    client: Option<Object>,
    /// Inside `BEGIN`, not yet committed or rolled back.
    open: bool,
    wake_channel: Arc<str>,
    /// Queues already announced in this transaction: one NOTIFY each is enough.
    announced: Vec<String>,
    /// Facts for the observer, handed on by whoever commits the transaction.
    facts: Vec<Fact>,
    /// Leases for parked polls, answered once the transaction commits.
    deliveries: Vec<Delivery>,
    /// Kept run counts' changes, applied just before COMMIT.
    recounts: Recounts,
}

impl PgTx {
    /// Statements on the connection outside a transaction: reads, and writes of one statement
    /// (each its own implicit transaction).
    pub(crate) fn autocommit(client: Object, wake_channel: Arc<str>) -> Self {
        Self {
            client: Some(client),
            open: false,
            wake_channel,
            announced: Vec::new(),
            facts: Vec::new(),
            deliveries: Vec::new(),
            recounts: Recounts::new(),
        }
    }

    /// Opens a transaction on the connection.
    pub(crate) async fn begin(client: Object, wake_channel: Arc<str>) -> StoreResult<Self> {
        let mut tx = Self::autocommit(client, wake_channel);
        tx.client().batch_execute("BEGIN").await?;
        tx.open = true;
        Ok(tx)
    }

    fn client(&self) -> &Object {
        self.client.as_ref().expect("the connection is held until drop")
    }

    /// Commits; the facts the transaction recorded, for the committer to hand on. An error the
    /// database sent (a failed deferred check, a serialization failure) means nothing was
    /// applied; a connection lost before the answer leaves the outcome unknown.
    pub(crate) async fn commit(mut self) -> StoreResult<Committed> {
        self.open = false;
        match self.client().batch_execute("COMMIT").await {
            Ok(()) => Ok(Committed {
                facts: std::mem::take(&mut self.facts),
                deliveries: std::mem::take(&mut self.deliveries),
            }),
            Err(error) if error.as_db_error().is_some() => Err(error.into()),
            Err(error) => Err(StoreError::OutcomeUnknown(error.to_string())),
        }
    }

    /// Rolls back now, so the transaction's locks are gone before its caller answers (a drop
    /// rolls back too, but in the background). A connection that cannot roll back is closed.
    pub(crate) async fn rollback(mut self) {
        self.open = false;
        if self.client().batch_execute("ROLLBACK").await.is_err() {
            if let Some(client) = self.client.take() {
                drop(Object::take(client));
            }
        }
    }

    /// Runs `sql` (statements without parameters, e.g. a savepoint's) as it is.
    pub(crate) async fn batch(&mut self, sql: &str) -> StoreResult<()> {
        Ok(self.client().batch_execute(sql).await?)
    }

    /// Runs a statement an atomic handler sent, with JSON parameters, unprepared.
    pub(crate) async fn execute_dynamic(&self, sql: &str, params: &[&(dyn ToSql + Sync)]) -> Result<u64, tokio_postgres::Error> {
        self.client().execute(sql, params).await
    }

    pub(crate) async fn query_dynamic(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        self.client().query(sql, params).await
    }

    pub(crate) async fn query_prepared(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        let statement = self.client().prepare_cached(sql).await?;
        self.client().query(&statement, params).await
    }
}

impl Drop for PgTx {
    fn drop(&mut self) {
        let Some(client) = self.client.take() else { return };
        if !self.open {
            return;
        }
        // An abandoned transaction (an error, a refusal, a cancelled request) is rolled back
        // before the connection is pooled again; with no runtime to do that, the connection is
        // closed instead, which ends the transaction just as surely.
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    if client.batch_execute("ROLLBACK").await.is_err() {
                        drop(Object::take(client));
                    }
                });
            }
            Err(_) => drop(Object::take(client)),
        }
    }
}

fn bound<'p>(args: &'p [Param<'_>]) -> Vec<&'p (dyn ToSql + Sync)> {
    args.iter().map(|arg| arg as &(dyn ToSql + Sync)).collect()
}

fn row_of(row: &tokio_postgres::Row) -> StoreResult<Row> {
    let cells = row
        .columns()
        .iter()
        .enumerate()
        .map(|(index, column)| {
            let ty = column.type_();
            Ok(if *ty == Type::INT8 {
                row.try_get::<_, Option<i64>>(index)?.map_or(Cell::Null, Cell::Int)
            } else if *ty == Type::INT4 {
                row.try_get::<_, Option<i32>>(index)?.map_or(Cell::Null, |v| Cell::Int(v.into()))
            } else if *ty == Type::INT2 {
                row.try_get::<_, Option<i16>>(index)?.map_or(Cell::Null, |v| Cell::Int(v.into()))
            } else if *ty == Type::BOOL {
                row.try_get::<_, Option<bool>>(index)?.map_or(Cell::Null, |v| Cell::Int(v.into()))
            } else if *ty == Type::FLOAT8 {
                row.try_get::<_, Option<f64>>(index)?.map_or(Cell::Null, Cell::Real)
            } else if *ty == Type::VOID {
                Cell::Null
            } else {
                row.try_get::<_, Option<String>>(index)?.map_or(Cell::Null, Cell::Text)
            })
        })
        .collect::<StoreResult<Vec<_>>>()?;
    Ok(Row(cells))
}

impl Tx for PgTx {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn execute<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<u64> {
        let client = self.client();
        let statement = client.prepare_cached(sql).await?;
        Ok(client.execute(&statement, &bound(args)).await?)
    }

    async fn query<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Vec<Row>> {
        let rows = self.query_prepared(sql, &bound(args)).await?;
        rows.iter().map(row_of).collect()
    }

    async fn query_opt<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Option<Row>> {
        let rows = self.query_prepared(sql, &bound(args)).await?;
        rows.first().map(row_of).transpose()
    }

    async fn execute_all<'a>(&'a mut self, statements: &'a [Statement<'a>]) -> StoreResult<()> {
        let client = self.client();
        let mut prepared = Vec::with_capacity(statements.len());
        for statement in statements {
            prepared.push(client.prepare_cached(statement.sql).await?);
        }
        let bound_args: Vec<Vec<&(dyn ToSql + Sync)>> = statements.iter().map(|s| bound(&s.args)).collect();
        let sent = prepared
            .iter()
            .zip(&bound_args)
            .map(|(statement, args)| client.execute(statement, args));
        futures_util::future::try_join_all(sent).await?;
        Ok(())
    }

    async fn announce(&mut self, key: WakeKey) -> StoreResult<()> {
        let (namespace, kind, queue) = key;
        let payload = format!("{namespace}\u{1f}{}\u{1f}{queue}", kind.as_str());
        if self.announced.contains(&payload) {
            return Ok(());
        }
        // Delivered to every listening node when (and only if) this transaction commits.
        let client = self.client();
        let statement = client.prepare_cached("SELECT pg_notify($1, $2)").await?;
        client.execute(&statement, &[&&*self.wake_channel, &payload]).await?;
        self.announced.push(payload);
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

impl ToSql for Param<'_> {
    fn to_sql(&self, ty: &Type, out: &mut bytes::BytesMut) -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        match self {
            Param::Int(Some(value)) if *ty == Type::INT4 => i32::try_from(*value)?.to_sql_checked(ty, out),
            Param::Int(Some(value)) if *ty == Type::INT2 => i16::try_from(*value)?.to_sql_checked(ty, out),
            Param::Int(Some(value)) => value.to_sql_checked(ty, out),
            Param::Real(Some(value)) => value.to_sql_checked(ty, out),
            Param::Text(Some(text)) => text.to_sql_checked(ty, out),
            Param::Int(None) | Param::Real(None) | Param::Text(None) => Ok(IsNull::Yes),
        }
    }

    fn accepts(ty: &Type) -> bool {
        <i64 as ToSql>::accepts(ty)
            || <i32 as ToSql>::accepts(ty)
            || <i16 as ToSql>::accepts(ty)
            || <f64 as ToSql>::accepts(ty)
            || <&str as ToSql>::accepts(ty)
    }

    to_sql_checked!();
}

impl From<tokio_postgres::Error> for StoreError {
    fn from(error: tokio_postgres::Error) -> Self {
        // tokio-postgres displays a server error as just "db error": the server's message and
        // SQLSTATE (53100 disk full, 25006 read-only, ...) are what an operator needs to see.
        let Some(db) = error.as_db_error() else {
            return StoreError::Storage(match std::error::Error::source(&error) {
                Some(cause) => format!("{error}: {cause}"),
                None => error.to_string(),
            });
        };
        let message = format!("{} (SQLSTATE {})", db.message(), db.code().code());
        if *db.code() == tokio_postgres::error::SqlState::UNIQUE_VIOLATION {
            return StoreError::Conflict {
                constraint: db.constraint().unwrap_or_default().to_string(),
                message,
            };
        }
        StoreError::Storage(message)
    }
}
