//! `record_local_activity`: a local activity's whole story, recorded at once.

use super::*;

/// A local activity ran inside the workflow task: its whole story is recorded at once, as
/// activity events marked `execution_mode: local` (both SDKs' replayers need the marker on every
/// event of the step). No activity task exists and no new workflow task is needed: the same
/// completion already used the result.
pub(super) fn record_local_activity(run: &mut RunState, cx: &mut Cx, step: u32, wt: Option<&TaskId>, local: LocalActivityRecord) {
    let execution_id: ActivityExecutionId = cx.id();
    let mut common = obj!(
        "sequence" => step,
        "activity_execution_id" => execution_id,
        "activity_type" => local.activity_type,
        "execution_mode" => "local",
        "local_activity" => true,
    );
    extend(&mut common, &local.tags);
    let with = |extra: Map<String, Value>| {
        let mut payload = common.clone();
        payload.extend(extra);
        payload
    };
    let mut scheduled = with(obj!("arguments" => payload_json(&local.arguments)));
    scheduled.extend(local.echoed);
    run.append(cx, EventType::ActivityScheduled, scheduled, wt, None);
    let last_index = local.attempts.len().saturating_sub(1);
    let mut last = (1u32, None::<ActivityAttemptId>, None::<String>);
    for (index, attempt) in local.attempts.into_iter().enumerate() {
        let attempt_id: ActivityAttemptId = cx.id();
        let identity = obj!(
            "attempt_number" => attempt.attempt_number,
            "activity_attempt_id" => attempt_id,
        );
        let mut started = with(identity.clone());
        started.insert("worker_attempt_id".into(), json!(attempt.worker_attempt_id));
        run.append(cx, EventType::ActivityStarted, started, wt, None);
        for heartbeat in attempt.heartbeats {
            let mut payload = with(identity.clone());
            payload.insert("elapsed_ms".into(), heartbeat.get("elapsed_ms").cloned().unwrap_or(Value::Null));
            payload.insert("details".into(), heartbeat.get("details").cloned().unwrap_or(Value::Null));
            run.append(cx, EventType::ActivityHeartbeatRecorded, payload, wt, None);
        }
        if index < last_index {
            let mut payload = with(identity.clone());
            let retry = &attempt.retry;
            for (from, to) in [
                ("retry_reason", "retry_reason"),
                ("backoff_seconds", "retry_backoff_seconds"),
                ("message", "message"),
                ("exception_type", "exception_type"),
                ("timeout_kind", "timeout_kind"),
            ] {
                if let Some(value) = retry.get(from) {
                    payload.insert(to.into(), value.clone());
                }
            }
            run.append(cx, EventType::ActivityRetryScheduled, payload, wt, None);
        }
        last = (attempt.attempt_number, Some(attempt_id), attempt.worker_attempt_id);
    }
    let mut terminal = with(obj!(
        "attempt_number" => last.0,
        "activity_attempt_id" => last.1,
        "worker_attempt_id" => last.2,
    ));
    let trimmed = |message: &str| message.trim_matches(|c: char| " \t\n\r\0\u{b}".contains(c)).to_string();
    let event_type = match local.outcome {
        LocalOutcome::Completed(result) => {
            terminal.insert("result".into(), json!(result.blob));
            terminal.insert("payload_codec".into(), json!(result.codec));
            EventType::ActivityCompleted
        }
        LocalOutcome::Failed(failure) => {
            let failure_id: String = cx.ids.next_id();
            terminal.extend(obj!(
                "failure_id" => failure_id,
                "message" => trimmed(&failure.message),
                "exception_type" => failure.exception_type,
                "non_retryable" => failure.non_retryable,
                "failure_category" => "application",
            ));
            EventType::ActivityFailed
        }
        LocalOutcome::TimedOut(failure) => {
            let failure_id: String = cx.ids.next_id();
            terminal.extend(obj!(
                "failure_id" => failure_id,
                "timeout_kind" => failure.timeout_kind,
                "message" => trimmed(&failure.message),
                "exception_class" => failure.exception_type,
                "failure_category" => "timeout",
            ));
            EventType::ActivityTimedOut
        }
        LocalOutcome::Cancelled(failure) => {
            let failure_id: String = cx.ids.next_id();
            terminal.extend(obj!(
                "failure_id" => failure_id,
                "message" => trimmed(&failure.message),
                "exception_type" => failure.exception_type,
                "non_retryable" => true,
            ));
            EventType::ActivityCancelled
        }
    };
    run.append(cx, event_type, terminal, wt, None);
}
