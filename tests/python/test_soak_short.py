"""The soak's short form (`bench/soak/soak.py`, whose hour-long run is in bench/README.md):
a minute of W1 at 10 workflows/s through two stock Python SDK worker processes, one of them
SIGKILLed every 15 s and the server SIGKILLed and restarted every 30 s. Every workflow must
complete with its input echoed back."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from capstan_harness import capstan_binary

SOAK = Path(__file__).resolve().parents[2] / "bench" / "soak" / "soak.py"


def test_a_minute_of_load_with_workers_and_the_server_killed_loses_nothing(tmp_path):
    report_path = tmp_path / "soak.json"
    done = subprocess.run(
        [sys.executable, str(SOAK), "--binary", str(capstan_binary()), "--duration", "60", "--rate", "10",
         "--kill-worker-every", "15", "--restart-server-every", "30", "--drain", "120", "--sample-every", "5",
         "--out", str(report_path)],
        capture_output=True, text=True, timeout=400,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(report_path.read_text())
    assert report["started"] >= 550 and report["completed"] == report["started"], report["not_completed"][:10]
    assert report["worker_kills"] >= 3 and report["server_restarts"] >= 1, report["events"]
    assert report["wrong_results"] == []
