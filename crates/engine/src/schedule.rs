//! Schedules: when a schedule fires and what a firing does, as pure functions of the schedule's
//! document, the time, and whether the run it started last is still open. The store runs each
//! firing in the transaction that starts the workflow, so an occurrence fires exactly once.
//!
//! Semantics follow DW v2 (overlap policies, buffers, `max_runs` ending in deletion, pause and
//! resume without catch-up), with two deliberate differences: an interval or cron spec that
//! cannot be evaluated is refused instead of silently never firing, and occurrences missed while
//! the server was down fire one by one when they are within the catch-up window (a restart
//! neither skips nor doubles an occurrence); older ones are skipped and counted.

use crate::timefmt::iso8601;
use crate::Millis;
use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::str::FromStr;

/// Most buffered occurrences a `buffer_all` schedule keeps; later ones are skipped.
pub const BUFFER_ALL_MAX: usize = 1000;
/// How many recent actions describe shows.
const RECENT_ACTIONS: usize = 10;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "snake_case")]
pub enum OverlapPolicy {
    #[default]
    Skip,
    BufferOne,
    BufferAll,
    CancelOther,
    TerminateOther,
    AllowAll,
}

impl OverlapPolicy {
    pub fn parse(text: &str) -> Option<Self> {
        Some(match text {
            "skip" => Self::Skip,
            "buffer_one" => Self::BufferOne,
            "buffer_all" => Self::BufferAll,
            "cancel_other" => Self::CancelOther,
            "terminate_other" => Self::TerminateOther,
            "allow_all" => Self::AllowAll,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Skip => "skip",
            Self::BufferOne => "buffer_one",
            Self::BufferAll => "buffer_all",
            Self::CancelOther => "cancel_other",
            Self::TerminateOther => "terminate_other",
            Self::AllowAll => "allow_all",
        }
    }
}

/// A spec that parsed: cron expressions evaluated in a time zone, and epoch-anchored intervals.
#[derive(Clone, Debug)]
pub struct ParsedSpec {
    crons: Vec<croner::Cron>,
    timezone: chrono_tz::Tz,
    /// (every, offset) in milliseconds.
    intervals: Vec<(i64, i64)>,
}

/// Why a spec was refused: the field and what is wrong with it.
#[derive(Clone, Debug, PartialEq)]
pub struct SpecError {
    pub reason: crate::Reason,
    pub field: String,
    pub message: String,
}

impl SpecError {
    fn new(reason: crate::Reason, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason,
            field: field.into(),
            message: message.into(),
        }
    }
}

impl ParsedSpec {
    /// Parses `{"cron_expressions"?: [..], "intervals"?: [{"every", "offset"?}], "timezone"?}`.
    pub fn parse(spec: &Map<String, Value>) -> Result<Self, SpecError> {
        let timezone = match spec.get("timezone") {
            None | Some(Value::Null) => chrono_tz::UTC,
            Some(Value::String(name)) => chrono_tz::Tz::from_str(name).map_err(|_| {
                SpecError::new(
                    crate::Reason::InvalidScheduleSpec,
                    "spec.timezone",
                    format!("Unknown time zone [{name}]; use an IANA name such as Europe/Paris."),
                )
            })?,
            Some(_) => {
                return Err(SpecError::new(
                    crate::Reason::InvalidScheduleSpec,
                    "spec.timezone",
                    "spec.timezone must be a string.",
                ))
            }
        };
        let mut crons = Vec::new();
        match spec.get("cron_expressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let text = item.as_str().ok_or_else(|| {
                        SpecError::new(
                            crate::Reason::ValidationFailed,
                            format!("spec.cron_expressions.{i}"),
                            "Cron expressions must be strings.",
                        )
                    })?;
                    crons.push(parse_cron(text).map_err(|message| {
                        SpecError::new(
                            crate::Reason::InvalidCronExpression,
                            "spec.cron_expressions",
                            format!("Invalid cron expression: [{text}]. {message}"),
                        )
                    })?);
                }
            }
            Some(_) => {
                return Err(SpecError::new(
                    crate::Reason::ValidationFailed,
                    "spec.cron_expressions",
                    "spec.cron_expressions must be a list.",
                ))
            }
        }
        let mut intervals = Vec::new();
        match spec.get("intervals") {
            None | Some(Value::Null) => {}
            Some(Value::Array(items)) => {
                for (i, item) in items.iter().enumerate() {
                    let field = format!("spec.intervals.{i}.every");
                    let every = item.get("every").and_then(Value::as_str).ok_or_else(|| {
                        SpecError::new(
                            crate::Reason::ValidationFailed,
                            field.clone(),
                            "Each interval needs an \"every\" duration such as PT1H.",
                        )
                    })?;
                    let every_ms = parse_duration_ms(every)
                        .filter(|ms| (1..=MAX_INTERVAL_MS).contains(ms))
                        .ok_or_else(|| {
                            SpecError::new(
                                crate::Reason::InvalidScheduleSpec,
                                field.clone(),
                                format!(
                                    "Invalid interval [{every}]: use an ISO-8601 duration from PT0.001S to P3650D, such as PT30S, PT1H or P1D."
                                ),
                            )
                        })?;
                    let offset_ms = match item.get("offset") {
                        None | Some(Value::Null) => 0,
                        Some(Value::String(text)) => parse_duration_ms(text).ok_or_else(|| {
                            SpecError::new(
                                crate::Reason::InvalidScheduleSpec,
                                format!("spec.intervals.{i}.offset"),
                                format!("Invalid offset [{text}]: use an ISO-8601 duration."),
                            )
                        })?,
                        Some(_) => {
                            return Err(SpecError::new(
                                crate::Reason::ValidationFailed,
                                format!("spec.intervals.{i}.offset"),
                                "The offset must be a duration string.",
                            ))
                        }
                    };
                    intervals.push((every_ms, offset_ms.rem_euclid(every_ms)));
                }
            }
            Some(_) => {
                return Err(SpecError::new(
                    crate::Reason::ValidationFailed,
                    "spec.intervals",
                    "spec.intervals must be a list.",
                ))
            }
        }
        if crons.is_empty() && intervals.is_empty() {
            return Err(SpecError::new(
                crate::Reason::InvalidScheduleSpec,
                "spec",
                "Schedule spec must include at least one cron_expression or interval.",
            ));
        }
        Ok(Self {
            crons,
            timezone,
            intervals,
        })
    }

    /// Refuses a cron expression that matches no date at all (`0 0 31 2 *`): it would never
    /// fire, and every evaluation of it searches the calendar to its end (tens of ms) again.
    /// Creates and updates pay that search once.
    pub fn check_every_cron_fires(&self, now: Millis) -> Result<(), SpecError> {
        let Some(start) = Utc.timestamp_millis_opt(now).single() else {
            return Ok(());
        };
        for cron in &self.crons {
            if cron.find_next_occurrence(&start.with_timezone(&self.timezone), false).is_err() {
                return Err(SpecError::new(
                    crate::Reason::InvalidCronExpression,
                    "spec.cron_expressions",
                    format!("The cron expression [{}] matches no date: it would never fire.", cron.pattern),
                ));
            }
        }
        Ok(())
    }

    /// The first occurrence strictly after `after`.
    pub fn next_after(&self, after: Millis) -> Option<Millis> {
        let mut best: Option<Millis> = None;
        for &(every, offset) in &self.intervals {
            // Checked: an occurrence past the end of time is no occurrence, never a wrapped one.
            let next = after
                .checked_sub(offset)
                .map(|since| since.div_euclid(every))
                .and_then(|periods| periods.checked_add(1))
                .and_then(|periods| periods.checked_mul(every))
                .and_then(|at| at.checked_add(offset));
            if let Some(next) = next {
                best = Some(best.map_or(next, |b| b.min(next)));
            }
        }
        if !self.crons.is_empty() {
            // Cron has minute resolution: search from the whole second after `after`.
            let start = Utc.timestamp_millis_opt(after).single()?.with_timezone(&self.timezone);
            for cron in &self.crons {
                if let Ok(next) = cron.find_next_occurrence(&start, false) {
                    let next = next.timestamp_millis();
                    if next > after {
                        best = Some(best.map_or(next, |b| b.min(next)));
                    }
                }
            }
        }
        best
    }
}

