//! Wire JSON → engine types, by hand. Every malformed field becomes a `422 validation_failed`
//! naming the field; nothing here panics on input.

use crate::error::{ApiError, ApiResult};
use axum::http::StatusCode;
use capstan_engine::*;
use serde_json::{Map, Value};

pub mod bundle_sections;
mod fields;
pub mod history_bundle;
pub(crate) mod nexus;
pub(crate) mod streams;
pub mod worker_report;

pub use fields::{refuse_unknown_fields, Fields};

pub(crate) fn step_tags(command: &Map<String, Value>) -> StepTags {
    capstan_engine::step_tags_of(command)
}

/// Commands this server applies; anything else is `invalid_commands`.
pub const SUPPORTED_COMMANDS: &[&str] = &[
    "complete_workflow",
    "fail_workflow",
    "schedule_activity",
    "start_timer",
    "record_side_effect",
    "record_version_marker",
    "upsert_search_attributes",
    "open_condition_wait",
    "open_signal_wait",
    "continue_as_new",
    "upsert_memo",
    "complete_update",
    "fail_update",
    "start_child_workflow",
    "start_service_operation",
    "record_local_activity",
    "cancel_selection_operation",
];

fn invalid_commands(message: impl Into<String>) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, Reason::InvalidCommands, message)
        .with("outcome", "rejected")
        .with("recorded", false)
}

/// Parses `commands[]` of a workflow task completion.
pub fn parse_commands(list: Option<&Value>, limits: &Limits) -> ApiResult<Vec<WorkflowCommand>> {
    let Some(Value::Array(items)) = list else {
        return Err(ApiError::validation("commands", "The commands field must be a non-empty list."));
    };
    if items.is_empty() {
        return Err(ApiError::validation("commands", "The commands field must be a non-empty list."));
    }
    let mut commands = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Value::Object(map) = item else {
            return Err(ApiError::validation(
                &format!("commands.{index}"),
                "Each command must be an object.",
            ));
        };
        commands.push(parse_command(map, index, limits)?);
    }
    Ok(commands)
}

/// One command of a list, at `commands.{index}`.
pub(crate) fn parse_command_at(map: &Map<String, Value>, index: usize, limits: &Limits) -> ApiResult<WorkflowCommand> {
    parse_command(map, index, limits)
}

