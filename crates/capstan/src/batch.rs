//! `capstan batch …`: batch operations (`docs/batch-operations.md`): start one over a query
//! (or count what it would select), list them, follow one with a progress bar, cancel one.

use crate::cli::{print, Client, Connection, Output};
use crate::ops::{arguments, encode, run};
use clap::{Args, Subcommand};
use indicatif::{ProgressBar, ProgressStyle};
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;
use std::time::Duration;

#[derive(Subcommand)]
pub enum BatchCommand {
    /// Start a batch: ACTION (cancel, terminate, signal, pause, resume, redrive, archive, delete) on every
    /// current run the selection matches now.
    Start(Box<StartArgs>),
    /// The namespace's batches, newest first.
    List {
        #[arg(long, default_value_t = 50)]
        limit: usize,
    },
    /// One batch and its progress; `--follow` shows a progress bar until it ends.
    Describe {
        batch_id: String,
        #[arg(long)]
        follow: bool,
    },
    /// Stop a running batch.
    Cancel { batch_id: String },
}

#[derive(Args)]
pub struct StartArgs {
    action: String,
    /// A visibility query (`Amount > 10 AND Tier = "gold"`) or free text.
    #[arg(long)]
    query: Option<String>,
    #[arg(long = "type")]
    workflow_type: Option<String>,
    #[arg(long)]
    task_queue: Option<String>,
    /// running, completed, failed or paused.
    #[arg(long)]
    status: Option<String>,
    #[arg(long)]
    reason: Option<String>,
    /// The signal a signal batch sends.
    #[arg(long)]
    signal: Option<String>,
    /// The signal's arguments as a JSON list (or one JSON value).
    #[arg(long)]
    input: Option<String>,
    /// Runs acted on per second, at most.
    #[arg(long)]
    rate: Option<f64>,
    /// Runs visited, at most.
    #[arg(long)]
    limit: Option<u64>,
    /// Makes a retry of this command the same batch.
    #[arg(long)]
    request_id: Option<String>,
    /// Only count the runs the selection matches now; act on none.
    #[arg(long)]
    dry_run: bool,
    /// Follow the batch to its end with a progress bar.
    #[arg(long)]
    follow: bool,
}

const COLUMNS: [&str; 8] = ["batch_id", "action", "state", "matched", "done", "skipped", "failed", "created_at"];

pub fn batch(connection: Connection, command: BatchCommand) -> ExitCode {
    let output = connection.output;
    let client = Client::new(connection);
    run(async move {
        match command {
            BatchCommand::Start(start) => {
                let StartArgs {
                    action,
                    query,
                    workflow_type,
                    task_queue,
                    status,
                    reason,
                    signal,
                    input,
                    rate,
                    limit,
                    request_id,
                    dry_run,
                    follow,
                } = *start;
                let input = match (&signal, &input) {
                    (Some(_), _) | (_, Some(_)) => Some(arguments(input.as_deref())?),
                    _ => None,
                };
                let body = json!({
                    "action": action, "query": query, "workflow_type": workflow_type, "task_queue": task_queue,
                    "status": status, "reason": reason, "signal_name": signal, "input": input,
                    "rate_per_second": rate, "limit": limit, "request_id": request_id,
                });
                let mut counted = body.clone();
                counted["dry_run"] = json!(true);
                let matched = client.call(Method::POST, "/batch-operations", Some(counted)).await?;
                if dry_run {
                    print(output, &matched, &["action", "matched"], None);
                    return Ok(());
                }
                let created = client.call(Method::POST, "/batch-operations", Some(body)).await?;
                match follow {
                    true => follow_to_end(&client, output, &created, matched["matched"].as_u64()).await,
                    false => {
                        print(output, &created, &COLUMNS, None);
                        Ok(())
                    }
                }
            }
            BatchCommand::List { limit } => {
                let listed = client.call(Method::GET, &format!("/batch-operations?limit={limit}"), None).await?;
                print(output, &listed, &COLUMNS, Some("batch_operations"));
                Ok(())
            }
            BatchCommand::Describe { batch_id, follow } => {
                let batch = client
                    .call(Method::GET, &format!("/batch-operations/{}", encode(&batch_id)), None)
                    .await?;
                match follow {
                    true => follow_to_end(&client, output, &batch, None).await,
                    false => {
                        print(output, &batch, &COLUMNS, None);
                        Ok(())
                    }
                }
            }
            BatchCommand::Cancel { batch_id } => {
                let path = format!("/batch-operations/{}/cancel", encode(&batch_id));
                let batch = client.call(Method::POST, &path, Some(json!({}))).await?;
                print(output, &batch, &COLUMNS, None);
                Ok(())
            }
        }
    })
}

/// Polls the batch until it ends, with a progress bar sized by the runs it selected (a
/// spinner when that is not known), then prints it as it ended.
async fn follow_to_end(client: &Client, output: Output, batch: &Value, expected: Option<u64>) -> Result<(), String> {
    let batch_id = batch["batch_id"].as_str().unwrap_or_default().to_string();
    let bar = match (output, expected) {
        (Output::Json, _) => ProgressBar::hidden(),
        (Output::Table, Some(total)) => ProgressBar::new(total),
        (Output::Table, None) => ProgressBar::new_spinner(),
    };
    let style = ProgressStyle::with_template("{bar:40} {pos}/{len} runs ({per_sec}, {eta} left) {msg}").map_err(|e| e.to_string())?;
    if expected.is_some() {
        bar.set_style(style);
    }
    let mut current = batch.clone();
    loop {
        let matched = current["matched"].as_u64().unwrap_or(0);
        bar.set_position(matched);
        bar.set_message(format!(
            "{} done, {} skipped, {} failed",
            current["done"], current["skipped"], current["failed"]
        ));
        if current["state"] != "running" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        current = client
            .call(Method::GET, &format!("/batch-operations/{}", encode(&batch_id)), None)
            .await?;
    }
    bar.finish_and_clear();
    print(output, &current, &COLUMNS, None);
    Ok(())
}