fn parse_cron(text: &str) -> Result<croner::Cron, String> {
    let trimmed = text.trim();
    if !trimmed.starts_with('@') {
        let fields: Vec<&str> = trimmed.split_whitespace().collect();
        if fields.len() != 5 {
            return Err("Use five fields: minute hour day-of-month month day-of-week.".into());
        }
        // Standard cron only: croner's extensions (`+` for day-of-month AND day-of-week) are
        // not what DW's server accepts. And croner takes `,` and `1,,2` as lists with nothing
        // in them, then searches its whole calendar on every evaluation (seconds; both found
        // by fuzzing).
        let standard = |c: char| c.is_ascii_alphanumeric() || matches!(c, '*' | ',' | '-' | '/' | '?' | '#');
        if !fields.iter().all(|field| field.chars().all(standard)) {
            return Err("Use digits, names, and * , - / ? L W # only.".into());
        }
        if fields.iter().any(|field| field.split(',').any(str::is_empty)) {
            return Err("A list in a field has an empty item.".into());
        }
    }
    croner::Cron::from_str(trimmed).map_err(|e| e.to_string())
}

/// The longest interval a schedule may have (ten years, like every other delay).
pub const MAX_INTERVAL_MS: i64 = 3_650 * 86_400_000;

/// ISO-8601 durations (`PT30S`, `PT1H30M`, `P1D`, `P1W`; months as 30 days, years as 365, as DW
/// counts them), and the short forms `500ms`, `30s`, `5m`, `1h`, `1d`.
pub fn parse_duration_ms(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Some(rest) = text.strip_prefix('P').or_else(|| text.strip_prefix('p')) {
        let (date, time) = match rest.find(['T', 't']) {
            Some(i) => (&rest[..i], Some(&rest[i + 1..])),
            None => (rest, None),
        };
        if date.is_empty() && time.is_none_or(str::is_empty) {
            return None;
        }
        let mut total: i64 = 0;
        let mut add = |part: &str, units: &[(char, i64)]| -> Option<()> {
            let mut number = String::new();
            let mut last_unit = 0usize;
            for c in part.chars() {
                if c.is_ascii_digit() || c == '.' {
                    number.push(c);
                    continue;
                }
                let index = units.iter().position(|(u, _)| u.eq_ignore_ascii_case(&c))?;
                if index < last_unit || number.is_empty() {
                    return None;
                }
                last_unit = index + 1;
                let value: f64 = number.parse().ok()?;
                total = total.checked_add((value * units[index].1 as f64).round() as i64)?;
                number.clear();
            }
            number.is_empty().then_some(())
        };
        add(
            date,
            &[
                ('Y', 365 * 86_400_000),
                ('M', 30 * 86_400_000),
                ('W', 7 * 86_400_000),
                ('D', 86_400_000),
            ],
        )?;
        if let Some(time) = time {
            if time.is_empty() {
                return None;
            }
            add(time, &[('H', 3_600_000), ('M', 60_000), ('S', 1_000)])?;
        }
        return Some(total);
    }
    let split = text.find(|c: char| !c.is_ascii_digit())?;
    let (number, unit) = text.split_at(split);
    let number: i64 = number.parse().ok()?;
    let unit_ms = match unit {
        "ms" => 1,
        "s" => 1_000,
        "m" => 60_000,
        "h" => 3_600_000,
        "d" => 86_400_000,
        _ => return None,
    };
    number.checked_mul(unit_ms)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleStatus {
    Active,
    Paused,
    Deleted,
}

impl ScheduleStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Active => "active",
            Self::Paused => "paused",
            Self::Deleted => "deleted",
        }
    }
}

/// What a firing starts: the workflow, as the schedule's `action` describes it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleAction {
    pub workflow_type: String,
    pub task_queue: Option<String>,
    /// The input envelope as the client sent it (echoed back by describe).
    pub input: Option<Value>,
    pub execution_timeout_seconds: Option<i64>,
    pub run_timeout_seconds: Option<i64>,
    /// The input as the started workflow receives it (the server encodes it at create/update).
    #[serde(default)]
    pub input_payload: Option<crate::Payload>,
}

/// An occurrence waiting in a buffer for the previous run to close.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Buffered {
    pub buffered_at: Millis,
    pub occurrence: Millis,
}

/// One audit event of a schedule (its history, which survives deletion).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ScheduleEvent {
    pub event_type: String,
    pub recorded_at: Millis,
    pub workflow_id: Option<String>,
    pub run_id: Option<String>,
    pub payload: Map<String, Value>,
}

