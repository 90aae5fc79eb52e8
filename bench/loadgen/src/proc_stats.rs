//! A spawned `capstan serve` and what /proc says about it: CPU seconds and peak RSS.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct SpawnedServer {
    child: Child,
    pub url: String,
    data: tempfile::TempDir,
}

impl SpawnedServer {
    pub async fn start(binary: &str, extra_args: Option<&str>) -> Self {
        Self::start_on(binary, extra_args, None).await
    }

    /// The server, on one CPU only when `cpu` is given (`taskset`).
    pub async fn start_on(binary: &str, extra_args: Option<&str>, cpu: Option<usize>) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let data = tempfile::tempdir().expect("tempdir");
        let mut command = match cpu {
            Some(cpu) => {
                let mut taskset = Command::new("taskset");
                taskset.args(["-c", &cpu.to_string(), binary]);
                taskset
            }
            None => Command::new(binary),
        };
        command
            .args(["serve", "--listen", &format!("127.0.0.1:{port}"), "--data-dir"])
            .arg(data.path());
        if let Some(extra) = extra_args {
            command.args(extra.split_whitespace());
        }
        command.env("CAPSTAN_LOG", "warn").stdout(Stdio::null()).stderr(Stdio::inherit());
        let child = command
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {binary}: {e} (build it: cargo build --release -p capstan)"));
        let url = format!("http://127.0.0.1:{port}");
        let deadline = Instant::now() + Duration::from_secs(30);
        let http = reqwest::Client::new();
        loop {
            if let Ok(response) = http.get(format!("{url}/api/health")).send().await {
                if response.status().is_success() {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "capstan did not become healthy");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Self { child, url, data }
    }

    /// Stops the server (SIGKILL: what it acknowledged must be on disk already).
    /// The server's data directory.
    pub fn data_dir(&self) -> std::path::PathBuf {
        self.data.path().to_path_buf()
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// `capstan verify --json` on the stopped server's data directory.
    pub fn verify(&self, binary: &str) -> serde_json::Value {
        let output = Command::new(binary)
            .args(["verify", "--json", "--data-dir"])
            .arg(self.data.path())
            .output()
            .unwrap_or_else(|e| panic!("run {binary} verify: {e}"));
        serde_json::from_slice(&output.stdout).unwrap_or_else(|_| {
            serde_json::json!({"unreadable": String::from_utf8_lossy(&output.stdout), "stderr": String::from_utf8_lossy(&output.stderr)})
        })
    }

    /// User + system CPU seconds the server has used so far.
    pub fn cpu_seconds(&self) -> f64 {
        cpu_seconds_of(self.child.id())
    }

    /// Peak resident set size (VmHWM) in MiB.
    pub fn peak_rss_mib(&self) -> f64 {
        self.status_mib("VmHWM:")
    }

    /// Current resident set size (VmRSS) in MiB.
    pub fn current_rss_mib(&self) -> f64 {
        self.status_mib("VmRSS:")
    }

    fn status_mib(&self, field: &str) -> f64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix(field))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
            .map(|kb| kb / 1024.0)
            .unwrap_or(0.0)
    }
}

impl Drop for SpawnedServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// User + system CPU seconds process `pid` has used so far.
pub fn cpu_seconds_of(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name; utime and stime are the 14th and 15th.
    let after = stat.rsplit_once(')').map(|(_, rest)| rest).unwrap_or("");
    let fields: Vec<&str> = after.split_whitespace().collect();
    let ticks: f64 = fields.get(11).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0)
        + fields.get(12).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    ticks / 100.0
}
