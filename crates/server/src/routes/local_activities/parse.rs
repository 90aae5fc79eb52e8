//! The request bodies of the prepared local activity routes, as the Python SDK 2.12.0 sends
//! them. Every field is honoured or recorded; anything else is refused, naming it.

use crate::canonical::canonical_json;
use crate::error::{ApiError, ApiResult};
use crate::wire::{self, Fields};
use capstan_engine::*;
use serde_json::{Map, Value};
use sha2::{Digest, Sha256};

/// The fields every operation carries: the workflow task claim.
const CLAIM_FIELDS: &[&str] = &["lease_owner", "workflow_task_attempt"];

pub const PREPARE_FIELDS: &[&str] = &["sequence", "worker_attempt_id", "descriptor"];
pub const RECOVER_FIELDS: &[&str] = &["sequence", "descriptor"];
pub const CHECKPOINT_FIELDS: &[&str] = &["checkpoint_id", "start_sequence", "commands"];
pub const CONTROL_FIELDS: &[&str] = &["renew_lease"];
pub const HEARTBEAT_FIELDS: &[&str] = &["progress"];
pub const OUTCOME_FIELDS: &[&str] = &["report"];
pub const ACKNOWLEDGE_FIELDS: &[&str] = &["request_id"];

/// The descriptor's own fields (besides the step tags).
const DESCRIPTOR_FIELDS: &[&str] = &[
    "type",
    "activity_type",
    "execution_mode",
    "arguments",
    "payload_codec",
    "retry_policy",
    "cancellation_policy",
    "start_to_close_timeout",
    "schedule_to_close_timeout",
    "heartbeat_timeout",
    "cancellation_cleanup",
];

/// Refuses a field the operation does not take.
pub fn check_fields(body: &Map<String, Value>, own: &[&str], what: &str) -> ApiResult<()> {
    wire::refuse_unknown_fields(body, &[CLAIM_FIELDS, own], "", what)
}

/// A step sequence (`sequence`, `start_sequence`).
pub fn sequence(body: &Map<String, Value>, key: &str) -> ApiResult<u32> {
    Ok(Fields::new(body).req_int(key, 1, u32::MAX as i64)? as u32)
}

/// SHA-256 of a value's canonical JSON, hex.
pub fn fingerprint(value: &Value) -> String {
    hex::encode(Sha256::digest(canonical_json(value).as_bytes()))
}

/// `descriptor`: the authored local call (`record_local_activity` without a result).
pub fn descriptor(body: &Map<String, Value>, limits: &Limits) -> ApiResult<LocalDescriptor> {
    let Some(Value::Object(map)) = body.get("descriptor") else {
        return Err(ApiError::validation("descriptor", "descriptor must describe the local call."));
    };
    descriptor_at(map, "descriptor", "record_local_activity", limits)
}

/// `commands[]` of a group checkpoint: a local member (`prepare_local_activity`: its descriptor,
/// as its later `prepare` repeats it), or an activity, timer or child as a completion carries it.
pub fn group_members(body: &Map<String, Value>, limits: &Limits) -> ApiResult<Vec<GroupMember>> {
    let Some(Value::Array(items)) = body.get("commands") else {
        return Err(ApiError::validation("commands", "commands must list the group's leaves."));
    };
    let mut members = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let Value::Object(map) = item else {
            return Err(ApiError::validation(
                &format!("commands.{index}"),
                "Each command must be an object.",
            ));
        };
        members.push(match map.get("type").and_then(Value::as_str) {
            Some("prepare_local_activity") => {
                GroupMember::Local(descriptor_at(map, &format!("commands.{index}"), "prepare_local_activity", limits)?)
            }
            _ => GroupMember::Command(wire::parse_command_at(map, index, limits)?),
        });
    }
    Ok(members)
}

