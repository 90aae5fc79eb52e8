//! The clock against rows other transactions hold.

use crate::common::*;
use serde_json::json;
use std::time::{Duration, Instant};

/// A timer falls due while another transaction holds its run (a moment's contention, or a node
/// paused mid-transaction): the clock passes over the run without waiting, and fires the timer
/// within moments of the hold ending — not when its 30-second duty claim expires.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_timer_whose_run_was_held_fires_soon_after_the_hold_ends() {
    let h = Harness::start().await;
    let (start, task) = h.started_and_leased("held-timer", "w1", "q").await;
    let run_id = start["run_id"].as_str().unwrap();
    let timer = json!([{"type": "start_timer", "delay_seconds": 1}]);
    h.complete_workflow_task(&task, timer).await.ok(200);
    let Some(hold) = h.hold_run_row(run_id).await else {
        return; // SQLite: one writer at a time, nothing holds a row between transactions.
    };
    tokio::time::sleep(Duration::from_millis(2_000)).await;
    let history = h.history("held-timer", run_id).await;
    assert_eq!(count_events(&history, "TimerFired"), 0, "nothing fired through the hold");
    hold.release().await;

    let released = Instant::now();
    wait_for("the timer to fire after the hold", Duration::from_secs(5), || async {
        (count_events(&h.history("held-timer", run_id).await, "TimerFired") == 1).then_some(())
    })
    .await;
    assert!(released.elapsed() < Duration::from_secs(5));
}
