"""The job server's transport and operations: HTTPS, what it refuses to expose, its start line,
its access log and its Prometheus metrics; a real server process over HTTP(S)."""

from __future__ import annotations

import datetime
import ipaddress
import os
import pwd
import re
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
x509 = pytest.importorskip("cryptography.x509")

from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402
from server_helpers import ALICE, BOB, ROOT, TOKENS, Server, error_of, upload, wait_state  # noqa: E402


def _certificate(folder: Path) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1, and its key."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tlaunch test server")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False
        )
        .sign(key, hashes.SHA256())
    )
    cert_file, key_file = folder / "cert.pem", folder / "key.pem"
    cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_file.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        )
    )
    key_file.chmod(0o600)
    return cert_file, key_file


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One HTTPS server for the module."""
    folder = tmp_path_factory.mktemp("ops")
    cert, key = _certificate(folder)
    srv = Server(
        folder / "home", extra=["--tls-cert", str(cert), "--tls-key", str(key)], scheme="https", start=False
    )
    srv.verify = ssl.create_default_context(cafile=str(cert))
    srv.start()
    try:
        yield srv
    finally:
        srv.stop()


def test_https_a_start_line_and_an_access_log_that_never_holds_a_token(server: Server) -> None:
    with server.client() as c:
        assert c.get("/v1/version").status_code == 200
        pkg = upload(c, {"train.py": "print('hi')\n"})
        body = {"job_name": "ops", "trainer_package": pkg}
        assert c.post("/v1/trainer/job", json=body).status_code == 201
        assert wait_state(c, "ops", ("SUCCEEDED", "FAILED"))["state"] == "SUCCEEDED"
        error_of(c.get("/v1/jobs/ops%0Aforged"), 404)
    with server.client(None) as anonymous:
        error_of(anonymous.get("/v1/jobs"), 401)
    deadline = time.monotonic() + 10  # a line is written once its answer is sent: the client may be first
    while "GET /v1/jobs user=- status=401" not in (log := server.log.read_text()):
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    starts = [line for line in log.splitlines() if "listening on" in line]
    assert len(starts) == 1, log
    start = starts[0]
    assert f"listening on https://127.0.0.1:{server.port}" in start
    assert f"dashboard https://127.0.0.1:{server.port}/dashboard/" in start
    assert f"home {server.home}" in start and f"database {server.home}/server/jobs.db" in start
    assert "one account: for a single trusted team" in start, start
    me = pwd.getpwuid(os.getuid()).pw_name
    assert f"every job runs as {me} and can read the token file and the database" in start, start
    assert re.search(r"GET /v1/version user=alice status=200 ms=\d+\.\d", log), log
    assert re.search(r"POST /v1/trainer/job user=alice status=201 ms=", log), log
    assert re.search(r"GET /v1/jobs user=- status=401 ms=", log), log
    assert "GET /v1/jobs/ops\\nforged user=alice status=404" in log  # one line, whatever the path holds
    for token in (ALICE, BOB, ROOT):
        assert token not in log


def test_metrics_for_prometheus(server: Server) -> None:
    with server.client() as c:
        assert c.get("/v1/jobs").status_code == 200
        error_of(c.get("/metrics"), 403)
        pkg = upload(c, {"train.py": "import time; print('up', flush=True); time.sleep(30)\n"})
        assert (
            c.post("/v1/trainer/job", json={"job_name": "streamed", "trainer_package": pkg}).status_code
            == 201
        )
        wait_state(c, "streamed", ("RUNNING",))
        with (
            server.client(ROOT) as admin,
            c.stream("GET", "/v1/jobs/streamed/logs", params={"follow": "true"}) as r,
        ):
            assert r.status_code == 200
            lines = r.iter_lines()  # kept: a dropped iterator closes the connection, and the stream
            next(lines)
            text = admin.get("/metrics").text
            assert 'tlaunch_server_open_streams{route="/v1/jobs/{name}/logs"} 1.0' in text, text
            assert 'tlaunch_server_jobs{state="RUNNING"} 1.0' in text, text
            c.post("/v1/jobs/streamed/stop")
        wait_state(c, "streamed", ("STOPPED",))
        closed = 'tlaunch_server_open_streams{route="/v1/jobs/{name}/logs"} 0.0'
        deadline = time.monotonic() + 10  # the stream notices its client left
        with server.client(ROOT) as admin:
            while closed not in (text := admin.get("/metrics").text):
                assert time.monotonic() < deadline, text
                time.sleep(0.1)
    assert 'tlaunch_server_requests_total{method="GET",route="/v1/jobs",status="200"}' in text, text
    assert 'tlaunch_server_requests_total{method="GET",route="/metrics",status="403"} 1.0' in text
    assert 'tlaunch_server_request_seconds_bucket{le="0.1",method="GET",route="/v1/jobs/{name}"}' in text
    assert 'tlaunch_server_jobs{state="STOPPED"} 1.0' in text
    assert "/v1/jobs/streamed" not in text  # a route's template, never a job's name


def _refused(*args: str, home: Path) -> str:
    argv = [sys.executable, "-m", "tlaunch.server", "--home", str(home), "--port", "0", *args]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2, (done.returncode, done.stderr)
    return done.stderr


def test_a_server_others_can_reach_needs_tokens_and_tls_or_says_insecure(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    tokens.chmod(0o600)
    said = _refused("--host", "0.0.0.0", home=tmp_path / "h")
    assert "no token is set" in said and "it has no TLS" in said and "--insecure" in said, said
    said = _refused("--host", "0.0.0.0", "--token-file", str(tokens), home=tmp_path / "h")
    assert "no token is set" not in said and "it has no TLS" in said, said
    cert, _ = _certificate(tmp_path)
    said = _refused("--tls-cert", str(cert), home=tmp_path / "h")
    assert "give --tls-cert and --tls-key together" in said, said
    said = _refused("--tls-cert", str(cert), "--tls-key", str(tokens), home=tmp_path / "h")
    assert "cannot be used" in said, said


def test_the_help_says_one_account_without_unix_users() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.server", "--help"], capture_output=True, text=True, check=True
    )
    said = " ".join(done.stdout.split())
    assert "one account: for a single trusted team" in said, said
    assert "a job can read what the server can, its token file and its database included" in said, said
