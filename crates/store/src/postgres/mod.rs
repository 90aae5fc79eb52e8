//! PostgreSQL under [`SharedStore`](crate::SharedStore): connecting (bounded lock and idle
//! waits on every session, synchronous commit), migrating one node at a time under an advisory
//! lock, announcing ready tasks to every node with `NOTIFY`/`LISTEN`, and the settings an
//! operator's durability rests on. The store's statements themselves are shared (`logic/`).

mod migrations;
mod tx;

use crate::durability::Durability;
use crate::*;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use futures_util::StreamExt;
use migrations::MIGRATIONS;
use serde_json::Value;
use std::sync::Arc;
use tokio_postgres::{AsyncMessage, NoTls};
pub(crate) use tx::PgTx;

const POOL_SIZE: usize = 16;
/// How long a statement waits for a lock before it fails (and is retried by its caller).
pub const LOCK_TIMEOUT_MS: u64 = 10_000;
/// How long a session may sit idle inside a transaction before the database ends it.
pub const IDLE_IN_TRANSACTION_TIMEOUT_MS: u64 = 30_000;
const MIGRATION_LOCK: i64 = 0x00ca_9574_0001;
/// NOTIFY channel of the default schema; stores in another schema append its name.
const WAKE_CHANNEL: &str = "capstan_wake";

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(error: deadpool_postgres::PoolError) -> Self {
        StoreError::Storage(format!("no database connection: {error}"))
    }
}

/// A pool of connections to one PostgreSQL database (and schema).
#[derive(Clone)]
pub(crate) struct Postgres {
    pool: Pool,
    config: tokio_postgres::Config,
    /// The NOTIFY channel of this store's schema (channels are database-wide).
    wake_channel: Arc<str>,
}

/// Commits a migration's transaction. An error the database sent means nothing was applied; a
/// connection lost before the answer leaves the outcome unknown.
async fn commit(tx: deadpool_postgres::Transaction<'_>) -> StoreResult<()> {
    tx.commit().await.map_err(|error| {
        if error.as_db_error().is_some() {
            StoreError::from(error)
        } else {
            StoreError::OutcomeUnknown(error.to_string())
        }
    })
}

impl Postgres {
    /// Connects, with every table in `schema` when one is named (created if missing), and
    /// migrates.
    pub(crate) async fn connect(url: &str, schema: Option<&str>, now: Millis) -> StoreResult<Self> {
        let mut config: tokio_postgres::Config = url.parse().map_err(|e| StoreError::Storage(format!("bad database URL: {e}")))?;
        let Some(schema) = schema else {
            return Self::with_config(config, now, WAKE_CHANNEL.to_string()).await;
        };
        let (client, connection) = config.connect(NoTls).await?;
        let driver = tokio::spawn(connection);
        client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
        drop(client);
        let _ = driver.await;
        let options = format!("{} -c search_path={schema}", config.get_options().unwrap_or(""));
        config.options(options.trim());
        Self::with_config(config, now, format!("{WAKE_CHANNEL}_{schema}")).await
    }

    pub(crate) async fn autocommit(&self) -> StoreResult<PgTx> {
        Ok(PgTx::autocommit(self.pool.get().await?, self.wake_channel.clone()))
    }

    pub(crate) async fn begin(&self) -> StoreResult<PgTx> {
        PgTx::begin(self.pool.get().await?, self.wake_channel.clone()).await
    }

