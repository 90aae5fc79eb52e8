//! CI's short form of the simulation: a few hundred seeds (the documented long form runs
//! 10,000+: `cargo run --release -p capstan-sim -- --seeds 10000`).

#[test]
fn a_few_hundred_seeds_keep_every_guarantee() {
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
    assert!(totals.refusals.values().sum::<usize>() > 0, "{}", totals.summary());
}
