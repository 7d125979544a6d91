"""The job server's ``/metrics`` for Prometheus: jobs by user and state, the queue, and each running
job's nodes' CPU and memory (a real server process, a real job)."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("prometheus_client")

from server_helpers import ROOT, Server, upload, wait_state

HOG = (
    "held = bytearray(300 << 20)\nfor i in range(0, len(held), 4096): held[i] = 1\nprint('up', flush=True)\n"
)
HOG += "import time; time.sleep(60)\n"


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "home")
    try:
        yield srv
    finally:
        srv.stop()


def test_metrics_say_jobs_by_user_the_queue_and_each_nodes_use(server: Server) -> None:
    with server.client() as alice, server.client(ROOT) as admin:
        pkg = upload(alice, {"train.py": HOG})
        assert (
            alice.post("/v1/trainer/job", json={"job_name": "hog", "trainer_package": pkg}).status_code == 201
        )
        wait_state(alice, "hog", ("RUNNING",))
        memory = re.compile(
            r'tlaunch_job_memory_bytes\{host="[^"]*",job="hog",node="([^"]+)",user="alice"\} (\S+)'
        )
        deadline = time.monotonic() + 30
        while True:
            text = admin.get("/metrics").text
            used = {m.group(1): float(m.group(2)) for m in memory.finditer(text)}
            if any(v > 300 << 20 for v in used.values()):
                break
            assert time.monotonic() < deadline, text
            time.sleep(0.5)
        assert 'tlaunch_server_jobs_by_user{state="RUNNING",user="alice"} 1.0' in text, text
        assert "tlaunch_server_queue_length 0.0" in text, text
        assert re.search(
            r'tlaunch_job_cpu_percent\{host="[^"]*",job="hog",node="[^"]+",user="alice"\} ', text
        ), text
        alice.post("/v1/jobs/hog/stop")
        wait_state(alice, "hog", ("STOPPED",))
        text = admin.get("/metrics").text
        assert 'tlaunch_server_jobs_by_user{state="STOPPED",user="alice"} 1.0' in text, text
        assert 'job="hog"' not in text.split("tlaunch_job_cpu_percent")[-1], text  # ended: no use