    async fn with_config(mut config: tokio_postgres::Config, now: Millis, wake_channel: String) -> StoreResult<Self> {
        // Bounded waits on every session: a statement waits at most LOCK_TIMEOUT for a lock, and
        // a session left idle inside a transaction (its node paused or partitioned) is ended by
        // the database after IDLE_IN_TRANSACTION_TIMEOUT, which releases its locks. A COMMIT
        // returns once its WAL is flushed (`synchronous_commit = on`), whatever the database's
        // default: a 2xx promises that. The URL's own `options` come last, so a setting the
        // operator names there wins.
        let options = format!(
            "-c lock_timeout={LOCK_TIMEOUT_MS} -c idle_in_transaction_session_timeout={IDLE_IN_TRANSACTION_TIMEOUT_MS} -c synchronous_commit=on {}",
            config.get_options().unwrap_or("")
        );
        config.options(options.trim());
        let manager = Manager::from_config(
            config.clone(),
            NoTls,
            ManagerConfig {
                recycling_method: RecyclingMethod::Fast,
            },
        );
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE)
            .build()
            .map_err(|e| StoreError::Storage(e.to_string()))?;
        let store = Self {
            pool,
            config,
            wake_channel: wake_channel.into(),
        };
        store.migrate(now).await?;
        Ok(store)
    }

    async fn migrate(&self, now: Millis) -> StoreResult<()> {
        let mut client = self.pool.get().await?;
        // Another node may migrate for longer than a lock wait is allowed elsewhere.
        client.batch_execute("SET lock_timeout = 0").await?;
        client.execute("SELECT pg_advisory_lock($1)", &[&MIGRATION_LOCK]).await?;
        let result = async {
            client.batch_execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at BIGINT NOT NULL)").await?;
            client.batch_execute(schema_floor::CREATE_FLOOR_TABLE).await?;
            let database: Option<i64> = client.query_one("SELECT MAX(version) FROM schema_migrations", &[]).await?.get(0);
            let floor: Option<i64> = client.query_opt(schema_floor::READ_FLOOR, &[]).await?.map(|row| row.get(0));
            let known = MIGRATIONS.last().map_or(0, |(version, _)| *version);
            schema_floor::admit(known, database, floor)?;
            for (version, sql) in MIGRATIONS {
                let applied = client.query_opt("SELECT 1 FROM schema_migrations WHERE version = $1", &[version]).await?.is_some();
                if applied {
                    continue;
                }
                let tx = client.transaction().await?;
                tx.batch_execute(sql).await?;
                tx.execute("INSERT INTO schema_migrations (version, applied_at) VALUES ($1, $2)", &[version, &now]).await?;
                commit(tx).await?;
            }
            client
                .execute(
                    "INSERT INTO schema_floor (id, floor) VALUES (1, $1) ON CONFLICT (id) DO UPDATE SET floor = GREATEST(schema_floor.floor, excluded.floor)",
                    &[&schema_floor::schema_floor(crate::tx::Dialect::Postgres)],
                )
                .await?;
            client
                .execute(
                    "INSERT INTO namespaces (name, description, created_at) VALUES ('default', 'Default namespace', $1) ON CONFLICT DO NOTHING",
                    &[&now],
                )
                .await?;
            Ok::<(), StoreError>(())
        }
        .await;
        client.execute("SELECT pg_advisory_unlock($1)", &[&MIGRATION_LOCK]).await?;
        client.batch_execute("RESET lock_timeout").await?;
        result
    }

    /// What the durability of an acknowledged change rests on, as the database reports it to
    /// the store's sessions.
    pub(crate) async fn durability(&self) -> StoreResult<Durability> {
        const NAMES: [&str; 3] = ["fsync", "full_page_writes", "synchronous_commit"];
        let values = self.settings(NAMES).await?;
        Ok(Durability {
            settings: NAMES.iter().map(|n| n.to_string()).zip(values).collect(),
        })
    }

    /// The bounded waits of the store's sessions, as the database reports them:
    /// `(lock_timeout, idle_in_transaction_session_timeout)`.
    pub(crate) async fn session_timeouts(&self) -> StoreResult<(String, String)> {
        let [lock, idle] = self.settings(["lock_timeout", "idle_in_transaction_session_timeout"]).await?;
        Ok((lock, idle))
    }

    /// The values of `names` as a session of the store sees them (as `SHOW` prints them), in
    /// one round trip.
    async fn settings<const N: usize>(&self, names: [&str; N]) -> StoreResult<[String; N]> {
        let client = self.pool.get().await?;
        let columns: Vec<String> = (1..=N).map(|i| format!("current_setting(${i})")).collect();
        let params: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = names.iter().map(|n| n as _).collect();
        let row = client.query_one(&format!("SELECT {}", columns.join(", ")), &params).await?;
        Ok(std::array::from_fn(|i| row.get::<_, String>(i)))
    }

    /// Ready tasks other nodes announce: every node `LISTEN`s on the schema's channel.
    pub(crate) async fn wakeups(&self) -> StoreResult<Option<WakeReceiver>> {
        let (sender, receiver) = tokio::sync::mpsc::unbounded_channel();
        let config = self.config.clone();
        let channel = self.wake_channel.clone();
        tokio::spawn(async move {
            // Reconnect forever: a lost listener only costs latency (pollers re-check the
            // database every second), never a task.
            loop {
                if let Err(error) = listen(&config, &channel, &sender).await {
                    tracing::warn!(%error, "wake-up listener lost its connection; reconnecting");
                }
                if sender.is_closed() {
                    return;
                }
                tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            }
        });
        Ok(Some(receiver))
    }

    pub(crate) fn pool_use(&self) -> PoolUse {
        let status = self.pool.status();
        PoolUse {
            max: status.max_size,
            open: status.size,
            idle: status.available,
            waiting: status.waiting,
        }
    }
}