fn parse_command(map: &Map<String, Value>, index: usize, limits: &Limits) -> ApiResult<WorkflowCommand> {
    let f = Fields::nested(map, format!("commands.{index}."));
    let kind = f.req_str("type", 64)?;
    let tags = step_tags(map);
    check_command_fields(map, &kind, index)?;
    let max_delay = limits.delay_seconds_max;
    Ok(match kind.as_str() {
        "schedule_activity" => WorkflowCommand::ScheduleActivity(parse_schedule_activity(&f, index, limits, tags)?),
        "start_timer" => WorkflowCommand::StartTimer {
            delay_seconds: f.req_int("delay_seconds", 0, max_delay)?,
            tags,
        },
        "open_condition_wait" => WorkflowCommand::OpenConditionWait {
            condition_key: f.opt_str("condition_key", 255)?,
            fingerprint: f.opt_str("condition_definition_fingerprint", 255)?,
            timeout_seconds: f.opt_int("timeout_seconds", 0, max_delay)?,
            occurrence_id: f.opt_str("condition_wait_occurrence_id", 255)?,
            tags,
        },
        "open_signal_wait" => WorkflowCommand::OpenSignalWait {
            signal_name: f.req_str("signal_name", 255)?,
            timeout_seconds: f.opt_int("timeout_seconds", 0, max_delay)?,
            tags,
        },
        "record_side_effect" => WorkflowCommand::RecordSideEffect {
            result: f
                .opt_payload("result", limits)?
                .ok_or_else(|| ApiError::validation(&format!("commands.{index}.result"), "The result field is required."))?,
            tags,
            stream: streams::parse_directive(map, index, limits)?,
        },
        "record_version_marker" => WorkflowCommand::RecordVersionMarker {
            change_id: f.req_str("change_id", 255)?,
            version: f.req_int("version", i64::MIN, i64::MAX)?,
            min_supported: f.req_int("min_supported", i64::MIN, i64::MAX)?,
            max_supported: f.req_int("max_supported", i64::MIN, i64::MAX)?,
            tags,
        },
        "upsert_search_attributes" => WorkflowCommand::UpsertSearchAttributes {
            attributes: f
                .opt_object("attributes")?
                .cloned()
                .ok_or_else(|| ApiError::validation(&format!("commands.{index}.attributes"), "The attributes field is required."))?,
            attribute_types: parse_attribute_types(&f, index)?,
            tags,
        },
        "complete_workflow" => WorkflowCommand::CompleteWorkflow {
            result: f
                .opt_payload("result", limits)?
                .unwrap_or_else(|| Payload::avro(crate::avro::null_blob())),
        },
        "start_child_workflow" => WorkflowCommand::StartChildWorkflow(parse_start_child(&f, index, limits, tags)?),
        "start_service_operation" => WorkflowCommand::StartServiceOperation(nexus::parse_service_operation(map, &f, index, limits, tags)?),
        "record_local_activity" => WorkflowCommand::RecordLocalActivity(parse_local_activity(map, index, limits, tags)?),
        "cancel_selection_operation" => WorkflowCommand::CancelSelectionOperation(parse_selection_cancel(map, &f, index, &tags)?),
        "complete_update" => WorkflowCommand::CompleteUpdate {
            update_id: f.req_str("update_id", 255)?,
            result: f
                .opt_payload("result", limits)?
                .unwrap_or_else(|| Payload::avro(crate::avro::null_blob())),
        },
        "fail_update" => WorkflowCommand::FailUpdate {
            update_id: f.req_str("update_id", 255)?,
            failure: parse_workflow_failure(&f)?,
        },
        "upsert_memo" => WorkflowCommand::UpsertMemo {
            entries: f
                .opt_payload("entries", limits)?
                .ok_or_else(|| ApiError::validation(&format!("commands.{index}.entries"), "The entries field is required."))?,
            tags,
        },
        "continue_as_new" => WorkflowCommand::ContinueAsNew {
            arguments: f.arguments("arguments", limits)?,
            workflow_type: f.opt_str("workflow_type", 255)?,
            queue: f.opt_str("queue", 255)?,
            tags,
            observability_context: f.opt_trace("observability_context")?,
        },
        "fail_workflow" => WorkflowCommand::FailWorkflow(WorkflowFailure {
            boundary: parse_failure_boundary(&f, index)?,
            ..parse_workflow_failure(&f)?
        }),
        other => return Err(invalid_commands(format!("Command type {other:?} is not supported by this server."))),
    })
}

/// Every field each command type takes: each is honoured or recorded on its events (see
/// `docs/protocol-coverage.md`). Step commands also take the parallel-group and selection
/// fields (`STEP_TAG_FIELDS`). Anything else is refused, naming the field: a field accepted and
/// dropped would be lost on replay without anyone noticing.
const COMMAND_FIELDS: &[(&str, bool, &[&str])] = &[
    // (command type, takes STEP_TAG_FIELDS, its own fields besides `type`)
    (
        "schedule_activity",
        true,
        &[
            "activity_type",
            "arguments",
            "queue",
            "retry_policy",
            "start_to_close_timeout",
            "schedule_to_start_timeout",
            "schedule_to_close_timeout",
            "heartbeat_timeout",
            "cancellation_policy",
            "worker_session",
        ],
    ),
    (
        "record_local_activity",
        true,
        &[
            "activity_type",
            "arguments",
            "execution_mode",
            "outcome",
            "attempts",
            "result",
            "message",
            "exception_type",
            "non_retryable",
            "timeout_kind",
            "retry_policy",
            "start_to_close_timeout",
            "schedule_to_close_timeout",
            "heartbeat_timeout",
        ],
    ),
    ("start_timer", true, &["delay_seconds"]),
    (
        "open_condition_wait",
        true,
        &[
            "condition_key",
            "condition_definition_fingerprint",
            "timeout_seconds",
            "condition_wait_occurrence_id",
        ],
    ),
    ("open_signal_wait", true, &["signal_name", "timeout_seconds"]),
    ("record_side_effect", true, &["result", "workflow_stream"]),
    (
        "record_version_marker",
        true,
        &["change_id", "version", "min_supported", "max_supported"],
    ),
    ("upsert_search_attributes", true, &["attributes", "attribute_types"]),
    ("upsert_memo", true, &["entries"]),
    ("complete_workflow", false, &["result"]),
    (
        "fail_workflow",
        false,
        &[
            "message",
            "exception_type",
            "exception_class",
            "exception",
            "non_retryable",
            "failed_step_sequence",
            "failed_activity_execution_id",
        ],
    ),
    (
        "continue_as_new",
        true,
        &["arguments", "workflow_type", "queue", "observability_context"],
    ),
    (
        "start_child_workflow",
        true,
        &[
            "workflow_type",
            "arguments",
            "queue",
            "workflow_id",
            "parent_close_policy",
            "cancellation_policy",
            "execution_timeout_seconds",
            "run_timeout_seconds",
            "retry_policy",
            "observability_context",
        ],
    ),
    ("start_service_operation", true, nexus::SERVICE_OPERATION_FIELDS),
    ("complete_update", false, &["update_id", "result"]),
    (
        "fail_update",
        false,
        &[
            "update_id",
            "message",
            "exception_type",
            "exception_class",
            "exception",
            "non_retryable",
        ],
    ),
    (
        "cancel_selection_operation",
        false,
        &[
            "selection_group_id",
            "member_key",
            "member_index",
            "member_base_sequence",
            "member_size",
            "operation_kind",
            "operation_identity",
        ],
    ),
];

