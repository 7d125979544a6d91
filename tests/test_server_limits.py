"""The job server's limits and refusals: bodies, fields, archives, leftovers, token files, hosts, origins.

A real ``python -m tlaunch.server`` process over HTTP (and raw sockets, where a
client must misbehave): every refusal is the server's one error shape, never a
500, a reset connection or memory spent on what it refuses.
"""

from __future__ import annotations

import io
import os
import select
import socket
import struct
import subprocess
import sys
import tarfile
import time
import warnings
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("fastapi")

from server_helpers import ALICE, TOKENS, Server, error_of, upload, zip_of


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = Server(tmp_path_factory.mktemp("limits") / "home")
    try:
        yield srv
    finally:
        srv.stop()


def _rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))


def _answer(sock: socket.socket, timeout: float = 30) -> bytes:
    """What the server answered on ``sock``, until it closed the connection."""
    sock.settimeout(timeout)
    got = b""
    while chunk := sock.recv(65536):
        got += chunk
    return got


def _head(server: Server, path: str, headers: dict[str, str]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port))
    lines = [f"POST {path} HTTP/1.1", f"Host: 127.0.0.1:{server.port}", f"Authorization: Bearer {ALICE}"]
    lines += [f"{k}: {v}" for k, v in headers.items()]
    sock.sendall(("\r\n".join(lines) + "\r\n\r\n").encode())
    return sock


def test_an_oversized_json_body_is_413_before_it_is_read_and_memory_stays_flat(server: Server) -> None:
    assert server.proc is not None
    before = _rss_kib(server.proc.pid)
    chunk = b"x" * (1 << 20)
    # A body that says it is 200 MB: answered before a byte of it is read.
    with _head(
        server, "/v1/trainer/job", {"Content-Type": "application/json", "Content-Length": "200000000"}
    ) as s:
        answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert b'"code":"too_large"' in answer.replace(b" ", b"") and b"200000000" in answer
    # One that does not say (chunked): answered as it passes the limit; the client cannot send 200 MB.
    sent = 0
    with _head(
        server, "/v1/trainer/job", {"Content-Type": "application/json", "Transfer-Encoding": "chunked"}
    ) as s:
        s.setblocking(False)
        while sent < 200 << 20 and not select.select([s], [], [], 0)[0]:
            try:
                s.sendall(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                sent += len(chunk)
            except (BlockingIOError, BrokenPipeError, ConnectionResetError):
                if not select.select([s], [], [], 1)[0]:
                    continue
        s.setblocking(True)
        answer = _answer(s)
    assert answer.startswith(b"HTTP/1.1 413"), answer[:200]
    assert sent < 32 << 20, f"the server took {sent >> 20} MiB before it refused"
    grown = _rss_kib(server.proc.pid) - before
    assert grown < 30 << 10, f"the server grew by {grown >> 10} MiB"
    # Through an ordinary client: the one error shape.
    with server.client() as c:
        e = error_of(c.post("/v1/trainer/job", json={"job_name": "big", "env": {"X": "y" * (2 << 20)}}), 413)
        assert "limit is 1048576" in e["message"] and "--max-request-kb" in e["message"]
        assert c.get("/v1/health").json() == {"status": "ok"}


def test_every_list_map_and_string_of_a_job_is_bounded(server: Server) -> None:
    with server.client() as c:
        pkg = upload(c)
        base = {"job_name": "bounded", "trainer_package": pkg}
        for extra, where in (
            ({"env": {f"V{i}": "1" for i in range(257)}}, "env"),
            ({"env": {"V": "v" * 65537}}, "env.V"),
            ({"labels": {"team": "t" * 257}}, "labels.team"),
            ({"args": ["a"] * 1025}, "args"),
            ({"args": ["a" * 4097]}, "args.0"),
            ({"hosts": ["h" * 257]}, "hosts.0"),
            ({"slurm": {"sbatch_args": ["--x"] * 65}}, "slurm.sbatch_args"),
        ):
            e = error_of(c.post("/v1/trainer/job", json={**base, **extra}), 400)
            assert e["message"].startswith(f"body.{where}"), (extra.keys(), e)
        error_of(c.get("/v1/jobs/bounded"), 404)


def test_an_unknown_field_is_a_400_naming_it(server: Server) -> None:
    with server.client() as c:
        pkg = upload(c)
        body = {"job_name": "typo", "trainer_package": pkg, "num_trainers": 4}
        e = error_of(c.post("/v1/trainer/job", json=body), 400)
        assert e["message"].startswith("unknown fields ['num_trainers']"), e
        assert "did you mean 'num_trainer'?" in e["message"], e
        body = {"job_name": "typo", "trainer_package": pkg, "slurm": {"partiton": "gpu"}, "lables": {}}
        e = error_of(c.post("/v1/trainer/job", json=body), 400)
        assert "'slurm.partiton'" in e["message"] and "'lables'" in e["message"], e
        error_of(c.get("/v1/jobs/typo"), 404)  # nothing ran with the fields it understood


def _patched(data: bytes, **fields: int) -> bytes:
    """A zip's first member with its header fields changed: ``flags``, ``method`` (both its headers)."""
    out = bytearray(data)
    local, central = out.index(b"PK\x03\x04"), out.index(b"PK\x01\x02")
    for name, value in fields.items():
        at = {"flags": (6, 8), "method": (8, 10)}[name]
        struct.pack_into("<H", out, local + at[0], value)
        struct.pack_into("<H", out, central + at[1], value)
    return bytes(out)


def _stored(files: dict[str, str]) -> bytes:
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # zipfile warns of a duplicate name, which is the point
        with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_STORED) as z:
            for name, text in files.items():
                z.writestr(name, text)
            if "twice" in files:
                z.writestr("twice", "again")
    return buf.getvalue()


