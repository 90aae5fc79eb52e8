"""Every repository path the documentation names exists.

Scans `README.md`, `ARCHITECTURE.md` and `docs/**/*.md` (fenced code blocks left out) for
inline code spans and link targets, and fails naming each path that does not resolve. The
rules a doc follows:

* A path in backticks is written from the repository root: `crates/store/src/backend.rs`,
  `docs/cluster.md`, `tests/python/test_zombies.py`. It is checked when its first segment is
  an entry at the repository's root (`crates`, `docs`, `tests`, `scripts`, `deploy`, `bench`,
  `examples`, `fuzz`, `README.md`…; the build output `target/` is not). A `:line` or
  `:from-to` suffix, an `#anchor` and a `::item` are stripped; `*` globs must match something;
  `{a,b}` alternatives are each checked.
* A path relative to a crate or to a module folder (`store/src/lib.rs`, `routes/worker.rs`,
  `logic/runs.rs`) fails: write `crates/store/src/lib.rs`. The first segments refused are the
  crates' names and the folders inside their `src/`. A bare name (`wire.rs`, `logic/`) names a
  file or folder the sentence has already located and is not checked.
* A path outside the repository fails: `../…`, or a developer's machine (`/tmp/…`,
  `/home/…`, `~/…`, a virtualenv's `site-packages/…`, `.cargo/registry/…`).
* A file of another project is named with that project first and a colon:
  `durable-workflow/server:tests/Feature/MessageStreamsTest.php`; such a span is not checked.
  So is anything that is not a path: an HTTP route (`/api/…`), a URL, a template (`<…>`,
  an ellipsis `…`).
* A relative link target `[text](path)` is resolved from the document's own folder and must
  exist (an `#anchor` alone, or a URL, is not checked).

A plain test: it asks for no fixture, starts no server and uses no network. Run it alone with
`python3 -m pytest tests/python/test_docs_paths.py`, or `python3 tests/python/test_docs_paths.py`.
"""
from __future__ import annotations

import glob
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# Root entries that are not part of the repository's content: build output, and the data a
# `capstan serve` started at the root leaves behind.
NOT_CHECKED_ROOTS = {"target", "node_modules", "capstan-data"}