/// The fields of a retry policy, on every command that takes one.
pub(crate) const RETRY_POLICY_FIELDS: &[&str] = &["max_attempts", "backoff_seconds", "non_retryable_error_types"];

/// The fields of one attempt in a `record_local_activity`.
const LOCAL_ATTEMPT_FIELDS: &[&str] = &[
    "attempt_id",
    "attempt_number",
    "outcome",
    "duration_ms",
    "heartbeats",
    "message",
    "exception_type",
    "non_retryable",
    "timeout_kind",
    "retry_reason",
    "backoff_seconds",
];

/// Every field of a command is one its type takes, and so are the fields of its retry policy.
fn check_command_fields(map: &Map<String, Value>, kind: &str, index: usize) -> ApiResult<()> {
    let Some((_, tagged, fields)) = COMMAND_FIELDS.iter().find(|(name, _, _)| *name == kind) else {
        return Ok(()); // an unknown type is refused as such
    };
    let tags: &[&str] = if *tagged { STEP_TAG_FIELDS } else { &[] };
    let at = format!("commands.{index}.");
    let shared: &[&str] = if kind == "start_service_operation" {
        nexus::SHARED_CALL_FIELDS
    } else {
        &[]
    };
    refuse_unknown_fields(map, &[&["type"], fields, tags, shared], &at, &format!("{kind} commands"))?;
    if let Some(Value::Object(policy)) = map.get("retry_policy") {
        refuse_unknown_fields(policy, &[RETRY_POLICY_FIELDS], &format!("{at}retry_policy."), "retry policies")?;
    }
    Ok(())
}

fn parse_schedule_activity(f: &Fields, index: usize, limits: &Limits, tags: StepTags) -> ApiResult<ScheduleActivity> {
    let max_delay = limits.delay_seconds_max;
    let timeout = |key: &str| f.opt_int(key, 1, max_delay);
    let timeouts = ActivityTimeouts {
        start_to_close_seconds: timeout("start_to_close_timeout")?,
        schedule_to_start_seconds: timeout("schedule_to_start_timeout")?,
        schedule_to_close_seconds: timeout("schedule_to_close_timeout")?,
        heartbeat_seconds: timeout("heartbeat_timeout")?,
    };
    let le = |a: Option<i64>, b: Option<i64>, what: &str| match (a, b) {
        (Some(a), Some(b)) if a > b => Err(ApiError::validation(&format!("commands.{index}"), what.to_string())),
        _ => Ok(()),
    };
    le(
        timeouts.heartbeat_seconds,
        timeouts.start_to_close_seconds,
        "heartbeat_timeout must not exceed start_to_close_timeout.",
    )?;
    le(
        timeouts.start_to_close_seconds,
        timeouts.schedule_to_close_seconds,
        "start_to_close_timeout must not exceed schedule_to_close_timeout.",
    )?;
    le(
        timeouts.schedule_to_start_seconds,
        timeouts.schedule_to_close_seconds,
        "schedule_to_start_timeout must not exceed schedule_to_close_timeout.",
    )?;
    Ok(ScheduleActivity {
        activity_type: f.req_str("activity_type", 255)?,
        arguments: f.arguments("arguments", limits)?,
        queue: f.opt_str("queue", 255)?,
        retry_policy: f
            .opt_object("retry_policy")?
            .map(|p| parse_retry_policy(p, index, max_delay))
            .transpose()?,
        timeouts,
        cancellation_policy: f
            .opt_str("cancellation_policy", 64)?
            .map(|policy| {
                ActivityCancellationPolicy::parse(&policy).ok_or_else(|| {
                    ApiError::validation(
                        &format!("commands.{index}.cancellation_policy"),
                        "cancellation_policy must be try_cancel, wait_cancellation_completed or abandon.",
                    )
                })
            })
            .transpose()?,
        worker_session: f
            .opt_object("worker_session")?
            .map(|session| parse_session_requirement(session, index))
            .transpose()?,
        tags,
    })
}

