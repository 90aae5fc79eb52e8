//! `capstan serve --config FILE`: every `serve` flag as a TOML key (its long name in snake case:
//! `listen`, `data_dir`, `workflow_task_lease_seconds`, …). A flag on the command line wins over
//! its environment variable, which wins over the file, which wins over the default.
//!
//! The file's settings become command-line arguments for the flags that neither the command line
//! nor the environment set, so clap checks them exactly as it checks flags (ranges, choices).
//! A key that names no flag is refused: a misspelt setting must never be quietly ignored.

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};
use std::collections::BTreeSet;
use std::ffi::OsString;
use std::path::Path;

/// Settings that only make sense on the command line.
const NOT_IN_FILE: [&str; 2] = ["config", "check_config"];

/// `argv` with the config file's settings added, and the names of the settings the file gave.
/// Without `serve` or without a config file, `argv` unchanged.
pub fn with_file_settings(command: Command, argv: Vec<OsString>) -> Result<(Vec<OsString>, BTreeSet<String>), String> {
    // A parse that fails is reported by the real parse, with clap's own message.
    let Ok(matches) = command.clone().try_get_matches_from(&argv) else {
        return Ok((argv, BTreeSet::new()));
    };
    let Some(("serve", serve)) = matches.subcommand() else {
        return Ok((argv, BTreeSet::new()));
    };
    let Some(path) = serve.get_one::<std::path::PathBuf>("config") else {
        return Ok((argv, BTreeSet::new()));
    };
    let text = std::fs::read_to_string(path).map_err(|e| format!("--config {}: {e}", path.display()))?;
    let serve_command = command.find_subcommand("serve").expect("the serve subcommand").clone();
    let settings = settings(&serve_command, serve, path, &text)?;
    let from_file = settings.iter().map(|(id, _)| id.clone()).collect();
    let position = argv
        .iter()
        .position(|arg| arg == "serve")
        .expect("a parsed serve subcommand is on the command line");
    let mut out = argv[..=position].to_vec();
    out.extend(settings.into_iter().map(|(_, arg)| arg));
    out.extend_from_slice(&argv[position + 1..]);
    Ok((out, from_file))
}

/// The file's settings as `(id, --flag=value)`, for flags the command line and environment
/// left at their defaults.
fn settings(serve: &Command, matches: &ArgMatches, path: &Path, text: &str) -> Result<Vec<(String, OsString)>, String> {
    let table: toml::Table = text.parse().map_err(|e| format!("--config {}: {e}", path.display()))?;
    let known: Vec<&str> = serve
        .get_arguments()
        .filter(|arg| arg.get_long().is_some())
        .map(|arg| arg.get_id().as_str())
        .filter(|id| !NOT_IN_FILE.contains(id))
        .collect();
    let mut out = Vec::new();
    for (key, value) in &table {
        if !known.contains(&key.as_str()) {
            return Err(format!(
                "--config {}: unknown setting `{key}` (settings: {})",
                path.display(),
                known.join(", ")
            ));
        }
        let given = matches!(matches.value_source(key), Some(ValueSource::CommandLine | ValueSource::EnvVariable));
        if given {
            continue;
        }
        let arg = serve
            .get_arguments()
            .find(|arg| arg.get_id() == key.as_str())
            .expect("a known setting");
        let long = arg.get_long().expect("a known setting has a long flag");
        let repeatable = matches!(arg.get_action(), clap::ArgAction::Append);
        // A repeatable flag takes a list (the flag once per item); a table is its JSON (a
        // task queue limit).
        let items = match value {
            toml::Value::Array(items) if repeatable => items.iter().collect(),
            single => vec![single],
        };
        for item in items {
            let value = match item {
                toml::Value::String(text) => text.clone(),
                toml::Value::Integer(number) => number.to_string(),
                toml::Value::Boolean(flag) => flag.to_string(),
                toml::Value::Table(table) if repeatable => {
                    serde_json::to_string(table).map_err(|e| format!("--config {}: `{key}`: {e}", path.display()))?
                }
                other if repeatable => {
                    return Err(format!(
                        "--config {}: `{key}` must be a table, a string or a list of them, not {}",
                        path.display(),
                        other.type_str()
                    ))
                }
                other => {
                    return Err(format!(
                        "--config {}: `{key}` must be a string, an integer or a boolean, not {}",
                        path.display(),
                        other.type_str()
                    ))
                }
            };
            out.push((key.clone(), OsString::from(format!("--{long}={value}"))));
        }
    }
    Ok(out)
}

/// The effective `serve` settings as a config file would hold them, each with where it came
/// from; secrets masked. What `--check-config` prints.
pub fn effective(serve: &Command, matches: &ArgMatches, from_file: &BTreeSet<String>, mask: impl Fn(&str, &str) -> String) -> String {
    let mut out = String::new();
    for arg in serve.get_arguments().filter(|arg| arg.get_long().is_some()) {
        let id = arg.get_id().as_str();
        if NOT_IN_FILE.contains(&id) {
            continue;
        }
        let source = if from_file.contains(id) {
            "config file"
        } else {
            match matches.value_source(id) {
                Some(ValueSource::CommandLine) => "flag",
                Some(ValueSource::EnvVariable) => "environment",
                Some(ValueSource::DefaultValue) => "default",
                _ => "unset",
            }
        };
        if matches!(arg.get_action(), clap::ArgAction::Append) {
            let values: Vec<String> = matches
                .get_raw(id)
                .into_iter()
                .flatten()
                .map(|raw| toml::Value::String(mask(id, &raw.to_string_lossy())).to_string())
                .collect();
            if values.is_empty() {
                out.push_str(&format!("# {id} = (unset)\n"));
            } else {
                out.push_str(&format!("{id} = [{}]  # {source}\n", values.join(", ")));
            }
            continue;
        }
        let Some(raw) = matches.get_raw(id).and_then(|mut values| values.next()) else {
            out.push_str(&format!("# {id} = (unset)\n"));
            continue;
        };
        let value = mask(id, &raw.to_string_lossy());
        let rendered = if value.parse::<i64>().is_ok() {
            value
        } else {
            toml::Value::String(value).to_string()
        };
        out.push_str(&format!("{id} = {rendered}  # {source}\n"));
    }
    out
}