async fn listen(
    config: &tokio_postgres::Config,
    channel: &str,
    sender: &tokio::sync::mpsc::UnboundedSender<(String, TaskKind, String)>,
) -> StoreResult<()> {
    let (client, mut connection) = config.connect(NoTls).await?;
    let mut messages = futures_util::stream::poll_fn(move |cx| connection.poll_message(cx));
    let listen_sql = format!("LISTEN {channel}");
    let listening = client.batch_execute(&listen_sql);
    // The connection must be driven while LISTEN runs; do both until LISTEN returns.
    tokio::pin!(listening);
    loop {
        tokio::select! {
            result = &mut listening => { result?; break; }
            message = messages.next() => match message {
                Some(Ok(_)) => {}
                Some(Err(error)) => return Err(error.into()),
                None => return Err(StoreError::Storage("listener connection closed".into())),
            }
        }
    }
    while let Some(message) = messages.next().await {
        if let AsyncMessage::Notification(notification) = message? {
            let mut parts = notification.payload().splitn(3, '\u{1f}');
            if let (Some(namespace), Some(kind), Some(queue)) = (parts.next(), parts.next().and_then(crate::rows::wake_kind), parts.next())
            {
                if sender.send((namespace.to_string(), kind, queue.to_string())).is_err() {
                    return Ok(());
                }
            }
        }
    }
    Err(StoreError::Storage("listener connection closed".into()))
}

/// Runs a statement an atomic handler sent, inside the recording transaction.
pub(crate) async fn atomic_execute(tx: &mut PgTx, sql: &str, params: &[Value]) -> Result<u64, String> {
    let owned = pg_params(params);
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = owned.iter().map(|p| p.as_ref() as _).collect();
    tx.execute_dynamic(sql, &refs).await.map_err(|e| e.to_string())
}

/// Runs a query an atomic handler sent, inside the recording transaction.
pub(crate) async fn atomic_query(tx: &mut PgTx, sql: &str, params: &[Value]) -> Result<Vec<Vec<Value>>, String> {
    let owned = pg_params(params);
    let refs: Vec<&(dyn tokio_postgres::types::ToSql + Sync)> = owned.iter().map(|p| p.as_ref() as _).collect();
    let rows = tx.query_dynamic(sql, &refs).await.map_err(|e| e.to_string())?;
    Ok(rows.iter().map(atomic_row).collect())
}

/// A result row as JSON values, for an atomic handler.
fn atomic_row(row: &tokio_postgres::Row) -> Vec<Value> {
    (0..row.len())
        .map(|i| {
            if let Ok(v) = row.try_get::<_, Option<i64>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else if let Ok(v) = row.try_get::<_, Option<i32>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else if let Ok(v) = row.try_get::<_, Option<f64>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else if let Ok(v) = row.try_get::<_, Option<bool>>(i) {
                v.map(Value::from).unwrap_or(Value::Null)
            } else {
                row.try_get::<_, Option<String>>(i)
                    .ok()
                    .flatten()
                    .map(Value::from)
                    .unwrap_or(Value::Null)
            }
        })
        .collect()
}

fn pg_params(params: &[Value]) -> Vec<Box<dyn tokio_postgres::types::ToSql + Sync + Send>> {
    params
        .iter()
        .map(|value| -> Box<dyn tokio_postgres::types::ToSql + Sync + Send> {
            match value {
                Value::Bool(b) => Box::new(*b),
                Value::Number(n) if n.is_i64() => Box::new(n.as_i64().unwrap_or_default()),
                Value::Number(n) => Box::new(n.as_f64().unwrap_or_default()),
                other => Box::new(json_text(other)),
            }
        })
        .collect()
}
