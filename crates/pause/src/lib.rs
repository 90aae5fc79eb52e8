//! Pause points: named places in Capstan's code where a fault test can freeze the whole process,
//! as a garbage-collection pause, a frozen VM or a descheduled container would, at the worst
//! moment: after a node claimed a duty and before it acted on the claim, or inside a
//! transaction that holds a run's lock.
//!
//! A process arms points from `CAPSTAN_TEST_PAUSE_AT` once, at start-up ([`arm_from_env`]):
//! a comma-separated list of `name` or `name@n` (pause the `n`-th time the point is passed; the
//! first by default). Each armed point stops the process once (`SIGSTOP` to itself); the test
//! sees the stopped process, lets the rest of the cluster take over, and resumes it with
//! `SIGCONT` to watch what the woken process does with what it believed it owned.
//!
//! Unarmed, a point costs one atomic load. Names are checked against [`POINTS`] when armed, so a
//! misspelt point fails start-up instead of never firing.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The environment variable that arms pause points.
pub const ENV: &str = "CAPSTAN_TEST_PAUSE_AT";

/// Every pause point in the code, with where it is.
pub const POINTS: &[(&str, &str)] = &[
    (
        DUTY_CLAIMED,
        "a node claimed due deadlines (timers, lease expiries, timeouts) and has not applied them",
    ),
    (
        DUTY_LOCKED,
        "inside a deadline duty's transaction, the run locked and its fence checked, before COMMIT",
    ),
    (SCHEDULES_DUE, "a node read which schedules are due and has not fired them"),
    (
        WORKFLOW_TASK_COMPLETING,
        "a workflow task completion was checked and admitted, before its transaction",
    ),
    (
        ACTIVITY_REPORTING,
        "an activity attempt's completion or failure arrived, before its transaction",
    ),
    (SESSION_RENEWING, "a worker session's heartbeat arrived, before its transaction"),
];

pub const DUTY_CLAIMED: &str = "duty_claimed";
pub const DUTY_LOCKED: &str = "duty_locked";
pub const SCHEDULES_DUE: &str = "schedules_due";
pub const WORKFLOW_TASK_COMPLETING: &str = "workflow_task_completing";
pub const ACTIVITY_REPORTING: &str = "activity_reporting";
pub const SESSION_RENEWING: &str = "session_renewing";

struct Armed {
    name: &'static str,
    at: u64,
    passed: AtomicU64,
}

static ARMED: OnceLock<Vec<Armed>> = OnceLock::new();

/// Arms the points `CAPSTAN_TEST_PAUSE_AT` names. Returns the armed names, or an error naming a
/// malformed entry or an unknown point. Call once, before any point is passed.
pub fn arm_from_env() -> Result<Vec<&'static str>, String> {
    match std::env::var(ENV) {
        Ok(spec) if !spec.trim().is_empty() => arm(&spec),
        _ => Ok(Vec::new()),
    }
}

/// Arms the points of `spec` (the format of `CAPSTAN_TEST_PAUSE_AT`).
pub fn arm(spec: &str) -> Result<Vec<&'static str>, String> {
    let mut armed = Vec::new();
    for entry in spec.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let (name, at) = match entry.split_once('@') {
            Some((name, n)) => {
                let at = n
                    .parse::<u64>()
                    .ok()
                    .filter(|n| *n >= 1)
                    .ok_or_else(|| format!("{ENV}: {entry:?}: the count after '@' must be a whole number from 1"))?;
                (name, at)
            }
            None => (entry, 1),
        };
        let Some((known, _)) = POINTS.iter().find(|(known, _)| *known == name) else {
            let names: Vec<&str> = POINTS.iter().map(|(n, _)| *n).collect();
            return Err(format!("{ENV}: unknown pause point {name:?} (known: {})", names.join(", ")));
        };
        armed.push(Armed {
            name: known,
            at,
            passed: AtomicU64::new(0),
        });
    }
    let names = armed.iter().map(|a| a.name).collect();
    if ARMED.set(armed).is_err() {
        return Err(format!("{ENV}: pause points are armed once per process"));
    }
    Ok(names)
}

/// Passes the point `name`: stops the process if it is armed and this is its turn.
#[inline]
pub fn point(name: &'static str) {
    if let Some(armed) = ARMED.get() {
        passed(armed, name);
    }
}

#[cold]
fn passed(armed: &[Armed], name: &'static str) {
    for point in armed.iter().filter(|a| a.name == name) {
        if point.passed.fetch_add(1, Ordering::AcqRel) + 1 == point.at {
            // Written straight to stderr: a buffered logger may not flush before the stop.
            eprintln!("capstan: pause point {name} reached: stopping the process until SIGCONT");
            stop_process();
        }
    }
}

#[cfg(unix)]
fn stop_process() {
    // SAFETY: raise(3) with a valid signal number has no memory-safety preconditions.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
}

#[cfg(not(unix))]
fn stop_process() {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_and_malformed_points_are_refused() {
        let err = arm("duty_claimed,no_such_point").unwrap_err();
        assert!(err.contains("unknown pause point \"no_such_point\""), "{err}");
        let err = arm("duty_claimed@0").unwrap_err();
        assert!(err.contains("whole number from 1"), "{err}");
        let err = arm("duty_claimed@x").unwrap_err();
        assert!(err.contains("whole number from 1"), "{err}");
        // Nothing was armed by the refused specs: passing a point does nothing.
        point(DUTY_CLAIMED);
        assert!(ARMED.get().is_none());
    }
}
