//! One scrape: the process's counters, and gauges of what the database holds now (queue
//! backlogs, the recovery ledger, open integrity incidents) and of the connection pool.

use super::{Families, Metrics, LABEL_VALUES_MAX};
use crate::error::ApiResult;
use crate::AppState;
use capstan_engine::{LedgerState, Millis};
use capstan_store::{LedgerStats, PoolUse, QueueLoad, Store};
use prometheus::{Encoder, TextEncoder};
use std::collections::BTreeSet;
use std::fmt::Write as _;

/// The Prometheus text of one scrape; with `only`, just the series labelled with one of those
/// namespaces (what a credential bound to them may see: nothing of another tenant, nor the
/// process-wide series that sum over every tenant).
pub(crate) async fn render<S: Store>(state: &AppState<S>, only: Option<&BTreeSet<String>>) -> ApiResult<String> {
    let now = state.now();
    let namespaces: Vec<String> = state.store.namespaces().await?.into_iter().map(|n| n.name).collect();
    for namespace in &namespaces {
        state.metrics.namespace_seen(namespace);
    }
    let loads = state.store.queue_loads(now, LABEL_VALUES_MAX).await?;
    let ledger = state.store.ledger_stats().await?;
    let classes = state.store.current_run_classes().await?;
    let paused = state.store.paused_queues().await?;
    let mut gauges = Families::new();
    run_gauges(&mut gauges, &classes);
    paused_queue_gauges(&mut gauges, &paused, now);
    queue_gauges(&mut gauges, &loads, now);
    ledger_gauges(&mut gauges, &namespaces, &ledger, now);
    pool_gauges(&mut gauges, state.store.pool_use());
    gauges
        .gauges(
            "capstan_write_queue_delay_milliseconds",
            "How long writes stand in line before they run now: the smallest wait of the last 100 ms (SQLite's writer queue, a shared database's connection pool). Admission refuses work past its target.",
            &[],
        )
        .with_label_values(&[])
        .set(state.store.write_queue_delay().as_millis() as i64);
    admission_gauges(&mut gauges, state);
    for reporter in &state.config.reporters {
        reported(&mut gauges, reporter.readings(now));
    }
    Ok(state.metrics.text_with(&gauges, only))
}

fn admission_gauges<S: Store>(f: &mut Families, state: &AppState<S>) {
    let limits = f.gauges(
        "capstan_admission_inflight_limit",
        "Requests of a plane this node admits at once now: a limit that follows their latency (it shrinks when every request of a window is slow). Past it, new ones are refused with 503.",
        &["plane"],
    );
    let inflight = f.gauges(
        "capstan_admission_inflight",
        "Requests of a plane in flight on this node now.",
        &["plane"],
    );
    for (plane, limit) in state.admission.planes() {
        limits.with_label_values(&[plane.as_str()]).set(limit.limit() as i64);
        inflight.with_label_values(&[plane.as_str()]).set(limit.inflight() as i64);
    }
}

fn reported(f: &mut Families, readings: Vec<super::Reading>) {
    for reading in readings {
        if reading.counter {
            f.counters(reading.name, reading.help, &[])
                .with_label_values(&[])
                .inc_by(reading.value.max(0) as u64);
        } else {
            f.gauges(reading.name, reading.help, &[]).with_label_values(&[]).set(reading.value);
        }
    }
}

/// Current runs per class, from the counts kept in the transactions (a few rows however many
/// runs there are). Alert on `class="paused"` for runs an operator left held.
fn run_gauges(f: &mut Families, classes: &[(String, String, i64)]) {
    let runs = f.gauges(
        "capstan_workflow_runs",
        "Current runs (each instance's latest) per class: open, paused (held by an operator), or how they closed.",
        &["namespace", "class"],
    );
    for (namespace, class, count) in classes {
        runs.with_label_values(&[namespace, class]).set(*count);
    }
}

/// How long each paused queue kind has been paused: alert on one left paused.
fn paused_queue_gauges(f: &mut Families, paused: &[(String, String, String, Millis)], now: Millis) {
    let held = f.gauges(
        "capstan_task_queue_paused_seconds",
        "How long an operator has held a queue's workflow or activity tasks (present only while paused).",
        &["namespace", "kind", "queue"],
    );
    for (namespace, queue, kind, paused_at) in paused.iter().take(LABEL_VALUES_MAX) {
        held.with_label_values(&[namespace, kind, queue])
            .set(((now - paused_at).max(0)) / 1000);
    }
}

