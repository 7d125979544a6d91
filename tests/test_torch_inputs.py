"""tlaunch.torch's bad input, files and permissions: clear errors before anything starts, private files.

Each test here reproduces a finding of a review (issue 21's torch LOWs) and
failed before its fix.
"""

from __future__ import annotations

import json
import logging
import os
import resource
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tlaunch.errors import LaunchError


def _tlaunch(*args: str, cwd: str | None = None, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    """``python -m tlaunch.cli.main ARGS``, its memory capped (a bad value must not eat the machine)."""

    def cap() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))

    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        cwd=cwd,
        preexec_fn=cap,
    )


@pytest.fixture
def umask_022() -> Iterator[None]:
    """The usual umask, under which a plain makedirs or open gives 0755 and 0644."""
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def _mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


# -- the tlaunch CLI's bad input ------------------------------------------------------


@pytest.mark.parametrize("ranks", ["a", "0,x", "-1", "1,,2"])
def test_echo_ranks_that_are_not_ranks_are_refused_by_name(ranks: str, tmp_path: Path) -> None:
    done = _tlaunch("torchrun", "--log-dir", str(tmp_path), "--echo-ranks", ranks, "train.py")
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr
    assert "--echo-ranks" in done.stderr and repr(ranks) in done.stderr and "all" in done.stderr
    assert os.listdir(tmp_path) == []


