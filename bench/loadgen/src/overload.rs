//! The `overload` workload: how a server bends under more than it can do (docs/reliability.md,
//! Overload). The load is workflow starts, offered open loop (at a fixed rate, whatever the
//! answers), so that an overloaded server cannot slow its own load down:
//!
//! 1. what the machine sustains: starts many at a time, closed loop, on a server that refuses
//!    nothing (admission off);
//! 2. on the server under test, the unloaded latency of a start (one at a time);
//! 3. `--overload-multiple` times what the machine sustains, for `--seconds`: the admitted
//!    starts' rate and latency, the refusals (a 429 or 503 with `Retry-After`) and anything
//!    else ("broken": another status, a refusal without `Retry-After`, a timeout, a dropped
//!    connection), and the server's memory every second;
//! 4. half of what it sustains for five seconds: whether everything is admitted again;
//! 5. the server stopped, `capstan verify` on its data: the runs it holds against the starts
//!    that were acknowledged.
//!
//! With `--server-cpu N` the server runs on CPU N only (`taskset`); run the generator itself on
//! another (`taskset -c M capstan-bench …`) so that the load's CPU is not what the server waits
//! for.

use crate::proc_stats::{cpu_seconds_of, SpawnedServer};
use crate::CONTROL_HEADERS;
use reqwest::Client;
use serde_json::{json, Value};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Starts in flight when finding what the machine sustains.
const SATURATING: usize = 32;
const CAPACITY_SECONDS: f64 = 5.0;
const UNLOADED_STARTS: usize = 300;
const CALM_SECONDS: f64 = 5.0;

pub struct Setup {
    pub binary: String,
    pub server_args: Option<String>,
    pub server_cpu: Option<usize>,
    pub seconds: f64,
    pub multiple: f64,
}

/// What one start came to.
enum Answer {
    Admitted(Duration),
    /// 429 or 503 with a `Retry-After`.
    Refused(u16),
    Broken(String),
}

#[derive(Default)]
struct Tally {
    admitted: Vec<Duration>,
    refused_429: u64,
    refused_503: u64,
    broken: Vec<String>,
}

impl Tally {
    fn add(&mut self, answer: Answer) {
        match answer {
            Answer::Admitted(latency) => self.admitted.push(latency),
            Answer::Refused(429) => self.refused_429 += 1,
            Answer::Refused(_) => self.refused_503 += 1,
            Answer::Broken(why) => self.broken.push(why),
        }
    }

    fn refused(&self) -> u64 {
        self.refused_429 + self.refused_503
    }

    /// The admitted starts' latency at `p` (0..1), in milliseconds.
    fn percentile_ms(&mut self, p: f64) -> f64 {
        if self.admitted.is_empty() {
            return 0.0;
        }
        self.admitted.sort_unstable();
        let at = ((self.admitted.len() as f64 * p) as usize).min(self.admitted.len() - 1);
        self.admitted[at].as_secs_f64() * 1000.0
    }

    fn report(&mut self, seconds: f64) -> Value {
        json!({
            "admitted": self.admitted.len(),
            "admitted_per_s": self.admitted.len() as f64 / seconds,
            "latency_ms": {"p50": self.percentile_ms(0.5), "p99": self.percentile_ms(0.99)},
            "refused_429": self.refused_429,
            "refused_503": self.refused_503,
            "broken": self.broken.len(),
            "broken_samples": &self.broken[..self.broken.len().min(5)],
        })
    }
}

struct Starts {
    http: Client,
    base: String,
    next_id: AtomicU64,
}

impl Starts {
    async fn one(&self) -> Answer {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let began = Instant::now();
        let mut request = self
            .http
            .post(format!("{}/api/workflows", self.base))
            .json(&json!({"workflow_type": "overload", "task_queue": "overload", "workflow_id": format!("overload-{id}")}));
        for (name, value) in CONTROL_HEADERS {
            request = request.header(name, value);
        }
        let response = match request.send().await {
            Ok(response) => response,
            Err(error) => return Answer::Broken(format!("{error}")),
        };
        let status = response.status().as_u16();
        let retry_after = response.headers().contains_key("retry-after");
        let body = response.text().await.unwrap_or_default();
        match status {
            200..=299 => Answer::Admitted(began.elapsed()),
            429 | 503 if retry_after => Answer::Refused(status),
            _ => Answer::Broken(format!("{status} (Retry-After: {retry_after}): {body}")),
        }
    }
}

fn client() -> Client {
    Client::builder()
        .timeout(Duration::from_secs(10))
        .pool_max_idle_per_host(4096)
        .build()
        .expect("http client")
}

