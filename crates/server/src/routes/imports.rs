//! `POST /api/workflows/import/embedded-v2`: DW's embedded-v2 import of a history-export bundle
//! (`capstan_engine::import`), answered with DW's import report.

use crate::auth::Caller;
use crate::body::JsonObject;
use crate::error::{ApiError, ApiResult};
use crate::planes::Namespace;
use crate::wire::history_bundle;
use crate::wire::{refuse_unknown_fields, Fields};
use crate::{render, Shared};
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use capstan_app::imports::{import_run, ImportRequest, ImportVerdict};
use capstan_engine::import::{self, Finding};
use capstan_engine::{Reason, RunState};
use capstan_store::Store;
use serde_json::{json, Map, Value};

const OPTIONS: &[&str] = &["bundle", "dry_run", "namespace", "import_id", "signing_key", "require_signature"];

/// The request's options; the body is `{bundle, …options}`, or the bundle itself.
struct Options {
    bundle: Map<String, Value>,
    dry_run: bool,
    import_id: Option<String>,
    signing_key: Option<String>,
    require_signature: bool,
}

fn options(mut body: Map<String, Value>, namespace: &str) -> ApiResult<Options> {
    if body.contains_key("schema") {
        return Ok(Options {
            bundle: body,
            dry_run: false,
            import_id: None,
            signing_key: None,
            require_signature: false,
        });
    }
    refuse_unknown_fields(&body, &[OPTIONS], "", "an embedded-v2 import")?;
    let f = Fields::new(&body);
    let dry_run = f.opt_bool("dry_run")?.unwrap_or(false);
    let require_signature = f.opt_bool("require_signature")?.unwrap_or(false);
    let import_id = f.opt_str("import_id", 128)?;
    if import_id
        .as_deref()
        .is_some_and(|id| !capstan_engine::ids::valid_client_name(id, 128))
    {
        return Err(ApiError::validation(
            "import_id",
            "The import_id may only contain letters, digits, '.', '_', ':' and '-'.",
        ));
    }
    let signing_key = f.opt_str("signing_key", 4096)?;
    if let Some(target) = f.opt_str("namespace", 255)? {
        if target.to_lowercase() != namespace {
            return Err(ApiError::validation(
                "namespace",
                format!("The import goes to the request's namespace ({namespace}); send X-Namespace: {target} to import there."),
            ));
        }
    }
    let bundle = match body.remove("bundle") {
        Some(Value::Object(bundle)) => bundle,
        _ => {
            return Err(ApiError::validation(
                "bundle",
                "The bundle must be a durable-workflow.v2.history-export object.",
            ))
        }
    };
    Ok(Options {
        bundle,
        dry_run,
        import_id,
        signing_key,
        require_signature,
    })
}

pub async fn embedded_v2<S: Store>(
    State(state): State<Shared<S>>,
    Extension(Namespace(namespace)): Extension<Namespace>,
    Extension(caller): Extension<Caller>,
    JsonObject(body): JsonObject,
) -> ApiResult<Response> {
    let options = options(body, &namespace)?;
    let bundle = &options.bundle;
    let integrity = history_bundle::verify(bundle, options.signing_key.as_deref(), options.require_signature);
    let checksum = integrity.verified_checksum.clone().unwrap_or_default();
    let mut errors = Vec::new();
    if !integrity.errors.is_empty() {
        let rules: Vec<&str> = integrity.errors.iter().map(|f| f.rule.as_str()).collect();
        errors.push(Finding::new(
            "bundle.integrity_failed",
            format!("Bundle integrity verification failed ({}).", rules.join(", ")),
        ));
    }
    let verdict = match history_bundle::read_run(bundle, &namespace, &checksum, &state.config.limits) {
        Err(findings) => {
            errors.extend(findings);
            ImportVerdict::Rejected(errors)
        }
        Ok((run, in_flight)) => {
            let request = ImportRequest {
                run,
                in_flight,
                integrity_errors: errors,
                import_id: options.import_id.clone(),
                principal: Some(caller.principal.clone()),
                dry_run: options.dry_run,
            };
            import_run(&*state, request).await?
        }
    };
    let report = report(bundle, &namespace, &integrity.report, options.dry_run, &verdict);
    Ok(match &verdict {
        ImportVerdict::Imported(_) => (StatusCode::CREATED, Json(report)).into_response(),
        ImportVerdict::AlreadyImported(_) | ImportVerdict::DryRun(_) => (StatusCode::OK, Json(report)).into_response(),
        ImportVerdict::Rejected(errors) => refused(StatusCode::UNPROCESSABLE_ENTITY, Reason::ImportRejected, errors, report),
        ImportVerdict::Conflict(errors) => refused(StatusCode::CONFLICT, Reason::ImportRunConflict, errors, report),
    })
}

/// A refused import: DW's error shape (`reason`, `message`) around the whole report.
fn refused(status: StatusCode, reason: Reason, errors: &[Finding], mut report: Value) -> Response {
    let message = errors
        .first()
        .map_or_else(|| "The bundle was not imported.".to_string(), |f| f.message.clone());
    report["reason"] = json!(reason.as_str());
    report["message"] = json!(message);
    report["error"] = json!(message);
    (status, Json(report)).into_response()
}

