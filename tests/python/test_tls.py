"""TLS end to end: `capstan serve --tls-cert --tls-key` with certificates made here by openssl.
The published Python SDK's client and worker reach it with the SDK's own trust option
(`tls_context`) and run a workflow; a client that does not trust the certificate, or a server
certificate that has expired, is refused by the handshake with the SSL error naming why; a
certificate replaced on disk is served from the next connection without a restart; a
certificate file that is not one refuses the start (exit 2), naming it. With `--tls-client-ca`, a
client certificate a named credential lists authenticates the SDK's client and worker, and
history records the principal it maps to; a client without one, or with one no credential
names, is refused.
"""
from __future__ import annotations

import ssl
import subprocess
import time
from pathlib import Path

import httpx
import pytest
from durable_workflow import activity, workflow

from capstan_harness import capstan_binary, make_client, run_async, running_worker, unique, wait_result


@activity.defn(name="tls.greet")
def greet(name: str) -> str:
    return f"hello {name}"


@workflow.defn(name="tls.greeter")
class Greeter:
    def run(self, ctx, name):
        return (yield ctx.schedule_activity("tls.greet", [name]))


def openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def authority(directory: Path, name: str) -> Path:
    """A self-signed CA in `directory` (`{name}.pem`, `{name}.key`)."""
    openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", cwd=directory)
    return directory / f"{name}.pem"


def server_certificate(directory: Path, ca: str, name: str, days: int = 2, *, client: str | None = None) -> tuple[Path, Path]:
    """A certificate for 127.0.0.1 and localhost signed by `ca`; `days` below 0 is expired. With
    `client`, a client certificate for that DNS name instead."""
    names, usage = (f"DNS:{client}", "clientAuth") if client else ("IP:127.0.0.1,DNS:localhost", "serverAuth")
    (directory / "ext.cnf").write_text(
        f"subjectAltName={names}\nbasicConstraints=CA:FALSE\nextendedKeyUsage={usage}\n"
    )
    openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", "/CN=localhost", cwd=directory)
    openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", str(days), "-extfile", "ext.cnf", cwd=directory)
    return directory / f"{name}.pem", directory / f"{name}.key"


def trusting(ca: Path) -> ssl.SSLContext:
    return ssl.create_default_context(cafile=str(ca))


def answered(outcome) -> bool:
    return isinstance(outcome, httpx.Response)


def polled(server, context: ssl.SSLContext, until, seconds: float = 20):
    """`GET /api/health` trusting `context` until `until` accepts the outcome: the response, or
    the error the connection ended with (the server may still be starting or reloading)."""
    deadline = time.monotonic() + seconds
    while True:
        try:
            outcome = httpx.get(f"{server.url}/api/health", verify=context, timeout=5)
        except httpx.HTTPError as error:
            outcome = error
        if until(outcome):
            return outcome
        assert time.monotonic() < deadline and server.proc.poll() is None, f"{outcome!r}\n{server.log_tail()}"
        time.sleep(0.1)


def handshake_error(url: str, context: ssl.SSLContext) -> str:
    with pytest.raises(httpx.ConnectError) as refused:
        httpx.get(f"{url}/api/health", verify=context, timeout=5)
    return str(refused.value)


def tls_server(server_factory, tmp_path: Path):
    """A server on a certificate signed by its own CA; the paths it serves from are kept so a
    test can replace them."""
    ca = authority(tmp_path, "ca-one")
    cert, key = server_certificate(tmp_path, "ca-one", "served")
    server = server_factory.create("--tls-cert", str(cert), "--tls-key", str(key), start=False)
    server.tls_ca = ca
    server.spawn()
    server.wait_ready()
    return server, cert, key


def test_the_sdk_runs_a_workflow_over_tls_and_untrusted_clients_are_refused(server_factory, tmp_path):
    server, _, _ = tls_server(server_factory, tmp_path)
    assert server.url.startswith("https://")
    context = trusting(server.tls_ca)
    queue = unique("tls")

    async def main():
        async with make_client(server.url, tls_context=context) as client:
            async with running_worker(server.url, queue, workflows=[Greeter], activities=[greet],
                                      tls_context=context) as worker:
                handle = await client.start_workflow(workflow_type="tls.greeter", task_queue=queue,
                                                     workflow_id=unique("tls-wf"), input=["over tls"])
                return await wait_result(handle, timeout=60, workers=[worker])

    assert run_async(main(), timeout=90) == "hello over tls"

    # HTTP/2 is chosen by ALPN when the client offers it; HTTP/1.1 is still served.
    with httpx.Client(verify=context) as http1:
        assert http1.get(f"{server.url}/api/health").http_version == "HTTP/1.1"
    negotiated = subprocess.run(
        ["openssl", "s_client", "-connect", f"127.0.0.1:{server.port}", "-alpn", "h2,http/1.1",
         "-CAfile", str(server.tls_ca), "-verify_return_error"],
        input="", capture_output=True, text=True, timeout=30,
    )
    assert "ALPN protocol: h2" in negotiated.stdout, negotiated.stdout + negotiated.stderr

    # A client that trusts another CA is refused by the handshake, naming the reason.
    other = authority(tmp_path, "stranger")
    assert "CERTIFICATE_VERIFY_FAILED" in handshake_error(server.url, trusting(other))
    # Plain HTTP to a TLS port gets no answer it could mistake for one.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"http://127.0.0.1:{server.port}/api/health", timeout=5)


