//! What a seed tells: its [`Report`], or the [`Failure`] that stopped it; and [`Totals`], many
//! seeds' reports summed. The counters are declared once, in [`Counters`]: a report holds one
//! seed's, the totals their sums.

use std::collections::BTreeMap;

/// A counter summed over seeds: a count, a row of counts, or counts by name.
trait Tally {
    fn tally(&mut self, seen: &Self);
}

impl Tally for usize {
    fn tally(&mut self, seen: &Self) {
        *self += seen;
    }
}

impl<const N: usize> Tally for [usize; N] {
    fn tally(&mut self, seen: &Self) {
        for (total, n) in self.iter_mut().zip(seen) {
            *total += n;
        }
    }
}

impl Tally for BTreeMap<String, usize> {
    fn tally(&mut self, seen: &Self) {
        for (name, n) in seen {
            *self.entry(name.clone()).or_default() += n;
        }
    }
}

/// Declares [`Counters`] from one list of counters (doc, name and kind) and sums them.
macro_rules! counters {
    ($($(#[doc = $doc:literal])* $name:ident: $kind:ty,)*) => {
        /// What a seed exercised, counted as it went.
        #[derive(Clone, Debug, Default, PartialEq, Eq)]
        pub struct Counters {
            $($(#[doc = $doc])* pub $name: $kind,)*
        }

        impl Counters {
            /// Adds `other`'s counts to these, counter by counter.
            pub fn add(&mut self, other: &Counters) {
                $(Tally::tally(&mut self.$name, &other.$name);)*
            }
        }
    };
}

counters! {
    /// Workflow instances that came to exist; all of them closed.
    completed: usize,
    restarts: usize,
    duplicates_delivered: usize,
    /// Refusals by reason.
    refusals: BTreeMap<String, usize>,
    outcome_unknown_resolved: usize,
    /// Workflows an operator paused (each resumed before the end).
    paused: usize,
    /// Batch operations operators started (nodes step them).
    batches: usize,
    lost_tasks: usize,
    updates_accepted: usize,
    update_retries_answered_from_receipt: usize,
    queries_answered: usize,
    children_started: usize,
    continued_as_new: usize,
    scheduled_starts: usize,
    closed_by_clients: usize,
    /// Workflow leases by replay mode: `[cold, sticky hit expected, forced cold]`.
    replay_modes: [usize; 3],
    /// Session activity attempts leased.
    session_attempts: usize,
    /// Worker retirements.
    workers_retired: usize,
    /// Tasks handed to a parked poll in the transaction that made them.
    hand_offs: usize,
    /// Condition waits that timed out (`ConditionWaitTimedOut`, checked after its timer).
    condition_timeouts: usize,
    /// Activity lease renewals granted.
    lease_renewals: usize,
    /// Uploaded payloads that nothing named, collected.
    payloads_collected: usize,
    /// Runs started by Nexus calls (each call's linked run).
    service_calls: usize,
    /// Cooperative cancellations requested, delivered, deferred (a call waited for its
    /// activities to stop) and stops acknowledged.
    cancellations: [usize; 4],
    /// Prepared local attempts admitted, retried by the server, recovered after a lost claim,
    /// stopped by a cancellation.
    local_attempts: [usize; 4],
    /// Standalone activity runs started (first starts and restarts of a closed id).
    standalone_started: usize,
    /// Stream messages ingested.
    messages_ingested: usize,
    /// Output-stream items checked against their side effects (counted at every check).
    stream_items: usize,
    /// Retried stream appends answered from their receipt.
    message_retries: usize,
    /// Reused stream message ids refused.
    message_conflicts: usize,
    /// Failed runs redriven.
    redrives: usize,
    /// Closed runs imported under a new id, imports sent again (answered `already_imported`),
    /// and open runs rebuilt from their histories that matched the runs.
    imports: [usize; 3],
    /// Nodes frozen between claiming duties and acting on them.
    node_pauses: usize,
    /// Duty claims that took over an earlier claim.
    duty_takeovers: usize,
    /// What the woken nodes' stale duties came to: `[applied, refused stale_fence]`.
    zombie_duties: [usize; 2],
    /// Schedule starts by woken nodes (occurrences still due when they woke).
    zombie_firings: usize,
    /// Power cuts.
    power_cuts: usize,
    /// The unsynced writes the power cuts dropped.
    unsynced_writes_lost: usize,
    /// Of the power cuts, those inside a commit (at its sync: before or after it reached disk).
    mid_commit_cuts: usize,
    /// Probes by how they ended for their entry: found, absent, inconclusive (said so, answered
    /// nonsense, failed or timed out), and those the operator settled before they answered.
    probes: [usize; 4],
}

/// What one seed did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub seed: u64,
    pub steps: usize,
    /// Workflow instances the seed's clients started or saw started (children, schedules' runs
    /// and continued instances included).
    pub workflows: usize,
    /// Rounds the calm phase took until everything had finished.
    pub calm_rounds: usize,
    /// A hash of every step taken, ids included: equal digests mean the same run.
    pub digest: u64,
    pub counters: Counters,
}

/// A broken guarantee: the seed, the step and what was seen.
#[derive(Clone, Debug)]
pub struct Failure {
    pub seed: u64,
    pub step: usize,
    pub message: String,
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "seed {} failed at step {}: {}\n  replay: cargo run -p capstan-sim -- --seed {} --trace",
            self.seed, self.step, self.message, self.seed
        )
    }
}

/// Sums of many seeds' reports.
#[derive(Clone, Debug, Default)]
pub struct Totals {
    pub seeds: usize,
    pub steps: usize,
    pub counters: Counters,
}

impl Totals {
    pub fn add(&mut self, report: &Report) {
        self.seeds += 1;
        self.steps += report.steps;
        self.counters.add(&report.counters);
    }

    pub fn summary(&self) -> String {
        let c = &self.counters;
        let refusals: Vec<String> = c.refusals.iter().map(|(r, n)| format!("{r} {n}")).collect();
        format!(
            "{} seeds, {} steps, {} workflows finished ({} children, {} scheduled, {} continued runs), {} updates ({} retries answered from the receipt), {} queries answered, {} cancelled or terminated by clients, {} restarts, {} duplicate deliveries, {} lost tasks, {} unknown outcomes resolved, {} workflows paused, {} batch operations, workflow leases cold/sticky-hit/forced-cold {}/{}/{}, {} session activity attempts, {} workers retired, {} hand-offs to parked polls, {} condition waits timed out, {} activity leases renewed, cooperative cancellations requested/delivered/deferred/stops acknowledged {}/{}/{}/{}, prepared local attempts admitted/retried/recovered/stopped {}/{}/{}/{}, {} standalone activities, {} redrives, closed runs imported/imports repeated/open runs rebuilt {}/{}/{}, stream messages ingested/retries answered/reused ids refused {}/{}/{}, {} output-stream items checked, {} unused uploads collected, {} Nexus calls' linked runs, {} node pauses ({} duty take-overs; woken nodes' stale duties applied/refused {}/{}, schedule starts {}), {} power cuts ({} inside a commit; {} unsynced writes lost), probe answers found/absent/inconclusive/after the operator {}/{}/{}/{}; refusals: {}",
            self.seeds,
            self.steps,
            c.completed,
            c.children_started,
            c.scheduled_starts,
            c.continued_as_new,
            c.updates_accepted,
            c.update_retries_answered_from_receipt,
            c.queries_answered,
            c.closed_by_clients,
            c.restarts,
            c.duplicates_delivered,
            c.lost_tasks,
            c.outcome_unknown_resolved,
            c.paused,
            c.batches,
            c.replay_modes[0],
            c.replay_modes[1],
            c.replay_modes[2],
            c.session_attempts,
            c.workers_retired,
            c.hand_offs,
            c.condition_timeouts,
            c.lease_renewals,
            c.cancellations[0],
            c.cancellations[1],
            c.cancellations[2],
            c.cancellations[3],
            c.local_attempts[0],
            c.local_attempts[1],
            c.local_attempts[2],
            c.local_attempts[3],
            c.standalone_started,
            c.redrives,
            c.imports[0],
            c.imports[1],
            c.imports[2],
            c.messages_ingested,
            c.message_retries,
            c.message_conflicts,
            c.stream_items,
            c.payloads_collected,
            c.service_calls,
            c.node_pauses,
            c.duty_takeovers,
            c.zombie_duties[0],
            c.zombie_duties[1],
            c.zombie_firings,
            c.power_cuts,
            c.mid_commit_cuts,
            c.unsynced_writes_lost,
            c.probes[0],
            c.probes[1],
            c.probes[2],
            c.probes[3],
            if refusals.is_empty() { "none".to_string() } else { refusals.join(", ") }
        )
    }
}
