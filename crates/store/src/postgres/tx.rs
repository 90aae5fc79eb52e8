//! [`Tx`] on an open PostgreSQL transaction. Statements are prepared once per pooled
//! connection (`prepare_cached`); independent ones are pipelined; ready tasks are announced
//! with `pg_notify`, which PostgreSQL delivers only when the transaction commits.

use crate::tx::{Cell, Dialect, Param, Row, Statement, Tx};
use crate::{Fact, StoreError, StoreResult, WakeKey};
use deadpool_postgres::{Client, Transaction};
use tokio_postgres::types::{to_sql_checked, IsNull, ToSql, Type};

pub(crate) struct PgTx<'t, 'c> {
    conn: Conn<'t, 'c>,
    wake_channel: &'t str,
    /// Queues already announced in this transaction: one NOTIFY each is enough.
    announced: Vec<String>,
    /// Facts for the observer, handed on by whoever commits the transaction.
    facts: Vec<Fact>,
}

/// An open transaction, or a pooled connection for single statements and reads (each its own
/// implicit transaction).
#[derive(Clone, Copy)]
enum Conn<'t, 'c> {
    Tx(&'t Transaction<'c>),
    Client(&'t Client),
}

impl<'t, 'c> PgTx<'t, 'c> {
    pub(crate) fn new(tx: &'t Transaction<'c>, wake_channel: &'t str) -> Self {
        Self {
            conn: Conn::Tx(tx),
            wake_channel,
            announced: Vec::new(),
            facts: Vec::new(),
        }
    }

    /// Statements on a pooled connection outside a transaction: reads, and writes of one
    /// statement.
    pub(crate) fn client(client: &'t Client, wake_channel: &'t str) -> Self {
        Self {
            conn: Conn::Client(client),
            wake_channel,
            announced: Vec::new(),
            facts: Vec::new(),
        }
    }

    /// The facts this transaction recorded, for its committer to hand on after COMMIT.
    pub(crate) fn take_facts(&mut self) -> Vec<Fact> {
        std::mem::take(&mut self.facts)
    }
}

impl Conn<'_, '_> {
    async fn prepare(self, sql: &str) -> Result<tokio_postgres::Statement, tokio_postgres::Error> {
        match self {
            Conn::Tx(tx) => tx.prepare_cached(sql).await,
            Conn::Client(client) => client.prepare_cached(sql).await,
        }
    }

    async fn execute(self, statement: &tokio_postgres::Statement, args: &[&(dyn ToSql + Sync)]) -> Result<u64, tokio_postgres::Error> {
        match self {
            Conn::Tx(tx) => tx.execute(statement, args).await,
            Conn::Client(client) => client.execute(statement, args).await,
        }
    }

    async fn query(
        self,
        statement: &tokio_postgres::Statement,
        args: &[&(dyn ToSql + Sync)],
    ) -> Result<Vec<tokio_postgres::Row>, tokio_postgres::Error> {
        match self {
            Conn::Tx(tx) => tx.query(statement, args).await,
            Conn::Client(client) => client.query(statement, args).await,
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

impl Tx for PgTx<'_, '_> {
    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn execute<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<u64> {
        let statement = self.conn.prepare(sql).await?;
        Ok(self.conn.execute(&statement, &bound(args)).await?)
    }

    async fn query<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Vec<Row>> {
        let statement = self.conn.prepare(sql).await?;
        let rows = self.conn.query(&statement, &bound(args)).await?;
        rows.iter().map(row_of).collect()
    }

    async fn query_opt<'a>(&'a mut self, sql: &'a str, args: &'a [Param<'a>]) -> StoreResult<Option<Row>> {
        let statement = self.conn.prepare(sql).await?;
        let rows = self.conn.query(&statement, &bound(args)).await?;
        rows.first().map(row_of).transpose()
    }

    async fn execute_all<'a>(&'a mut self, statements: &'a [Statement<'a>]) -> StoreResult<()> {
        let mut prepared = Vec::with_capacity(statements.len());
        for statement in statements {
            prepared.push(self.conn.prepare(statement.sql).await?);
        }
        let bound_args: Vec<Vec<&(dyn ToSql + Sync)>> = statements.iter().map(|s| bound(&s.args)).collect();
        let conn = self.conn;
        let sent = prepared
            .iter()
            .zip(&bound_args)
            .map(|(statement, args)| conn.execute(statement, args));
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
        let statement = self.conn.prepare("SELECT pg_notify($1, $2)").await?;
        self.conn.execute(&statement, &[&self.wake_channel, &payload]).await?;
        self.announced.push(payload);
        Ok(())
    }

    fn observe(&mut self, fact: Fact) {
        self.facts.push(fact);
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
        <i64 as ToSql>::accepts(ty) || <i32 as ToSql>::accepts(ty) || <f64 as ToSql>::accepts(ty) || <&str as ToSql>::accepts(ty)
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
