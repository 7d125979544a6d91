"""The tests' DeepSpeed runs never wait on a lock that a killed run left (tests/extensions.py).

A rank takes its op's ``lock`` (torch's ``FileBaton``) on every start, to build
or check DeepSpeed's CPU op; a run killed then left the file in the tests'
``TORCH_EXTENSIONS_DIR``, and every later DeepSpeed run waited until its timeout.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from extensions import EXTENSIONS, clear_stale_locks, deepspeed_env, holders
from userpath import ROOT, run_as_user, says

HOLD = """
import sys, time
from torch.utils.file_baton import FileBaton
baton = FileBaton(sys.argv[1])
while not baton.try_acquire():  # as a rank does, before it builds or checks the op (another run's
    time.sleep(0.1)             # rank on this machine may hold it a moment: it waits its turn)
print("held", flush=True)
time.sleep(600)
"""


def _holder(lock: Path) -> subprocess.Popen[str]:
    """A process that holds ``lock`` as a rank does, once it said so."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(lock)], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    try:
        assert proc.stdout.readline().strip() == "held"
    except BaseException:
        proc.kill()
        proc.communicate()
        raise
    return proc


def _killed_holder(lock: Path) -> None:
    """Leave ``lock`` as a rank killed while it held it does."""
    proc = _holder(lock)
    proc.send_signal(signal.SIGKILL)
    proc.communicate()
    assert lock.exists()


def test_a_lock_nobody_holds_is_removed_and_a_held_one_is_kept(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    lock = tmp_path / "deepspeed_shm_comm" / "lock"
    proc = _holder(lock)
    try:
        assert clear_stale_locks(str(tmp_path), settle=0.2) == []  # a rank builds: wait for it
        assert lock.exists()
    finally:
        proc.kill()
        proc.communicate()
    assert clear_stale_locks(str(tmp_path), settle=0.2) == [str(lock)]  # its rank was killed
    assert not lock.exists()


def test_a_deepspeed_run_after_one_killed_with_the_lock_runs(tmp_path: Path) -> None:
    """A user-path run (``tlaunch deepspeed`` on this machine) after a rank was killed holding the
    lock: it ends, instead of waiting on the lock until its timeout."""
    pytest.importorskip("deepspeed")
    _killed_holder(Path(EXTENSIONS) / "deepspeed_shm_comm" / "lock")
    argv = ["tlaunch", "deepspeed", "--num_gpus", "1", "--log-dir", str(tmp_path),
            str(ROOT / "examples" / "torch" / "deepspeed_train.py"), "--steps", "1"]  # fmt: skip
    done = run_as_user(argv, tmp_path, timeout=300, env=deepspeed_env())
    assert done.returncode == 0, says(done)
    assert "step=0 rank=0 world=1" in done.stdout + done.stderr, says(done)
    lock = os.path.join(EXTENSIONS, "deepspeed_shm_comm", "lock")
    # Gone, unless a rank of another run on this machine holds it now (it releases it in a moment).
    deadline = time.monotonic() + 5
    while os.path.exists(lock) and not holders(lock):
        assert time.monotonic() < deadline, "the run left the op's lock behind, held by nobody"
        time.sleep(0.2)
