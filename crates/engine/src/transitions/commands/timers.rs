//! Durable timers: user timers and the timeouts of waits.

use crate::transitions::commands::At;
use crate::transitions::{events, TimerWait};
use crate::{Cx, EventType, RunState, StepTags, TaskDetail, TaskKind, TimerId, TimerPurpose, TimerState};

/// A user timer: `TimerScheduled`.
pub(super) fn start_timer(run: &mut RunState, cx: &mut Cx, at: At, delay_seconds: i64, tags: StepTags) {
    let At { step, task: wt } = at;
    let timer = schedule_timer(run, cx, step, delay_seconds, TimerPurpose::User, tags);
    let payload = events::timer_scheduled(&timer, TimerWait::default());
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