/// The schedule document: everything the store keeps for one schedule.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Schedule {
    pub namespace: String,
    pub schedule_id: String,
    /// The spec as sent (echoed by describe); parsed again whenever it is evaluated.
    pub spec: Map<String, Value>,
    pub action: ScheduleAction,
    pub overlap_policy: OverlapPolicy,
    pub jitter_seconds: i64,
    pub max_runs: Option<i64>,
    pub remaining_actions: Option<i64>,
    pub memo: Option<Map<String, Value>>,
    pub search_attributes: Option<Map<String, Value>>,
    pub status: ScheduleStatus,
    pub note: Option<String>,
    pub paused_at: Option<Millis>,
    pub deleted_at: Option<Millis>,
    pub created_at: Millis,
    pub updated_at: Millis,
    /// The next nominal occurrence (before jitter).
    pub next_occurrence: Option<Millis>,
    /// The latest nominal occurrence already taken (fired, buffered or skipped). A next
    /// occurrence recomputed later (resume, update) is always after it, whatever the clock of
    /// the node recomputing it: cluster nodes' clocks differ, and one behind the node that fired
    /// would otherwise offer the same occurrence again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_occurrence: Option<Millis>,
    pub fires_count: i64,
    pub failures_count: i64,
    pub last_fired_at: Option<Millis>,
    pub latest_workflow_id: Option<String>,
    pub latest_run_id: Option<String>,
    pub recent_actions: Vec<Value>,
    pub buffered: Vec<Buffered>,
    pub skipped_trigger_count: i64,
    pub last_skip_reason: Option<String>,
    pub last_skipped_at: Option<Millis>,
    /// Events recorded by the last change, for the store to append (never stored here).
    #[serde(skip)]
    pub pending_events: Vec<ScheduleEvent>,
    /// Who is making the current change (never stored here): its events and the runs it
    /// starts record it. `None`: the scheduler's own evaluation.
    #[serde(skip)]
    pub acting: Option<crate::Principal>,
}

/// The fields a create or update may set (None: not given).
#[derive(Clone, Debug, Default)]
pub struct ScheduleFields {
    pub spec: Option<Map<String, Value>>,
    /// For an update, merged over the stored action field by field.
    pub action: Option<Map<String, Value>>,
    pub overlap_policy: Option<OverlapPolicy>,
    pub jitter_seconds: Option<i64>,
    pub max_runs: Option<i64>,
    /// `Some(None)`: clear.
    pub memo: Option<Option<Map<String, Value>>>,
    pub search_attributes: Option<Option<Map<String, Value>>>,
    pub note: Option<String>,
    /// The encoded input when `action.input` is given.
    pub input_payload: Option<crate::Payload>,
}

fn action_from(map: &Map<String, Value>) -> Result<ScheduleAction, SpecError> {
    let workflow_type = map
        .get("workflow_type")
        .and_then(Value::as_str)
        .filter(|s| !s.is_empty())
        .ok_or_else(|| {
            SpecError::new(
                crate::Reason::ValidationFailed,
                "action.workflow_type",
                "The action needs a workflow_type.",
            )
        })?;
    let seconds = |key: &str| -> Result<Option<i64>, SpecError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v.as_i64().filter(|n| *n >= 1).map(Some).ok_or_else(|| {
                SpecError::new(
                    crate::Reason::ValidationFailed,
                    format!("action.{key}"),
                    format!("action.{key} must be an integer of at least 1."),
                )
            }),
        }
    };
    Ok(ScheduleAction {
        workflow_type: workflow_type.to_string(),
        task_queue: map.get("task_queue").and_then(Value::as_str).map(str::to_string),
        input: map.get("input").filter(|v| !v.is_null()).cloned(),
        execution_timeout_seconds: seconds("execution_timeout_seconds")?,
        run_timeout_seconds: seconds("run_timeout_seconds")?,
        input_payload: None,
    })
}

fn action_json(action: &ScheduleAction) -> Map<String, Value> {
    let mut map = Map::new();
    map.insert("workflow_type".into(), json!(action.workflow_type));
    map.insert("task_queue".into(), json!(action.task_queue));
    map.insert("input".into(), action.input.clone().unwrap_or(Value::Null));
    map.insert("execution_timeout_seconds".into(), json!(action.execution_timeout_seconds));
    map.insert("run_timeout_seconds".into(), json!(action.run_timeout_seconds));
    map
}

