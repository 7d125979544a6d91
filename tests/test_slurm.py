"""The SLURM test cluster (a real slurmctld and a slurmd per test host) and tlaunch.torch in an allocation."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from tlaunch.nodelist import expand_nodelist

pytestmark = [pytest.mark.slurm, pytest.mark.ssh]


@pytest.mark.parametrize(
    "nodelist", ["n[1-3,5]", "gpu[01-02],cpu7", "a[08-10]", "r[1-2]-c[3-4]", "x[9-10],y"]
)
def test_node_lists_agree_with_scontrol(slurm_cluster, nodelist: str) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        ["scontrol", "show", "hostnames", nodelist],
        env=slurm_cluster.env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert expand_nodelist(nodelist) == done.stdout.split()


def test_gpus_per_node_sets_cuda_visible_devices(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        ["srun", "-N2", "--gpus-per-node=1", "sh", "-c", 'echo "$(hostname) $CUDA_VISIBLE_DEVICES"'],
        env=slurm_cluster.env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert sorted(done.stdout.splitlines()) == ["th1 0", "th2 0"]


ASK = """
import os
from tlaunch.backends.slurm.commands import job_and_nodes, job_state, node_infos
from tlaunch.errors import LaunchError
job = os.environ["SLURM_JOB_ID"]
state, nodes = job_and_nodes(job, ["th1", "th2"])
print("SAME", state == job_state(job), nodes == node_infos(["th1", "th2"]), state.state, sorted(nodes))
print("FORGOTTEN", job_and_nodes("99999", ["th1"])[0].state)
try:
    job_and_nodes(job, ["th1", "nosuch"])
except LaunchError as exc:
    print("REFUSED", exc)
"""


def test_one_scontrol_answers_what_two_would(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    """The job's state and its nodes' records from one ``scontrol`` (a launch asks while its
    steps start) are what ``scontrol show job`` and ``show node`` say apart; a job the
    controller forgot is UNKNOWN, and a node SLURM does not know is named."""
    done = _salloc(slurm_cluster, ["-N2"], ASK)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "SAME True True RUNNING ['th1', 'th2']" in done.stdout, done.stdout
    assert "FORGOTTEN UNKNOWN" in done.stdout, done.stdout
    assert "REFUSED SLURM knows no node 'nosuch'" in done.stdout, done.stdout


LAUNCHER = """
import os, sys
import tlaunch.torch

def work():
    import torch, torch.distributed as dist
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return os.uname().nodename, dist.get_rank(), t.item()

result = tlaunch.torch.launch(work, hostnames="slurm", workers_per_host="slurm", backend="gloo",
                              ssh_config_file=sys.argv[1], log_dir=sys.argv[2])
print("NODELIST", os.environ["SLURM_JOB_NODELIST"])
for host in result.hosts:
    print("RESULT", host, result.results[host])
"""


def test_torch_function_launch_in_an_allocation(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    argv = ["salloc", "-N2", "--ntasks-per-node=2", sys.executable, "-c", LAUNCHER]
    done = subprocess.run(  # 2 CPUs per node: workers_per_host="slurm" gives 2 workers on each
        [*argv, slurm_cluster.hosts.ssh_config, str(tmp_path)],
        env=slurm_cluster.env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "NODELIST th[1-2]" in done.stdout
    assert "RESULT th1 [('th1', 0, 6.0), ('th1', 1, 6.0)]" in done.stdout
    assert "RESULT th2 [('th2', 2, 6.0), ('th2', 3, 6.0)]" in done.stdout
    (run_id,) = os.listdir(tmp_path)
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}


def test_workers_per_host_slurm_follows_the_allocations_gpus(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    argv = ["salloc", "-N2", "--gpus-per-node=1", sys.executable, "-c", LAUNCHER]
    done = subprocess.run(
        [*argv, slurm_cluster.hosts.ssh_config, str(tmp_path)],
        env=slurm_cluster.env, capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "RESULT th1 [('th1', 0, 1.0)]" in done.stdout and "RESULT th2 [('th2', 1, 1.0)]" in done.stdout


# -- the SLURM backend: a program in an allocation ----------------------------

TESTS = os.path.dirname(os.path.abspath(__file__))


def _salloc(cluster, salloc_args: list[str], script: str, *argv: str, timeout: float = 120):  # type: ignore[no-untyped-def]
    """Run ``script`` with ``python -c`` under ``salloc``; the finished process."""
    return subprocess.run(
        ["salloc", *salloc_args, sys.executable, "-c", script, *argv],
        env=cluster.env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip


def _steps_left(cluster, run_id: str) -> list[str]:  # type: ignore[no-untyped-def]
    out = subprocess.run(
        ["squeue", "-h", "-s", "-o", "%i %j"], env=cluster.env, capture_output=True, text=True, check=True
    ).stdout
    return [line for line in out.splitlines() if run_id in line]


@contextlib.contextmanager
def _under_salloc(cluster, script: str, name: str) -> Iterator[tuple[subprocess.Popen[str], str]]:  # type: ignore[no-untyped-def]
    """``script`` (its nodes write pid files into a shared folder) running under ``salloc -N2``."""
    pid_dir = os.path.join(cluster.shared_dir, name)
    os.makedirs(pid_dir)
    proc = subprocess.Popen(
        ["salloc", "-N2", sys.executable, "-c", script, TESTS, pid_dir],
        env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        yield proc, pid_dir
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # (communicate() closed them, unless the test failed before)
            if pipe is not None:
                pipe.close()


def _started(proc: subprocess.Popen[str], pid_dir: str, nodes: int) -> str:
    """The run id the launcher printed, once ``nodes`` nodes have written their pid files."""
    assert proc.stdout is not None
    run_id = proc.stdout.readline().split()[1]
    deadline = time.monotonic() + 30
    while len(os.listdir(pid_dir)) < nodes:
        assert time.monotonic() < deadline, "the nodes did not start"
        time.sleep(0.1)
    return run_id


def _run_id(stdout: str) -> str:
    return next(line.split()[1] for line in stdout.splitlines() if line.startswith("RUN "))


SILENT = """
import json, os, sys
from tlaunch import lp_ssh as lp
from tlaunch.runtime.records import read_record