/// A local call's descriptor at field path `at`, whose `type` is `kind`. Its fingerprint is
/// taken as a `record_local_activity`: a group member's later `prepare` sends it so.
fn descriptor_at(map: &Map<String, Value>, at: &str, kind: &str, limits: &Limits) -> ApiResult<LocalDescriptor> {
    let prefix = format!("{at}.");
    wire::refuse_unknown_fields(
        map,
        &[DESCRIPTOR_FIELDS, capstan_engine::STEP_TAG_FIELDS],
        &prefix,
        "local activity descriptors",
    )?;
    let f = Fields::nested(map, prefix.clone());
    if f.req_str("type", 64)? != kind {
        return Err(ApiError::validation(&format!("{at}.type"), format!("{at}.type is {kind}.")));
    }
    if f.opt_str("execution_mode", 32)?.is_some_and(|mode| mode != "local") {
        return Err(ApiError::validation(
            "descriptor.execution_mode",
            "A local call's execution_mode is local.",
        ));
    }
    let activity_type = f.req_str("activity_type", 255)?.trim().to_string();
    if activity_type.is_empty() {
        return Err(ApiError::validation(
            &format!("{at}.activity_type"),
            "activity_type must not be blank.",
        ));
    }
    let arguments = f.arguments("arguments", limits)?;
    if f.opt_str("payload_codec", 64)?.is_some_and(|codec| codec != arguments.codec) {
        return Err(ApiError::validation(
            &format!("{at}.payload_codec"),
            "payload_codec must be the arguments' codec.",
        ));
    }
    let retry_policy = match f.opt_object("retry_policy")? {
        Some(policy) => {
            wire::refuse_unknown_fields(policy, &[wire::RETRY_POLICY_FIELDS], "descriptor.retry_policy.", "retry policies")?;
            Some(wire::parse_retry_policy_at(
                policy,
                "descriptor.retry_policy",
                limits.delay_seconds_max,
            )?)
        }
        None => None,
    };
    let cancellation_policy = match f.opt_str("cancellation_policy", 64)? {
        None => None,
        Some(text) => Some(
            ActivityCancellationPolicy::parse(&text)
                .filter(|p| *p != ActivityCancellationPolicy::Abandon)
                .ok_or_else(|| {
                    ApiError::validation(
                        &format!("{at}.cancellation_policy"),
                        "A local call's cancellation_policy is try_cancel or wait_cancellation_completed.",
                    )
                })?,
        ),
    };
    let timeout = |key| f.opt_int(key, 1, limits.delay_seconds_max);
    Ok(LocalDescriptor {
        activity_type,
        arguments,
        retry_policy,
        cancellation_policy,
        start_to_close_seconds: timeout("start_to_close_timeout")?,
        schedule_to_close_seconds: timeout("schedule_to_close_timeout")?,
        heartbeat_seconds: timeout("heartbeat_timeout")?,
        cleanup: cleanup(&f, at)?,
        tags: wire::step_tags(map),
        fingerprint: {
            let mut as_prepared = map.clone();
            as_prepared.insert("type".into(), Value::from("record_local_activity"));
            fingerprint(&Value::Object(as_prepared))
        },
    })
}

/// `descriptor.cancellation_cleanup`: a cleanup call's authority. Scoped cleanups are not
/// served (cancellation scopes are not advertised): `scope_id` is refused, not dropped.
fn cleanup(f: &Fields, at: &str) -> ApiResult<Option<CleanupAuthority>> {
    let Some(map) = f.opt_object("cancellation_cleanup")? else {
        return Ok(None);
    };
    wire::refuse_unknown_fields(
        map,
        &[&["request_id", "delivery_history_event_id"]],
        &format!("{at}.cancellation_cleanup."),
        "cleanup authorities",
    )?;
    let c = Fields::nested(map, format!("{at}.cancellation_cleanup."));
    Ok(Some(CleanupAuthority {
        request_id: c.req_str("request_id", 255)?,
        delivery_history_event_id: c.req_str("delivery_history_event_id", 255)?,
    }))
}

/// `report`: how the callback ended, and the fingerprint a repeat is recognised by.
pub fn report(body: &Map<String, Value>, limits: &Limits) -> ApiResult<(LocalReport, String)> {
    let Some(Value::Object(map)) = body.get("report") else {
        return Err(ApiError::validation("report", "report must say how the callback ended."));
    };
    let f = Fields::nested(map, "report.".into());
    let report = match f.req_str("outcome", 32)?.as_str() {
        "completed" => {
            wire::refuse_unknown_fields(map, &[&["outcome", "result", "payload_codec"]], "report.", "completed reports")?;
            let result = f
                .opt_payload("result", limits)?
                .ok_or_else(|| ApiError::validation("report.result", "A completed report carries its result."))?;
            if f.opt_str("payload_codec", 64)?.is_some_and(|codec| codec != result.codec) {
                return Err(ApiError::validation(
                    "report.payload_codec",
                    "payload_codec must be the result's codec.",
                ));
            }
            LocalReport::Completed(result)
        }
        "failed" => {
            wire::refuse_unknown_fields(
                map,
                &[&["outcome", "message", "exception_type", "non_retryable"]],
                "report.",
                "failed reports",
            )?;
            LocalReport::Failed {
                message: f.opt_str("message", limits.payload_bytes_max)?.unwrap_or_default(),
                exception_type: f.opt_str("exception_type", 1000)?,
                non_retryable: f.opt_bool("non_retryable")?.unwrap_or(false),
            }
        }
        _ => {
            return Err(ApiError::validation(
                "report.outcome",
                "report.outcome is completed or failed: the server decides timeouts.",
            ))
        }
    };
    Ok((report, fingerprint(&Value::Object(map.clone()))))
}

/// A heartbeat's `progress` (`{details}`), recorded as sent; none without details.
pub fn progress(body: &Map<String, Value>) -> ApiResult<Option<Map<String, Value>>> {
    let Some(progress) = Fields::new(body).opt_object("progress")? else {
        return Ok(None);
    };
    wire::refuse_unknown_fields(progress, &[&["details"]], "progress.", "heartbeat progress")?;
    match progress.get("details") {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Object(_)) => Ok(Some(progress.clone())),
        Some(_) => Err(ApiError::validation("progress.details", "progress.details must be an object.")),
    }
}