fn queue_gauges(f: &mut Families, loads: &[QueueLoad], now: Millis) {
    let labels = ["namespace", "kind", "queue"];
    let ready = f.gauges(
        "capstan_task_queue_ready",
        "Workflow and activity tasks ready for a worker now, per queue (the busiest queues, at most 500).",
        &labels,
    );
    let oldest = f.gauges(
        "capstan_task_queue_oldest_ready_age_seconds",
        "How long the oldest ready task of a queue has waited for a worker (0 when none waits).",
        &labels,
    );
    let leased = f.gauges("capstan_task_queue_leased", "Tasks of a queue leased to workers now.", &labels);
    for load in loads {
        let key = [load.namespace.as_str(), load.kind.as_str(), load.queue.as_str()];
        ready.with_label_values(&key).set(load.ready);
        leased.with_label_values(&key).set(load.leased);
        let age = load.oldest_ready_at.map_or(0, |at| ((now - at) / 1000).max(0));
        oldest.with_label_values(&key).set(age);
    }
}

fn ledger_gauges(f: &mut Families, namespaces: &[String], stats: &LedgerStats, now: Millis) {
    let entries = f.gauges(
        "capstan_ledger_entries",
        "Recovery-ledger entries by state.",
        &["namespace", "state"],
    );
    let unknown_age = f.gauges(
        "capstan_ledger_outcome_unknown_oldest_age_seconds",
        "Age of the oldest dispatch whose outcome is unknown (0 when none).",
        &["namespace"],
    );
    let resolutions = f.counters(
        "capstan_ledger_resolutions_total",
        "Resolved unknown outcomes (by an operator or a probe), by decision.",
        &["namespace", "decision"],
    );
    let incidents = f.gauges(
        "capstan_integrity_incidents_open",
        "Open integrity incidents (runs blocked on a broken chain).",
        &["namespace"],
    );
    // Every namespace's series, at zero until the database holds something for them.
    for namespace in namespaces.iter().take(LABEL_VALUES_MAX) {
        for state in LedgerState::ALL {
            entries.with_label_values(&[namespace, state.as_str()]);
        }
        unknown_age.with_label_values(&[namespace]);
        incidents.with_label_values(&[namespace]);
        for decision in [LedgerState::EffectConfirmed, LedgerState::EffectAbsent] {
            resolutions.with_label_values(&[namespace, decision.as_str()]);
        }
    }
    for (namespace, state, count, oldest) in &stats.entries {
        entries.with_label_values(&[namespace, state]).set(*count);
        match state.as_str() {
            "outcome_unknown" => unknown_age.with_label_values(&[namespace]).set(((now - oldest) / 1000).max(0)),
            "effect_confirmed" | "effect_absent" => resolutions.with_label_values(&[namespace, state]).inc_by(*count as u64),
            _ => {}
        }
    }
    for (namespace, count) in &stats.open_incidents {
        incidents.with_label_values(&[namespace]).set(*count);
    }
}

fn pool_gauges(f: &mut Families, pool: PoolUse) {
    let connections = f.gauges(
        "capstan_db_pool_connections",
        "Database connections by state (PostgreSQL's pool; SQLite's readers).",
        &["state"],
    );
    connections.with_label_values(&["idle"]).set(pool.idle as i64);
    connections
        .with_label_values(&["in_use"])
        .set(pool.open.saturating_sub(pool.idle) as i64);
    let max = f.gauges("capstan_db_pool_max_connections", "The most connections the pool opens.", &[]);
    max.with_label_values(&[]).set(pool.max as i64);
    let waiting = f.gauges("capstan_db_pool_waiting", "Callers waiting for a database connection.", &[]);
    waiting.with_label_values(&[]).set(pool.waiting as i64);
}

impl Metrics {
    /// The text of this process's series and `scraped`'s, families in name order; a family
    /// with no sample yet is declared (help and type) all the same.
    fn text_with(&self, scraped: &Families, only: Option<&BTreeSet<String>>) -> String {
        let mut families = self.families.registry.gather();
        families.extend(scraped.registry.gather());
        if let Some(allowed) = only {
            for family in &mut families {
                let kept: Vec<_> = family
                    .take_metric()
                    .into_iter()
                    .filter(|metric| {
                        metric
                            .get_label()
                            .iter()
                            .any(|label| label.get_name() == "namespace" && allowed.contains(label.get_value()))
                    })
                    .collect();
                family.set_metric(kept);
            }
            families.retain(|family| !family.get_metric().is_empty());
        }
        families.sort_by(|a, b| a.get_name().cmp(b.get_name()));
        let mut text = Vec::new();
        TextEncoder::new()
            .encode(&families, &mut text)
            .expect("the text encoder writes to memory");
        let mut text = String::from_utf8(text).expect("the text encoder writes UTF-8");
        for (name, help, kind) in self.families.declared.iter().chain(&scraped.declared) {
            if !families.iter().any(|family| family.get_name() == name) {
                let _ = write!(text, "# HELP {name} {help}\n# TYPE {name} {kind}\n");
            }
        }
        text
    }

    /// This process's series alone (for tests).
    #[cfg(test)]
    pub(crate) fn families_text(&self) -> String {
        self.text_with(&Families::new(), None)
    }
}
