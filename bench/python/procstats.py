"""What /proc says about a process tree: CPU seconds and peak resident memory.

Used by ``sdk_bench.py`` and by the side-by-side drivers in ``bench/compare/``
so every peer's server is measured the same way:

* CPU seconds: ``utime + stime`` (fields 14 and 15 of ``/proc/<pid>/stat``)
  summed over the root process and all its live descendants, plus the
  ``cutime + cstime`` the root has collected from children that already
  exited. Take a reading before and after a run and subtract.
* Peak RSS: a background sampler sums ``VmRSS`` over the tree every
  ``interval`` seconds and keeps the maximum; for a one-process tree the
  kernel's own high-water mark ``VmHWM`` is used instead (it is exact).
"""
from __future__ import annotations

import os
import threading

CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as handle:
            return handle.read()
    except OSError:
        return ""


def _stat_fields(pid: int) -> list[str]:
    stat = _read(f"/proc/{pid}/stat")
    if ")" not in stat:
        return []
    # Fields after the parenthesised command name start at field 3 (state).
    return stat.rsplit(")", 1)[1].split()


def children(pid: int) -> list[int]:
    found: list[int] = []
    for tid in os.listdir(f"/proc/{pid}/task") if os.path.isdir(f"/proc/{pid}/task") else []:
        text = _read(f"/proc/{pid}/task/{tid}/children")
        found.extend(int(child) for child in text.split())
    return found


def tree(pid: int) -> list[int]:
    """The process and all its live descendants."""
    seen: list[int] = []
    stack = [pid]
    while stack:
        current = stack.pop()
        if current in seen or not os.path.exists(f"/proc/{current}"):
            continue
        seen.append(current)
        stack.extend(children(current))
    return seen


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds used so far by the tree rooted at ``pid``."""
    ticks = 0
    for index, member in enumerate(tree(pid)):
        fields = _stat_fields(member)
        if len(fields) < 15:
            continue
        ticks += int(fields[11]) + int(fields[12])  # utime, stime
        if index == 0:
            ticks += int(fields[13]) + int(fields[14])  # cutime, cstime of reaped children
    return ticks / CLOCK_TICKS


def _status_kib(pid: int, key: str) -> int:
    for line in _read(f"/proc/{pid}/status").splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    return 0


class RssSampler:
    """Samples the tree's summed RSS in a thread; ``peak_mib()`` gives the maximum."""

    def __init__(self, pid: int, interval: float = 0.2) -> None:
        self.pid = pid
        self.interval = interval
        self._peak_kib = 0
        self._single_process = True
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="rss-sampler", daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        members = tree(self.pid)
        if len(members) > 1:
            self._single_process = False
        total = sum(_status_kib(member, "VmRSS") for member in members)
        self._peak_kib = max(self._peak_kib, total)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self._sample()

    def peak_mib(self) -> float:
        self._sample()
        if self._single_process:
            hwm = _status_kib(self.pid, "VmHWM")
            if hwm:
                return hwm / 1024.0
        return self._peak_kib / 1024.0

    def stop(self) -> float:
        peak = self.peak_mib()
        self._stop.set()
        return peak


def percentile(sorted_values: list[float], p: float) -> float:
    """Nearest-rank percentile with the same rounding as ``capstan-bench``."""
    if not sorted_values:
        return 0.0
    index = round((len(sorted_values) - 1) * p)
    return sorted_values[index]