/// `schedule_activity.worker_session`: the session options, kept as sent too (they are
/// replayed verbatim).
fn parse_session_requirement(options: &Map<String, Value>, index: usize) -> ApiResult<SessionRequirement> {
    Ok(SessionRequirement {
        options: parse_session_options(options, &format!("commands.{index}.worker_session."))?,
        as_sent: options.clone(),
    })
}

/// The fields of a worker session's options (`POST /worker/sessions` also takes `worker_id`).
pub const SESSION_OPTION_FIELDS: &[&str] = &[
    "session_id",
    "queue",
    "connection",
    "requirements",
    "lease_seconds",
    "ttl_seconds",
    "max_concurrent_activities",
    "create_if_missing",
    "allow_reacquire_after_failure",
];

/// Worker session options with DW's defaults (lease 120 s, TTL 1800 s, one activity at a time,
/// created if missing, reacquirable).
pub fn parse_session_options(map: &Map<String, Value>, prefix: &str) -> ApiResult<SessionOptions> {
    refuse_unknown_fields(map, &[SESSION_OPTION_FIELDS, &["worker_id"]], prefix, "worker session options")?;
    let f = Fields::nested(map, prefix.to_string());
    let defaults = SessionOptions::new(f.req_str("session_id", 255)?.trim());
    let seconds = |key: &str, default: i64| Ok::<_, ApiError>(f.opt_int(key, 1, 31_536_000)?.unwrap_or(default));
    let mut requirements = Vec::new();
    for requirement in f.string_list("requirements")? {
        let requirement = requirement.trim().to_string();
        if !requirement.is_empty() && !requirements.contains(&requirement) {
            requirements.push(requirement);
        }
    }
    Ok(SessionOptions {
        queue: f.opt_str("queue", 255)?.map(|q| q.trim().to_string()).filter(|q| !q.is_empty()),
        connection: f.opt_str("connection", 255)?,
        requirements,
        lease_seconds: seconds("lease_seconds", defaults.lease_seconds)?,
        ttl_seconds: seconds("ttl_seconds", defaults.ttl_seconds)?,
        max_concurrent_activities: f
            .opt_int("max_concurrent_activities", 1, 10_000)?
            .unwrap_or(defaults.max_concurrent_activities),
        create_if_missing: f.opt_bool("create_if_missing")?.unwrap_or(true),
        allow_reacquire_after_failure: f.opt_bool("allow_reacquire_after_failure")?.unwrap_or(true),
        ..defaults
    })
}

fn parse_start_child(f: &Fields, index: usize, limits: &Limits, tags: StepTags) -> ApiResult<StartChild> {
    let max_delay = limits.delay_seconds_max;
    let policy = |key: &str, allowed: &[&str]| -> ApiResult<String> {
        match f.opt_str(key, 64)? {
            None => Ok("abandon".into()),
            Some(value) if allowed.contains(&value.as_str()) => Ok(value),
            Some(value) => Err(ApiError::validation(
                &format!("commands.{index}.{key}"),
                format!("{key} {value:?} is not one of {allowed:?}."),
            )),
        }
    };
    let workflow_id = f.opt_str("workflow_id", 128)?;
    if workflow_id.as_deref().is_some_and(|id| !valid_workflow_id(id)) {
        return Err(ApiError::validation(
            &format!("commands.{index}.workflow_id"),
            "The child workflow_id is not a valid workflow id.",
        ));
    }
    let execution_timeout_seconds = f.opt_int("execution_timeout_seconds", 1, max_delay)?;
    let run_timeout_seconds = f.opt_int("run_timeout_seconds", 1, max_delay)?;
    if let (Some(run), Some(execution)) = (run_timeout_seconds, execution_timeout_seconds) {
        if run > execution {
            return Err(ApiError::validation(
                &format!("commands.{index}.run_timeout_seconds"),
                "run_timeout_seconds must not exceed execution_timeout_seconds.",
            ));
        }
    }
    Ok(StartChild {
        workflow_type: f.req_str("workflow_type", 255)?,
        arguments: f.arguments("arguments", limits)?,
        queue: f.opt_str("queue", 255)?,
        workflow_id,
        parent_close_policy: policy(
            "parent_close_policy",
            &["abandon", "terminate", "request_cancel", "request_cancellation"],
        )?,
        cancellation_policy: policy("cancellation_policy", &["abandon", "try_cancel", "wait_cancellation_completed"])?,
        execution_timeout_seconds,
        run_timeout_seconds,
        retry_policy: f
            .opt_object("retry_policy")?
            .map(|p| parse_retry_policy(p, index, max_delay))
            .transpose()?
            .filter(|p| p.max_attempts.is_some() || !p.backoff_seconds.is_empty() || !p.non_retryable_error_types.is_empty()),
        tags,
        observability_context: f.opt_trace("observability_context")?,
    })
}