class Where:
    def __init__(self, peer=None):
        self._peer = peer
    def where(self):
        return lp.get_context().address
    def peer(self):
        return self._peer.where()

program = lp.Program("silent")
far = program.add_node(lp.CourierNode(Where).to_host("th2"), label="far")
near = program.add_node(lp.CourierNode(Where, far).to_host("th1"), label="near")
run = lp.launch(program, launch_type="slurm", wait=False)
seen = {"near": near.dereference().where(), "far": far.dereference().where()}
seen["peer"] = near.dereference().peer()
seen["record"] = read_record(run.run_dir).coordinator
with open(sys.argv[1]) as f:
    seen["scontrol"] = f.read().splitlines()
print("SEEN", json.dumps(seen))
run.stop()
"""


def test_a_launch_from_outside_its_allocation_asks_slurm_nothing(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """No ``scontrol`` while the steps start: each reaches the launcher at the address its launch
    came from and advertises its own on the route there; the record's address is this machine's."""
    calls = tmp_path / "scontrol.calls"
    calls.write_text("")
    shims = tmp_path / "bin"
    shims.mkdir()
    real = shutil.which("scontrol", path=slurm_cluster.env["PATH"])
    (shims / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    (shims / "scontrol").chmod(0o755)
    env = {**slurm_cluster.env, "PATH": f"{shims}:{slurm_cluster.env['PATH']}"}
    done = subprocess.run(
        ["salloc", "-N2", sys.executable, "-c", SILENT, str(calls)],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    seen = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("SEEN "))[5:])
    addresses = {h.name: h.address for h in slurm_cluster.hosts.hosts}
    assert (seen["near"], seen["far"], seen["peer"]) == (addresses["th1"], addresses["th2"], addresses["th2"])
    assert seen["record"].startswith("127.0.0.1:"), seen
    assert seen["scontrol"] == [], seen


CONSUMER_PRODUCERS = """
import sys
sys.path.insert(0, sys.argv[1])
from tlaunch import lp_ssh as lp
import socket
from programs import Producer

class Where(Producer):
    def hostname(self):
        return socket.gethostname()

class Consumer:
    def __init__(self, producers, out):
        self._producers, self._out = producers, out
    def run(self):
        results = [f.result() for f in [p.futures.work(i) for i, p in enumerate(self._producers)]]
        hosts = [p.hostname() for p in self._producers]
        with open(self._out, "w") as f:
            f.write(repr((results, hosts)))
        lp.stop()

program = lp.Program("consumer_producers")
with program.group("producer"):
    producers = [program.add_node(lp.CourierNode(Where)) for _ in range(4)]