FENCE = re.compile(r"^\s*(```|~~~)")
CODE_SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")
LINK = re.compile(r"\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
LINE_SUFFIX = re.compile(r":\d[\d,\-–]*$")
BRACES = re.compile(r"\{([^{}]*)\}")
MACHINE = re.compile(r"^(~|/tmp/|/home/|/root/|/Users/|/work/|/var/folders/|/private/)|site-packages/|\.cargo/registry/")
URL = re.compile(r"^[a-z][a-z0-9+.-]*://", re.IGNORECASE)


def documents() -> list[Path]:
    found = [ROOT / "README.md", ROOT / "ARCHITECTURE.md"]
    found += sorted((ROOT / "docs").rglob("*.md"))
    return [path for path in found if path.is_file()]


def root_entries() -> set[str]:
    return {
        entry.name
        for entry in ROOT.iterdir()
        if not entry.name.startswith(".") and entry.name not in NOT_CHECKED_ROOTS
    }


def relative_roots() -> set[str]:
    """First segments that betray a path written from inside a crate: crate folder names and
    the module folders under their `src/`."""
    names: set[str] = set()
    crates = ROOT / "crates"
    for crate in crates.iterdir():
        if not crate.is_dir():
            continue
        names.add(crate.name)
        source = crate / "src"
        if source.is_dir():
            names.update(d.name for d in source.rglob("*") if d.is_dir())
    return names


def prose_lines(path: Path) -> list[tuple[int, str]]:
    """The document's lines outside fenced code blocks, numbered from 1."""
    lines = []
    fenced = False
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((number, line))
    return lines


def expand(path: str) -> list[str]:
    """`a/{b,c}.rs` → `a/b.rs`, `a/c.rs` (nested and repeated groups too)."""
    match = BRACES.search(path)
    if not match:
        return [path]
    head, tail = path[: match.start()], path[match.end():]
    return [expanded for option in match.group(1).split(",") for expanded in expand(head + option.strip() + tail)]


def exists(path: str) -> bool:
    path = path.rstrip("/")
    if any(ch in path for ch in "*?["):
        return bool(glob.glob(str(ROOT / path)))
    return (ROOT / path).exists()


def normalise(span: str) -> str:
    span = span.strip()
    span = span.split("::", 1)[0]
    span = span.split("#", 1)[0]
    return LINE_SUFFIX.sub("", span)


def span_problem(span: str, roots: set[str], relative: set[str]) -> str | None:
    """Why a code span's path is wrong, or None (also for spans that are not paths)."""
    if any(ch.isspace() for ch in span.strip()):
        return None
    if MACHINE.search(span):
        return "a path on a developer's machine, not in the repository"
    if span.startswith("../"):
        return "a path outside the repository"
    span = span.strip()
    if span.startswith("./"):
        span = span[2:]
    if URL.match(span) or span.startswith(("/", "…", "$")) or any(ch in span for ch in "<>…|="):
        return None
    path = normalise(span)
    if "/" not in path.rstrip("/"):
        return None  # a bare file or folder name (`wire.rs`, `logic/`): named, not located
    first = path.split("/", 1)[0]
    if ":" in first:
        return None  # `project:path`: another project's file
    if first in roots:
        missing = [p for p in expand(path) if not exists(p)]
        if missing:
            return "does not exist" if missing == [path] else f"does not exist: {', '.join(missing)}"
        return None
    if first in relative and first not in roots:
        return "written from inside a crate; write the path from the repository root"
    return None


def link_problem(document: Path, target: str) -> str | None:
    if URL.match(target) or target.startswith(("#", "mailto:")):
        return None
    if MACHINE.search(target):
        return "a path on a developer's machine, not in the repository"
    path = target.split("#", 1)[0]
    if not path:
        return None
    resolved = (document.parent / path).resolve()
    try:
        resolved.relative_to(ROOT)
    except ValueError:
        return "a link outside the repository"
    if not resolved.exists():
        return "a link to nothing"
    return None


def problems() -> list[str]:
    roots = root_entries()
    relative = relative_roots()
    found = []
    for document in documents():
        name = document.relative_to(ROOT).as_posix()
        for number, line in prose_lines(document):
            for match in CODE_SPAN.finditer(line):
                problem = span_problem(match.group(1), roots, relative)
                if problem:
                    found.append(f"{name}:{number}: `{match.group(1)}` — {problem}")
            for match in LINK.finditer(line):
                problem = link_problem(document, match.group(1))
                if problem:
                    found.append(f"{name}:{number}: ({match.group(1)}) — {problem}")
    return found


def test_every_path_the_docs_name_exists() -> None:
    found = problems()
    assert not found, "paths in the docs that do not resolve:\n" + "\n".join(found)


def test_the_rules_catch_what_they_should() -> None:
    roots = root_entries()
    relative = relative_roots()
    assert span_problem("crates/store/src/backend.rs:12-40", roots, relative) is None
    assert span_problem("./scripts/test-all.sh", roots, relative) is None
    assert span_problem("./scripts/no-such-script.sh", roots, relative) == "does not exist"
    assert span_problem("crates/store/src/contract/{runs,tasks}.rs", roots, relative) is None
    assert span_problem("crates/store/src/no_such_file.rs", roots, relative) == "does not exist"
    assert span_problem("crates/store/src/contract/{runs,nothing}.rs", roots, relative)
    assert span_problem("store/src/lib.rs", roots, relative)
    assert span_problem("routes/worker.rs", roots, relative)
    assert span_problem("logic/", roots, relative) is None
    assert span_problem("../shared/protocol/70-sdk-surface.md", roots, relative)
    assert span_problem("/tmp/research/probe.py", roots, relative)
    assert span_problem(".venv/lib/python3.11/site-packages/durable_workflow/", roots, relative)
    assert span_problem("durable-workflow/server:tests/Feature/X.php", roots, relative) is None
    assert span_problem("/api/worker/poll", roots, relative) is None
    assert span_problem("s3://bucket/key", roots, relative) is None


if __name__ == "__main__":
    listed = problems()
    print("\n".join(listed) if listed else "every path the docs name exists")
    sys.exit(1 if listed else 0)
