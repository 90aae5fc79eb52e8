#!/usr/bin/env python3
"""Turns bench/compare's results.jsonl into Markdown: every result, then the ratios to Capstan.

Usage: report.py RESULTS.jsonl [--machine machine.txt]
"""
from __future__ import annotations

import argparse
import json

BASELINES = [
    ("capstan-sdk-sticky", "Capstan via the Python SDK, sticky"),
    ("capstan-bench", "Capstan via capstan-bench"),
    ("capstan-pg", "Capstan on PostgreSQL via capstan-bench"),
    ("capstan-local-pg", "Capstan on PostgreSQL via capstan-bench, local activities"),
]


def fmt(value, digits=1):
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def ratio(a, b):
    if a is None or b is None or not b:
        return "–"
    return f"{a / b:.2f}×"


def load(path: str) -> list[dict]:
    entries = []
    with open(path) as handle:
        for line in handle:
            line = line.strip()
            if line:
                entries.append(json.loads(line))
    return entries


def metrics(entry: dict) -> dict:
    latency = entry.get("latency_ms") or {}
    cpu = entry.get("server_cpu_s_per_workflow")
    worker = entry.get("worker_cpu_s_per_workflow")
    return {
        "wfs": entry.get("workflows_per_s"),
        "p50": latency.get("p50"),
        "p90": latency.get("p90"),
        "p99": latency.get("p99"),
        "cpu_ms": cpu * 1000 if cpu is not None else None,
        "worker_ms": worker * 1000 if worker is not None else None,
        "rss": entry.get("server_peak_rss_mib"),
        "pg_ms": entry["postgres_cpu_s_per_workflow"] * 1000 if entry.get("postgres_cpu_s_per_workflow") is not None else None,
    }


def with_pg(m: dict):
    """Server CPU plus PostgreSQL's, for rows measured on PostgreSQL only."""
    if m["cpu_ms"] is None or m["pg_ms"] is None:
        return None
    return m["cpu_ms"] + m["pg_ms"]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("results")
    parser.add_argument("--machine")
    args = parser.parse_args()
    entries = load(args.results)
    lines: list[str] = []
    if args.machine:
        lines += ["```", open(args.machine).read().rstrip(), "```", ""]
    for workload in ("w1", "w10"):
        rows = [e for e in entries if e.get("workload") == workload]
        if not rows:
            continue
        lines += [
            f"### {workload.upper()}: every result",
            "",
            "| peer | done/started | wf/s | p50 ms | p90 ms | p99 ms | server CPU ms/wf | PostgreSQL CPU ms/wf | server peak RSS MiB | worker CPU ms/wf | load before | status |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for e in rows:
            m = metrics(e)
            done = f"{e.get('completed', '–')}/{e.get('started', e.get('workflows', '–'))}" if "completed" in e else "–"
            status = "ok" if e.get("ok") else f"FAILED: {e.get('error', '')[:160]}"
            if e.get("verification_problems"):
                status += f" ({e['verification_problems']} verification problems)"
            lines.append(
                f"| {e['label']} | {done} | {fmt(m['wfs'])} | {fmt(m['p50'], 0)} | {fmt(m['p90'], 0)} | {fmt(m['p99'], 0)} "
                f"| {fmt(m['cpu_ms'], 2)} | {fmt(m['pg_ms'], 2)} | {fmt(m['rss'], 0)} | {fmt(m['worker_ms'], 2)} | {fmt(e.get('loadavg_1m_before'), 2)} | {status} |"
            )
        lines.append("")
        for base_label, base_title in BASELINES:
            base = next((e for e in rows if e["label"] == base_label and e.get("ok")), None)
            if base is None:
                continue
            b = metrics(base)
            lines += [
                f"### {workload.upper()}: ratios, peer ÷ {base_title}",
                "",
                "wf/s above 1× means the peer completed more workflows per second; latency, CPU and RSS "
                "above 1× mean the peer took longer or used more.",
                "",
                "| peer | wf/s | p50 | p99 | server CPU/wf | server+PostgreSQL CPU/wf | server peak RSS |",
                "|---|---|---|---|---|---|---|",
            ]
            for e in rows:
                if e["label"] == base_label or not e.get("completed"):
                    continue
                m = metrics(e)
                lines.append(
                    f"| {e['label']} | {ratio(m['wfs'], b['wfs'])} | {ratio(m['p50'], b['p50'])} | {ratio(m['p99'], b['p99'])} "
                    f"| {ratio(m['cpu_ms'], b['cpu_ms'])} | {ratio(with_pg(m), with_pg(b))} | {ratio(m['rss'], b['rss'])} |"
                )
            lines.append("")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