/// Starts per second the machine sustains: many at a time, each sender waiting for its answer.
async fn sustained(setup: &Setup) -> f64 {
    let extra = format!("{} --overload-queue-delay-ms 0", setup.server_args.as_deref().unwrap_or(""));
    let server = SpawnedServer::start_on(&setup.binary, Some(&extra), setup.server_cpu).await;
    let starts = Arc::new(Starts {
        http: client(),
        base: server.url.clone(),
        next_id: AtomicU64::new(0),
    });
    let tally = Arc::new(Mutex::new(Tally::default()));
    let until = Instant::now() + Duration::from_secs_f64(CAPACITY_SECONDS);
    let senders: Vec<_> = (0..SATURATING)
        .map(|_| {
            let (starts, tally) = (starts.clone(), tally.clone());
            tokio::spawn(async move {
                while Instant::now() < until {
                    let answer = starts.one().await;
                    tally.lock().unwrap().add(answer);
                }
            })
        })
        .collect();
    for sender in senders {
        sender.await.expect("sender");
    }
    let tally = tally.lock().unwrap();
    assert!(
        tally.broken.is_empty() && tally.refused() == 0,
        "the capacity run (admission off) failed: {:?}",
        &tally.broken[..tally.broken.len().min(5)]
    );
    tally.admitted.len() as f64 / CAPACITY_SECONDS
}

/// Starts offered at `rate` a second for `seconds`, each sent on time whatever the earlier
/// ones came to; the server's memory sampled every second (peak MiB).
async fn offered(starts: &Arc<Starts>, server: &SpawnedServer, rate: f64, seconds: f64) -> (Tally, Busy) {
    let own_cpu = cpu_seconds_of(std::process::id());
    let server_cpu = server.cpu_seconds();
    let tally = Arc::new(Mutex::new(Tally::default()));
    let began = Instant::now();
    let total = (rate * seconds) as u64;
    let mut sent = Vec::with_capacity(total as usize);
    let mut peak_rss: f64 = 0.0;
    let mut next_sample = began;
    for n in 0..total {
        let due = began + Duration::from_secs_f64(n as f64 / rate);
        tokio::time::sleep_until(due.into()).await;
        if Instant::now() >= next_sample {
            peak_rss = peak_rss.max(server.current_rss_mib());
            next_sample += Duration::from_secs(1);
        }
        let (starts, tally) = (starts.clone(), tally.clone());
        sent.push(tokio::spawn(async move {
            let answer = starts.one().await;
            tally.lock().unwrap().add(answer);
        }));
    }
    let sending = began.elapsed().as_secs_f64();
    for request in sent {
        request.await.expect("start");
    }
    let elapsed = began.elapsed().as_secs_f64();
    let busy = Busy {
        peak_rss_mib: peak_rss,
        sent_per_s: total as f64 / sending,
        generator_cpu: (cpu_seconds_of(std::process::id()) - own_cpu) / elapsed,
        server_cpu: (server.cpu_seconds() - server_cpu) / elapsed,
    };
    let tally = Arc::try_unwrap(tally).ok().expect("every start answered").into_inner().unwrap();
    (tally, busy)
}

/// How busy an offered load kept the machine.
struct Busy {
    /// The server's largest resident set, sampled every second.
    peak_rss_mib: f64,
    /// The rate the generator kept up (below the offered one when it could not).
    sent_per_s: f64,
    /// CPUs' worth of time the generator and the server used: a generator near a whole CPU
    /// (with `taskset`) inflates the latencies it measures.
    generator_cpu: f64,
    server_cpu: f64,
}

pub async fn run(setup: &Setup) -> Value {
    let sustained = sustained(setup).await;

    let mut server = SpawnedServer::start_on(&setup.binary, setup.server_args.as_deref(), setup.server_cpu).await;
    let starts = Arc::new(Starts {
        http: client(),
        base: server.url.clone(),
        next_id: AtomicU64::new(0),
    });
    let mut unloaded = Tally::default();
    for _ in 0..UNLOADED_STARTS {
        unloaded.add(starts.one().await);
    }
    let rss_before = server.current_rss_mib();

    let rate = setup.multiple * sustained;
    let (mut overload, busy) = offered(&starts, &server, rate, setup.seconds).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let (mut calm, _) = offered(&starts, &server, sustained / 2.0, CALM_SECONDS).await;

    let acknowledged = (unloaded.admitted.len() + overload.admitted.len() + calm.admitted.len()) as u64;
    server.stop();
    let verified = server.verify(&setup.binary);
    let unloaded_p99 = unloaded.percentile_ms(0.99);
    let overload_p99 = overload.percentile_ms(0.99);
    json!({
        "workload": "overload",
        "server_args": setup.server_args,
        "server_cpu": setup.server_cpu,
        "sustained_starts_per_s": sustained,
        "unloaded": unloaded.report(1.0),
        "overload": {
            "multiple": setup.multiple,
            "seconds": setup.seconds,
            "offered_per_s": rate,
            "sent_per_s": busy.sent_per_s,
            "generator_cpus": busy.generator_cpu,
            "server_cpus": busy.server_cpu,
            "answers": overload.report(setup.seconds),
            "p99_over_unloaded_p99": overload_p99 / unloaded_p99.max(f64::EPSILON),
            "admitted_over_sustained": overload.admitted.len() as f64 / setup.seconds / sustained,
            "server_rss_mib_before": rss_before,
            "server_rss_mib_peak": busy.peak_rss_mib,
        },
        "calm": calm.report(CALM_SECONDS),
        "acknowledged_starts": acknowledged,
        "verify": verified,
    })
}