fn parse_selection_cancel(map: &Map<String, Value>, f: &Fields, index: usize, tags: &StepTags) -> ApiResult<SelectionCancel> {
    if !tags.is_empty() {
        return Err(ApiError::validation(
            &format!("commands.{index}"),
            "cancel_selection_operation takes no parallel-group fields.",
        ));
    }
    let member_key = match map.get("member_key") {
        Some(Value::String(key)) if !key.is_empty() => Value::String(key.clone()),
        Some(Value::Number(n)) if n.as_u64().is_some() => Value::Number(n.clone()),
        _ => {
            return Err(ApiError::validation(
                &format!("commands.{index}.member_key"),
                "member_key must be a non-empty string or a non-negative integer.",
            ))
        }
    };
    Ok(SelectionCancel {
        selection_group_id: f.req_str("selection_group_id", 255)?,
        member_key,
        member_index: f.req_int("member_index", 0, 1000)? as u64,
        member_base_sequence: f.req_int("member_base_sequence", 1, u32::MAX as i64)? as u32,
        member_size: f.req_int("member_size", 1, 1000)? as u32,
        operation_kind: f.req_str("operation_kind", 32)?,
        operation_identity: f.req_str("operation_identity", 255)?.trim().to_string(),
    })
}

fn parse_workflow_failure(f: &Fields) -> ApiResult<WorkflowFailure> {
    Ok(WorkflowFailure {
        message: f.req_str("message", 1_000_000)?,
        exception_type: f.opt_str("exception_type", 1000)?,
        exception_class: f.opt_str("exception_class", 1000)?,
        exception: f.raw("exception").cloned(),
        non_retryable: f.opt_bool("non_retryable")?.unwrap_or(false),
        boundary: None,
    })
}

/// `fail_workflow.failed_step_sequence` and `failed_activity_execution_id`: sent together.
fn parse_failure_boundary(f: &Fields, index: usize) -> ApiResult<Option<FailureBoundary>> {
    let step = f.opt_int("failed_step_sequence", 1, u32::MAX as i64)?;
    let execution = f.opt_str("failed_activity_execution_id", 255)?;
    match (step, execution) {
        (None, None) => Ok(None),
        (Some(failed_step_sequence), Some(failed_activity_execution_id)) => Ok(Some(FailureBoundary {
            failed_step_sequence,
            failed_activity_execution_id,
        })),
        _ => Err(ApiError::validation(
            &format!("commands.{index}.failed_step_sequence"),
            "failed_step_sequence and failed_activity_execution_id go together.",
        )),
    }
}

/// `upsert_search_attributes.attribute_types`: a type name per upserted key.
fn parse_attribute_types(f: &Fields, index: usize) -> ApiResult<Option<Map<String, Value>>> {
    let Some(types) = f.opt_object("attribute_types")? else {
        return Ok(None);
    };
    for (key, value) in types {
        if !value.as_str().is_some_and(|name| !name.is_empty() && name.len() <= 64) {
            return Err(ApiError::validation(
                &format!("commands.{index}.attribute_types.{key}"),
                "Each attribute type must be a type name.",
            ));
        }
    }
    Ok(Some(types.clone()))
}

/// Attempts a local activity record may carry, and heartbeats across them (DW's bounds).
const LOCAL_ATTEMPTS_MAX: usize = 100;
const LOCAL_HEARTBEATS_MAX: usize = 1000;