def test_a_hostfile_with_absurd_slots_is_refused_naming_its_line(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w0 slots=2\nw1 slots=1000000000000\n")
    done = _tlaunch("deepspeed", "--hostfile", str(hostfile), "--log-dir", str(tmp_path / "logs"), "t.py")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr
    assert "line 2" in done.stderr and "slots=1000000000000" in done.stderr
    assert not (tmp_path / "logs").exists()


def test_a_hostfile_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    hostfile = tmp_path / "hostfile"
    hostfile.write_bytes(b"w0 slots=2\nw\xff1 slots=1\n")
    done = _tlaunch("deepspeed", "--hostfile", str(hostfile), "t.py")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert str(hostfile) in done.stderr and "UTF-8" in done.stderr


def test_a_hostfile_that_is_a_folder_says_so(tmp_path: Path) -> None:
    done = _tlaunch("deepspeed", "--hostfile", str(tmp_path), "t.py")
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    assert "is a folder" in done.stderr and "does not exist" not in done.stderr
    missing = _tlaunch("deepspeed", "--hostfile", str(tmp_path / "nope"), "t.py")
    assert missing.returncode == 1 and "does not exist" in missing.stderr


ENV_TRAINER = """
import os, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}"), "w") as f:
    f.write(os.environ.get("FROM_ENV_FILE", "<unset>"))
print(f"trainer {os.environ['RANK']} of {os.environ['WORLD_SIZE']} says hi", flush=True)
"""


def test_basic_takes_its_env_file_and_log_dir(tmp_path: Path) -> None:
    """``tlaunch basic`` accepted ``--env-file`` and ``--log-dir`` and ignored both."""
    script = tmp_path / "trainer.py"
    script.write_text(ENV_TRAINER)
    env_file = tmp_path / "job.env"
    env_file.write_text("FROM_ENV_FILE=sourced-$((6 * 7))\n")
    out, logs = tmp_path / "out", tmp_path / "logs"
    out.mkdir()
    done = _tlaunch(
        "basic", "--num-trainer", "2", "--env-file", str(env_file), "--log-dir", str(logs),
        str(script), str(out),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert {p.name: p.read_text() for p in out.iterdir()} == {"rank0": "sourced-42", "rank1": "sourced-42"}
    (run_dir,) = logs.iterdir()
    assert sorted(p.name for p in run_dir.iterdir()) == ["localhost[0].log", "localhost[1].log"]
    assert "trainer 1 of 2 says hi" in (run_dir / "localhost[1].log").read_text()
    assert _mode(run_dir) == 0o700 and _mode(run_dir / "localhost[0].log") == 0o600


# -- files tlaunch.torch makes are private --------------------------------------------


def says_hi() -> str:
    print("hi", flush=True)
    return "done"


def test_torch_logs_are_private(tmp_path: Path, umask_022: None) -> None:
    pytest.importorskip("torch")
    from tlaunch.torch import launch

    log_dir = tmp_path / "made" / "logs"
    result = launch(says_hi, hostnames=["localhost"], workers_per_host=2, backend=None, log_dir=str(log_dir))
    assert result.rank(1) == "done"
    assert _mode(log_dir) == 0o700 and _mode(result.log_dir) == 0o700
    files = sorted(os.listdir(result.log_dir))
    assert files == ["localhost[0].log", "localhost[1].log"]
    assert {_mode(os.path.join(result.log_dir, f)) for f in files} == {0o600}
    assert _mode(tmp_path / "made") == 0o755  # above log_dir: not tlaunch's to close


def test_basic_share_folder_is_private(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, umask_022: None
) -> None:
    from tlaunch.torch import basic

    script = tmp_path / "noop.py"
    script.write_text("import os\nassert os.environ['TLAUNCH_SHARE_FILE']\n")
    monkeypatch.chdir(tmp_path)
    basic([str(script)], 1, ["localhost"], set_share_file=True)
    assert _mode(tmp_path / "tlaunch-share") == 0o700


# -- .deepspeed_env ---------------------------------------------------------------


@pytest.fixture
def ds_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A current folder and a home without a .deepspeed_env of the user's."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("DS_ENV_FILE", raising=False)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_deepspeed_env_others_can_write_is_refused(ds_folder: Path, mode: int) -> None:
    from tlaunch.torch.deepspeed import deepspeed_env_file

    path = ds_folder / ".deepspeed_env"
    path.write_text("NCCL_DEBUG=INFO\n")
    path.chmod(mode)
    with pytest.raises(LaunchError, match=r"\.deepspeed_env.*writable by others.*chmod go-w"):
        deepspeed_env_file()
    path.chmod(0o600)
    assert deepspeed_env_file() == {"NCCL_DEBUG": "INFO"}


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another user needs root")
def test_a_deepspeed_env_of_another_user_is_refused(ds_folder: Path) -> None:
    from tlaunch.torch.deepspeed import deepspeed_env_file

    path = ds_folder / ".deepspeed_env"
    path.write_text("LD_PRELOAD=/tmp/evil.so\n")
    path.chmod(0o644)
    os.chown(path, 65534, 65534)
    with pytest.raises(LaunchError, match=r"\.deepspeed_env is owned by uid 65534"):
        deepspeed_env_file()


def test_a_deepspeed_env_that_sets_loader_or_python_variables_is_announced(
    ds_folder: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from tlaunch.torch.deepspeed import deepspeed_env_file

    path = ds_folder / ".deepspeed_env"
    path.write_text("NCCL_DEBUG=INFO\nLD_PRELOAD=/opt/lib/x.so\nPYTHONPATH=/opt/py\n")
    path.chmod(0o600)
    with caplog.at_level(logging.WARNING, logger="tlaunch.torch"):
        assert deepspeed_env_file()["LD_PRELOAD"] == "/opt/lib/x.so"
    said = " ".join(r.getMessage() for r in caplog.records)
    assert "LD_PRELOAD" in said and "PYTHONPATH" in said and str(path) in said
    assert "NCCL_DEBUG" not in said


# -- what comes back from workers ----------------------------------------------------


class ExitsWhenUnpickled(Exception):
    """An exception whose unpickling calls ``sys.exit(0)`` (as a hostile or broken one could)."""

    def __reduce__(self) -> tuple[object, ...]:
        return (sys.exit, (0,))


def raises_an_exception_that_exits_when_unpickled() -> None:
    raise ExitsWhenUnpickled("made to exit")


def calls_sys_exit_0() -> None:
    sys.exit(0)


@pytest.mark.parametrize(
    ("func", "raised", "line"),
    [
        (raises_an_exception_that_exits_when_unpickled, "ExitsWhenUnpickled: made to exit", "raise Exits"),
        (calls_sys_exit_0, "SystemExit: 0", "sys.exit(0)"),
    ],
)
def test_a_worker_exception_that_would_end_the_launcher_is_still_a_failure(
    func: object, raised: str, line: str, tmp_path: Path
) -> None:
    """Unpickled (or raised) here, these ended the launcher with exit code 0 and no failure."""
    pytest.importorskip("torch")
    from tlaunch.torch import WorkerRaisedError, launch

    with pytest.raises(WorkerRaisedError, match=raised) as info:
        launch(func, hostnames=["localhost"], workers_per_host=1, backend=None, log_dir=str(tmp_path))  # type: ignore[arg-type]
    assert line in info.value.remote_traceback


BAD_REPORT = """
import json, os
folder = os.environ["TLAUNCH_TORCH_REPORTS"]
os.makedirs(folder, exist_ok=True)
with open(os.path.join(folder, "odd.json"), "w") as f:
    json.dump({"rank": "zero", "time": "soon"}, f)  # nothing tlaunch.torch.record writes
os._exit(3)  # no report of its own
"""


def test_a_malformed_rank_report_gives_a_job_failure_not_a_traceback(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from tlaunch.torch import JobFailedError, torchrun

    script = tmp_path / "bad_report.py"
    script.write_text(BAD_REPORT)
    started = time.monotonic()
    with pytest.raises(JobFailedError) as info:
        torchrun([str(script)], ["localhost"], log_dir=str(tmp_path / "logs"), echo_ranks=None)
    assert info.value.host == "localhost" and info.value.exit_code not in (None, 0)
    assert "unreadable error report" in str(info.value)
    assert time.monotonic() - started < 120


def test_rank_reports_read_by_the_agent_are_typed(tmp_path: Path) -> None:
    """Reports come to the collector as :class:`RankError`; a broken one is one that says so."""
    from tlaunch.torch.collector import Collector
    from tlaunch.torch.hostjob import Reports
    from tlaunch.torch.outcomes import RankError

    (tmp_path / "1-0.json").write_text(
        json.dumps({
            "time": 2.0, "host": "h", "rank": 1, "local_rank": 0, "restart": 0,
            "type": "ValueError", "message": "bad", "traceback": "Traceback...\nValueError: bad\n",
        })
    )  # fmt: skip
    (tmp_path / "0-0.json").write_text('["not", "a", "report"]')
    (tmp_path / "2-0.json").write_text("{not json")
    collector = Collector(1)
    Reports(str(tmp_path)).push(collector, 0)
    collector.finished(0, collector_outcome_exit(0))
    outcome = collector.wait(1.0)
    assert outcome is not None
    good, *bad = sorted(outcome.errors, key=lambda e: e.type)
    assert good == RankError(2.0, "h", 1, 0, 0, "ValueError", "bad", "Traceback...\nValueError: bad\n")
    assert [e.type for e in bad] == ["unreadable error report"] * 2 and all(e.rank is None for e in bad)


def collector_outcome_exit(code: int) -> object:
    from tlaunch.torch.outcomes import HostOutcome

    return HostOutcome(exit_code=code)