def _bad_crc() -> bytes:
    data = bytearray(_stored({"train.py": "print('hello')"}))
    at = data.index(b"print('hello')")
    data[at] ^= 0xFF
    return bytes(data)


def _truncated_tgz() -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as t:
        for i in range(20):
            data = os.urandom(20_000)
            info = tarfile.TarInfo(f"f{i}.bin")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    whole = buf.getvalue()
    return whole[: len(whole) // 2]


MALFORMED: list[tuple[str, Callable[[], bytes], str]] = [
    ("duplicate members", lambda: _stored({"twice": "once"}), "in the package twice"),
    ("a file, then x/y", lambda: _stored({"x": "a file", "x/y": "under it"}), "under 'x', which is a file"),
    ("a bad CRC", _bad_crc, "Bad CRC-32"),
    ("an encrypted flag", lambda: _patched(_stored({"a.py": "x"}), flags=1), "is encrypted"),
    ("compression method 99", lambda: _patched(_stored({"a.py": "x"}), method=99), "method 99"),
    ("a 300-character name", lambda: zip_of({"a" * 300 + ".py": "x"}), "name too long"),
    ("a truncated tar.gz", _truncated_tgz, "cannot be unpacked"),
]


@pytest.mark.parametrize(("archive", "why"), [(m[1], m[2]) for m in MALFORMED], ids=[m[0] for m in MALFORMED])
def test_an_archive_the_server_cannot_unpack_is_a_400_saying_why(
    server: Server, archive: Callable[[], bytes], why: str
) -> None:
    with server.client() as c:
        e = error_of(c.post("/v1/package", content=archive()), 400)
        assert e["message"].startswith("refused package: ") and why in e["message"], e
        assert c.get("/v1/health").json() == {"status": "ok"}
    store = server.home / "server" / "packages"
    assert not [p for p in store.rglob("*") if p.name.startswith((".upload-", ".incoming-"))]
    assert "Traceback" not in server.log.read_text()


def test_an_upload_cut_by_a_kill_leaves_nothing_once_the_server_starts_again(tmp_path: Path) -> None:
    srv = Server(tmp_path / "home")
    try:
        store = srv.home / "server" / "packages"
        with _head(srv, "/v1/package", {"Content-Length": str(1 << 20)}) as s:
            s.sendall(b"PK" + b"\0" * 100_000)
            deadline = time.monotonic() + 10
            while not list(store.rglob(".incoming-*")):
                assert time.monotonic() < deadline, "the upload was not being written"
                time.sleep(0.05)
            srv.kill()
        assert list(store.rglob(".incoming-*"))
        srv.start()
        assert list(store.rglob(".incoming-*")) == []
    finally:
        srv.stop()


def test_a_token_file_others_can_read_is_refused_at_start(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens"
    tokens.write_text(TOKENS)
    os.chmod(tokens, 0o644)
    argv = [
        sys.executable,
        "-m",
        "tlaunch.server",
        "--home",
        str(tmp_path / "h"),
        "--token-file",
        str(tokens),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and f"chmod 600 {tokens}" in done.stderr and "0644" in done.stderr, (
        done.stderr
    )


def _raw(
    server: Server, method: str, path: str, headers: dict[str, str], body: bytes = b""
) -> tuple[int, Any]:
    with socket.create_connection(("127.0.0.1", server.port)) as s:
        head = [f"{method} {path} HTTP/1.1", "Connection: close", f"Content-Length: {len(body)}"]
        head += [f"{k}: {v}" for k, v in headers.items()]
        s.sendall(("\r\n".join(head) + "\r\n\r\n").encode() + body)
        answer = _answer(s)
    return int(answer.split()[1]), answer


def test_host_names_are_checked_and_a_server_without_tokens_takes_no_cross_origin_write(
    tmp_path: Path,
) -> None:
    srv = Server(tmp_path / "home", tokens=None)
    try:
        own = f"127.0.0.1:{srv.port}"
        assert _raw(srv, "GET", "/v1/version", {"Host": own})[0] == 200
        assert _raw(srv, "GET", "/v1/version", {"Host": f"localhost:{srv.port}"})[0] == 200
        status, answer = _raw(srv, "GET", "/v1/version", {"Host": f"rebound.example:{srv.port}"})
        assert status == 400 and b"is not a name of this server" in answer
        package = zip_of({"train.py": "print(1)"})
        for headers in (
            {"Origin": "http://evil.example"},
            {"Origin": "null"},
            {"Sec-Fetch-Site": "cross-site"},
        ):
            status, answer = _raw(srv, "POST", "/v1/package", {"Host": own, **headers}, package)
            assert status == 403 and b"another origin" in answer, headers
        assert not list((srv.home / "server" / "packages").glob("*/[0-9a-f]*"))
        assert _raw(srv, "POST", "/v1/package", {"Host": own, "Origin": f"http://{own}"}, package)[0] == 201
        assert _raw(srv, "POST", "/v1/package", {"Host": own}, package)[0] == 200  # a client: no Origin
    finally:
        srv.stop()