/// Whole seconds of jitter for an occurrence: derived from the schedule id and the occurrence,
/// so every node (and every retry after a crash) computes the same fire time.
fn jitter_ms(schedule_id: &str, occurrence: Millis, jitter_seconds: i64) -> Millis {
    if jitter_seconds <= 0 {
        return 0;
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(format!("{schedule_id}\u{1f}{occurrence}").as_bytes());
    let n = u64::from_be_bytes(digest[..8].try_into().expect("8 bytes"));
    (n % (jitter_seconds as u64 + 1)) as i64 * 1000
}

impl Schedule {
    /// A new schedule; `Err` names the refused field.
    pub fn create(
        namespace: &str,
        schedule_id: &str,
        spec: Map<String, Value>,
        action: &Map<String, Value>,
        fields: ScheduleFields,
        paused: bool,
        now: Millis,
    ) -> Result<Self, SpecError> {
        let parsed = ParsedSpec::parse(&spec)?;
        parsed.check_every_cron_fires(now)?;
        let mut schedule = Schedule {
            namespace: namespace.to_string(),
            schedule_id: schedule_id.to_string(),
            spec,
            action: ScheduleAction {
                input_payload: fields.input_payload.clone(),
                ..action_from(action)?
            },
            overlap_policy: fields.overlap_policy.unwrap_or_default(),
            jitter_seconds: fields.jitter_seconds.unwrap_or(0),
            max_runs: fields.max_runs,
            remaining_actions: fields.max_runs,
            memo: fields.memo.flatten().filter(|m| !m.is_empty()),
            search_attributes: fields.search_attributes.flatten().filter(|m| !m.is_empty()),
            status: ScheduleStatus::Active,
            note: fields.note,
            paused_at: None,
            deleted_at: None,
            created_at: now,
            updated_at: now,
            next_occurrence: parsed.next_after(now),
            last_occurrence: None,
            fires_count: 0,
            failures_count: 0,
            last_fired_at: None,
            latest_workflow_id: None,
            latest_run_id: None,
            recent_actions: Vec::new(),
            buffered: Vec::new(),
            skipped_trigger_count: 0,
            last_skip_reason: None,
            last_skipped_at: None,
            pending_events: Vec::new(),
            acting: None,
        };
        let mut payload = Map::new();
        payload.insert("spec".into(), Value::Object(schedule.spec.clone()));
        payload.insert("action".into(), Value::Object(action_json(&schedule.action)));
        payload.insert("overlap_policy".into(), json!(schedule.overlap_policy.as_str()));
        payload.insert("next_fire_at".into(), json!(schedule.next_fire_at().map(iso8601)));
        schedule.record(now, "ScheduleCreated", payload, None);
        if paused {
            schedule.pause(None, now);
        }
        Ok(schedule)
    }

    /// When the next occurrence fires (jitter included), if the schedule is active.
    pub fn next_fire_at(&self) -> Option<Millis> {
        let occurrence = self.next_occurrence?;
        Some(occurrence + jitter_ms(&self.schedule_id, occurrence, self.jitter_seconds))
    }

    /// When the scheduler should look at this schedule again: its next fire, or soon while a
    /// buffer waits for the previous run to close.
    pub fn wake_at(&self) -> Option<Millis> {
        if self.status != ScheduleStatus::Active {
            return None;
        }
        self.next_fire_at()
    }

    pub fn has_buffer(&self) -> bool {
        self.status == ScheduleStatus::Active && !self.buffered.is_empty()
    }

    /// Names who makes the change under way: the events it has recorded so far (a create's)
    /// and every one it records from now on carry the principal.
    pub fn acting_as(&mut self, principal: Option<crate::Principal>) {
        for event in &mut self.pending_events {
            event
                .payload
                .insert("principal".into(), crate::principal::recorded(principal.as_ref()));
        }
        self.acting = principal;
    }

    fn record(&mut self, now: Millis, event_type: &str, mut payload: Map<String, Value>, run: Option<(&str, Option<&str>)>) {
        payload.insert("schedule".into(), self.snapshot());
        payload.insert("principal".into(), crate::principal::recorded(self.acting.as_ref()));
        self.pending_events.push(ScheduleEvent {
            event_type: event_type.to_string(),
            recorded_at: now,
            workflow_id: run.map(|(w, _)| w.to_string()),
            run_id: run.and_then(|(_, r)| r.map(str::to_string)),
            payload,
        });
    }

    fn snapshot(&self) -> Value {
        let mut map = Map::new();
        let mut put = |k: &str, v: Value| {
            if !v.is_null() {
                map.insert(k.into(), v);
            }
        };
        put("schedule_id", json!(self.schedule_id));
        put("namespace", json!(self.namespace));
        put("status", json!(self.status.as_str()));
        put("overlap_policy", json!(self.overlap_policy.as_str()));
        put("next_fire_at", json!(self.next_fire_at().map(iso8601)));
        put("last_fired_at", json!(self.last_fired_at.map(iso8601)));
        put("paused_at", json!(self.paused_at.map(iso8601)));
        put("deleted_at", json!(self.deleted_at.map(iso8601)));
        put("last_skip_reason", json!(self.last_skip_reason));
        put("last_skipped_at", json!(self.last_skipped_at.map(iso8601)));
        put("fires_count", json!(self.fires_count));
        put("skipped_trigger_count", json!(self.skipped_trigger_count));
        put("latest_workflow_instance_id", json!(self.latest_workflow_id));
        put("note", json!(self.note));
        Value::Object(map)
    }

    fn recompute_next(&mut self, from: Millis) {
        let from = self.last_occurrence.map_or(from, |last| from.max(last));
        self.next_occurrence = ParsedSpec::parse(&self.spec).ok().and_then(|spec| spec.next_after(from));
    }

    pub fn update(&mut self, fields: ScheduleFields, now: Millis) -> Result<(), SpecError> {
        let mut changed = vec!["spec", "action"];
        if let Some(spec) = fields.spec {
            ParsedSpec::parse(&spec)?.check_every_cron_fires(now)?;
            self.spec = spec;
        }
        if let Some(action) = fields.action {
            let mut merged = action_json(&self.action);
            for (k, v) in action {
                merged.insert(k, v);
            }
            let action = action_from(&merged)?;
            let kept = self.action.input_payload.take();
            self.action = ScheduleAction {
                input_payload: fields.input_payload.clone().or(kept),
                ..action
            };
        }
        if let Some(policy) = fields.overlap_policy {
            self.overlap_policy = policy;
            changed.push("overlap_policy");
        }
        if let Some(jitter) = fields.jitter_seconds {
            self.jitter_seconds = jitter;
            changed.push("jitter_seconds");
        }
        if let Some(note) = fields.note {
            self.note = Some(note);
            changed.push("note");
        }
        if let Some(memo) = fields.memo {
            self.memo = memo.filter(|m| !m.is_empty());
            changed.push("memo");
        }
        if let Some(attributes) = fields.search_attributes {
            self.search_attributes = attributes.filter(|m| !m.is_empty());
            changed.push("search_attributes");
        }
        if let Some(max_runs) = fields.max_runs {
            self.max_runs = Some(max_runs);
            changed.push("max_runs");
            if self.remaining_actions.is_none() || max_runs > self.fires_count {
                self.remaining_actions = Some((max_runs - self.fires_count).max(0));
                changed.push("remaining_actions");
            }
        }
        self.updated_at = now;
        self.recompute_next(now);
        let mut payload = Map::new();
        payload.insert("changed_fields".into(), json!(changed));
        payload.insert("spec".into(), Value::Object(self.spec.clone()));
        payload.insert("action".into(), Value::Object(action_json(&self.action)));
        payload.insert("overlap_policy".into(), json!(self.overlap_policy.as_str()));
        payload.insert("next_fire_at".into(), json!(self.next_fire_at().map(iso8601)));
        self.record(now, "ScheduleUpdated", payload, None);
        Ok(())
    }

    pub fn pause(&mut self, note: Option<String>, now: Millis) {
        self.status = ScheduleStatus::Paused;
        self.paused_at = Some(now);
        if note.is_some() {
            self.note = note.clone();
        }
        self.updated_at = now;
        let mut payload = Map::new();
        if let Some(note) = note {
            payload.insert("reason".into(), json!(note));
        }
        payload.insert("paused_at".into(), json!(iso8601(now)));
        self.record(now, "SchedulePaused", payload, None);
    }

    /// Resumes from now: occurrences missed while paused do not fire (DW semantics).
    pub fn resume(&mut self, note: Option<String>, now: Millis) {
        self.status = ScheduleStatus::Active;
        self.paused_at = None;
        if note.is_some() {
            self.note = note;
        }
        self.updated_at = now;
        self.recompute_next(now);
        let mut payload = Map::new();
        payload.insert("next_fire_at".into(), json!(self.next_fire_at().map(iso8601)));
        self.record(now, "ScheduleResumed", payload, None);
    }

    pub fn delete(&mut self, reason: &str, now: Millis) {
        self.status = ScheduleStatus::Deleted;
        self.deleted_at = Some(now);
        self.next_occurrence = None;
        self.buffered.clear();
        self.updated_at = now;
        let mut payload = Map::new();
        payload.insert("reason".into(), json!(reason));
        payload.insert("deleted_at".into(), json!(iso8601(now)));
        self.record(now, "ScheduleDeleted", payload, None);
    }

    fn skip(&mut self, reason: &str, count: i64, now: Millis) {
        self.skipped_trigger_count += count;
        self.last_skip_reason = Some(reason.to_string());
        self.last_skipped_at = Some(now);
        let mut payload = Map::new();
        payload.insert("reason".into(), json!(reason));
        payload.insert("skipped_trigger_count".into(), json!(self.skipped_trigger_count));
        payload.insert("last_skipped_at".into(), json!(iso8601(now)));
        self.record(now, "ScheduleTriggerSkipped", payload, None);
    }

    /// The next due occurrence at `now`, if any. Occurrences older than the catch-up window are
    /// skipped (one event counting them) and the schedule moves on to the oldest one inside it.
    pub fn take_due(&mut self, now: Millis, catchup_window_ms: i64) -> Option<Millis> {
        if self.status != ScheduleStatus::Active {
            return None;
        }
        let fire_at = self.next_fire_at()?;
        if fire_at > now {
            return None;
        }
        let occurrence = self.next_occurrence?;
        let horizon = now - catchup_window_ms;
        if fire_at < horizon {
            let spec = ParsedSpec::parse(&self.spec).ok()?;
            const COUNT_CAP: i64 = 100_000;
            let fire_time = |at: Millis| at + jitter_ms(&self.schedule_id, at, self.jitter_seconds);
            let (mut missed, mut latest_missed, mut cursor) = (0i64, occurrence, Some(occurrence));
            while let Some(at) = cursor {
                if fire_time(at) >= horizon || missed >= COUNT_CAP {
                    break;
                }
                missed += 1;
                latest_missed = at;
                cursor = spec.next_after(at);
            }
            // Past the counting cap, jump straight to the window.
            let resume_from = if missed >= COUNT_CAP {
                spec.next_after(horizon - 1)
            } else {
                cursor
            };
            if resume_from.is_some_and(|at| fire_time(at) <= now) {
                self.skip("missed_catchup_window", missed, now);
                self.last_occurrence = Some(latest_missed);
                self.next_occurrence = resume_from;
                return self.take_due(now, catchup_window_ms);
            }
            // Nothing inside the window is due: the latest missed occurrence still fires once
            // (DW's policy, and all of it with a zero window); the older ones are skipped.
            if missed > 1 {
                self.skip("missed_catchup_window", missed - 1, now);
            }
            self.next_occurrence = Some(latest_missed);
            return Some(latest_missed);
        }
        Some(occurrence)
    }

    /// Moves past `occurrence` (after it fired, was skipped or buffered).
    pub fn advance_past(&mut self, occurrence: Millis) {
        if self.next_occurrence == Some(occurrence) {
            self.last_occurrence = Some(occurrence);
            self.next_occurrence = ParsedSpec::parse(&self.spec).ok().and_then(|spec| spec.next_after(occurrence));
        }
    }

    /// What to do with an occurrence, given whether the run this schedule started last is open.
    pub fn decide(&mut self, occurrence: Millis, trigger: Trigger, policy: OverlapPolicy, previous_open: bool, now: Millis) -> Decision {
        if self.status != ScheduleStatus::Active && trigger != Trigger::Drain {
            return Decision::Skipped("status_not_triggerable");
        }
        if self.remaining_actions.is_some_and(|r| r <= 0) {
            self.skip("remaining_actions_exhausted", 1, now);
            return Decision::Skipped("remaining_actions_exhausted");
        }
        let policy = match (trigger, policy) {
            (Trigger::Backfill, OverlapPolicy::BufferOne | OverlapPolicy::BufferAll) => OverlapPolicy::AllowAll,
            (_, policy) => policy,
        };
        if !previous_open {
            return Decision::Start {
                policy,
                close_previous: None,
            };
        }
        match policy {
            OverlapPolicy::AllowAll => Decision::Start {
                policy,
                close_previous: None,
            },
            OverlapPolicy::CancelOther => Decision::Start {
                policy,
                close_previous: Some(crate::run::CloseCommand::Cancel),
            },
            OverlapPolicy::TerminateOther => Decision::Start {
                policy,
                close_previous: Some(crate::run::CloseCommand::Terminate),
            },
            OverlapPolicy::Skip => {
                self.skip("overlap_policy_skip", 1, now);
                Decision::Skipped("overlap_policy_skip")
            }
            OverlapPolicy::BufferOne | OverlapPolicy::BufferAll => {
                let full = match policy {
                    OverlapPolicy::BufferOne => !self.buffered.is_empty(),
                    _ => self.buffered.len() >= BUFFER_ALL_MAX,
                };
                if full {
                    self.skip("buffer_full", 1, now);
                    Decision::BufferFull
                } else {
                    self.buffered.push(Buffered {
                        buffered_at: now,
                        occurrence,
                    });
                    Decision::Buffered(self.buffered.len())
                }
            }
        }
    }

    /// Records a started workflow. Returns true when `max_runs` is now used up (the schedule
    /// deleted itself).
    pub fn record_started(
        &mut self,
        occurrence: Millis,
        trigger: Trigger,
        policy: OverlapPolicy,
        workflow_id: &str,
        run_id: &str,
        now: Millis,
    ) -> bool {
        self.fires_count += 1;
        self.last_fired_at = Some(now);
        self.latest_workflow_id = Some(workflow_id.to_string());
        self.latest_run_id = Some(run_id.to_string());
        self.updated_at = now;
        let outcome = trigger.outcome();
        self.recent_actions.push(json!({
            "workflow_id": workflow_id, "run_id": run_id, "outcome": outcome, "fired_at": iso8601(now),
            "occurrence_time": iso8601(occurrence), "fire_lag_ms": (now - occurrence).max(0),
        }));
        if self.recent_actions.len() > RECENT_ACTIONS {
            self.recent_actions.remove(0);
        }
        let mut payload = Map::new();
        payload.insert("workflow_instance_id".into(), json!(workflow_id));
        payload.insert("workflow_run_id".into(), json!(run_id));
        payload.insert("outcome".into(), json!(outcome));
        payload.insert("effective_overlap_policy".into(), json!(policy.as_str()));
        payload.insert("trigger_number".into(), json!(self.fires_count));
        payload.insert("occurrence_time".into(), json!(iso8601(occurrence)));
        self.record(now, "ScheduleTriggered", payload, Some((workflow_id, Some(run_id))));
        if let Some(remaining) = self.remaining_actions.as_mut() {
            *remaining = (*remaining - 1).max(0);
            if *remaining == 0 {
                self.delete("max_runs_exhausted", now);
                return true;
            }
        }
        false
    }

    /// Records a start that could not be made (the workflow id is taken, the namespace is gone).
    pub fn record_failure(&mut self, reason: &str, now: Millis) {
        self.failures_count += 1;
        self.last_fired_at = Some(now);
        self.recent_actions
            .push(json!({"outcome": "failed", "reason": reason, "fired_at": iso8601(now)}));
        if self.recent_actions.len() > RECENT_ACTIONS {
            self.recent_actions.remove(0);
        }
    }

    /// The oldest buffered occurrence, once the previous run has closed.
    pub fn take_buffered(&mut self, previous_open: bool) -> Option<Millis> {
        if previous_open || self.status != ScheduleStatus::Active || self.buffered.is_empty() {
            return None;
        }
        Some(self.buffered.remove(0).occurrence)
    }

    /// Occurrences in `[start, end)`, unjittered, at most `limit`.
    pub fn occurrences_between(&self, start: Millis, end: Millis, limit: usize) -> Vec<Millis> {
        let Ok(spec) = ParsedSpec::parse(&self.spec) else {
            return Vec::new();
        };
        let mut out = Vec::new();
        let mut cursor = spec.next_after(start - 1);
        while let Some(at) = cursor {
            if at >= end || out.len() >= limit {
                break;
            }
            out.push(at);
            cursor = spec.next_after(at);
        }
        out
    }

    /// The describe document (DW's nested `state`/`info` and the newer top-level fields).
    pub fn describe(&self) -> Value {
        let next_fire_at = match self.status {
            ScheduleStatus::Deleted => None,
            _ => self.next_fire_at().map(iso8601),
        };
        json!({
            "schedule_id": self.schedule_id,
            "namespace": self.namespace,
            "workflow_type": self.action.workflow_type,
            "spec": self.spec,
            "action": action_json(&self.action),
            "overlap_policy": self.overlap_policy.as_str(),
            "status": self.status.as_str(),
            "paused": self.status == ScheduleStatus::Paused,
            "note": self.note,
            "state": {"status": self.status.as_str(), "paused": self.status == ScheduleStatus::Paused, "note": self.note},
            "info": {
                "next_fire": next_fire_at,
                "last_fire": self.last_fired_at.map(iso8601),
                "fires_count": self.fires_count,
                "failures_count": self.failures_count,
                "recent_actions": self.recent_actions,
                "buffered_actions": self.buffered.iter().map(|b| json!({
                    "buffered_at": iso8601(b.buffered_at), "occurrence_time": iso8601(b.occurrence)})).collect::<Vec<_>>(),
                "skipped_trigger_count": self.skipped_trigger_count,
                "last_skip_reason": self.last_skip_reason,
                "last_skipped_at": self.last_skipped_at.map(iso8601),
            },
            "memo": self.memo,
            "search_attributes": self.search_attributes,
            "jitter_seconds": self.jitter_seconds,
            "max_runs": self.max_runs,
            "remaining_actions": self.remaining_actions,
            "fires_count": self.fires_count,
            "failures_count": self.failures_count,
            "next_fire_at": next_fire_at,
            "last_fired_at": self.last_fired_at.map(iso8601),
            "latest_workflow_instance_id": self.latest_workflow_id,
            "paused_at": self.paused_at.map(iso8601),
            "created_at": iso8601(self.created_at),
            "updated_at": iso8601(self.updated_at),
        })
    }
}

/// What made an occurrence fire.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Trigger {
    /// The spec's time came.
    Tick,
    /// An operator's trigger-now.
    Manual,
    Backfill,
    /// A buffered occurrence, after the previous run closed.
    Drain,
}

