//! DW's history budget: how close a run's history is to the size where continue-as-new is
//! recommended, in three dimensions — events, bytes (each event's type plus its JSON payload)
//! and fan-out (the largest `parallel_group_size` recorded). A warning threshold makes the
//! pressure `approaching`; a hard one `continue_as_new_recommended`. Advisory only: the hard
//! refusal is the history limit (`Limits::history_events_max`).
//!
//! The counters are kept on the run as events are appended, from the events themselves, so a
//! replay of the same history reaches the same figures.

use crate::RunState;
use serde_json::{Map, Value};

/// Events at which the pressure is `approaching` / `continue_as_new_recommended` (DW's defaults).
pub const EVENT_WARNING: u64 = 8_000;
pub const EVENT_CONTINUE_AS_NEW: u64 = 10_000;
/// History bytes at which the pressure is `approaching` / `continue_as_new_recommended`.
pub const SIZE_WARNING_BYTES: u64 = 4 * 1024 * 1024;
pub const SIZE_CONTINUE_AS_NEW_BYTES: u64 = 5 * 1024 * 1024;
/// The largest parallel group at which the pressure is `approaching` / `continue_as_new_recommended`.
pub const FAN_OUT_WARNING: u64 = 160;
pub const FAN_OUT_CONTINUE_AS_NEW: u64 = 200;

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Pressure {
    Ok,
    Approaching,
    ContinueAsNewRecommended,
}

impl Pressure {
    pub fn as_str(self) -> &'static str {
        match self {
            Pressure::Ok => "ok",
            Pressure::Approaching => "approaching",
            Pressure::ContinueAsNewRecommended => "continue_as_new_recommended",
        }
    }
}

/// A run's history budget as DW reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryBudget {
    pub event_count: u64,
    pub size_bytes: u64,
    pub fan_out: u64,
    pub pressure: Pressure,
    /// The dimensions at or past the threshold that set the pressure (`event_count`,
    /// `size_bytes`, `fan_out`), in that order.
    pub dimensions: Vec<&'static str>,
}

impl HistoryBudget {
    pub fn of(run: &RunState) -> Self {
        Self::from_counts(run.last_sequence, run.history_size_bytes, run.history_fan_out)
    }

    /// The pressure alone, without the dimensions (checked on every appended event).
    pub fn pressure_of(event_count: u64, size_bytes: u64, fan_out: u64) -> Pressure {
        if event_count >= EVENT_CONTINUE_AS_NEW || size_bytes >= SIZE_CONTINUE_AS_NEW_BYTES || fan_out >= FAN_OUT_CONTINUE_AS_NEW {
            Pressure::ContinueAsNewRecommended
        } else if event_count >= EVENT_WARNING || size_bytes >= SIZE_WARNING_BYTES || fan_out >= FAN_OUT_WARNING {
            Pressure::Approaching
        } else {
            Pressure::Ok
        }
    }

    pub fn from_counts(event_count: u64, size_bytes: u64, fan_out: u64) -> Self {
        let figures = [
            ("event_count", event_count, EVENT_WARNING, EVENT_CONTINUE_AS_NEW),
            ("size_bytes", size_bytes, SIZE_WARNING_BYTES, SIZE_CONTINUE_AS_NEW_BYTES),
            ("fan_out", fan_out, FAN_OUT_WARNING, FAN_OUT_CONTINUE_AS_NEW),
        ];
        let past = |threshold: fn(&(&'static str, u64, u64, u64)) -> u64| -> Vec<&'static str> {
            figures.iter().filter(|f| f.1 >= threshold(f)).map(|f| f.0).collect()
        };
        let hard = past(|f| f.3);
        let (pressure, dimensions) = if !hard.is_empty() {
            (Pressure::ContinueAsNewRecommended, hard)
        } else {
            let soft = past(|f| f.2);
            (if soft.is_empty() { Pressure::Ok } else { Pressure::Approaching }, soft)
        };
        HistoryBudget {
            event_count,
            size_bytes,
            fan_out,
            pressure,
            dimensions,
        }
    }

    pub fn continue_as_new_recommended(&self) -> bool {
        self.pressure == Pressure::ContinueAsNewRecommended
    }
}

/// What one event adds to the size dimension: its type's name and its JSON payload, in bytes.
/// The definition; a run counts the same bytes from the canonical text it hashes (see
/// `RunState::append`), and a property test holds the two equal.
pub fn event_size_bytes(event_type: &str, payload: &Map<String, Value>) -> u64 {
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(0);
    serde_json::to_writer(&mut count, payload).expect("a JSON map serializes");
    event_type.len() as u64 + count.0
}

/// The parallel group size an event records, if any (the fan-out dimension).
pub fn event_fan_out(payload: &Map<String, Value>) -> u64 {
    payload.get("parallel_group_size").and_then(Value::as_u64).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_pressure_follows_dws_thresholds_per_dimension() {
        let budget = HistoryBudget::from_counts(10, 100, 2);
        assert_eq!((budget.pressure, budget.dimensions.len()), (Pressure::Ok, 0));
        let budget = HistoryBudget::from_counts(EVENT_WARNING, 100, FAN_OUT_WARNING);
        assert_eq!(
            (budget.pressure, budget.dimensions.clone()),
            (Pressure::Approaching, vec!["event_count", "fan_out"])
        );
        assert!(!budget.continue_as_new_recommended());
        let budget = HistoryBudget::from_counts(EVENT_WARNING, SIZE_CONTINUE_AS_NEW_BYTES, 0);
        assert_eq!(
            (budget.pressure, budget.dimensions.clone()),
            (Pressure::ContinueAsNewRecommended, vec!["size_bytes"])
        );
        assert!(budget.continue_as_new_recommended());
        assert_eq!(
            HistoryBudget::from_counts(EVENT_CONTINUE_AS_NEW - 1, 0, 0).pressure,
            Pressure::Approaching
        );
        assert_eq!(
            HistoryBudget::from_counts(EVENT_CONTINUE_AS_NEW, 0, 0).pressure,
            Pressure::ContinueAsNewRecommended
        );
        for (events, bytes, fan_out) in [
            (0, 0, 0),
            (EVENT_WARNING, 0, 0),
            (0, SIZE_WARNING_BYTES, FAN_OUT_CONTINUE_AS_NEW),
            (1, 2, FAN_OUT_WARNING),
        ] {
            let budget = HistoryBudget::from_counts(events, bytes, fan_out);
            assert_eq!(HistoryBudget::pressure_of(events, bytes, fan_out), budget.pressure);
        }
    }

    #[test]
    fn an_event_counts_its_type_and_its_json_payload() {
        let payload = json!({"a": "é"}).as_object().unwrap().clone();
        assert_eq!(event_size_bytes("TimerFired", &payload), 10 + r#"{"a":"é"}"#.len() as u64);
        assert_eq!(event_fan_out(&json!({"parallel_group_size": 7}).as_object().unwrap().clone()), 7);
        assert_eq!(event_fan_out(&Map::new()), 0);
    }
}
