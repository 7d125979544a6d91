"""``breakpoint()`` in a node that runs as a SLURM step (the real test cluster), attached with
``tlaunch debug`` in a pty from the machine that launched it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import pytest

pexpect = pytest.importorskip("pexpect")

pytestmark = pytest.mark.slurm

SCRIPT = """
from tlaunch import lp_ssh as lp

def learner():
    secret = 6 * 7
    breakpoint()
    print("learner goes on with", secret, flush=True)
    lp.stop()

def idle():
    lp.wait_for_stop()

program = lp.Program("dbgslurm")
program.add_node(lp.PyNode(idle).to_host("th1"), label="idle")
program.add_node(lp.PyNode(learner).to_host("th2"), label="learner")
run = lp.launch(program, launch_type="slurm")
print("program ended:", run.snapshot().state, flush=True)
"""


def test_breakpoint_in_a_slurm_step(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    env = {**slurm_cluster.env, "TLAUNCH_HOME": os.environ["TLAUNCH_HOME"]}
    proc = subprocess.Popen(
        ["salloc", "-N2", sys.executable, "-c", SCRIPT],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    out: list[str] = []
    reader = threading.Thread(target=lambda: out.extend(proc.stdout), daemon=True)  # type: ignore[arg-type]
    reader.start()
    try:
        deadline = time.monotonic() + 120
        while not (
            found := re.search(
                r"learner/0\] waiting for a debugger: tlaunch debug (\S+) learner/0", "".join(out)
            )
        ):
            assert time.monotonic() < deadline and proc.poll() is None, "".join(out)
            time.sleep(0.1)
        run_id = found.group(1)
        # Metrics: the step samples itself (no supervisor runs beside a SLURM step).
        from tlaunch import control

        handle = control.find_run(run_id, home=os.environ["TLAUNCH_HOME"])
        while not {"learner/0", "idle/0"} <= set(control.metrics.samples(handle)):
            assert time.monotonic() < deadline, control.metrics.samples(handle)
            time.sleep(0.5)
        assert control.metrics.samples(handle)["learner/0"][-1].rss > 10 << 20
        argv = ["-m", "tlaunch.cli.main", "debug", run_id, "learner/0"]
        dbg = pexpect.spawn(sys.executable, argv, env=env, encoding="utf-8", timeout=60)
        dbg.expect(r"attached to learner/0 on th2")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("p secret")
        dbg.expect(r"\r\n42\r\n")
        dbg.expect(r"\(Pdb\) ")
        dbg.sendline("c")
        dbg.expect(pexpect.EOF)
        dbg.close()
        assert proc.wait(60) == 0, "".join(out)
        reader.join(10)
        rest = "".join(out)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(10)  # its pipe closed under the reader would raise in its thread, under a later test
        proc.stdout.close()
    assert "learner goes on with 42" in rest and "program ended: SUCCEEDED" in rest, rest
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}
