"""Resource samples: what a watcher reads of a node's process tree, and what the coordinator keeps."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from tlaunch.runtime.observed import Windows
from tlaunch.runtime.sampling import GpuSampler, Sample, TreeSampler

CHILDREN = textwrap.dedent(
    """
    import os, subprocess, sys, threading, time
    spin = "import time\\nt=time.time()\\nwhile time.time()-t<20: pass"
    busy = subprocess.Popen([sys.executable, "-c", spin])
    held = bytearray(200 << 20)
    for i in range(0, len(held), 4096):
        held[i] = 1
    files = [open(os.devnull) for _ in range(20)]
    for _ in range(3):
        threading.Thread(target=time.sleep, args=(30,), daemon=True).start()
    print("ready", flush=True)
    busy.wait()
    """
)


def test_a_tree_sample_counts_every_descendant() -> None:
    # In a session of its own: its spinning child goes with it (a kill of the node alone left it
    # spinning for the rest of its 20 s, beside the tests after this one).
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILDREN], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "ready\n"
        psutil = pytest.importorskip("psutil")  # the reference: the same interval, read by psutil
        tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]

        def cpu_seconds() -> float:
            return sum(p.cpu_times().user + p.cpu_times().system for p in tree)

        sampler = TreeSampler()
        first = sampler.sample(proc.pid)
        before, t0 = cpu_seconds(), time.monotonic()
        assert first is not None and first.cpu == 0.0  # no interval yet
        time.sleep(1.0)
        s = sampler.sample(proc.pid)
        reference = 100 * (cpu_seconds() - before) / (time.monotonic() - t0)
        assert s is not None
        assert s.procs == 2  # the node and its busy child
        assert s.cpu > 0 and abs(s.cpu - reference) < 15, (s, reference)  # the child spins
        assert s.rss > 200 << 20, s
        assert s.threads >= 4 and s.fds >= 20, s
        assert s.host_available is not None and s.host_available > 0
        assert s.gpu is None and (s.gpu_mem is None) == (not GpuSampler().available)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        assert proc.stdout is not None
        proc.stdout.close()
    gone = TreeSampler().sample(proc.pid)
    assert gone is None


def test_windows_keep_the_last_samples_of_each_node() -> None:
    windows = Windows(size=3)
    for t in range(1, 6):
        windows.add("a/0", Sample(float(t), 1.0, 1, 1, 1, 1))
    windows.add("b/0", Sample(4.5, 1.0, 1, 1, 1, 1))
    got = windows.since(0.0)
    assert [s.t for s in got["a/0"]] == [3.0, 4.0, 5.0]
    assert [s.t for s in windows.since(4.0)["a/0"]] == [5.0]
    assert windows.since(4.0, ["b/0", "c/0"]) == {"b/0": [Sample(4.5, 1.0, 1, 1, 1, 1)]}
    assert windows.since(10.0) == {}


def test_top_refuses_an_unknown_sort_naming_the_valid_ones() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", "top", "x", "--sort", "memory"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode != 0
    assert "--sort 'memory' is not one of cpu, mem, gpu" in out.stderr


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux /proc")
def test_the_sample_of_this_process_is_cheap() -> None:
    """A sample reads a handful of /proc files: well under a millisecond here (bench/sampling.py measures)."""
    sampler = TreeSampler()
    sampler.sample(os.getpid())
    took = []
    for _ in range(50):
        t = time.perf_counter()
        sampler.sample(os.getpid())
        took.append(time.perf_counter() - t)
    took.sort()
    assert took[len(took) // 2] < 0.005  # the median: 5 ms is 0.5 % of a core at one a second
