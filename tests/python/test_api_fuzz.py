"""Property-based fuzzing of the HTTP API from DW's own OpenAPI documents (Schemathesis).

Every operation of the control-plane and worker-protocol specs is called with generated
requests (valid and invalid bodies, paths, queries and headers). The guarantees: no 5xx, no
hang, and every 4xx is a DW error body (`reason` and `message`). CI runs a short form
(`CAPSTAN_FUZZ_EXAMPLES`, default 8 examples per operation); raise it for a long run:

    CAPSTAN_FUZZ_EXAMPLES=500 .venv/bin/python -m pytest tests/python/test_api_fuzz.py -q

The specs are read from `CAPSTAN_DW_SPECS` (default `/work/shared/protocol/specs`, the team's
copy of DW's contracts; they are not vendored into this repository). Adaptations, because the
documents are older or broader than the SDKs in places (see docs/reliability.md): operations
Capstan does not serve (deployments, services, worker sessions, streams) answer 404 with a DW
body, which the checks accept; the documents' response schemas are not enforced (they lag the
SDKs), only the status and error shape are.
"""
from __future__ import annotations

import os
from pathlib import Path

import hypothesis
import schemathesis
from schemathesis.checks import not_a_server_error

from capstan_harness import CONTROL_HEADERS

SPECS = Path(os.environ.get("CAPSTAN_DW_SPECS", "/work/shared/protocol/specs"))
EXAMPLES = int(os.environ.get("CAPSTAN_FUZZ_EXAMPLES", "8"))


@schemathesis.check
def dw_error_body(ctx, response, case):
    """Every refusal is a DW error document, never an empty or HTML body."""
    if 400 <= response.status_code < 500:
        try:
            body = response.json()
        except Exception as error:  # noqa: BLE001 - any parse failure is the finding
            raise AssertionError(f"{response.status_code} without a JSON body: {response.text[:200]!r}") from error
        if not (isinstance(body, dict) and body.get("reason") and body.get("message")):
            raise AssertionError(f"{response.status_code} body lacks reason/message: {body!r}")


def load(name: str):
    path = SPECS / name
    assert path.is_file(), f"DW's OpenAPI document {path} is missing (set CAPSTAN_DW_SPECS)"
    return schemathesis.openapi.from_path(str(path))


control_plane = load("control-plane-api.openapi.yaml")
worker_plane = load("worker-protocol-api.openapi.yaml")

SETTINGS = hypothesis.settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    suppress_health_check=list(hypothesis.HealthCheck),
    database=None,
)


def call(case, server_url: str, headers: dict[str, str]):
    # The version header where the case has none, so bodies and parameters reach the handlers;
    # a generated (possibly wrong) value wins, so the refusals are exercised too.
    case.headers = {**headers, **(case.headers or {})}
    response = case.call(base_url=f"{server_url}/api", timeout=15)
    case.validate_response(response, checks=[not_a_server_error, dw_error_body])


@control_plane.parametrize()
@SETTINGS
def test_control_plane_operations(case, server_url):
    call(case, server_url, CONTROL_HEADERS)


@worker_plane.parametrize()
@SETTINGS
def test_worker_plane_operations(case, server_url):
    call(case, server_url, {"X-Durable-Workflow-Protocol-Version": "1.20"})


def test_the_specs_were_loaded():
    """Guards against a fuzz run that silently covers nothing."""
    assert len(list(control_plane.get_all_operations())) >= 50
    assert len(list(worker_plane.get_all_operations())) >= 10