program.add_node(lp.CourierNode(Consumer, producers=producers, out=sys.argv[2]), label="consumer")
run = lp.launch(program)  # no launch type: inside an allocation of 2 nodes, the SLURM backend
print("RUN", run.run_id, run.launch_type)
print("PLACED", sorted((k, v["host"]) for k, v in run.status().items()))
"""


def test_consumer_producers_in_an_allocation(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    out = os.path.join(slurm_cluster.shared_dir, "consumer_producers.txt")
    done = _salloc(slurm_cluster, ["-N2"], CONSUMER_PRODUCERS, TESTS, out)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    run_id = _run_id(done.stdout)
    assert f"RUN {run_id} slurm" in done.stdout
    with open(out) as f:
        results, hosts = eval(f.read())
    assert results == [0, 2, 4, 6]
    assert hosts == ["th1", "th2", "th1", "th2"]  # spread in order; each answered from its own node
    assert "('consumer/0', 'th1')" in done.stdout  # the fifth node without a host: th1 again
    assert _steps_left(slurm_cluster, run_id) == []
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}


FAILING = """
import sys, time
from tlaunch import lp_ssh as lp

def fail():
    time.sleep(0.5)
    raise ValueError("boom on purpose")

def idle():
    while not lp.wait_for_stop(0.05):
        pass

program = lp.Program("failing")
program.add_node(lp.PyNode(idle).to_host("th1"), label="idle")
program.add_node(lp.PyNode(fail).to_host("th2"), label="fail")
try:
    lp.launch(program, launch_type="slurm")
except ValueError as exc:
    print("FAILED", exc.node, exc.host)
    print(exc.remote_traceback)
"""


def test_a_node_that_raises_fails_the_run_with_its_traceback(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    done = _salloc(slurm_cluster, ["-N2"], FAILING)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "FAILED fail/0 th2" in done.stdout
    assert "ValueError: boom on purpose" in done.stdout and "in fail" in done.stdout
    assert _steps_left(slurm_cluster, "failing-") == []


ENDING = """
import os, sys, time
from tlaunch import lp_ssh as lp
from tlaunch.backends.slurm import backend
from tlaunch.backends.slurm.commands import JobState
from tlaunch.errors import LaunchError

def idle():
    while not lp.wait_for_stop(0.05):
        pass

real = backend.ask_job_and_nodes

def ending(job_id, names, env=None):  # SLURM answers once the steps are starting: the job is ending
    asked = real(job_id, names)
    def answer():
        time.sleep(0.3)
        return JobState(job_id, "COMPLETING", nodes=os.environ["SLURM_JOB_NODELIST"]), asked()[1]
    return answer

backend.ask_job_and_nodes = ending
# As an sbatch script on one of the allocation's nodes: SLURM is asked while the steps start (a
# launcher outside its allocation asks nothing, and its steps fail if the job ends).
os.environ["SLURMD_NODENAME"] = "th1"
program = lp.Program("ending")
for host in ("th1", "th2"):
    program.add_node(lp.PyNode(idle).to_host(host), label="idle")
try:
    lp.launch(program, launch_type="slurm")
except LaunchError as exc:
    print("REFUSED", exc)
def parent(pid):
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rpartition(")")[2].split()[1]
print("CHILDREN", sum(1 for p in os.listdir("/proc") if p.isdigit() and parent(p) == str(os.getpid())))
"""


def test_a_job_found_ending_once_its_steps_start_leaves_nothing(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    """Steps start while SLURM is asked about the job; found not RUNNING, they are ended, none restarted."""
    done = _salloc(slurm_cluster, ["-N2"], ENDING)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "is COMPLETING, not RUNNING; launch inside a running allocation" in done.stdout, done.stdout
    assert "CHILDREN 0" in done.stdout, done.stdout
    assert _steps_left(slurm_cluster, "ending-") == []


LOOPING = """
import sys
sys.path.insert(0, sys.argv[1])
from tlaunch import lp_ssh as lp
from programs import Looper

program = lp.Program("looping")
with program.group("looper"):
    for _ in range(3):
        program.add_node(lp.CourierNode(Looper, sys.argv[2]))
