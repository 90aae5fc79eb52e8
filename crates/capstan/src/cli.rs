//! Operator commands over HTTP: `capstan actions …` and `capstan ledger …`. They talk to any
//! running Capstan (or DW-compatible) server; errors print the server's `reason` and exit 1.

use clap::{Args, Subcommand, ValueEnum};
use serde_json::{json, Value};
use std::process::ExitCode;

#[derive(Args, Clone)]
pub struct Connection {
    /// Server base URL.
    #[arg(long, global = true, env = "CAPSTAN_SERVER", default_value = "http://127.0.0.1:8080")]
    pub(crate) server: String,
    /// Namespace.
    #[arg(long, global = true, env = "CAPSTAN_NAMESPACE", default_value = "default")]
    pub(crate) namespace: String,
    /// Bearer token (also read from DURABLE_WORKFLOW_AUTH_TOKEN).
    #[arg(long, global = true, env = "CAPSTAN_TOKEN", hide_env_values = true)]
    pub(crate) token: Option<String>,
    /// Output format: a table for people, JSON (stable) for scripts.
    #[arg(long, global = true, value_enum, default_value = "table")]
    pub(crate) output: Output,
}

#[derive(Clone, Copy, PartialEq, ValueEnum)]
pub enum Output {
    Table,
    Json,
}

#[derive(Subcommand)]
pub enum ActionsCommand {
    /// Declare (or re-declare) an activity type a consequential action.
    Define {
        activity_type: String,
        /// non_atomic, atomic, snapshot_restore, irreversible or linked_run.
        #[arg(long)]
        mode: String,
        /// The `verification` block as JSON (result_schema, declared_effects).
        #[arg(long)]
        verification: Option<String>,
        /// The `pending` rule as JSON ({"pointer": "/status", "values": ["processing"]}).
        #[arg(long)]
        pending: Option<String>,
        /// Seconds between polls of a pending result.
        #[arg(long)]
        poll_interval_seconds: Option<i64>,
        /// Where approval/backup references sit in the arguments, as JSON.
        #[arg(long)]
        pins: Option<String>,
        /// The reconciliation probe as JSON ({"activity_type": "payments.lookup", "max_attempts": 3}).
        #[arg(long)]
        probe: Option<String>,
        /// A JSON pointer to the provider's idempotency key in the arguments ("/0/order_id").
        #[arg(long)]
        idempotency_key: Option<String>,
        /// A JSON pointer to the effect's human-readable preview in the arguments ("/0/preview").
        #[arg(long)]
        preview: Option<String>,
    },
    /// Every action definition of the namespace.
    List,
    /// One action definition.
    Show { activity_type: String },
}

#[derive(Subcommand)]
pub enum LedgerCommand {
    /// Ledger entries, oldest dispatch first.
    List {
        /// dispatched, verified, outcome_unknown, pending, effect_confirmed or effect_absent.
        #[arg(long)]
        state: Option<String>,
        #[arg(long)]
        workflow_id: Option<String>,
        #[arg(long)]
        activity_type: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// One entry with its checkpoints and the chain's status.
    Show { ledger_key: String },
    /// Record an operator's decision on an entry whose outcome is unknown.
    Resolve {
        ledger_key: String,
        /// effect_confirmed or effect_absent.
        #[arg(long)]
        decision: String,
        /// Evidence as a JSON object (provider reference, note…).
        #[arg(long)]
        evidence: String,
        /// The activity's result as JSON (effect_confirmed only).
        #[arg(long)]
        result: Option<String>,
    },
}

pub(crate) fn parse_json(flag: &str, text: &str) -> Result<Value, String> {
    serde_json::from_str(text).map_err(|e| format!("--{flag} is not valid JSON: {e}"))
}

pub(crate) struct Client {
    http: reqwest::Client,
    connection: Connection,
}

impl Client {
    pub(crate) fn new(connection: Connection) -> Self {
        Self {
            http: reqwest::Client::new(),
            connection,
        }
    }

    pub(crate) async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<Value, String> {
        let (status, body) = self.exchange(method, path, body).await?;
        if (200..300).contains(&status) {
            Ok(body)
        } else {
            Err(format!(
                "{status} {}: {}",
                body["reason"].as_str().unwrap_or("error"),
                body["message"].as_str().unwrap_or("")
            ))
        }
    }