/// `record_local_activity`: the worker's account of a local activity it already ran.
fn parse_local_activity(map: &Map<String, Value>, index: usize, limits: &Limits, tags: StepTags) -> ApiResult<LocalActivityRecord> {
    let at = |key: &str| format!("commands.{index}.{key}");
    let f = Fields::nested(map, at(""));
    let activity_type = f.req_str("activity_type", 255)?.trim().to_string();
    if activity_type.is_empty() {
        return Err(ApiError::validation(&at("activity_type"), "activity_type must not be blank."));
    }
    let arguments = f.arguments("arguments", limits)?;
    // Every local activity's events carry `execution_mode: local`; no other mode is a local one.
    if f.opt_str("execution_mode", 32)?.is_some_and(|mode| mode != "local") {
        return Err(ApiError::validation(
            &at("execution_mode"),
            "A record_local_activity's execution_mode is local.",
        ));
    }
    let mut echoed = Map::new();
    if let Some(policy) = f.opt_object("retry_policy")? {
        parse_retry_policy(policy, index, limits.delay_seconds_max)?;
        echoed.insert("retry_policy".into(), Value::Object(policy.clone()));
    }
    for key in ["start_to_close_timeout", "schedule_to_close_timeout", "heartbeat_timeout"] {
        if let Some(seconds) = f.opt_int(key, 1, limits.delay_seconds_max)? {
            echoed.insert(key.into(), Value::from(seconds));
        }
    }
    let failure = || -> ApiResult<LocalFailure> {
        let message = match map.get("message") {
            Some(Value::String(message)) => message.clone(),
            _ => {
                return Err(ApiError::validation(
                    &at("message"),
                    "A local activity that did not complete needs a message.",
                ))
            }
        };
        Ok(LocalFailure {
            message,
            exception_type: f.opt_str("exception_type", 1000)?,
            non_retryable: f.opt_bool("non_retryable")?.unwrap_or(false),
            timeout_kind: f.opt_str("timeout_kind", 64)?,
        })
    };
    let outcome = match f.req_str("outcome", 32)?.as_str() {
        "completed" => LocalOutcome::Completed(
            f.opt_payload("result", limits)?
                .ok_or_else(|| ApiError::validation(&at("result"), "A completed local activity needs its result."))?,
        ),
        "failed" => LocalOutcome::Failed(failure()?),
        "timed_out" => LocalOutcome::TimedOut(failure()?),
        "cancelled" => LocalOutcome::Cancelled(failure()?),
        other => {
            return Err(ApiError::validation(
                &at("outcome"),
                format!("outcome must be completed, failed, timed_out or cancelled, not {other:?}."),
            ))
        }
    };
    let Some(Value::Array(reported)) = map.get("attempts") else {
        return Err(ApiError::validation(&at("attempts"), "attempts must list every attempt."));
    };
    if reported.is_empty() || reported.len() > LOCAL_ATTEMPTS_MAX {
        return Err(ApiError::validation(
            &at("attempts"),
            format!("attempts must list 1 to {LOCAL_ATTEMPTS_MAX} attempts."),
        ));
    }
    let mut attempts = Vec::with_capacity(reported.len());
    let mut heartbeat_count = 0;
    for (n, attempt) in reported.iter().enumerate() {
        let Value::Object(attempt) = attempt else {
            return Err(ApiError::validation(
                &at(&format!("attempts.{n}")),
                "Each attempt must be an object.",
            ));
        };
        refuse_unknown_fields(
            attempt,
            &[LOCAL_ATTEMPT_FIELDS],
            &at(&format!("attempts.{n}.")),
            "local activity attempts",
        )?;
        let a = Fields::nested(attempt, at(&format!("attempts.{n}.")));
        let attempt_number = a.req_int("attempt_number", 1, LOCAL_ATTEMPTS_MAX as i64)? as u32;
        a.req_str("outcome", 32)?;
        a.opt_bool("non_retryable")?;
        let heartbeats = match attempt.get("heartbeats") {
            None | Some(Value::Null) => vec![],
            Some(Value::Array(items)) if items.iter().all(Value::is_object) => items.clone(),
            Some(_) => {
                return Err(ApiError::validation(
                    &at(&format!("attempts.{n}.heartbeats")),
                    "heartbeats must be a list of objects.",
                ))
            }
        };
        heartbeat_count += heartbeats.len();
        let retry = ["retry_reason", "backoff_seconds", "message", "exception_type", "timeout_kind"]
            .into_iter()
            .filter_map(|key| attempt.get(key).map(|v| (key.to_string(), v.clone())))
            .collect();
        attempts.push(LocalAttempt {
            attempt_number,
            worker_attempt_id: a.opt_str("attempt_id", 255)?,
            heartbeats,
            retry,
            duration_ms: a.opt_int("duration_ms", 0, i64::MAX)?,
        });
    }
    if heartbeat_count > LOCAL_HEARTBEATS_MAX {
        return Err(ApiError::validation(
            &at("attempts"),
            format!("At most {LOCAL_HEARTBEATS_MAX} heartbeats per local activity."),
        ));
    }
    Ok(LocalActivityRecord {
        activity_type,
        arguments,
        echoed,
        outcome,
        attempts,
        tags,
    })
}