run = lp.launch(program, launch_type="slurm", wait=False)
print("RUN", run.run_id, flush=True)
run.wait()
print("STOPPED", run.stop_reason, flush=True)
"""


def test_scancel_ends_the_run_as_cancelled_with_nothing_left(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with _under_salloc(slurm_cluster, LOOPING, "scancel") as (proc, pid_dir):
        run_id = _started(proc, pid_dir, 3)
        (job,) = subprocess.run(
            ["squeue", "-h", "-o", "%i"], env=slurm_cluster.env, capture_output=True, text=True, check=True
        ).stdout.split()
        subprocess.run(["scancel", job], env=slurm_cluster.env, check=True)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, out + err[-3000:]
    assert f"STOPPED SLURM job {job} was cancelled" in out
    assert "RunFailedError" not in err and "failed" not in out
    assert _steps_left(slurm_cluster, run_id) == []
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}


# -- submitted as a batch job ---------------------------------------------------


@pytest.fixture
def on_the_cluster(slurm_cluster, monkeypatch):  # type: ignore[no-untyped-def]
    """This test process submits to the test cluster; runs are kept where its nodes see them."""
    monkeypatch.setenv("SLURM_CONF", slurm_cluster.conf)
    home = os.path.join(slurm_cluster.shared_dir, f"home-{time.monotonic_ns()}")
    monkeypatch.setenv("TLAUNCH_HOME", home)
    return slurm_cluster


def _tlaunch(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_submitted_program_runs_and_its_logs_are_read(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    from programs import consumer_producers

    from tlaunch import lp_ssh as lp

    out = os.path.join(on_the_cluster.shared_dir, "submitted.txt")
    program = consumer_producers(out)
    program.add_node(lp.PyNode(print, "hello from a node"), label="greeter")
    job = lp.launch(program, launch_type="slurm", submit=True, nodes=2, time="5", job_name="cp")
    assert job.job_id.isdigit()
    with open(job.script) as f:
        script = f.read()
    assert "#SBATCH --job-name=cp\n#SBATCH --nodes=2\n#SBATCH --time=5\n" in script
    from tlaunch import control

    followed = list(control.find_run(job.run_id).logs(follow=True))  # from submission to the job's end
    state = job.wait(timeout=120)
    assert state.state == "COMPLETED" and state.exit_code == 0
    assert ("greeter/0", "hello from a node") in [(line.node, line.text) for line in followed], followed
    snap = control.find_run(job.run_id).snapshot()
    assert snap.state is control.RunState.SUCCEEDED and snap.refs["slurm_job"] == job.job_id, snap
    with open(out) as f:
        assert f.read() == "[0, 2, 4]"
    assert "[greeter/0] hello from a node" in job.read_output()
    shown = _tlaunch("logs", job.run_id)
    assert "[greeter/0] hello from a node" in shown.stdout, shown.stderr
    listed = _tlaunch("ps", job.run_id)
    assert "ended" in listed.stdout and f"SLURM job {job.job_id} ended COMPLETED" in listed.stdout, (
        listed.stdout
    )


def test_submitted_program_whose_node_raises(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import lp_ssh as lp

    program = lp.Program("raising")
    program.add_node(lp.PyNode(int, "not a number"), label="parse")
    job = lp.launch(program, launch_type="slurm", submit=True)
    with pytest.raises(ValueError) as caught:
        job.wait(timeout=120)
    assert caught.value.node == "parse/0" and caught.value.host == "th1"  # type: ignore[attr-defined]
    assert "invalid literal for int()" in caught.value.remote_traceback  # type: ignore[attr-defined]
    assert job.state().state == "FAILED" and job.state().exit_code == 1
    assert "Traceback" in job.read_output()


def test_tlaunch_stop_cancels_a_submitted_job_with_nothing_left(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    from programs import Looper

    from tlaunch import lp_ssh as lp

    pid_dir = os.path.join(on_the_cluster.shared_dir, f"pids-{time.monotonic_ns()}")
    os.makedirs(pid_dir)
    program = lp.Program("looping")
    with program.group("looper"):
        for _ in range(3):
            program.add_node(lp.CourierNode(Looper, pid_dir))
    job = lp.launch(program, launch_type="slurm", submit=True, nodes=2)
    deadline = time.monotonic() + 60
    while len(os.listdir(pid_dir)) < 3:
        assert time.monotonic() < deadline, job.read_output()
        time.sleep(0.1)
    assert "running (SLURM job" in _tlaunch("ps").stdout
    stopped = _tlaunch("stop", job.run_id)
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert job.wait(timeout=60).state == "CANCELLED"
    assert job.result is not None and job.result["state"] == "cancelled"
    assert _steps_left(on_the_cluster, job.job_id) == []
    inner = job.result.get("run_id")
    assert on_the_cluster.hosts.wait_no_leftovers(inner or job.run_id, 10) == {}
    assert "CANCELLED" in _tlaunch("ps", job.run_id).stdout


def test_a_program_whose_name_has_a_space_is_submitted(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import lp_ssh as lp

    program = lp.Program("my program")
    program.add_node(lp.PyNode(print, "spaced"), label="p")
    job = lp.launch(program, launch_type="slurm", submit=True)
    assert job.wait(timeout=120).state == "COMPLETED", job.read_output()
    with open(job.script) as f:
        assert "#SBATCH --job-name=my_program\n" in f.read()
    assert "[p/0] spaced" in job.read_output()


# -- bad input: a clear error, nothing submitted ---------------------------------


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        (
            {"partition": "gpu"},
            "partition='gpu' does not exist on this cluster; its partitions are ['debug']",
        ),
        ({"nodes": 5}, "nodes=5 is more than partition 'debug' can give (2 nodes: th1, th2)"),
        ({"nodelist": "th[1-"}, "node list 'th[1-' is not one SLURM can read"),
        ({"nodelist": "th9"}, "nodelist='th9' names ['th9'], which are not nodes of partition 'debug'"),
        ({"time": "soon"}, "time='soon' is not a SLURM time limit"),
        ({"sbatch_args": "--exclusive"}, "sbatch_args='--exclusive' must be a list of options"),
        ({"mem": "lots"}, "mem='lots' is not a SLURM memory size"),
    ],
)
def test_bad_resources_are_refused_before_submitting(on_the_cluster, options, expected) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import LaunchError
    from tlaunch import lp_ssh as lp

    program = lp.Program("never")
    program.add_node(lp.PyNode(print), label="p")
    with pytest.raises(LaunchError) as caught:
        lp.launch(program, launch_type="slurm", submit=True, **options)
    assert expected in str(caught.value)
    queued = subprocess.run(
        ["squeue", "-h"], env=on_the_cluster.env, capture_output=True, text=True, check=True
    )
    assert queued.stdout == ""
    runs = os.path.join(os.environ["TLAUNCH_HOME"], "runs")
    assert not os.path.isdir(runs) or os.listdir(runs) == []


def test_slurm_launches_without_slurm_or_an_allocation_say_why(on_the_cluster, tmp_path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    from tlaunch import LaunchError
    from tlaunch import lp_ssh as lp

    program = lp.Program("never")
    program.add_node(lp.PyNode(print), label="p")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(LaunchError, match=r"there is none here \(\$SLURM_JOB_ID is unset\).*submit=True"):
        lp.launch(program, launch_type="slurm")
    with pytest.raises(LaunchError, match=r"describe a batch job to submit: pass submit=True"):
        lp.launch(program, launch_type="slurm", nodes=2)
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(LaunchError, match="sbatch, scontrol, squeue, scancel is not on PATH"):
        lp.launch(program, launch_type="slurm", submit=True, nodes=1)


# -- torch on the SLURM backend -----------------------------------------------

ON_STEPS = """
import os, sys
import tlaunch.torch

