"""Runtime environments (``tlaunch.runtime.pyenv``): real virtualenvs, real pip, a wheel made here.

pip installs offline: the requirement is a tiny wheel written by the test into
the package's folder and named by a relative path, as a package would ship it.
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from tlaunch import control
from tlaunch.backends.recorded import STOPPED_PREPARING
from tlaunch.jobs import JobSpec
from tlaunch.procs import pid_alive
from tlaunch.runtime.pyenv import MARKER, RuntimeEnv, env_dir, find, has_requirements

WHEEL = "tinyrt-0.1-py3-none-any.whl"


def wheel_bytes(value: int = 42) -> bytes:
    """A pure-Python wheel of the package ``tinyrt`` (``tinyrt.VALUE == value``)."""
    path = Path(os.environ.get("TMPDIR", "/tmp")) / f"tinyrt-{os.getpid()}-{time.monotonic_ns()}.whl"
    try:
        with zipfile.ZipFile(path, "w") as z:
            z.writestr("tinyrt/__init__.py", f"VALUE = {value}\n")
            z.writestr("tinyrt-0.1.dist-info/METADATA", "Metadata-Version: 2.1\nName: tinyrt\nVersion: 0.1\n")
            z.writestr(
                "tinyrt-0.1.dist-info/WHEEL",
                "Wheel-Version: 1.0\nGenerator: tlaunch-tests\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
            )
            z.writestr("tinyrt-0.1.dist-info/RECORD", "")
        return path.read_bytes()
    finally:
        path.unlink(missing_ok=True)


def package(folder: Path, requirements: str = f"./{WHEEL}\n") -> Path:
    """A package folder: the wheel, a requirements.txt naming it, a trainer that imports it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / WHEEL).write_bytes(wheel_bytes())
    (folder / "requirements.txt").write_text(requirements)
    (folder / "train.py").write_text(
        "import os, sys, tinyrt\n"
        "print('rank', os.environ['RANK'], 'tinyrt', tinyrt.VALUE, 'python', sys.executable, flush=True)\n"
    )
    return folder


