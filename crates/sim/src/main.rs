//! `capstan-sim`: runs seeds of the deterministic simulation and reports what they found.
//!
//! ```sh
//! cargo run --release -p capstan-sim -- --seeds 10000          # seeds 0..10000
//! cargo run -p capstan-sim -- --seed 4242 --trace               # replay one seed, step by step
//! ```

use clap::Parser;
use std::process::ExitCode;

#[derive(Parser)]
#[command(about = "Deterministic simulation of Capstan's engine and store under faults")]
struct Args {
    /// Run this one seed.
    #[arg(long)]
    seed: Option<u64>,
    /// Run seeds FIRST..FIRST+SEEDS.
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Faulty steps per seed (a calm phase follows).
    #[arg(long, default_value_t = 300)]
    steps: usize,
    /// Workflows per seed.
    #[arg(long, default_value_t = 8)]
    workflows: usize,
    /// Print every step.
    #[arg(long)]
    trace: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    let seeds: Vec<u64> = match args.seed {
        Some(seed) => vec![seed],
        None => (args.first..args.first + args.seeds).collect(),
    };
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let started = std::time::Instant::now();
    let mut totals = capstan_sim::Totals::default();
    for seed in seeds {
        let mut config = capstan_sim::Config::new(seed);
        config.steps = args.steps;
        config.workflows = args.workflows;
        config.trace = args.trace;
        match runtime.block_on(capstan_sim::run_caught(config)) {
            Ok(report) => totals.add(&report),
            Err(failure) => {
                eprintln!("{failure}");
                return ExitCode::FAILURE;
            }
        }
    }
    println!("{} in {:.1} s", totals.summary(), started.elapsed().as_secs_f64());
    ExitCode::SUCCESS
}
