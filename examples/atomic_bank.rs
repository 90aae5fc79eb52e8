//! An application that embeds Capstan and registers **atomic actions**: activity types Capstan
//! runs itself, inside the database transaction that records the activity's completion. The
//! application's writes (here, a small bank ledger in the same database) and Capstan's history
//! commit together or not at all, so the outcome of such a step can never be unknown.
//!
//! ```text
//! cargo run -p capstan --example atomic_bank -- serve --listen 127.0.0.1:8080 --data-dir ./bank-data
//! curl -X PUT localhost:8080/api/action-definitions/bank.debit \
//!      -H 'X-Durable-Workflow-Control-Plane-Version: 2' -H 'Content-Type: application/json' \
//!      -d '{"recovery_mode": "atomic"}'
//! ```
//!
//! Workflows (any DW SDK) then schedule `bank.debit` and `bank.balance` like any activity; no
//! worker polls them. Arguments (positional, as the SDKs send them):
//! - `bank.debit(transfer_id, account, amount)`: records the transfer, then takes `amount` from
//!   the account (every account opens with 100); fails with "insufficient funds" otherwise, and
//!   the transfer row is rolled back with the failed attempt.
//! - `bank.balance(account)`: `{"balance": …, "transfers": …}`.

use capstan_server::{AtomicAction, AtomicActions, AtomicTransaction, ServerConfig};
use capstan_store::{SharedStore, SqliteStore};
use clap::Parser;
use serde_json::{json, Value};
use std::path::PathBuf;
use std::sync::Arc;

const OPENING_BALANCE: i64 = 100;

/// Works on SQLite and PostgreSQL alike: `$N` placeholders and portable DDL.
fn open_books(tx: &mut dyn AtomicTransaction, account: &Value) -> Result<(), String> {
    tx.execute(
        "CREATE TABLE IF NOT EXISTS bank_accounts (account TEXT PRIMARY KEY, balance BIGINT NOT NULL)",
        &[],
    )?;
    tx.execute(
        "CREATE TABLE IF NOT EXISTS bank_transfers (transfer_id TEXT PRIMARY KEY, account TEXT NOT NULL, amount BIGINT NOT NULL)",
        &[],
    )?;
    tx.execute(
        "INSERT INTO bank_accounts (account, balance) VALUES ($1, $2) ON CONFLICT (account) DO NOTHING",
        &[account.clone(), json!(OPENING_BALANCE)],
    )?;
    Ok(())
}

fn argument<'a>(arguments: &'a Value, index: usize, name: &str) -> Result<&'a Value, String> {
    arguments
        .get(index)
        .filter(|v| !v.is_null())
        .ok_or_else(|| format!("argument {index} ({name}) is missing"))
}

struct Debit;

impl AtomicAction for Debit {
    fn run(&self, tx: &mut dyn AtomicTransaction, arguments: &Value) -> Result<Value, String> {
        let transfer_id = argument(arguments, 0, "transfer_id")?;
        let account = argument(arguments, 1, "account")?;
        let amount = argument(arguments, 2, "amount")?.as_i64().ok_or("amount must be an integer")?;
        open_books(tx, account)?;
        // Written first on purpose: a refused debit shows that its writes roll back.
        tx.execute(
            "INSERT INTO bank_transfers (transfer_id, account, amount) VALUES ($1, $2, $3)",
            &[transfer_id.clone(), account.clone(), json!(amount)],
        )?;
        let rows = tx.query(
            "SELECT balance FROM bank_accounts WHERE account = $1",
            std::slice::from_ref(account),
        )?;
        let balance = rows.first().and_then(|r| r[0].as_i64()).ok_or("the account has no balance row")?;
        if balance < amount {
            return Err(format!("insufficient funds: balance {balance}, debit {amount}"));
        }
        tx.execute(
            "UPDATE bank_accounts SET balance = balance - $1 WHERE account = $2",
            &[json!(amount), account.clone()],
        )?;
        Ok(json!({"transfer_id": transfer_id, "balance": balance - amount}))
    }
}

struct Balance;

impl AtomicAction for Balance {
    fn run(&self, tx: &mut dyn AtomicTransaction, arguments: &Value) -> Result<Value, String> {
        let account = argument(arguments, 0, "account")?;
        open_books(tx, account)?;
        let balance = tx.query(
            "SELECT balance FROM bank_accounts WHERE account = $1",
            std::slice::from_ref(account),
        )?;
        let transfers = tx.query(
            "SELECT COUNT(*) FROM bank_transfers WHERE account = $1",
            std::slice::from_ref(account),
        )?;
        Ok(json!({"balance": balance[0][0], "transfers": transfers[0][0]}))
    }
}

#[derive(Parser)]
enum Command {
    /// Serve the DW protocol with the bank's atomic actions registered.
    Serve {
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: String,
        #[arg(long, default_value = "./bank-data")]
        data_dir: PathBuf,
        /// `postgres://…` to use PostgreSQL instead of DATA_DIR/capstan.db.
        #[arg(long)]
        database: Option<String>,
    },
}

#[tokio::main]
async fn main() -> Result<(), String> {
    tracing_subscriber::fmt().with_writer(std::io::stderr).init();
    let Command::Serve {
        listen,
        data_dir,
        database,
    } = Command::parse();
    let config = ServerConfig {
        atomic_actions: AtomicActions::new([
            ("bank.debit".to_string(), Arc::new(Debit) as Arc<dyn AtomicAction>),
            ("bank.balance".to_string(), Arc::new(Balance) as Arc<dyn AtomicAction>),
        ]),
        ..ServerConfig::default()
    };
    let listener = tokio::net::TcpListener::bind(&listen)
        .await
        .map_err(|e| format!("listen on {listen}: {e}"))?;
    let now = config.sources.now_ms();
    let shutdown = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    match database {
        Some(url) if url.starts_with("postgres") => {
            let store = SharedStore::connect(&url, config.limits.clone(), now)
                .await
                .map_err(|e| e.to_string())?;
            capstan_server::serve(listener, store, config, shutdown)
                .await
                .map_err(|e| e.to_string())
        }
        other => {
            let path = other.map(PathBuf::from).unwrap_or_else(|| data_dir.join("capstan.db"));
            std::fs::create_dir_all(path.parent().unwrap_or(&data_dir)).map_err(|e| e.to_string())?;
            let store = SqliteStore::open(&path, config.limits.clone(), now).map_err(|e| e.to_string())?;
            capstan_server::serve(listener, store, config, shutdown)
                .await
                .map_err(|e| e.to_string())
        }
    }
}
