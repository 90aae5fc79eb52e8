//! `capstan import`: history bundles into a server by DW's embedded-v2 import
//! (`POST /api/workflows/import/embedded-v2`), from bundle files, directories of them, or a
//! running DW or Capstan server's list and export API. One run at a time, each import
//! idempotent (run id and dedupe key), so an interrupted import is simply run again; a
//! migration also keeps a progress file so a second run skips what the first finished.

use crate::cli::{Client, Connection, Output};
use clap::Args;
use reqwest::Method;
use serde_json::{json, Map, Value};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

const LIST_PAGE: usize = 100;

#[derive(Args)]
pub struct ImportArgs {
    /// Bundle files (`durable-workflow.v2.history-export` JSON), or directories whose `*.json`
    /// files are imported in name order.
    paths: Vec<PathBuf>,
    /// Migrate from a running DW or Capstan server at this base URL: page its workflow list
    /// and import every run of every workflow, oldest run first.
    #[arg(long, conflicts_with = "paths")]
    from: Option<String>,
    /// Bearer token for the source server.
    #[arg(long, env = "CAPSTAN_IMPORT_FROM_TOKEN", hide_env_values = true, requires = "from")]
    from_token: Option<String>,
    /// The source server's namespace (default: the target's `--namespace`).
    #[arg(long, requires = "from")]
    from_namespace: Option<String>,
    /// Where a migration records the runs it finished; a second run skips them.
    #[arg(long, default_value = "capstan-import-progress.json", requires = "from")]
    progress: PathBuf,
    /// Check every bundle and report what would be imported; write nothing.
    #[arg(long)]
    dry_run: bool,
    /// HMAC key the bundles' `integrity.signature` is checked with.
    #[arg(long, hide_env_values = true, env = "CAPSTAN_IMPORT_SIGNING_KEY")]
    signing_key: Option<String>,
    /// Refuse bundles whose signature is not verified with `--signing-key`.
    #[arg(long)]
    require_signature: bool,
}

/// What the runs imported so far came to.
#[derive(Default)]
struct Tally(BTreeMap<String, usize>);

impl Tally {
    fn count(&mut self, status: &str) {
        *self.0.entry(status.to_string()).or_default() += 1;
    }

    fn refused(&self) -> usize {
        self.0.get("rejected").copied().unwrap_or(0)
    }

    fn summary(&self) -> String {
        let parts: Vec<String> = self.0.iter().map(|(status, n)| format!("{n} {status}")).collect();
        if parts.is_empty() {
            "nothing to import".into()
        } else {
            parts.join(", ")
        }
    }
}

