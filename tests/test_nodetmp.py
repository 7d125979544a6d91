"""A node process's own $TMPDIR: removed with it, swept once its maker was killed, kept while held."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from tlaunch.runtime.nodetmp import NodeTmp, sweep

MAKER = """
import os, sys, time
from tlaunch.runtime.nodetmp import NodeTmp
tmp = NodeTmp.make(sys.argv[1], "killed-run")
open(os.path.join(tmp.path, "scratch"), "w").write("left")
print(tmp.path, flush=True)
time.sleep(60)
"""


def test_a_folder_goes_with_its_node_or_with_a_sweep_once_its_maker_is_killed(tmp_path: Path) -> None:
    held = NodeTmp.make(str(tmp_path), "run/with/slashes")
    assert held is not None
    assert os.path.dirname(held.path) == str(tmp_path) and "/" not in os.path.basename(held.path)
    assert os.stat(held.path).st_mode & 0o777 == 0o700
    maker = subprocess.Popen(
        [sys.executable, "-c", MAKER, str(tmp_path)], stdout=subprocess.PIPE, text=True, cwd=os.getcwd()
    )
    try:
        assert maker.stdout is not None
        orphan = maker.stdout.readline().strip()
        assert os.path.exists(os.path.join(orphan, "scratch"))
        unrelated = tmp_path / "tlaunch-notes"  # not a node's folder: never swept
        unrelated.mkdir()
        young, old = tmp_path / ".tlaunch-r-tmp-0a0b0c0d", tmp_path / ".tlaunch-r-tmp-01020304"
        young.mkdir()  # a folder not yet locked and named: its maker may be at it
        old.mkdir()  # one whose maker was killed before it locked it
        os.utime(old, (0, 0))
        sweep(str(tmp_path))
        assert os.path.exists(orphan), "swept while its maker lives"
        maker.send_signal(signal.SIGKILL)
        maker.wait()
        sweep(str(tmp_path))
        assert not os.path.exists(orphan), "its maker was killed: the sweep removes it"
        assert os.path.exists(held.path) and unrelated.exists()
        assert young.exists() and not old.exists()
        held.remove()
        assert not os.path.exists(held.path)
        held.remove()  # once
    finally:
        if maker.poll() is None:
            maker.kill()
            maker.wait()
        if maker.stdout is not None:
            maker.stdout.close()