def _ensure(root: Path, key: str, folder: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "tlaunch.runtime.pyenv", "ensure", str(root), key, str(folder)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_requirements_that_name_nothing_need_no_environment(tmp_path: Path) -> None:
    assert not has_requirements(str(tmp_path))
    (tmp_path / "requirements.txt").write_text("\n# nothing yet\n   \n")
    assert not has_requirements(str(tmp_path))
    (tmp_path / "requirements.txt").write_text("numpy  # the one we need\n")
    assert has_requirements(str(tmp_path))


def test_concurrent_builders_build_once_and_later_ones_reuse(tmp_path: Path) -> None:
    folder = package(tmp_path / "pkg")
    root = tmp_path / "envs"
    procs = [_ensure(root, "pkg-1", folder) for _ in range(2)]  # at once: one builds, one waits
    answers = []
    for proc in procs:
        out, err = proc.communicate(timeout=180)
        assert proc.returncode == 0, err
        answers.append(json.loads(out.strip().splitlines()[-1]))
    assert sorted(a["built"] for a in answers) == [False, True], answers
    assert answers[0]["python"] == answers[1]["python"] == find(str(root), "pkg-1")
    python = answers[0]["python"]
    said = subprocess.run(
        [python, "-c", "import tinyrt, tlaunch, fastapi, sys; print(tinyrt.VALUE, sys.prefix)"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    # Its own requirement, and the host's tlaunch and libraries (through its layer on them).
    assert said == ["42", env_dir(str(root), "pkg-1")], said
    again = _ensure(root, "pkg-1", folder)
    out, _ = again.communicate(timeout=60)
    assert json.loads(out.strip().splitlines()[-1])["built"] is False
    assert [p.name for p in root.iterdir() if not p.name.endswith(".lock")] == [Path(python).parents[1].name]


def test_a_failed_build_says_why_and_leaves_nothing_half_made(tmp_path: Path) -> None:
    folder = package(tmp_path / "pkg", requirements="./missing-0.1-py3-none-any.whl\n")
    root = tmp_path / "envs"
    report = tmp_path / "result.json"
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.runtime.pyenv", "ensure", str(root), "bad", str(folder),
         "--report", str(report)],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 1 and done.stdout == ""
    assert "missing-0.1-py3-none-any.whl" in done.stderr
    assert "pip install -r requirements.txt failed" in done.stderr
    assert not os.path.exists(env_dir(str(root), "bad")) and find(str(root), "bad") is None
    failure = json.loads(report.read_text())["failure"]  # what a SLURM job's result.json says
    assert failure["key"] == "runtime-env" and "No such file or directory" in failure["traceback"], failure
    # The next attempt, with the file there, builds it whole.
    (folder / "missing-0.1-py3-none-any.whl").write_bytes(wheel_bytes())
    (folder / "requirements.txt").write_text(f"./{WHEEL}\n")
    proc = _ensure(root, "bad", folder)
    _, err = proc.communicate(timeout=180)
    assert proc.returncode == 0, err
    assert os.path.isfile(os.path.join(env_dir(str(root), "bad"), MARKER))


def test_a_half_made_environment_is_rebuilt(tmp_path: Path) -> None:
    """A builder killed mid-build leaves a folder without its marker: the next one starts again."""
    folder = package(tmp_path / "pkg")
    root = tmp_path / "envs"
    half = Path(env_dir(str(root), "k"))
    (half / "bin").mkdir(parents=True)
    (half / "bin" / "python").write_text("not an interpreter")
    assert find(str(root), "k") is None
    proc = _ensure(root, "k", folder)
    out, err = proc.communicate(timeout=180)
    assert proc.returncode == 0 and json.loads(out.strip().splitlines()[-1])["built"] is True, err


def test_a_submitted_job_waits_pending_for_its_environment_and_stops_cleanly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """control.submit returns at once (PENDING: preparing); a stop then ends the launcher and its wait."""
    home = tmp_path / "home"
    monkeypatch.setenv("TLAUNCH_HOME", str(home))
    folder = package(tmp_path / "pkg")
    env = RuntimeEnv(str(folder), "held")
    root = home / "envs"
    root.mkdir(parents=True)
    lock = os.open(env_dir(str(root), "held") + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(lock, fcntl.LOCK_EX)  # another job's build, as far as this one can tell
    try:
        job = JobSpec(lpjob_name="held", script=["train.py"], image="none")
        started = time.monotonic()
        run = control.submit(job, control.Hosts(("localhost",), working_dir=str(folder), runtime_env=env))
        assert time.monotonic() - started < 30
        snap = run.snapshot()
        assert snap.state.value == "PENDING", snap
        assert "building its runtime environment" in (snap.reason or ""), snap
        pid = run.record.launcher_pid  # type: ignore[attr-defined]
        run.stop()  # returns once the launcher has ended (StopError if not within its timeout)
        assert not pid_alive(pid), "the launcher outlived its stop"
        snap = run.snapshot()
        assert snap.state.value == "STOPPED", snap
        assert snap.reason == STOPPED_PREPARING, snap
    finally:
        os.close(lock)
    assert find(str(root), "held") is None  # it never built: the stop came while it waited


def test_a_submitted_job_runs_in_its_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("TLAUNCH_HOME", str(home))
    folder = package(tmp_path / "pkg")
    job = JobSpec(lpjob_name="inenv", script=["train.py"], image="none", num_trainer=2)
    target = control.Hosts(("localhost",), working_dir=str(folder), runtime_env=RuntimeEnv(str(folder), "k1"))
    run = control.submit(job, target)
    lines = [(line.node, line.text) for line in run.logs(follow=True)]  # from its build to its end
    python = find(str(home / "envs"), "k1")
    assert python is not None
    assert ("trainer/1", f"rank 1 tinyrt 42 python {python}") in lines, lines
    assert any(node == "runtime-env" and "Successfully installed tinyrt-0.1" in text for node, text in lines)
    assert run.snapshot().state.value == "SUCCEEDED"
