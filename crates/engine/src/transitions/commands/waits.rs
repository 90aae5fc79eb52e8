//! Condition and signal waits the workflow opens, each with an optional timeout timer.

use super::timers::schedule_timer;
use crate::transitions::commands::At;
use crate::transitions::{events, TimerWait};
use crate::{ConditionWait, Cx, EventType, RunState, SignalWait, StepTags, TaskId, TimerPurpose, TimerState, WaitId};

/// What an `open_condition_wait` asks for.
pub(super) struct ConditionWaitSpec {
    pub condition_key: Option<String>,
    pub fingerprint: Option<String>,
    pub timeout_seconds: Option<i64>,
    pub occurrence_id: Option<String>,
}

/// `ConditionWaitOpened`, and its timeout timer when it has one.
pub(super) fn open_condition_wait(run: &mut RunState, cx: &mut Cx, at: At, spec: ConditionWaitSpec, tags: StepTags) {
    let At { step, task: wt } = at;
    let wait_id: WaitId = cx.id();
    let timeout_seconds = spec.timeout_seconds;
    let mut wait = ConditionWait {
        id: wait_id.clone(),
        step,
        condition_key: spec.condition_key,
        fingerprint: spec.fingerprint,
        timeout_seconds,
        timer_id: None,
        occurrence_id: spec.occurrence_id,
    };
    let payload = events::condition_wait_opened(&wait, &tags);
    run.append(cx, EventType::ConditionWaitOpened, payload, wt, None);
    if let Some(timeout) = timeout_seconds.filter(|t| *t > 0) {
        let timer = schedule_timer(run, cx, step, timeout, TimerPurpose::ConditionTimeout(wait_id), tags);
        wait.timer_id = Some(timer.id.clone());
        let payload = events::timer_scheduled(
            &timer,
            TimerWait {
                condition: Some(&wait),
                ..Default::default()
            },
        );
        run.condition_waits.push(wait);
        run.append(cx, EventType::TimerScheduled, payload, wt, None);
    } else {
        run.condition_waits.push(wait);
    }
}

/// `SignalWaitOpened`, and its timeout timer when it has one (a zero timeout fires at once).
pub(super) fn open_signal_wait(run: &mut RunState, cx: &mut Cx, at: At, signal_name: String, timeout_seconds: Option<i64>, tags: StepTags) {
    let At { step, task: wt } = at;
    let now = cx.now;
    let wait_id: WaitId = cx.id();
    let mut wait = SignalWait {
        id: wait_id.clone(),
        step,
        signal_name,
        timeout_seconds,
        timer_id: None,
    };
    let payload = events::signal_wait_opened(&wait, &tags);
    run.append(cx, EventType::SignalWaitOpened, payload, wt, None);
    match timeout_seconds {
        Some(0) => {
            // A zero timeout resolves at once: the wait times out in this very completion.
            let timer = TimerState {
                id: cx.id(),
                step,
                delay_seconds: 0,
                fire_at: now,
                task_id: TaskId(String::new()),
                purpose: TimerPurpose::SignalTimeout(wait_id),
                tags,
            };
            let payload = events::timer_fired(&timer, for_signal(&wait), now);
            run.append(cx, EventType::TimerFired, payload, wt, None);
            run.workflow_task_wanted = true;
        }
        Some(timeout) if timeout > 0 => {
            let timer = schedule_timer(run, cx, step, timeout, TimerPurpose::SignalTimeout(wait_id), tags);
            wait.timer_id = Some(timer.id.clone());
            let payload = events::timer_scheduled(&timer, for_signal(&wait));
            run.signal_waits.push(wait);
            run.append(cx, EventType::TimerScheduled, payload, wt, None);
        }
        _ => run.signal_waits.push(wait),
    }
}

fn for_signal(wait: &SignalWait) -> TimerWait<'_> {
    TimerWait {
        signal_name: Some(&wait.signal_name),
        ..Default::default()
    }
}
