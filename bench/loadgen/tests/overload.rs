//! Overload that bends, asserted on what does not depend on timing (docs/reliability.md,
//! Overload). It runs the `overload` workload (three times what the machine sustains, offered
//! open loop) against the debug build and checks: every refusal is a 429/503 with
//! `Retry-After` and nothing else went wrong (no timeout, no other status); the server still
//! admitted work; its memory stayed bounded; at half the load 95% of starts are admitted again;
//! and `capstan verify` finds exactly the starts that were acknowledged. How fast the admitted
//! starts stayed is a figure of a release build: bench/README.md, not an assertion here.

use serde_json::Value;
use std::path::PathBuf;
use std::process::Command;

const SECONDS: &str = "20";

fn capstan() -> PathBuf {
    if let Some(bin) = std::env::var_os("CAPSTAN_BIN") {
        return bin.into();
    }
    let beside = PathBuf::from(env!("CARGO_BIN_EXE_capstan-bench")).with_file_name("capstan");
    assert!(beside.exists(), "{} is missing: cargo build -p capstan", beside.display());
    beside
}

/// The generator on the last CPU and the server on the first, when there are two or more: the
/// load's own CPU must not be what the server waits for.
fn bench(args: &[&str]) -> Command {
    let cpus = std::thread::available_parallelism().map_or(1, usize::from);
    let bench = env!("CARGO_BIN_EXE_capstan-bench");
    if cpus < 2 {
        let mut command = Command::new(bench);
        command.args(args);
        return command;
    }
    let mut command = Command::new("taskset");
    command
        .args(["-c", &(cpus - 1).to_string(), bench])
        .args(args)
        .args(["--server-cpu", "0"]);
    command
}

#[test]
fn three_times_the_sustainable_load_is_refused_politely_and_nothing_acknowledged_is_lost() {
    let capstan = capstan();
    let output = bench(&["--workload", "overload", "--seconds", SECONDS, "--spawn", capstan.to_str().unwrap()])
        .output()
        .expect("run capstan-bench");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "capstan-bench failed: {stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: Value = serde_json::from_str(stdout.trim()).unwrap_or_else(|_| panic!("not a report: {stdout}"));
    println!("{report:#}");
    let overload = &report["overload"];
    let answers = &overload["answers"];
    let count = |value: &Value| value.as_u64().unwrap_or_else(|| panic!("not a count in {report:#}"));

    assert_eq!(count(&report["unloaded"]["broken"]), 0, "unloaded starts failed: {report:#}");
    assert_eq!(
        count(&answers["broken"]),
        0,
        "every refusal a 429/503 with Retry-After, no timeout: {:#}",
        answers["broken_samples"]
    );
    assert!(
        count(&answers["refused_429"]) + count(&answers["refused_503"]) > 0,
        "three times what the machine sustains was not refused at all: {report:#}"
    );
    assert!(count(&answers["admitted"]) > 0, "nothing admitted under overload: {report:#}");
    let before = overload["server_rss_mib_before"].as_f64().unwrap();
    let peak = overload["server_rss_mib_peak"].as_f64().unwrap();
    assert!(peak < before + 256.0, "memory bounded: {before} → {peak} MiB");

    // Throughput returns when the load drops: at half of what the machine sustains, 95% of the
    // starts are admitted. Not all: after the overload the limit sits at its floor (16) and grows
    // back only when reached with fast answers, so a stall of the debug build's disk (20 ms of
    // arrivals fill it) is refused in the meantime.
    let calm = &report["calm"];
    assert_eq!(count(&calm["broken"]), 0, "{report:#}");
    let calm_refused = count(&calm["refused_429"]) + count(&calm["refused_503"]);
    assert!(
        calm_refused * 20 <= count(&calm["admitted"]),
        "throughput returns when the load drops: {report:#}"
    );

    let verify = &report["verify"];
    assert_eq!(verify["problems"].as_array().map(Vec::len), Some(0), "capstan verify: {verify:#}");
    assert_eq!(
        verify["runs_checked"], report["acknowledged_starts"],
        "every acknowledged start is kept, and only those"
    );
}