pub fn run(connection: Connection, args: ImportArgs) -> ExitCode {
    let runtime = tokio::runtime::Runtime::new().expect("start the tokio runtime");
    let output = connection.output;
    let namespace = connection.namespace.clone();
    let target = Client::new(connection);
    let result = runtime.block_on(async {
        let mut tally = Tally::default();
        match &args.from {
            Some(url) => migrate(&target, &args, url, &namespace, output, &mut tally).await?,
            None if args.paths.is_empty() => return Err("name bundle files or directories, or --from a server".to_string()),
            None => {
                for file in bundle_files(&args.paths)? {
                    let text = std::fs::read_to_string(&file).map_err(|e| format!("cannot read {}: {e}", file.display()))?;
                    let label = file.display().to_string();
                    match serde_json::from_str::<Value>(&text) {
                        Ok(Value::Object(bundle)) => {
                            import_one(&target, &args, bundle, &label, output, &mut tally).await?;
                        }
                        _ => {
                            eprintln!("rejected  {label}: not a JSON object");
                            tally.count("rejected");
                        }
                    }
                }
            }
        }
        Ok(tally)
    });
    match result {
        Ok(tally) => {
            if output == Output::Table {
                println!("{}", tally.summary());
            }
            if tally.refused() > 0 {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(message) => {
            eprintln!("capstan: {message}");
            ExitCode::from(2)
        }
    }
}

/// The bundle files `paths` name, directories expanded to their `*.json` files in name order.
fn bundle_files(paths: &[PathBuf]) -> Result<Vec<PathBuf>, String> {
    let mut files = Vec::new();
    for path in paths {
        if path.is_dir() {
            let mut found: Vec<PathBuf> = std::fs::read_dir(path)
                .map_err(|e| format!("cannot read {}: {e}", path.display()))?
                .filter_map(|entry| entry.ok().map(|e| e.path()))
                .filter(|p| p.is_file() && p.extension().is_some_and(|x| x == "json"))
                .collect();
            found.sort();
            files.extend(found);
        } else if path.is_file() {
            files.push(path.clone());
        } else {
            return Err(format!("{} is neither a file nor a directory", path.display()));
        }
    }
    Ok(files)
}

/// Imports one bundle and prints what became of it; returns its report's status.
async fn import_one(
    target: &Client,
    args: &ImportArgs,
    bundle: Map<String, Value>,
    label: &str,
    output: Output,
    tally: &mut Tally,
) -> Result<String, String> {
    let body = json!({
        "bundle": bundle, "dry_run": args.dry_run,
        "signing_key": args.signing_key, "require_signature": args.require_signature,
    });
    let (status, report) = target.exchange(Method::POST, "/workflows/import/embedded-v2", Some(body)).await?;
    let outcome = match report["status"].as_str() {
        Some(outcome) if report["schema"] == "durable-workflow.v2.embedded-v2-import.report" => outcome.to_string(),
        // Not an import report: the server refused the request itself (auth, size, a field).
        _ => {
            return Err(format!(
                "{label}: {status} {}: {}",
                report["reason"].as_str().unwrap_or("error"),
                report["message"].as_str().unwrap_or("")
            ))
        }
    };
    tally.count(&outcome);
    match output {
        Output::Json => println!("{}", json!({"source": label, "report": report})),
        Output::Table => {
            let workflow = &report["workflow"];
            let ids = format!(
                "{} {}",
                workflow["instance_id"].as_str().unwrap_or("-"),
                workflow["run_id"].as_str().unwrap_or("-")
            );
            let errors = report["eligibility"]["errors"].as_array().cloned().unwrap_or_default();
            match errors.first() {
                None => println!("{outcome:<16}  {ids}  ({label})"),
                Some(first) => println!(
                    "{outcome:<16}  {ids}  ({label}): {} — {}",
                    first["rule"].as_str().unwrap_or("-"),
                    first["message"].as_str().unwrap_or("")
                ),
            }
        }
    }
    Ok(outcome)
}

/// A migration's record of the runs it finished, kept after each one (written whole, then
/// renamed over the old one, so an interruption leaves the last complete record).
struct Progress {
    path: PathBuf,
    done: BTreeMap<String, String>,
}

impl Progress {
    fn load(path: &Path, source: &str, namespace: &str) -> Result<Self, String> {
        let done = match std::fs::read_to_string(path) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => BTreeMap::new(),
            Err(e) => return Err(format!("cannot read {}: {e}", path.display())),
            Ok(text) => {
                let saved: Value = serde_json::from_str(&text).map_err(|e| format!("{} is not a progress file: {e}", path.display()))?;
                if saved["source"] != source || saved["namespace"] != namespace {
                    return Err(format!(
                        "{} records a migration from {} ({}); name another --progress file",
                        path.display(),
                        saved["source"],
                        saved["namespace"]
                    ));
                }
                serde_json::from_value(saved["done"].clone()).unwrap_or_default()
            }
        };
        Ok(Self {
            path: path.to_path_buf(),
            done,
        })
    }

    fn finish(&mut self, source: &str, namespace: &str, run_id: &str, status: &str) -> Result<(), String> {
        self.done.insert(run_id.to_string(), status.to_string());
        let record = json!({"source": source, "namespace": namespace, "done": self.done});
        let partial = self.path.with_extension("partial");
        std::fs::write(&partial, record.to_string()).map_err(|e| format!("cannot write {}: {e}", partial.display()))?;
        std::fs::rename(&partial, &self.path).map_err(|e| format!("cannot write {}: {e}", self.path.display()))
    }
}

/// Pages the source's workflow list and imports every run of each workflow, oldest first.
async fn migrate(target: &Client, args: &ImportArgs, url: &str, namespace: &str, output: Output, tally: &mut Tally) -> Result<(), String> {
    let source_namespace = args.from_namespace.clone().unwrap_or_else(|| namespace.to_string());
    let source = Client::new(Connection {
        server: url.to_string(),
        namespace: source_namespace.clone(),
        token: args.from_token.clone(),
        output,
    });
    let mut progress = Progress::load(&args.progress, url, &source_namespace)?;
    let mut token: Option<String> = None;
    loop {
        let mut path = format!("/workflows?page_size={LIST_PAGE}");
        if let Some(token) = &token {
            path.push_str(&format!(
                "&next_page_token={}",
                percent_encoding::utf8_percent_encode(token, percent_encoding::NON_ALPHANUMERIC)
            ));
        }
        let page = source.call(Method::GET, &path, None).await?;
        for workflow in page["workflows"].as_array().into_iter().flatten() {
            let Some(workflow_id) = workflow["workflow_id"].as_str() else {
                continue;
            };
            let encoded = percent_encoding::utf8_percent_encode(workflow_id, percent_encoding::NON_ALPHANUMERIC).to_string();
            let runs = source.call(Method::GET, &format!("/workflows/{encoded}/runs"), None).await?;
            let mut runs: Vec<&Value> = runs["runs"].as_array().into_iter().flatten().collect();
            runs.sort_by_key(|run| run["run_number"].as_u64().unwrap_or(0));
            for run in runs {
                let Some(run_id) = run["run_id"].as_str() else { continue };
                if progress.done.contains_key(run_id) {
                    tally.count("skipped (done before)");
                    continue;
                }
                let bundle = source
                    .call(Method::GET, &format!("/workflows/{encoded}/runs/{run_id}/history/export"), None)
                    .await?;
                let Value::Object(bundle) = bundle else {
                    return Err(format!("{url}: the export of {workflow_id} {run_id} is not a JSON object"));
                };
                let label = format!("{url} {workflow_id} {run_id}");
                let status = import_one(target, args, bundle, &label, output, tally).await?;
                if !args.dry_run && matches!(status.as_str(), "imported" | "already_imported") {
                    progress.finish(url, &source_namespace, run_id, &status)?;
                }
            }
        }
        match page["next_page_token"].as_str() {
            Some(next) if !next.is_empty() => token = Some(next.to_string()),
            _ => return Ok(()),
        }
    }
}
