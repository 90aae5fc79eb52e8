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
    // The faults were really injected (a run without them would prove nothing).
    assert!(
        totals.restarts > 0 && totals.duplicates > 0 && totals.lost_tasks > 0,
        "{}",
        totals.summary()
    );
    assert!(totals.unknown_resolved > 0, "{}", totals.summary());
    // So was the whole workload: every kind of durable id had its chance to be doubled.
    assert!(
        totals.updates > 0
            && totals.update_retries > 0
            && totals.queries > 0
            && totals.children > 0
            && totals.continued > 0
            && totals.scheduled > 0
            && totals.lease_renewals > 0
            && totals.cancellations.iter().all(|n| *n > 0)
            && totals.local_attempts.iter().all(|n| *n > 0)
            && totals.standalone > 0
            && totals.redrives > 0
            && totals.messages.iter().all(|n| *n > 0)
            && totals.stream_items > 0
            && totals.payloads_collected > 0
            && totals.service_calls > 0
            && totals.node_pauses > 0
            && totals.duty_takeovers > 0
            && totals.zombie_duties.iter().all(|n| *n > 0)
            && totals.power_cuts > 0
            && totals.mid_commit_cuts > 0
            && totals.probes.iter().all(|n| *n > 0),
        "{}",
        totals.summary()
    );
    assert!(totals.refusals.values().sum::<usize>() > 0, "{}", totals.summary());
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
        assert!(first.restarts > 0 || first.duplicates_delivered > 0, "seed {seed} injected nothing");
    }
}