def work():
    import torch, torch.distributed as dist
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return os.uname().nodename, dist.get_rank(), t.item(), os.environ.get("CUDA_VISIBLE_DEVICES")

# No ssh config: the agents run as steps of the allocation.
result = tlaunch.torch.launch(
    work, hostnames="slurm", workers_per_host="slurm", backend="gloo", log_dir=sys.argv[1]
)
for host in result.hosts:
    print("RESULT", host, result.results[host])
"""


def test_torch_function_launch_on_slurm_steps(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    done = _salloc(slurm_cluster, ["-N2", "--ntasks-per-node=2"], ON_STEPS, str(tmp_path), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "RESULT th1 [('th1', 0, 6.0, None), ('th1', 1, 6.0, None)]" in done.stdout
    assert "RESULT th2 [('th2', 2, 6.0, None), ('th2', 3, 6.0, None)]" in done.stdout
    (run_id,) = os.listdir(tmp_path)
    assert _steps_left(slurm_cluster, run_id) == []
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}


def test_torch_workers_see_the_schedulers_gpus(slurm_cluster, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    done = _salloc(slurm_cluster, ["-N2", "--gpus-per-node=1"], ON_STEPS, str(tmp_path), timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "RESULT th1 [('th1', 0, 1.0, '0')]" in done.stdout
    assert "RESULT th2 [('th2', 1, 1.0, '0')]" in done.stdout


@pytest.mark.parametrize("presses", [1, 2])
def test_ctrl_c_in_an_allocation_leaves_nothing(slurm_cluster, presses: int) -> None:  # type: ignore[no-untyped-def]
    held = subprocess.run(
        ["salloc", "--no-shell", "-N2"], env=slurm_cluster.env, capture_output=True, text=True, check=True
    )
    job = held.stderr.split("Granted job allocation ")[1].split()[0]
    pid_dir = os.path.join(slurm_cluster.shared_dir, f"ctrl-c-{presses}")
    os.makedirs(pid_dir)
    proc = subprocess.Popen(
        [sys.executable, "-c", LOOPING, TESTS, pid_dir],
        env={**slurm_cluster.env, "SLURM_JOB_ID": job},
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        run_id = _started(proc, pid_dir, 3)
        for _ in range(presses):
            proc.send_signal(signal.SIGINT)
            time.sleep(0.05)
        proc.communicate(timeout=30)
        assert _steps_left(slurm_cluster, run_id) == []
        assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}
        state = subprocess.run(
            ["squeue", "-h", "-j", job, "-o", "%T"], env=slurm_cluster.env, capture_output=True, text=True
        )
        assert state.stdout.strip() == "RUNNING"  # the allocation is the user's: it stays
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # (communicate() closed them, unless the test failed before)
            if pipe is not None:
                pipe.close()
        subprocess.run(["scancel", job], env=slurm_cluster.env, check=False)


LOST = """
import sys
sys.path.insert(0, sys.argv[1])
from tlaunch import lp_ssh as lp
from programs import Looper