fn parse_retry_policy(policy: &Map<String, Value>, index: usize, max_delay: i64) -> ApiResult<RetryPolicy> {
    parse_retry_policy_at(policy, &format!("commands.{index}.retry_policy"), max_delay)
}

/// A retry policy at field path `at`.
pub(crate) fn parse_retry_policy_at(policy: &Map<String, Value>, at: &str, max_delay: i64) -> ApiResult<RetryPolicy> {
    let f = Fields::nested(policy, format!("{at}."));
    let backoff_seconds = match policy.get("backoff_seconds") {
        None | Some(Value::Null) => vec![],
        Some(Value::Array(items)) => items
            .iter()
            .map(|v| v.as_i64().filter(|s| (0..=max_delay).contains(s)))
            .collect::<Option<Vec<_>>>()
            .ok_or_else(|| {
                ApiError::validation(
                    &format!("{at}.backoff_seconds"),
                    "backoff_seconds must be a list of non-negative integers.",
                )
            })?,
        Some(Value::Number(n)) => vec![n
            .as_i64()
            .filter(|s| *s >= 0)
            .ok_or_else(|| ApiError::validation(&format!("{at}.backoff_seconds"), "backoff_seconds must be non-negative."))?],
        Some(_) => {
            return Err(ApiError::validation(
                &format!("{at}.backoff_seconds"),
                "backoff_seconds must be a list of integers.",
            ))
        }
    };
    Ok(RetryPolicy {
        max_attempts: f.opt_int("max_attempts", 1, u32::MAX as i64)?.map(|n| n as u32),
        backoff_seconds,
        non_retryable_error_types: f.string_list("non_retryable_error_types")?,
    })
}

/// `failure` of an activity fail report.
pub fn parse_activity_failure(map: &Map<String, Value>, limits: &Limits) -> ApiResult<ActivityFailure> {
    let f = Fields::nested(map, "failure.".into());
    Ok(ActivityFailure {
        message: f.opt_str("message", 1_000_000)?.unwrap_or_default(),
        failure_type: f.opt_str("type", 1000)?,
        class: f.opt_str("class", 1000)?,
        code: f.raw("code").cloned(),
        stack_trace: f.opt_str("stack_trace", 1_000_000)?,
        non_retryable: f.opt_bool("non_retryable")?.unwrap_or(false) || f.opt_bool("retryable")? == Some(false),
        details: f.opt_payload("details", limits)?,
    })
}

/// `sticky_cache` of a workflow task completion: the worker keeps the run in its replay cache.
pub fn parse_sticky_claim(body: &Map<String, Value>) -> ApiResult<Option<StickyClaim>> {
    let Some(claim) = Fields::new(body).opt_object("sticky_cache")? else {
        return Ok(None);
    };
    const FIELDS: &[&str] = &["worker_id", "workflow_id", "run_id", "build_id", "ttl_seconds", "metrics"];
    refuse_unknown_fields(claim, &[FIELDS], "sticky_cache.", "sticky_cache claims")?;
    let f = Fields::nested(claim, "sticky_cache.".into());
    let metrics = f.opt_object("metrics")?.cloned().unwrap_or_default();
    for (key, value) in &metrics {
        if !value.is_null() && value.as_u64().is_none() {
            return Err(ApiError::validation(
                &format!("sticky_cache.metrics.{key}"),
                "Each sticky cache counter must be a non-negative integer.",
            ));
        }
    }
    Ok(Some(StickyClaim {
        worker_id: f.req_str("worker_id", 255)?,
        workflow_id: f.req_str("workflow_id", 255)?,
        run_id: f.req_str("run_id", 255)?,
        build_id: f.req_str("build_id", 255)?,
        ttl_seconds: f.req_int("ttl_seconds", 1, capstan_engine::sticky::STICKY_TTL_SECONDS_MAX)?,
        metrics,
    }))
}

