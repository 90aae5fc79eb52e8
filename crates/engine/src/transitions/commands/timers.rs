//! Durable timers: user timers and the timeouts of waits.

use super::*;

/// A user timer: `TimerScheduled`.
pub(super) fn start_timer(run: &mut RunState, cx: &mut Cx, at: At, delay_seconds: i64, tags: StepTags) {
    let At { step, task: wt } = at;
    let timer = schedule_timer(run, cx, step, delay_seconds, TimerPurpose::User, tags);
    let payload = timer_payload(run, &timer);
    run.append(cx, EventType::TimerScheduled, payload, wt, None);
}

pub(super) fn schedule_timer(
    run: &mut RunState,
    cx: &mut Cx,
    step: u32,
    delay_seconds: i64,
    purpose: TimerPurpose,
    tags: StepTags,
) -> TimerState {
    let timer_id: TimerId = cx.id();
    let fire_at = cx.now + delay_seconds * 1000;
    let task_id = run.new_task(
        cx,
        TaskKind::Timer,
        "",
        TaskDetail::Timer {
            timer_id: timer_id.clone(),
        },
    );
    run.task_mut(cx, &task_id).expect("just created").deadline_at = Some(fire_at);
    let timer = TimerState {
        id: timer_id,
        step,
        delay_seconds,
        fire_at,
        task_id,
        purpose,
        tags,
    };
    run.timers.insert(timer.id.clone(), timer.clone());
    timer
}

pub(super) fn timer_payload(run: &RunState, timer: &TimerState) -> Map<String, Value> {
    let condition = match &timer.purpose {
        TimerPurpose::ConditionTimeout(wait_id) => run.condition_waits.iter().find(|w| &w.id == wait_id),
        _ => None,
    };
    let mut payload = timer_payload_for(timer, None);
    if let Some(wait) = condition {
        payload.insert("condition_key".into(), json!(wait.condition_key));
        payload.insert("condition_definition_fingerprint".into(), json!(wait.fingerprint));
    }
    payload
}

pub(in crate::transitions) fn timer_payload_for(timer: &TimerState, signal_name: Option<&str>) -> Map<String, Value> {
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
            if let Some(name) = signal_name {
                payload.insert("signal_name".into(), json!(name));
            }
        }
    }
    extend(&mut payload, &timer.tags);
    payload
}
