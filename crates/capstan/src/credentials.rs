//! `capstan credentials …`: how a secret is written in a credentials file, and the named
//! credentials an admin manages over the API (a new secret is printed once, never again).

use crate::cli::{finish, print, Client, Connection, Output};
use crate::ops::encode;
use clap::Subcommand;
use reqwest::Method;
use serde_json::{json, Value};
use std::process::ExitCode;

#[derive(Subcommand)]
pub enum CredentialsCommand {
    /// Read a secret from standard input (one line) and print it as a credentials file stores
    /// it (`sha256:<hex>`). The secret itself is never printed.
    Hash,
    /// Every named credential: the file's and those managed over the API (admin).
    List,
    /// One credential: its grants, its secrets' ids and who changed it.
    Show { principal: String },
    /// A new credential with a generated secret, printed once.
    Create {
        principal: String,
        /// worker, operator or admin (repeat for several).
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// Bind it to a namespace (repeat for several); no --bind: every namespace.
        #[arg(long = "bind", value_name = "NAMESPACE")]
        namespaces: Vec<String>,
    },
    /// Replace a credential's roles and namespaces.
    Grant {
        principal: String,
        #[arg(long = "role", required = true)]
        roles: Vec<String>,
        /// Bind it to a namespace (repeat for several); no --bind: every namespace.
        #[arg(long = "bind", value_name = "NAMESPACE")]
        namespaces: Vec<String>,
    },
    /// A new secret beside the others (a rotation's first half), printed once.
    AddSecret { principal: String },
    /// Retire a secret (a rotation's second half); it stops authenticating.
    RemoveSecret { principal: String, secret_id: String },
    /// Delete a credential: none of its secrets authenticates any more.
    Delete { principal: String },
    /// The audit trail of the credentials managed over the API, newest first: every change, who
    /// made it, the grants it left (admin).
    Events {
        /// Only this principal's.
        principal: Option<String>,
        /// How many (1 to 500).
        #[arg(long, default_value_t = 50)]
        limit: u32,
    },
}

const EVENT_COLUMNS: [&str; 6] = ["sequence", "recorded_at", "action", "principal", "secret_id", "by"];

/// The trail as a table shows it: who made each change by id (`server` when none did).
fn events_table(answer: &Value) -> Value {
    let events: Vec<Value> = answer["events"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|event| {
            let mut row = event.clone();
            row["by"] = json!(event["by"]["id"].as_str().unwrap_or("server"));
            row
        })
        .collect();
    json!({"events": events})
}

const COLUMNS: [&str; 6] = ["principal", "source", "roles", "namespaces", "secret_count", "updated_at"];

fn grants(roles: Vec<String>, namespaces: Vec<String>) -> Value {
    let namespaces = if namespaces.is_empty() { Value::Null } else { json!(namespaces) };
    json!({"roles": roles, "namespaces": namespaces})
}

fn path(principal: &str) -> String {
    format!("/auth/credentials/{}", encode(principal))
}

/// Prints a change that made a secret; the secret goes to standard output once.
fn print_secret(output: Output, answer: &Value) {
    if output == Output::Json {
        print(output, answer, &COLUMNS, None);
        return;
    }
    print(output, &answer["credential"], &COLUMNS, None);
    println!("secret_id: {}", answer["secret"]["secret_id"].as_str().unwrap_or(""));
    println!("token:     {}", answer["secret"]["token"].as_str().unwrap_or(""));
    eprintln!("capstan: store the token now; it is not shown again.");
}

pub fn run(connection: Connection, command: CredentialsCommand) -> ExitCode {
    if let CredentialsCommand::Hash = command {
        return hash();
    }
    let output = connection.output;
    let client = Client::new(connection);
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    finish(runtime.block_on(async {
        match command {
            CredentialsCommand::Hash => unreachable!("answered above"),
            CredentialsCommand::List => {
                let listed = client.call(Method::GET, "/auth/credentials", None).await?;
                print(output, &listed, &COLUMNS, Some("credentials"));
            }
            CredentialsCommand::Show { principal } => {
                let shown = client.call(Method::GET, &path(&principal), None).await?;
                print(output, &shown, &COLUMNS, None);
                if output == Output::Table {
                    for secret in shown["secrets"].as_array().into_iter().flatten() {
                        let by = secret["created_by"]["id"].as_str().unwrap_or("server");
                        println!("  secret {}  created {} by {by}", secret["secret_id"], secret["created_at"]);
                    }
                }
            }
            CredentialsCommand::Create {
                principal,
                roles,
                namespaces,
            } => {
                let mut body = grants(roles, namespaces);
                body["principal"] = json!(principal);
                let created = client.call(Method::POST, "/auth/credentials", Some(body)).await?;
                print_secret(output, &created);
            }
            CredentialsCommand::Grant {
                principal,
                roles,
                namespaces,
            } => {
                let changed = client.call(Method::PUT, &path(&principal), Some(grants(roles, namespaces))).await?;
                print(output, &changed, &COLUMNS, None);
            }
            CredentialsCommand::AddSecret { principal } => {
                let added = client.call(Method::POST, &format!("{}/secrets", path(&principal)), None).await?;
                print_secret(output, &added);
            }
            CredentialsCommand::RemoveSecret { principal, secret_id } => {
                let at = format!("{}/secrets/{}", path(&principal), encode(&secret_id));
                let changed = client.call(Method::DELETE, &at, None).await?;
                print(output, &changed, &COLUMNS, None);
            }
            CredentialsCommand::Delete { principal } => {
                let deleted = client.call(Method::DELETE, &path(&principal), None).await?;
                print(output, &deleted, &COLUMNS, None);
            }
            CredentialsCommand::Events { principal, limit } => {
                let mut at = format!("/auth/credential-events?limit={limit}");
                if let Some(principal) = principal {
                    at.push_str(&format!("&principal={}", encode(&principal)));
                }
                let trail = client.call(Method::GET, &at, None).await?;
                match output {
                    Output::Json => print(output, &trail, &EVENT_COLUMNS, Some("events")),
                    Output::Table => print(output, &events_table(&trail), &EVENT_COLUMNS, Some("events")),
                }
            }
        }
        Ok(())
    }))
}

fn hash() -> ExitCode {
    let mut secret = String::new();
    if let Err(error) = std::io::stdin().read_line(&mut secret) {
        eprintln!("capstan: cannot read the secret: {error}");
        return ExitCode::from(2);
    }
    let secret = secret.trim_end_matches(['\r', '\n']);
    if secret.len() < 16 {
        eprintln!("capstan: a secret must be at least 16 characters (use a random one, e.g. `openssl rand -hex 32`)");
        return ExitCode::from(2);
    }
    println!("{}", capstan_server::auth::stored_form(secret));
    ExitCode::SUCCESS
}
