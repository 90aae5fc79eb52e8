// W1 / W10 on Restate (npm @restatedev/restate-server) with its TypeScript SDK.
//
// Run it inside a network namespace that has only loopback (restate-server reaches out to the
// internet at start-up):
//
//   unshare -n sh -c 'ip link set lo up && NODE_PATH=PEERS/restate/node_modules \
//       node bench/compare/restate/bench.cjs --workload w1 --workflows 500 --concurrency 50'
//
// It spawns a fresh restate-server (default configuration, own --base-dir), the Node.js service
// endpoint of service.cjs in a separate process, registers the deployment, then runs the closed
// loop: N invocations of <workflow>/<id>/run in flight through the HTTP ingress, each answered
// with the workflow's result (start→result in one request), every result checked. It reads the
// server process tree's CPU and peak RSS from /proc and prints one JSON object with the fields
// of `capstan-bench --json`.
"use strict";
const { spawn } = require("node:child_process");
const fs = require("node:fs");
const os = require("node:os");
const path = require("node:path");
const net = require("node:net");

function parseArgs(argv) {
  const args = { workload: "w1", flavour: "step", workflows: 500, concurrency: 50, payloadBytes: 1024, maxSeconds: 0, json: false, server: "" };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i];
    const value = () => argv[++i];
    if (key === "--workload") args.workload = value();
    else if (key === "--flavour") args.flavour = value();
    else if (key === "--workflows") args.workflows = Number(value());
    else if (key === "--concurrency") args.concurrency = Number(value());
    else if (key === "--payload-bytes") args.payloadBytes = Number(value());
    else if (key === "--max-seconds") args.maxSeconds = Number(value());
    else if (key === "--restate-server") args.server = value();
    else if (key === "--json") args.json = true;
    else throw new Error(`unknown argument ${key}`);
  }
  if (!["w1", "w10"].includes(args.workload)) throw new Error("--workload is w1 or w10");
  if (!["step", "rpc"].includes(args.flavour)) throw new Error("--flavour is step or rpc");
  return args;
}

// ── /proc ──
const CLOCK_TICKS = 100; // USER_HZ on Linux
function statFields(pid) {
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, "utf8");
    return stat.slice(stat.lastIndexOf(")") + 2).split(" ");
  } catch {
    return [];
  }
}
function childrenOf(pid) {
  const found = [];
  try {
    for (const tid of fs.readdirSync(`/proc/${pid}/task`)) {
      const text = fs.readFileSync(`/proc/${pid}/task/${tid}/children`, "utf8").trim();
      if (text) found.push(...text.split(/\s+/).map(Number));
    }
  } catch {}
  return found;
}
function tree(pid) {
  const seen = [];
  const stack = [pid];
  while (stack.length) {
    const current = stack.pop();
    if (seen.includes(current) || !fs.existsSync(`/proc/${current}`)) continue;
    seen.push(current);
    stack.push(...childrenOf(current));
  }
  return seen;
}
function cpuSeconds(pid) {
  let ticks = 0;
  tree(pid).forEach((member, index) => {
    const f = statFields(member);
    if (f.length < 15) return;
    ticks += Number(f[11]) + Number(f[12]);
    if (index === 0) ticks += Number(f[13]) + Number(f[14]);
  });
  return ticks / CLOCK_TICKS;
}
function statusKiB(pid, key) {
  try {
    const line = fs.readFileSync(`/proc/${pid}/status`, "utf8").split("\n").find((l) => l.startsWith(key + ":"));
    return line ? Number(line.split(/\s+/)[1]) : 0;
  } catch {
    return 0;
  }
}
class RssSampler {
  constructor(pid) {
    this.pid = pid;
    this.peak = 0;
    this.single = true;
    this.timer = setInterval(() => this.sample(), 200);
  }
  sample() {
    const members = tree(this.pid);
    if (members.length > 1) this.single = false;
    this.peak = Math.max(this.peak, members.reduce((sum, m) => sum + statusKiB(m, "VmRSS"), 0));
  }
  stop() {
    this.sample();
    clearInterval(this.timer);
    const hwm = this.single ? statusKiB(this.pid, "VmHWM") : 0;
    return (hwm || this.peak) / 1024;
  }
}