program = lp.Program("lost")
program.add_node(lp.CourierNode(Looper, sys.argv[2]).to_host("th1"), label="stays")
program.add_node(lp.CourierNode(Looper, sys.argv[2]).to_host("th2"), label="killed")
run = lp.launch(program, launch_type="slurm", wait=False)
print("RUN", run.run_id, flush=True)
try:
    run.wait()
except Exception as exc:
    print("FAILED", exc.node, exc.host, exc.reason, flush=True)
"""


def test_a_node_killed_on_its_slurm_node_fails_the_run_naming_it(slurm_cluster) -> None:  # type: ignore[no-untyped-def]
    with _under_salloc(slurm_cluster, LOST, "lost") as (proc, pid_dir):
        run_id = _started(proc, pid_dir, 2)
        assert slurm_cluster.hosts.crash("th2", run_id)
        out, err = proc.communicate(timeout=60)
    assert "FAILED killed/0 th2" in out, out + err[-3000:]
    assert _steps_left(slurm_cluster, run_id) == []
    assert slurm_cluster.hosts.wait_no_leftovers(run_id, 10) == {}


TRAINER = """
import os, socket
with open(os.path.join(os.environ["OUT"], f"rank{os.environ['RANK']}"), "w") as f:
    f.write(f"{socket.gethostname()} {os.environ['WORLD_SIZE']} {os.environ.get('TLAUNCH_SHARE_FILE', '')}")
"""


def test_tlaunchrun_backend_slurm_submits_a_basic_job(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    out = os.path.join(on_the_cluster.shared_dir, f"basic-{time.monotonic_ns()}")
    os.makedirs(out)
    script = os.path.join(out, "trainer.py")
    with open(script, "w") as f:
        f.write(TRAINER)
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", "--backend", "slurm", "--lpjob_name", "basic2",
         "--env", f"OUT={out}", "basic", "--num_trainer", "2", "--set_share_file", script],
        capture_output=True, text=True, timeout=60, cwd=on_the_cluster.shared_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted SLURM job ")[1].split()[0]
    run_id = done.stdout.split("(run ")[1].split(")")[0]
    from tlaunch.backends.slurm import SlurmJob

    run_dir = os.path.join(os.environ["TLAUNCH_HOME"], "runs", run_id)
    job = SlurmJob(job_id, run_id, run_dir)
    assert job.wait(timeout=120).state == "COMPLETED", job.read_output()
    with open(job.script) as f:
        assert "#SBATCH --job-name=basic2\n#SBATCH --nodes=2\n" in f.read()
    ranks = {}
    for r in range(2):
        with open(os.path.join(out, f"rank{r}")) as f:
            ranks[r] = f.read().split()
    assert ranks[0][0] == "th1" and ranks[1][0] == "th2"  # one trainer per node, as pods would be
    assert ranks[0][1] == ranks[1][1] == "2" and ranks[0][2] == ranks[1][2] != ""
    listed = _tlaunch("ps", run_id)
    assert f"SLURM job {job_id} ended COMPLETED" in listed.stdout, listed.stdout


SECRET_TRAINER = """
import os, time
with open(os.path.join(os.environ["OUT"], f"rank{os.environ['RANK']}"), "w") as f:
    f.write(os.environ["SECRET_TOKEN"])
time.sleep(4)
"""


def _cmdlines() -> list[str]:
    """Every process's command line on this machine (the test hosts share its process table)."""
    found = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    found.append(f.read().replace(b"\0", b" ").decode("utf-8", "replace"))
            except OSError:
                continue
    return found