    /// The answer's status and body, whatever the status (an error body is DW's shape).
    pub(crate) async fn exchange(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Result<(u16, Value), String> {
        let url = format!("{}/api{path}", self.connection.server.trim_end_matches('/'));
        let mut request = self
            .http
            .request(method, &url)
            .header("X-Durable-Workflow-Control-Plane-Version", "2")
            .header("X-Namespace", &self.connection.namespace)
            .header("Accept", "application/json");
        let token = self
            .connection
            .token
            .clone()
            .or_else(|| std::env::var("DURABLE_WORKFLOW_AUTH_TOKEN").ok());
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request.json(&body);
        }
        let response = request.send().await.map_err(|e| format!("cannot reach {url}: {e}"))?;
        let status = response.status().as_u16();
        let body: Value = response.json().await.unwrap_or(Value::Null);
        Ok((status, body))
    }
}

fn print_rows(columns: &[&str], rows: &[Value]) {
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|row| {
            columns
                .iter()
                .map(|c| match &row[*c] {
                    Value::String(s) => s.clone(),
                    Value::Null => "-".into(),
                    other => other.to_string(),
                })
                .collect()
        })
        .collect();
    let widths: Vec<usize> = columns
        .iter()
        .enumerate()
        .map(|(i, c)| cells.iter().map(|r| r[i].len()).chain([c.len()]).max().unwrap_or(0))
        .collect();
    let line = |values: Vec<String>| {
        values
            .iter()
            .zip(&widths)
            .map(|(v, w)| format!("{v:<w$}"))
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    println!("{}", line(columns.iter().map(|c| c.to_uppercase()).collect()));
    for row in cells {
        println!("{}", line(row));
    }
}

pub(crate) fn print(output: Output, value: &Value, columns: &[&str], list_key: Option<&str>) {
    match (output, list_key) {
        (Output::Json, _) => println!("{}", serde_json::to_string_pretty(value).expect("JSON prints")),
        (Output::Table, Some(key)) => print_rows(columns, value[key].as_array().map(Vec::as_slice).unwrap_or(&[])),
        (Output::Table, None) => print_rows(columns, std::slice::from_ref(value)),
    }
}

/// A failing workflow task (`workflow_task_failure` on describe and history answers), printed
/// first: it is why a run makes no progress. The stack trace follows, indented.
pub(crate) fn print_task_failure(failure: &Value) {
    if failure.is_null() {
        return;
    }
    let text = |key: &str| failure[key].as_str().unwrap_or("-").to_string();
    println!(
        "! workflow task failing ({} in a row since {}): {}",
        failure["consecutive_failures"],
        text("first_failed_at"),
        text("message")
    );
    println!(
        "  type: {}  reason: {}  attempt: {}  worker: {}  last failed: {}",
        text("type"),
        text("reason"),
        failure["workflow_task_attempt"],
        text("lease_owner"),
        text("failed_at")
    );
    if let Some(stack) = failure["stack_trace"].as_str() {
        for line in stack.lines() {
            println!("    {line}");
        }
    }
    if let Some(cut) = failure["truncated_bytes"].as_object() {
        let sizes: Vec<String> = cut.iter().map(|(field, bytes)| format!("{field} was {bytes} bytes")).collect();
        println!("  (cut to the stored limit: {})", sizes.join(", "));
    }
}

pub(crate) fn finish(result: Result<(), String>) -> ExitCode {
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("capstan: {message}");
            ExitCode::FAILURE
        }
    }
}

pub fn actions(connection: Connection, command: ActionsCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    let columns = ["activity_type", "recovery_mode", "version", "definition_hash", "updated_at"];
    finish(runtime.block_on(async {
        match command {
            ActionsCommand::Define {
                activity_type,
                mode,
                verification,
                pending,
                poll_interval_seconds,
                pins,
                probe,
                idempotency_key,
                preview,
            } => {
                let mut body = json!({"recovery_mode": mode});
                for (key, value) in [
                    ("verification", verification),
                    ("pending", pending),
                    ("pins", pins),
                    ("probe", probe),
                ] {
                    if let Some(text) = value {
                        body[key] = parse_json(key, &text)?;
                    }
                }
                for (key, value) in [("idempotency_key", idempotency_key), ("preview", preview)] {
                    if let Some(pointer) = value {
                        body[key] = json!(pointer);
                    }
                }
                if let Some(seconds) = poll_interval_seconds {
                    body["poll_interval_seconds"] = json!(seconds);
                }
                let defined = client
                    .call(reqwest::Method::PUT, &format!("/action-definitions/{activity_type}"), Some(body))
                    .await?;
                print(output, &defined, &columns, None);
            }
            ActionsCommand::List => {
                let listed = client.call(reqwest::Method::GET, "/action-definitions", None).await?;
                print(output, &listed, &columns, Some("action_definitions"));
            }
            ActionsCommand::Show { activity_type } => {
                let shown = client
                    .call(reqwest::Method::GET, &format!("/action-definitions/{activity_type}"), None)
                    .await?;
                print(output, &shown, &columns, None);
            }
        }
        Ok(())
    }))
}

pub fn ledger(connection: Connection, command: LedgerCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    let columns = [
        "ledger_key",
        "state",
        "activity_type",
        "workflow_id",
        "attempt_number",
        "dispatched_at",
    ];
    finish(runtime.block_on(async {
        match command {
            LedgerCommand::List {
                state,
                workflow_id,
                activity_type,
                limit,
            } => {
                let mut query = vec![format!("limit={limit}")];
                for (key, value) in [("state", state), ("workflow_id", workflow_id), ("activity_type", activity_type)] {
                    if let Some(value) = value {
                        query.push(format!("{key}={value}"));
                    }
                }
                let listed = client
                    .call(reqwest::Method::GET, &format!("/ledger?{}", query.join("&")), None)
                    .await?;
                print(output, &listed, &columns, Some("entries"));
            }
            LedgerCommand::Show { ledger_key } => {
                let shown = client.call(reqwest::Method::GET, &format!("/ledger/{ledger_key}"), None).await?;
                print(output, &shown, &columns, None);
                if output == Output::Table {
                    println!("chain verified: {}", shown["chain_verified"]);
                    for checkpoint in shown["checkpoints"].as_array().into_iter().flatten() {
                        println!("  {}  {}  {}", checkpoint["recorded_at"], checkpoint["state"], checkpoint["hash"]);
                    }
                }
            }
            LedgerCommand::Resolve {
                ledger_key,
                decision,
                evidence,
                result,
            } => {
                let mut body = json!({"decision": decision, "evidence": parse_json("evidence", &evidence)?});
                if let Some(text) = result {
                    body["result"] = parse_json("result", &text)?;
                }
                let resolved = client
                    .call(reqwest::Method::POST, &format!("/ledger/{ledger_key}/resolve"), Some(body))
                    .await?;
                print(output, &resolved, &columns, None);
            }
        }
        Ok(())
    }))
}