// ── processes ──
const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));
function portOpen(port) {
  return new Promise((resolve) => {
    const socket = net.connect(port, "127.0.0.1");
    socket.once("connect", () => { socket.destroy(); resolve(true); });
    socket.once("error", () => resolve(false));
  });
}
async function waitFor(what, check, child, seconds = 60) {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    if (child && child.exitCode !== null) throw new Error(`${what}: process exited with ${child.exitCode}`);
    try {
      if (await check()) return;
    } catch {}
    await sleep(100);
  }
  throw new Error(`${what}: not ready after ${seconds}s`);
}
function stop(child, graceMs = 10000) {
  if (!child || child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((resolve) => {
    const timer = setTimeout(() => { try { process.kill(-child.pid, "SIGKILL"); } catch {} }, graceMs);
    child.once("exit", () => { clearTimeout(timer); resolve(); });
    try { process.kill(-child.pid, "SIGTERM"); } catch { resolve(); }
  });
}
function serverBinary(explicit) {
  if (explicit) return explicit;
  try {
    const pkg = require.resolve(`@restatedev/restate-server-linux-${process.arch === "arm64" ? "arm64" : "x64"}/package.json`);
    return path.join(path.dirname(pkg), "bin", "restate-server");
  } catch {
    return "restate-server";
  }
}
function percentile(sorted, p) {
  return sorted.length ? sorted[Math.round((sorted.length - 1) * p)] : 0;
}

async function main() {
  const args = parseArgs(process.argv.slice(2));
  const base = fs.mkdtempSync(path.join(os.tmpdir(), "capstan-compare-restate-"));
  const binary = serverBinary(args.server);
  const log = fs.openSync(path.join(base, "server.log"), "w");
  const server = spawn(binary, ["--base-dir", path.join(base, "data"), "--no-logo", "--log-filter", "warn"], {
    stdio: ["ignore", log, log],
    detached: true,
  });
  let service = null;
  // Killed from outside (timeout, Ctrl-C): take the server and the service down with us.
  for (const signal of ["SIGTERM", "SIGINT", "SIGHUP"]) {
    process.on(signal, () => {
      for (const child of [service, server]) {
        try { if (child) process.kill(-child.pid, "SIGKILL"); } catch {}
      }
      process.exit(130);
    });
  }
  let report = null;
  let failure = null;
  try {
    await waitFor("restate admin", async () => (await fetch("http://127.0.0.1:9070/health", { signal: AbortSignal.timeout(2000) })).ok, server);
    await waitFor("restate ingress", () => portOpen(8080), server);
    service = spawn(process.execPath, [path.join(__dirname, "service.cjs"), "9080"], {
      stdio: ["ignore", "ignore", "inherit"],
      detached: true,
      env: process.env,
    });
    await waitFor("restate service endpoint", () => portOpen(9080), service);
    const registered = await fetch("http://127.0.0.1:9070/deployments", {
      method: "POST",
      signal: AbortSignal.timeout(30000),
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ uri: "http://127.0.0.1:9080" }),
    });
    if (!registered.ok) throw new Error(`deployment registration: ${registered.status} ${await registered.text()}`);

    const payload = "x".repeat(args.payloadBytes);
    const target = args.flavour === "rpc" ? `${args.workload}rpc` : args.workload;
    const invoke = async (id, timeoutMs = 120000) => {
      const response = await fetch(`http://127.0.0.1:8080/${target}/${id}/run`, {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify(payload),
        signal: AbortSignal.timeout(timeoutMs),
      });
      const text = await response.text();
      if (!response.ok) throw new Error(`${response.status} ${text.slice(0, 200)}`);
      return JSON.parse(text);
    };
    // The ingress learns the new deployment asynchronously: wait until one invocation goes through.
    await waitFor("first invocation", async () => (await invoke(`warmup-${Date.now()}`, 5000)) === payload, server, 30);

    const sampler = new RssSampler(server.pid);
    const cpuBefore = cpuSeconds(server.pid);
    const serviceCpuBefore = cpuSeconds(service.pid);
    const latencies = [];
    const problems = [];
    let next = 0;
    let started = 0;
    const begin = performance.now();
    const cutoff = args.maxSeconds > 0 ? begin + args.maxSeconds * 1000 : Infinity;
    async function lane() {
      while (next < args.workflows && performance.now() <= cutoff) {
        const index = next++;
        started++;
        const began = performance.now();
        try {
          const result = await invoke(`bench-${process.pid}-${index}`);
          if (result !== payload) problems.push(`workflow ${index}: unexpected result ${String(result).slice(0, 60)}`);
          else latencies.push(performance.now() - began);
        } catch (error) {
          problems.push(`workflow ${index}: ${error.message}`);
        }
      }
    }
    await Promise.all(Array.from({ length: args.concurrency }, lane));
    const elapsed = (performance.now() - begin) / 1000;
    const serverCpu = cpuSeconds(server.pid) - cpuBefore;
    const serviceCpu = cpuSeconds(service.pid) - serviceCpuBefore;
    const peak = sampler.stop();
    latencies.sort((a, b) => a - b);
    for (const problem of problems.slice(0, 10)) console.error(problem);
    const completed = latencies.length;
    const per = Math.max(completed, 1);
    const sdk = JSON.parse(fs.readFileSync(require.resolve("@restatedev/restate-sdk/package.json"), "utf8")).version;
    report = {
      workload: args.workload,
      driver: `@restatedev/restate-sdk ${sdk} service (${args.flavour === "rpc" ? "activity = call to an echo service" : "activity = ctx.run step"}), ingress HTTP client`,
      server: `restate-server ${binary.includes("node_modules") ? "(npm) " : ""}default config`,
      workflows: args.workflows,
      started,
      completed,
      concurrency: args.concurrency,
      payload_bytes: args.payloadBytes,
      elapsed_s: elapsed,
      workflows_per_s: completed / elapsed,
      activities_per_s: (completed * (args.workload === "w1" ? 1 : 10)) / elapsed,
      latency_ms: { p50: percentile(latencies, 0.5), p90: percentile(latencies, 0.9), p99: percentile(latencies, 0.99) },
      server_cpu_s_per_workflow: serverCpu / per,
      server_peak_rss_mib: peak,
      worker_cpu_s_per_workflow: serviceCpu / per,
      verification_problems: problems.length,
      flavour: args.flavour,
    };
  } catch (error) {
    failure = error;
  } finally {
    await stop(service);
    await stop(server, 20000);
    fs.closeSync(log);
    if (failure) {
      const tail = fs.readFileSync(path.join(base, "server.log"), "utf8").slice(-3000);
      console.error(`restate bench failed: ${failure.stack || failure}\n--- restate-server log tail ---\n${tail}`);
    }
    fs.rmSync(base, { recursive: true, force: true });
  }
  if (!report) process.exit(1);
  console.log(args.json ? JSON.stringify(report) : JSON.stringify(report, null, 2));
  process.exit(report.verification_problems === 0 && report.completed === report.started && report.started > 0 ? 0 : 1);
}

main().catch((error) => {
  console.error(error);
  process.exit(1);
});