/// `message_stream_cursors` (`{stream_name, through_position}`) and `message_stream_waits`
/// (`{stream_name, after_position}`) of a workflow task completion.
pub fn parse_stream_progress(body: &Map<String, Value>) -> ApiResult<StreamProgress> {
    let list = |key: &str, position: &str| -> ApiResult<Vec<(String, u64)>> {
        let Some(value) = body.get(key).filter(|v| !v.is_null()) else {
            return Ok(Vec::new());
        };
        let Some(entries) = value.as_array() else {
            return Err(ApiError::validation(key, "Must be a list."));
        };
        let mut parsed = Vec::with_capacity(entries.len());
        for (index, entry) in entries.iter().enumerate() {
            let at = format!("{key}.{index}");
            let Some(entry) = entry.as_object() else {
                return Err(ApiError::validation(&at, "Each entry must be an object."));
            };
            refuse_unknown_fields(entry, &[&["stream_name", position]], &format!("{at}."), key)?;
            let f = Fields::nested(entry, format!("{at}."));
            parsed.push((f.req_str("stream_name", 128)?, f.req_int(position, 0, i64::MAX)? as u64));
        }
        Ok(parsed)
    };
    Ok(StreamProgress {
        cursors: list("message_stream_cursors", "through_position")?,
        waits: list("message_stream_waits", "after_position")?,
    })
}

/// Workflow ids: `^[a-zA-Z0-9._:-]+$`, at most 128 characters.
pub use capstan_app::control::valid_workflow_id;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(value: Value) -> ApiResult<Vec<WorkflowCommand>> {
        parse_commands(Some(&value), &Limits::default())
    }

    #[test]
    fn parses_a_schedule_activity_with_policy_and_timeouts() {
        let commands = parse(json!([{"type": "schedule_activity", "activity_type": "charge", "queue": "orders",
            "arguments": {"codec": "avro", "blob": "wwHioz3/VYAiNwA="}, "start_to_close_timeout": "30",
            "retry_policy": {"max_attempts": 3, "backoff_seconds": [1, 2], "non_retryable_error_types": ["Bad"]}}]))
        .unwrap();
        let WorkflowCommand::ScheduleActivity(a) = &commands[0] else {
            panic!("not an activity")
        };
        assert_eq!(a.timeouts.start_to_close_seconds, Some(30));
        assert_eq!(a.retry_policy.as_ref().unwrap().max_attempts, Some(3));
        assert_eq!(a.arguments.blob, "wwHioz3/VYAiNwA=");
    }

    #[test]
    fn refuses_bad_commands_with_field_names() {
        let error = parse(json!([{"type": "start_timer", "delay_seconds": -1}])).unwrap_err();
        assert_eq!(error.reason, "validation_failed");
        assert!(error.fields["errors"].get("commands.0.delay_seconds").is_some());
        assert_eq!(parse(json!([{"type": "teleport"}])).unwrap_err().reason, "invalid_commands");
        assert_eq!(parse(json!([])).unwrap_err().reason, "validation_failed");
        assert_eq!(
            parse(json!([{"type": "start_timer", "delay_seconds": 1, "retry_policy": {}}]))
                .unwrap_err()
                .reason,
            "validation_failed"
        );
        let wrong_codec = parse(json!([{"type": "complete_workflow", "result": {"codec": "json", "blob": "1"}}])).unwrap_err();
        assert_eq!(wrong_codec.reason, "unsupported_payload_codec");
        let timeouts =
            parse(json!([{"type": "schedule_activity", "activity_type": "a", "heartbeat_timeout": 10, "start_to_close_timeout": 5}]));
        assert_eq!(timeouts.unwrap_err().reason, "validation_failed");
    }

    #[test]
    fn accepts_bare_blob_results() {
        let commands = parse(json!([{"type": "record_side_effect", "result": "wwHioz3/VYAiNwA="}])).unwrap();
        assert!(
            matches!(&commands[0], WorkflowCommand::RecordSideEffect { result, .. } if result.blob == "wwHioz3/VYAiNwA=" && result.codec == "avro")
        );
        // A blob no SDK could decode would poison every replay of the run: refused at the door.
        for bad in ["wwE=", "!!!not-base64!!!", "AAAA"] {
            let error = parse(json!([{"type": "record_side_effect", "result": bad}])).unwrap_err();
            assert_eq!(error.reason, "validation_failed", "{bad}");
            assert!(
                error.fields["errors"].get("commands.0.result").is_some(),
                "{bad}: {:?}",
                error.fields
            );
        }
    }

    #[test]
    fn workflow_id_pattern() {
        assert!(valid_workflow_id("order-42:a.b_c"));
        assert!(!valid_workflow_id("has space"));
        assert!(!valid_workflow_id(""));
        assert!(!valid_workflow_id(&"x".repeat(129)));
    }
}