/// DW's `durable-workflow.v2.embedded-v2-import.report`.
fn report(bundle: &Map<String, Value>, namespace: &str, integrity: &Value, dry_run: bool, verdict: &ImportVerdict) -> Value {
    let workflow = bundle.get("workflow").cloned().unwrap_or(Value::Null);
    let errors: &[Finding] = match verdict {
        ImportVerdict::Rejected(errors) | ImportVerdict::Conflict(errors) => errors,
        _ => &[],
    };
    let mut report = json!({
        "schema": import::REPORT_SCHEMA,
        "schema_version": import::REPORT_SCHEMA_VERSION,
        "contract_version": import::CONTRACT_VERSION,
        "source": import::IMPORT_SOURCE,
        "dry_run": dry_run,
        "workflow": {
            "instance_id": workflow.get("instance_id"),
            "run_id": workflow.get("run_id"),
            "run_number": workflow.get("run_number"),
            "workflow_type": workflow.get("workflow_type"),
            "namespace": namespace,
            "source_namespace": workflow.get("namespace"),
            "source_runtime": workflow.get("source_runtime"),
            "status": workflow.get("status"),
            "is_current_run": workflow.get("is_current_run") == Some(&Value::Bool(true)),
            "history_complete": bundle.get("history_complete") == Some(&Value::Bool(true)),
            "dedupe_key": bundle.get("dedupe_key"),
        },
        "eligibility": {"eligible": errors.is_empty(), "errors": errors, "warnings": []},
        "integrity": integrity,
        "rollback": {"mode": "database_transaction", "partial_import_behavior": "no_rows_committed_on_failure"},
        "status": verdict.status(),
        "import_id": null,
        "imported_at": null,
        "rows": {"workflow_runs": 0, "workflow_history_events": 0},
    });
    let written = |run: &RunState| json!({"workflow_runs": 1, "workflow_history_events": run.last_sequence});
    match verdict {
        ImportVerdict::Imported(run) | ImportVerdict::AlreadyImported(run) => {
            let stamp = run.import.as_ref();
            report["import_id"] = json!(stamp.map(|s| &s.import_id));
            report["imported_at"] = stamp.map_or(Value::Null, |s| render::time(s.imported_at));
            if matches!(verdict, ImportVerdict::Imported(_)) {
                report["rows"] = written(run);
            }
            report["run"] = imported_run(run);
        }
        ImportVerdict::DryRun(run) => {
            report["rows"] = written(run);
            report["run"] = imported_run(run);
        }
        _ => {}
    }
    report
}

/// Where the imported run stands here: its chain starts from the bundle's checksum.
fn imported_run(run: &RunState) -> Value {
    json!({
        "workflow_id": run.workflow_id,
        "run_id": run.run_id,
        "run_number": run.run_number,
        "status": run.status.as_str(),
        "closed_reason": run.closed_reason.map(|r| r.as_str()),
        "last_history_sequence": run.last_sequence,
        "history_chain_origin": run.chain_origin,
        "history_head_hash": run.last_hash,
    })
}

/// `cluster/info.embedded_v2_import_contract`: DW's manifest of the import, as Capstan honours it.
pub fn contract_manifest() -> Value {
    json!({
        "schema": import::CONTRACT_SCHEMA,
        "version": import::CONTRACT_VERSION,
        "history_export": {
            "schema": import::BUNDLE_SCHEMA,
            "schema_version": 1,
            "server_endpoint": "GET /api/workflows/{workflowId}/runs/{runId}/history/export",
        },
        "import": {
            "report_schema": import::REPORT_SCHEMA,
            "report_schema_version": import::REPORT_SCHEMA_VERSION,
            "command": "capstan import {bundle|directory}",
            "server_endpoint": "POST /api/workflows/import/embedded-v2",
            "options": OPTIONS,
            "idempotency": "workflow_run_id plus import_dedupe_key",
        },
        "eligibility": {
            "supported_source_runtimes": import::SOURCE_RUNTIMES,
            "required_bundle_schema": import::BUNDLE_SCHEMA,
            "required_bundle_schema_version": 1,
            "v1_history": "out_of_scope",
            "terminal_run_rules": {"history_complete_must_be_true": true, "may_import_non_current_runs_for_visibility": true},
            "live_run_rules": {
                "non_terminal_runs_must_be_current": true,
                "leased_workflow_or_activity_tasks": "rejected",
                "running_activity_attempts": "rejected",
                "non_terminal_runs_from_capstan": "continued from the carried capstan_run_state, checked against the history",
                "non_terminal_runs_from_embedded": "rebuilt from the history and the activities, tasks and signals sections; refused by name (workflow.open_feature_unsupported) where the history uses children, service calls, message streams, cooperative cancellation, selection cancels, worker sessions, prepared local activities or an update not yet handled",
            },
            "rejected": ["redacted_payloads", "external_storage_payloads", "unknown_event_types", "leased_tasks", "running_activity_attempts"],
        },
        "source_of_truth": {
            "history_events": "copied exactly (ids, types, payloads, recorded_at to the millisecond) and re-chained from the bundle checksum",
            "bundle_integrity": "json-recursive-ksort-v1 sha256 checksum verified; hmac-sha256 signature when signing_key is given",
        },
        "failure_and_rollback": {
            "transaction": "the instance, run and history are written in one database transaction",
            "retry_same_bundle": "returns already_imported when run_id and import_dedupe_key match",
            "conflicting_existing_run": "rejected before writing any rows (409 import_run_conflict)",
        },
        "visibility_and_audit": {
            "detail_fields": ["engine_source", "import_source", "import_id", "import_dedupe_key", "import_contract_version", "imported_at"],
            "summary_engine_source": import::ENGINE_SOURCE,
        },
    })
}
