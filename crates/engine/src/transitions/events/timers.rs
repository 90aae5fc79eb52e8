//! Timer events: user timers and the timeouts of waits.

use crate::transitions::events::extend;
use crate::transitions::iso8601;
use crate::{ConditionWait, Millis, TimerPurpose, TimerState};
use serde_json::{json, Map, Value};

/// What a wait's timeout timer repeats of its wait, when the wait is still known.
#[derive(Clone, Copy, Default)]
pub(in crate::transitions) struct TimerWait<'a> {
    pub signal_name: Option<&'a str>,
    pub condition: Option<&'a ConditionWait>,
}

/// `TimerScheduled`.
pub(in crate::transitions) fn timer_scheduled(timer: &TimerState, wait: TimerWait) -> Map<String, Value> {
    timer_payload(timer, wait, Map::new())
}

/// `TimerFired`.
pub(in crate::transitions) fn timer_fired(timer: &TimerState, wait: TimerWait, fired_at: Millis) -> Map<String, Value> {
    timer_payload(timer, wait, obj!("fired_at" => iso8601(fired_at)))
}

/// `TimerCancelled`: a user timer ended by a cooperative cancellation (no tags, no fire time).
pub(in crate::transitions) fn timer_cancelled(timer: &TimerState, cancelled_at: Millis) -> Map<String, Value> {
    obj!(
        "timer_id" => timer.id,
        "sequence" => timer.step,
        "delay_seconds" => timer.delay_seconds,
        "cancelled_at" => iso8601(cancelled_at),
    )
}

fn timer_payload(timer: &TimerState, wait: TimerWait, extra: Map<String, Value>) -> Map<String, Value> {
    let mut payload = obj!(
        "timer_id" => timer.id,
        "sequence" => timer.step,
        "delay_seconds" => timer.delay_seconds,
        "fire_at" => iso8601(timer.fire_at),
    );
    match &timer.purpose {
        TimerPurpose::User => {}
        TimerPurpose::ConditionTimeout(wait_id) => {
            payload.insert("timer_kind".into(), json!("condition_timeout"));
            payload.insert("condition_wait_id".into(), json!(wait_id));
        }
        TimerPurpose::SignalTimeout(wait_id) => {
            payload.insert("timer_kind".into(), json!("signal_timeout"));
            payload.insert("signal_wait_id".into(), json!(wait_id));
            if let Some(name) = wait.signal_name {
                payload.insert("signal_name".into(), json!(name));
            }
        }
    }
    if let Some(condition) = wait.condition {
        payload.insert("condition_key".into(), json!(condition.condition_key));
        payload.insert("condition_definition_fingerprint".into(), json!(condition.fingerprint));
    }
    payload.extend(extra);
    extend(&mut payload, &timer.tags);
    payload
}