def test_tlaunchrun_env_reaches_the_ranks_but_no_command_line(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    secret = f"s3cret-{time.monotonic_ns()}"
    out = os.path.join(on_the_cluster.shared_dir, f"secret-{time.monotonic_ns()}")
    os.makedirs(out)
    script = os.path.join(out, "trainer.py")
    with open(script, "w") as f:
        f.write(SECRET_TRAINER)
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", "--backend", "slurm", "--lpjob_name", "secret",
         "--env", f"OUT={out}", "--env", f"SECRET_TOKEN={secret}", "basic", "--num_trainer", "2", script],
        capture_output=True, text=True, timeout=60, cwd=on_the_cluster.shared_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted SLURM job ")[1].split()[0]
    run_id = done.stdout.split("(run ")[1].split(")")[0]
    from tlaunch.backends.slurm import SlurmJob

    job = SlurmJob(job_id, run_id, os.path.join(os.environ["TLAUNCH_HOME"], "runs", run_id))
    deadline = time.monotonic() + 120
    seen_on_a_command_line = []
    while len(os.listdir(out)) < 3 and time.monotonic() < deadline:  # trainer.py, rank0, rank1
        seen_on_a_command_line += [c for c in _cmdlines() if secret in c]
        time.sleep(0.05)
    while job.state().state in ("RUNNING", "PENDING") and time.monotonic() < deadline:
        seen_on_a_command_line += [c for c in _cmdlines() if secret in c]
        time.sleep(0.2)
    assert job.wait(timeout=60).state == "COMPLETED", job.read_output()
    assert seen_on_a_command_line == []
    for r in range(2):
        with open(os.path.join(out, f"rank{r}")) as f:
            assert f.read() == secret
    assert oct(os.stat(job.script).st_mode & 0o777) == "0o600"


TORCH_TRAINER = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.tensor([float(dist.get_rank() + 1)])
dist.all_reduce(t)
with open(os.path.join(os.environ["OUT"], f"rank{dist.get_rank()}"), "w") as f:
    f.write(f"{os.uname().nodename} {dist.get_world_size()} {t.item()} {torch.__file__}")
dist.destroy_process_group()
"""


def test_tlaunchrun_backend_slurm_runs_a_torchrun_job(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    """The job runs ``python -m tlaunch.cli.main torchrun`` in the allocation; its ranks import torch.

    The nodes' path once began with ``tlaunch/cli`` (the launcher's ``-m`` module's
    folder), and ``import torch`` found ``tlaunch/cli/torch.py``.
    """
    pytest.importorskip("torch")
    out = os.path.join(on_the_cluster.shared_dir, f"torchrun-{time.monotonic_ns()}")
    os.makedirs(out)
    script = os.path.join(out, "train.py")
    with open(script, "w") as f:
        f.write(TORCH_TRAINER)
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.tlaunchrun", "--backend", "slurm", "--lpjob_name", "tr2",
         "--env", f"OUT={out}", "torchrun", "--num_trainer", "2", "--nnodes", "2", "--nproc_per_node", "1",
         script],
        capture_output=True, text=True, timeout=60, cwd=on_the_cluster.shared_dir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job_id = done.stdout.split("submitted SLURM job ")[1].split()[0]
    run_id = done.stdout.split("(run ")[1].split(")")[0]
    from tlaunch.backends.slurm import SlurmJob

    job = SlurmJob(job_id, run_id, os.path.join(os.environ["TLAUNCH_HOME"], "runs", run_id))
    assert job.wait(timeout=180).state == "COMPLETED", job.read_output()
    ranks = {}
    for r in range(2):
        with open(os.path.join(out, f"rank{r}")) as f:
            ranks[r] = f.read().split()
    assert sorted(ranks[r][0] for r in ranks) == ["th1", "th2"]
    assert all(ranks[r][1:3] == ["2", "3.0"] for r in ranks)
    assert all("/tlaunch/cli/" not in ranks[r][3] for r in ranks), ranks


def uses_torch() -> None:
    import torch

    print("torch from", torch.__file__, "adds", torch.tensor([2.0]).add(1).item())


def test_submitted_program_whose_node_imports_torch(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    """The batch job's launcher runs as ``python -m``: its nodes must still find PyTorch."""
    pytest.importorskip("torch")
    from tlaunch import lp_ssh as lp

    program = lp.Program("torch-node")
    program.add_node(lp.PyNode(uses_torch), label="trainer")
    job = lp.launch(program, launch_type="slurm", submit=True)
    assert job.wait(timeout=120).state == "COMPLETED", job.read_output()
    line = next(x for x in job.read_output().splitlines() if "torch from" in x)
    assert "adds 3.0" in line and "/tlaunch/cli/" not in line, line


