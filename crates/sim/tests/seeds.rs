//! CI's short form of the simulation: a few hundred seeds (the documented long form runs
//! 10,000+: `cargo run --release -p capstan-sim -- --seeds 10000`).

/// The store's deterministic ids are process-wide: seeds run one at a time.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn a_few_hundred_seeds_keep_every_guarantee() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let seeds: u64 = std::env::var("CAPSTAN_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let mut totals = capstan_sim::Totals::default();
    for seed in 0..seeds {
        match runtime.block_on(capstan_sim::run_caught(capstan_sim::Config::new(seed))) {
            Ok(report) => totals.add(&report),
            Err(failure) => panic!("{failure}"),
        }
    }
    println!("{}", totals.summary());
    let counted = &totals.counters;
    // The faults were really injected (a run without them would prove nothing).
    assert!(
        counted.restarts > 0 && counted.duplicates_delivered > 0 && counted.lost_tasks > 0,
        "{}",
        totals.summary()
    );
    assert!(counted.outcome_unknown_resolved > 0, "{}", totals.summary());
    assert!(counted.paused > 0, "{}", totals.summary());
    assert!(counted.batches > 0, "{}", totals.summary());
    // So was the whole workload: every kind of durable id had its chance to be doubled.
    assert!(
        counted.updates_accepted > 0
            && counted.update_retries_answered_from_receipt > 0
            && counted.queries_answered > 0
            && counted.children_started > 0
            && counted.continued_as_new > 0
            && counted.scheduled_starts > 0
            && counted.lease_renewals > 0
            && counted.cancellations.iter().all(|n| *n > 0)
            && counted.local_attempts.iter().all(|n| *n > 0)
            && counted.standalone_started > 0
            && counted.redrives > 0
            && counted.messages_ingested > 0
            && counted.message_retries > 0
            && counted.message_conflicts > 0
            && counted.stream_items > 0
            && counted.condition_timeouts > 0
            && counted.imports.iter().all(|n| *n > 0)
            && counted.payloads_collected > 0
            && counted.service_calls > 0
            && counted.node_pauses > 0
            && counted.duty_takeovers > 0
            && counted.zombie_duties.iter().all(|n| *n > 0)
            && counted.power_cuts > 0
            && counted.mid_commit_cuts > 0
            && counted.probes.iter().all(|n| *n > 0),
        "{}",
        totals.summary()
    );
    assert!(counted.refusals.values().sum::<usize>() > 0, "{}", totals.summary());
}

/// A seed is a replay: the same seed runs the same steps to the same outcome (the store's ids
/// come from the seed too), which is what makes a printed failing seed worth anything.
#[test]
fn the_same_seed_replays_the_same_run() {
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    for seed in [3, 41] {
        let first = runtime.block_on(capstan_sim::run_caught(capstan_sim::Config::new(seed))).unwrap();
        let second = runtime.block_on(capstan_sim::run_caught(capstan_sim::Config::new(seed))).unwrap();
        assert_eq!(first, second, "seed {seed} did not replay");
        assert!(
            first.counters.restarts > 0 || first.counters.duplicates_delivered > 0,
            "seed {seed} injected nothing"
        );
    }
}