def test_a_replaced_certificate_is_served_without_a_restart(server_factory, tmp_path):
    server, cert, key = tls_server(server_factory, tmp_path)
    pid = server.proc.pid
    new_ca = authority(tmp_path, "ca-two")
    new_cert, new_key = server_certificate(tmp_path, "ca-two", "rotated")
    # Written beside, then renamed over: the server never reads half a file.
    for source, target in ((new_key, key), (new_cert, cert)):
        staged = target.with_suffix(".staged")
        staged.write_bytes(source.read_bytes())
        staged.replace(target)
    answer = polled(server, trusting(new_ca), answered)
    assert answer.status_code == 200 and server.proc.pid == pid
    assert "CERTIFICATE_VERIFY_FAILED" in handshake_error(server.url, trusting(server.tls_ca))

    # A broken file on disk keeps the certificate in service.
    cert.write_text("not a certificate")
    time.sleep(3)
    assert httpx.get(f"{server.url}/api/health", verify=trusting(new_ca), timeout=5).status_code == 200
    assert "TLS certificate not reloaded" in server.log_tail()


def test_an_expired_certificate_is_refused_by_clients_and_a_bad_file_refuses_the_start(server_factory, tmp_path):
    ca = authority(tmp_path, "ca-old")
    cert, key = server_certificate(tmp_path, "ca-old", "expired", days=-1)
    server = server_factory.create("--tls-cert", str(cert), "--tls-key", str(key), start=False)
    server.tls_ca = ca
    server.spawn()
    outcome = polled(server, trusting(ca), lambda o: answered(o) or "CERTIFICATE_VERIFY_FAILED" in str(o))
    assert not answered(outcome), "an expired certificate was accepted"
    assert "expired" in str(outcome), outcome

    bad = tmp_path / "bad.pem"
    bad.write_text("-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n")
    refused = subprocess.run(
        [str(capstan_binary()), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(tmp_path / "never"),
         "--tls-cert", str(bad), "--tls-key", str(key)],
        capture_output=True, text=True, timeout=30,
    )
    assert refused.returncode == 2 and "--tls-cert" in refused.stderr and str(bad) in refused.stderr, refused.stderr
    assert not (tmp_path / "never").exists()
    only_key = subprocess.run(
        [str(capstan_binary()), "serve", "--check-config", "--tls-key", str(key)],
        capture_output=True, text=True, timeout=30,
    )
    assert only_key.returncode == 2 and "--tls-cert" in only_key.stderr, only_key.stderr


def test_client_certificates_authenticate_as_the_credential_that_names_them(server_factory, tmp_path):
    ca = authority(tmp_path, "server-ca")
    cert, key = server_certificate(tmp_path, "server-ca", "served")
    clients = authority(tmp_path, "clients")
    worker_cert, worker_key = server_certificate(tmp_path, "clients", "worker-a", client="worker-a.capstan.test")
    stranger_cert, stranger_key = server_certificate(tmp_path, "clients", "stranger", client="stranger.capstan.test")
    credentials = tmp_path / "credentials.toml"
    credentials.write_text(
        '[[credential]]\nprincipal = "worker-a"\nroles = ["worker", "operator"]\n'
        'client_certificates = ["worker-a.capstan.test"]\n'
    )
    server = server_factory.create(
        "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-ca", str(clients),
        "--auth", "token", "--credentials-file", str(credentials), start=False,
    )
    server.tls_ca = ca
    server.spawn()

    def presenting(certificate: Path, private_key: Path) -> ssl.SSLContext:
        context = trusting(ca)
        context.load_cert_chain(str(certificate), str(private_key))
        return context

    worker_context = presenting(worker_cert, worker_key)
    polled(server, worker_context, answered, seconds=30)
    queue = unique("mtls")

    async def main():
        async with make_client(server.url, tls_context=worker_context) as client:
            async with running_worker(server.url, queue, workflows=[Greeter], activities=[greet],
                                      tls_context=worker_context) as worker:
                handle = await client.start_workflow(workflow_type="tls.greeter", task_queue=queue,
                                                     workflow_id=unique("mtls-wf"), input=["by certificate"])
                return handle, await wait_result(handle, timeout=60, workers=[worker])

    handle, result = run_async(main(), timeout=90)
    assert result == "hello by certificate"
    headers = {"X-Durable-Workflow-Control-Plane-Version": "2", "X-Namespace": "default"}
    history = httpx.get(f"{server.url}/api/workflows/{handle.workflow_id}/runs/{handle.run_id}/history",
                        headers=headers, verify=worker_context).json()["events"]
    started = next(e for e in history if e["event_type"] == "StartAccepted")
    assert started["payload"]["principal"] == {"type": "auth:mtls", "id": "worker-a"}, started
    whoami = httpx.get(f"{server.url}/api/auth/whoami", verify=worker_context).json()
    assert whoami["principal"] == {"type": "auth:mtls", "id": "worker-a"}, whoami

    # A certificate the CA signed that no credential names is authenticated by TLS but acts as
    # no one; a forged principal header changes nothing.
    stranger = httpx.get(f"{server.url}/api/cluster/info", verify=presenting(stranger_cert, stranger_key),
                         headers={"X-Capstan-Certified-Principal": "worker-a"})
    assert stranger.status_code == 401 and stranger.json()["reason"] == "unauthorized", stranger.text
    # Without a client certificate the handshake fails.
    with pytest.raises(httpx.HTTPError):
        httpx.get(f"{server.url}/api/cluster/info", verify=trusting(ca), timeout=5)
    info = httpx.get(f"{server.url}/api/cluster/info", verify=worker_context).json()
    mtls = info["auth_composition_contract"]["auth_material"]["mtls"]
    assert mtls["status"] == "reserved" and mtls["capstan_server"]["supported"] is True, mtls