def test_a_job_server_job_on_the_slurm_cluster(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    """POST /v1/trainer/job with a slurm target: an sbatch job, followed to its end by the server."""
    pytest.importorskip("fastapi")
    from pathlib import Path

    from test_server import TRAINER, Server, _events, _launched, _upload

    home = Path(os.environ["TLAUNCH_HOME"])  # on the folder the cluster's nodes share
    home.parent.mkdir(parents=True, exist_ok=True)
    server = Server(home)
    try:
        with server.client() as c:
            pkg = _upload(c, {"train.py": TRAINER})
            body = {"job_name": "onslurm", "trainer_package": pkg, "num_trainer": 2, "args": ["2"],
                    "slurm": {"time": "5"}}  # fmt: skip
            r = c.post("/v1/trainer/job", json=body)
            assert r.status_code == 201, r.text
            assert _launched(c, "onslurm")["refs"]["slurm_job"].isdigit()
            events = _events(c, "/v1/jobs/onslurm/logs?follow=true")
            assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
            texts = [d["text"] for k, d in events if k == "message"]
            assert any("step 1 rank 1 of 2" in t for t in texts), texts
            job = c.get("/v1/jobs/onslurm").json()
            assert job["state"] == "SUCCEEDED" and job["exit_code"] == 0, job
    finally:
        server.stop()


def test_a_job_server_job_with_requirements_on_the_slurm_cluster(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    """The batch job's first step builds the package's environment (one task per node, once under the
    lock on the shared filesystem); the trainers on both nodes import what it installed."""
    pytest.importorskip("fastapi")
    from pathlib import Path

    from test_server import Server, _env_package, _events, _upload

    home = Path(os.environ["TLAUNCH_HOME"])
    home.parent.mkdir(parents=True, exist_ok=True)
    server = Server(home)
    try:
        with server.client() as c:
            pkg = _upload(c, _env_package())
            body = {"job_name": "slurmenv", "trainer_package": pkg, "num_trainer": 2, "slurm": {"time": "5"}}
            r = c.post("/v1/trainer/job", json=body)
            assert r.status_code == 201, r.text
            events = _events(c, "/v1/jobs/slurmenv/logs?follow=true")
            assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
            texts = [d["text"] for k, d in events if k == "message"]
            for rank in (0, 1):
                assert any(f"rank {rank} tinyrt 42" in t for t in texts), texts
            assert sum('"built": true' in t for t in texts) == 1, texts  # one node built, the other reused
            run_id = c.get("/v1/jobs/slurmenv").json()["refs"]["run_id"]
            with open(os.path.join(server.home, "runs", run_id, "job.sbatch")) as f:
                script = f.read()
            assert "srun --ntasks-per-node=1" in script and "tlaunch.runtime.pyenv exec" in script, script
            bad = _env_package("./tinyrt-9.9-py3-none-any.whl")
            body = {"job_name": "slurmenv-bad", "trainer_package": _upload(c, bad), "slurm": {"time": "5"}}
            assert c.post("/v1/trainer/job", json=body).status_code == 201
            events = _events(c, "/v1/jobs/slurmenv-bad/logs?follow=true")
            assert events[-1] == ("end", {"state": "FAILED"}), events
            job = c.get("/v1/jobs/slurmenv-bad").json()
            assert job["failure"]["node"] == "runtime-env", job
            assert "No such file or directory" in job["failure"]["traceback"], job
    finally:
        server.stop()


def test_job_server_program_and_command_jobs_on_the_slurm_cluster(on_the_cluster) -> None:  # type: ignore[no-untyped-def]
    """launch_method program (make_program(pservers=2) of the package, launched inside the allocation)
    and command (each trainer runs an argv) as SLURM batch jobs, followed to SUCCEEDED."""
    pytest.importorskip("fastapi")
    from pathlib import Path

    from test_server import PROGRAM_PACKAGE, Server, _events, _upload

    home = Path(os.environ["TLAUNCH_HOME"])
    home.parent.mkdir(parents=True, exist_ok=True)
    server = Server(home)
    try:
        with server.client() as c:
            pkg = _upload(c, {"train.py": PROGRAM_PACKAGE})
            body = {"job_name": "slurmps", "trainer_package": pkg, "launch_method": "program", "pservers": 2,
                    "program": "train.py:make_program", "slurm": {"time": "5"}}  # fmt: skip
            r = c.post("/v1/trainer/job", json=body)
            assert r.status_code == 201, r.text
            events = _events(c, "/v1/jobs/slurmps/logs?follow=true")
            assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
            texts = [d["text"] for k, d in events if k == "message"]
            assert any("trainer got [0, 10]" in t for t in texts), texts
            command = ["sh", "-c", "echo trainer $RANK of $WORLD_SIZE on $(hostname)"]
            body = {"job_name": "slurmcmd", "trainer_package": pkg, "launch_method": "command",
                    "num_trainer": 2, "command": command, "slurm": {"time": "5"}}  # fmt: skip
            assert c.post("/v1/trainer/job", json=body).status_code == 201
            events = _events(c, "/v1/jobs/slurmcmd/logs?follow=true")
            assert events[-1] == ("end", {"state": "SUCCEEDED"}), events
            texts = [d["text"] for k, d in events if k == "message"]
            assert any("trainer 1 of 2 on" in t for t in texts), texts
    finally:
        server.stop()