impl Trigger {
    fn outcome(self) -> &'static str {
        match self {
            Trigger::Tick | Trigger::Manual => "scheduled",
            Trigger::Backfill => "backfilled",
            Trigger::Drain => "drained",
        }
    }
}

/// What `decide` concluded.
#[derive(Clone, Debug, PartialEq)]
pub enum Decision {
    Start {
        policy: OverlapPolicy,
        close_previous: Option<crate::run::CloseCommand>,
    },
    Buffered(usize),
    BufferFull,
    Skipped(&'static str),
}

/// `DateTime` helper for tests and callers that parse RFC 3339 bounds.
pub fn parse_instant(text: &str) -> Option<Millis> {
    DateTime::parse_from_rfc3339(text.trim())
        .ok()
        .map(|t| t.timestamp_millis())
        .or_else(|| {
            chrono::NaiveDate::parse_from_str(text.trim(), "%Y-%m-%d")
                .ok()
                .and_then(|d| d.and_hms_opt(0, 0, 0))
                .map(|t| t.and_utc().timestamp_millis())
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: Value) -> Map<String, Value> {
        value.as_object().unwrap().clone()
    }

    fn at(text: &str) -> Millis {
        parse_instant(text).unwrap()
    }

    #[test]
    fn durations_parse_in_iso_8601_and_short_forms() {
        assert_eq!(parse_duration_ms("PT30S"), Some(30_000));
        assert_eq!(parse_duration_ms("PT1H30M"), Some(5_400_000));
        assert_eq!(parse_duration_ms("P1D"), Some(86_400_000));
        assert_eq!(parse_duration_ms("P1W"), Some(7 * 86_400_000));
        assert_eq!(parse_duration_ms("PT0.5S"), Some(500));
        assert_eq!(parse_duration_ms("1h"), Some(3_600_000));
        assert_eq!(parse_duration_ms("250ms"), Some(250));
        for bad in ["", "P", "PT", "PT1X", "1y", "P1H", "PTM", "PT1S1H", "h"] {
            assert_eq!(parse_duration_ms(bad), None, "{bad}");
        }
    }

    #[test]
    fn intervals_are_anchored_at_the_epoch_with_their_offset() {
        let parsed = ParsedSpec::parse(&spec(json!({"intervals": [{"every": "PT1H", "offset": "PT15M"}]}))).unwrap();
        assert_eq!(parsed.next_after(at("2026-01-01T10:20:00Z")), Some(at("2026-01-01T11:15:00Z")));
        assert_eq!(
            parsed.next_after(at("2026-01-01T11:15:00Z")),
            Some(at("2026-01-01T12:15:00Z")),
            "strictly after"
        );
    }

    #[test]
    fn cron_is_evaluated_in_the_time_zone_and_combined_with_intervals() {
        let parsed = ParsedSpec::parse(&spec(json!({"cron_expressions": ["0 9 * * *"], "timezone": "Europe/Paris"}))).unwrap();
        // 09:00 in Paris in January is 08:00 UTC; in July, 07:00 UTC.
        assert_eq!(parsed.next_after(at("2026-01-10T00:00:00Z")), Some(at("2026-01-10T08:00:00Z")));
        assert_eq!(parsed.next_after(at("2026-07-10T00:00:00Z")), Some(at("2026-07-10T07:00:00Z")));
        let both = ParsedSpec::parse(&spec(json!({"cron_expressions": ["@daily"], "intervals": [{"every": "PT7H"}]}))).unwrap();
        assert_eq!(both.next_after(at("2026-01-10T22:00:00Z")), Some(at("2026-01-11T00:00:00Z")));
        // PT7H instants are multiples of seven hours since the epoch: 2026-01-10T22:00Z, then 05:00Z.
        assert_eq!(both.next_after(at("2026-01-11T00:00:00Z")), Some(at("2026-01-11T05:00:00Z")));
    }

    #[test]
    fn bad_specs_are_refused_with_the_field() {
        let refused = |value: Value| ParsedSpec::parse(&spec(value)).unwrap_err();
        assert_eq!(refused(json!({})).reason, crate::Reason::InvalidScheduleSpec);
        assert_eq!(
            refused(json!({"cron_expressions": ["61 * * * *"]})).reason,
            crate::Reason::InvalidCronExpression
        );
        assert_eq!(
            refused(json!({"cron_expressions": ["* * * * * *"]})).reason,
            crate::Reason::InvalidCronExpression
        );
        assert_eq!(refused(json!({"intervals": [{"every": "soon"}]})).field, "spec.intervals.0.every");
        assert_eq!(
            refused(json!({"intervals": [{"every": "PT1M"}], "timezone": "Mars/Olympus"})).field,
            "spec.timezone"
        );
    }

    /// Found by fuzzing: `P177777777777777777777777777777Y` parsed as an interval of i64::MAX
    /// ms, and the next occurrence overflowed to one in the past (a schedule that would fire on
    /// every pass in a release build, a panic in a debug one).
    #[test]
    fn intervals_longer_than_ten_years_are_refused_and_occurrences_never_wrap() {
        for every in [
            "P177777777777777777777777777777Y",
            "PT100000000000H",
            "P3651D",
            "9223372036854775807ms",
        ] {
            let error = ParsedSpec::parse(&spec(json!({"intervals": [{"every": every}]}))).unwrap_err();
            assert_eq!(error.reason, crate::Reason::InvalidScheduleSpec, "{every}");
        }
        let longest = ParsedSpec::parse(&spec(json!({"intervals": [{"every": "P3650D", "offset": "PT1S"}]}))).unwrap();
        for after in [0, 1_800_000_000_000, i64::MAX - MAX_INTERVAL_MS, i64::MAX - 1, i64::MAX] {
            if let Some(next) = longest.next_after(after) {
                assert!(next > after, "{after} → {next}");
            }
        }
        assert_eq!(longest.next_after(i64::MAX), None);
    }

    /// Found by fuzzing: croner accepts lists with empty items and then searches its whole
    /// calendar for a match on every evaluation (8 s for `,,, * * * *` in a release build).
    #[test]
    fn cron_lists_with_empty_items_are_refused() {
        for text in [
            ",,, * * * *",
            ", * , * 5",
            "1,,2 * * * *",
            "0 0 * * 1,",
            "0 ,0 * * *",
            "2 8 24 * +",
            "0 0 1 * +1",
        ] {
            let error = ParsedSpec::parse(&spec(json!({"cron_expressions": [text]}))).unwrap_err();
            assert_eq!(error.reason, crate::Reason::InvalidCronExpression, "{text}");
        }
        assert!(ParsedSpec::parse(&spec(json!({"cron_expressions": ["0,30 9,17 * * 1,5"]}))).is_ok());
    }

    #[test]
    fn a_cron_that_matches_no_date_is_refused_at_create_and_update() {
        let now = at("2026-01-01T00:00:00Z");
        for text in ["0 0 31 2 *", "0 0 31 4,6,9,11 *"] {
            let created = Schedule::create(
                "default",
                "s",
                spec(json!({"cron_expressions": ["@hourly", text]})),
                &spec(json!({"workflow_type": "t"})),
                ScheduleFields::default(),
                false,
                now,
            );
            assert_eq!(created.unwrap_err().reason, crate::Reason::InvalidCronExpression, "{text}");
            let mut schedule = every_minute(now, OverlapPolicy::Skip);
            let update = ScheduleFields {
                spec: Some(spec(json!({"cron_expressions": [text]}))),
                ..Default::default()
            };
            assert_eq!(
                schedule.update(update, now).unwrap_err().reason,
                crate::Reason::InvalidCronExpression
            );
        }
        // Rare is not never: 29 February fires in leap years.
        let leap = Schedule::create(
            "default",
            "s",
            spec(json!({"cron_expressions": ["0 0 29 2 *"]})),
            &spec(json!({"workflow_type": "t"})),
            ScheduleFields::default(),
            false,
            now,
        )
        .unwrap();
        assert_eq!(leap.next_occurrence, Some(at("2028-02-29T00:00:00Z")));
    }

    fn every_minute(now: Millis, policy: OverlapPolicy) -> Schedule {
        let fields = ScheduleFields {
            overlap_policy: Some(policy),
            ..Default::default()
        };
        Schedule::create(
            "default",
            "s",
            spec(json!({"intervals": [{"every": "PT1M"}]})),
            &spec(json!({"workflow_type": "t"})),
            fields,
            false,
            now,
        )
        .unwrap()
    }

    #[test]
    fn a_due_occurrence_is_taken_once_and_the_next_one_follows() {
        let now = at("2026-01-01T00:00:30Z");
        let mut s = every_minute(now, OverlapPolicy::Skip);
        assert_eq!(s.take_due(now, 60_000), None);
        let due = s.take_due(at("2026-01-01T00:01:00Z"), 60_000).unwrap();
        assert_eq!(due, at("2026-01-01T00:01:00Z"));
        s.advance_past(due);
        assert_eq!(s.take_due(at("2026-01-01T00:01:00Z"), 60_000), None);
        assert_eq!(s.next_occurrence, Some(at("2026-01-01T00:02:00Z")));
    }

    #[test]
    fn a_resume_on_a_node_whose_clock_is_behind_never_offers_a_taken_occurrence_again() {
        let mut s = every_minute(at("2026-01-01T00:00:30Z"), OverlapPolicy::BufferOne);
        // A node 150 ms ahead fires 00:01:00; one 50 ms behind pauses and resumes the schedule.
        let due = s.take_due(at("2026-01-01T00:01:00.100Z"), 60_000).unwrap();
        s.advance_past(due);
        s.pause(None, at("2026-01-01T00:00:59.950Z"));
        s.resume(None, at("2026-01-01T00:00:59.950Z"));
        assert_eq!(s.next_occurrence, Some(at("2026-01-01T00:02:00Z")), "00:01:00 was taken");
        assert_eq!(s.take_due(at("2026-01-01T00:01:00.100Z"), 60_000), None);
    }

    #[test]
    fn missed_occurrences_fire_within_the_catch_up_window_and_older_ones_are_counted_as_skipped() {
        let mut s = every_minute(at("2026-01-01T00:00:30Z"), OverlapPolicy::AllowAll);
        // Down for ten minutes; the window is three: 00:08, 00:09, 00:10 fire, seven are skipped.
        let now = at("2026-01-01T00:10:10Z");
        let mut fired = Vec::new();
        while let Some(due) = s.take_due(now, 180_000) {
            fired.push(due);
            s.advance_past(due);
        }
        assert_eq!(
            fired,
            vec![at("2026-01-01T00:08:00Z"), at("2026-01-01T00:09:00Z"), at("2026-01-01T00:10:00Z")]
        );
        assert_eq!(s.skipped_trigger_count, 7);
        assert_eq!(s.last_skip_reason.as_deref(), Some("missed_catchup_window"));
        // A zero window is DW's policy: the latest missed occurrence fires once, the rest skip.
        let mut dw = every_minute(at("2026-01-01T00:00:30Z"), OverlapPolicy::AllowAll);
        let mut fired = Vec::new();
        while let Some(due) = dw.take_due(now, 0) {
            fired.push(due);
            dw.advance_past(due);
        }
        assert_eq!(fired, vec![at("2026-01-01T00:10:00Z")]);
        assert_eq!(dw.skipped_trigger_count, 9);
        assert_eq!(dw.next_occurrence, Some(at("2026-01-01T00:11:00Z")));
    }

    #[test]
    fn overlap_policies_decide_against_the_previous_run() {
        let now = at("2026-01-01T00:00:00Z");
        let decide = |policy: OverlapPolicy, open: bool| every_minute(now, policy).decide(now, Trigger::Tick, policy, open, now);
        assert!(matches!(
            decide(OverlapPolicy::Skip, false),
            Decision::Start { close_previous: None, .. }
        ));
        assert_eq!(decide(OverlapPolicy::Skip, true), Decision::Skipped("overlap_policy_skip"));
        assert!(matches!(
            decide(OverlapPolicy::AllowAll, true),
            Decision::Start { close_previous: None, .. }
        ));
        assert!(matches!(
            decide(OverlapPolicy::TerminateOther, true),
            Decision::Start {
                close_previous: Some(crate::run::CloseCommand::Terminate),
                ..
            }
        ));
        assert!(matches!(
            decide(OverlapPolicy::CancelOther, true),
            Decision::Start {
                close_previous: Some(crate::run::CloseCommand::Cancel),
                ..
            }
        ));
        let mut one = every_minute(now, OverlapPolicy::BufferOne);
        assert_eq!(
            one.decide(1, Trigger::Tick, OverlapPolicy::BufferOne, true, now),
            Decision::Buffered(1)
        );
        assert_eq!(
            one.decide(2, Trigger::Tick, OverlapPolicy::BufferOne, true, now),
            Decision::BufferFull
        );
        assert_eq!(one.take_buffered(true), None, "not while the previous run is open");
        assert_eq!(one.take_buffered(false), Some(1));
        let mut all = every_minute(now, OverlapPolicy::BufferAll);
        for i in 0..3 {
            assert_eq!(
                all.decide(i, Trigger::Tick, OverlapPolicy::BufferAll, true, now),
                Decision::Buffered(i as usize + 1)
            );
        }
        // Backfills never buffer.
        assert!(matches!(
            all.decide(9, Trigger::Backfill, OverlapPolicy::BufferAll, true, now),
            Decision::Start { .. }
        ));
    }

    #[test]
    fn max_runs_deletes_the_schedule_when_used_up() {
        let now = at("2026-01-01T00:00:00Z");
        let fields = ScheduleFields {
            max_runs: Some(2),
            ..Default::default()
        };
        let mut s = Schedule::create(
            "default",
            "s",
            spec(json!({"intervals": [{"every": "PT1M"}]})),
            &spec(json!({"workflow_type": "t"})),
            fields,
            false,
            now,
        )
        .unwrap();
        assert!(!s.record_started(1, Trigger::Tick, OverlapPolicy::Skip, "w1", "r1", now));
        assert!(s.record_started(2, Trigger::Tick, OverlapPolicy::Skip, "w2", "r2", now));
        assert_eq!(s.status, ScheduleStatus::Deleted);
        assert_eq!(s.pending_events.last().unwrap().payload["reason"], "max_runs_exhausted");
        assert_eq!(
            s.decide(3, Trigger::Manual, OverlapPolicy::Skip, false, now),
            Decision::Skipped("status_not_triggerable")
        );
    }

    #[test]
    fn jitter_is_deterministic_and_bounded() {
        for occurrence in [0, 60_000, 120_000, 999_999_000] {
            let j = jitter_ms("s", occurrence, 30);
            assert_eq!(j, jitter_ms("s", occurrence, 30));
            assert!((0..=30_000).contains(&j) && j % 1000 == 0);
        }
        assert_eq!(jitter_ms("s", 5, 0), 0);
    }

    #[test]
    fn pause_and_resume_skip_what_was_missed_while_paused() {
        let mut s = every_minute(at("2026-01-01T00:00:30Z"), OverlapPolicy::Skip);
        s.pause(Some("maintenance".into()), at("2026-01-01T00:00:40Z"));
        assert_eq!(s.take_due(at("2026-01-01T00:05:00Z"), 600_000), None);
        s.resume(None, at("2026-01-01T00:05:10Z"));
        assert_eq!(s.next_occurrence, Some(at("2026-01-01T00:06:00Z")));
        assert_eq!(s.note.as_deref(), Some("maintenance"));
        let types: Vec<_> = s.pending_events.iter().map(|e| e.event_type.as_str()).collect();
        assert_eq!(types, ["ScheduleCreated", "SchedulePaused", "ScheduleResumed"]);
    }
}
