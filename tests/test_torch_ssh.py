"""tlaunch.torch on the SSH test hosts: function launch, torchrun (elastic), deepspeed and basic modes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import pytest
from extensions import deepspeed_env

torch = pytest.importorskip("torch")

from tlaunch.torch import (  # noqa: E402
    JobFailedError,
    WorkerFailedError,
    basic,
    deepspeed,
    launch,
    torchrun,
)

pytestmark = pytest.mark.ssh

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "torch")


def all_reduce() -> tuple[str, int, int, float]:
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    print(f"rank {dist.get_rank()} reduced {t.item()}", flush=True)
    return os.uname().nodename, dist.get_rank(), int(os.environ["LOCAL_RANK"]), t.item()


def test_function_launch_on_three_hosts(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    hosts = ["th1", "th2", "th3"]
    result = launch(
        all_reduce,
        hostnames=hosts,
        workers_per_host=2,
        backend="gloo",
        ssh_config_file=ssh_hosts.ssh_config,
        log_dir=str(tmp_path),
    )
    assert result.hosts == hosts
    for i, host in enumerate(hosts):
        assert result.results[host] == [(host, 2 * i + lr, lr, 15.0) for lr in range(2)]
    assert {f"{h}[{lr}].log" for h in hosts for lr in range(2)} <= set(os.listdir(result.log_dir))
    with open(os.path.join(result.log_dir, "th3[1].log")) as f:
        assert "rank 5 reduced 15.0" in f.read()
    assert ssh_hosts.wait_no_leftovers(result.run_id, 10) == {}


def train(steps: int) -> dict[str, object]:
    import torch.distributed as dist

    model = torch.nn.Linear(4, 1)
    for _ in range(steps):
        for p in model.parameters():
            p.grad = torch.ones_like(p)
            dist.all_reduce(p.grad)
            p.data -= 0.01 * p.grad / dist.get_world_size()
    return model.state_dict()


def test_seed_two_launches_train_on_hosts_then_test_here(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    trained = launch(
        train,
        (3,),
        hostnames=["th1", "th2"],
        workers_per_host=2,
        backend="gloo",
        ssh_config_file=ssh_hosts.ssh_config,
        log_dir=str(tmp_path),
    ).rank(0)

    def test(state: dict[str, torch.Tensor]) -> float:
        model = torch.nn.Linear(4, 1)
        model.load_state_dict(state)
        return float(model(torch.ones(4)).item())

    accuracy = launch(
        test, (trained,), hostnames=["localhost"], workers_per_host=1, log_dir=str(tmp_path)
    ).rank(0)
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(trained)
    assert accuracy == pytest.approx(float(model(torch.ones(4)).item()))


def rank_3_raises() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 3:
        time.sleep(0.5)
        raise ValueError(f"rank 3 gives up at {time.time()}")
    dist.barrier()


def test_a_raising_rank_ends_every_host_and_raises_here(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match="rank 3 gives up") as info:
        launch(
            rank_3_raises,
            hostnames=["th1", "th2", "th3"],
            workers_per_host=2,
            backend="gloo",
            ssh_config_file=ssh_hosts.ssh_config,
            log_dir=str(tmp_path),
        )
    took = time.time() - float(re.search(r"at ([\d.]+)", str(info.value)).group(1))  # type: ignore[union-attr]
    assert took < 4, f"raised {took:.1f} s after the worker did (target 2 s; bench/torch.py measures it)"
    assert (info.value.rank, info.value.host) == (3, "th2")  # type: ignore[attr-defined]
    assert "rank_3_raises" in info.value.remote_traceback  # type: ignore[attr-defined]
    (run_id,) = os.listdir(tmp_path)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def rank_2_killed() -> None:
    import torch.distributed as dist

    if dist.get_rank() == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    dist.barrier()


def test_a_killed_worker_on_a_host(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(WorkerFailedError) as info:
        launch(
            rank_2_killed,
            hostnames=["th1", "th2"],
            workers_per_host=2,
            backend="gloo",
            ssh_config_file=ssh_hosts.ssh_config,
            log_dir=str(tmp_path),
        )
    assert (info.value.host, info.value.rank, info.value.exit_code) == ("th2", 2, -signal.SIGKILL)
    (run_id,) = os.listdir(tmp_path)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def _logs(log_dir: str) -> str:
    text = ""
    for name in sorted(os.listdir(log_dir)):
        with open(os.path.join(log_dir, name)) as f:
            text += f.read()
    return text


def test_torchrun_elastic_job_survives_losing_a_host(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    checkpoint = f"/var/tmp/tlaunch-elastic-{os.getpid()}.pt"  # /var/tmp: every test host sees it
    outcome: dict[str, object] = {}

    def job() -> None:
        try:
            outcome["result"] = torchrun(
                [
                    os.path.join(EXAMPLES, "elastic_train.py"),
                    "--steps",
                    "30",
                    "--step-time",
                    "0.2",
                    "--checkpoint",
                    checkpoint,
                ],
                hostnames=["th1", "th2", "th3"],
                nnodes="2:3",
                nproc_per_node=2,
                max_restarts=3,
                ssh_config_file=ssh_hosts.ssh_config,
                log_dir=str(tmp_path),
            )
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=job)
    thread.start()
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # wait until training runs on all three hosts
            runs = os.listdir(tmp_path)
            if runs and "step=4 rank=0 world=6" in _logs(os.path.join(tmp_path, runs[0])):
                break
            time.sleep(0.2)
        else:
            pytest.fail(f"the job never reached step 4: {outcome}")
        run_id = runs[0]
        assert ssh_hosts.crash("th3", run_id), "nothing of the run was found on th3"
        thread.join(180)
        assert not thread.is_alive()
    finally:
        if os.path.exists(checkpoint):
            os.unlink(checkpoint)
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result.lost_hosts == ["th3"] and result.exit_codes == {"th1": 0, "th2": 0}  # type: ignore[attr-defined]
    logs = _logs(os.path.join(tmp_path, run_id))
    assert "world=4 restart=1" in logs and "done rank=0 world=4" in logs
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def test_torchrun_restarts_used_up_fail_with_the_root_cause(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(JobFailedError) as info:
        torchrun(
            [
                os.path.join(EXAMPLES, "elastic_train.py"),
                "--steps",
                "6",
                "--step-time",
                "0.05",
                "--fail-rank",
                "3",
            ],
            hostnames=["th1", "th2"],
            nproc_per_node=2,
            max_restarts=1,
            ssh_config_file=ssh_hosts.ssh_config,
            log_dir=str(tmp_path),
        )
    err = info.value
    assert (err.rank, err.host) == (3, "th2")
    assert "ValueError: rank 3 fails at step 3 on purpose" in str(err) and "after 1 restarts" in str(err)
    assert "elastic_train.py" in (err.remote_traceback or "")
    (run_id,) = os.listdir(tmp_path)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def test_torchrun_command_line(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    done = subprocess.run(
        [
            os.path.join(os.path.dirname(sys.executable), "tlaunch"), "torchrun",
            "--hosts", "th1,th2", "--nproc-per-node", "1",
            "--ssh-config", ssh_hosts.ssh_config, "--log-dir", str(tmp_path), "--echo-ranks", "all",
            os.path.join(EXAMPLES, "elastic_train.py"), "--steps", "2", "--step-time", "0",
        ],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[th1 0] done rank=0 world=2" in done.stdout and "[th2 1] done rank=1 world=2" in done.stdout
    (run_id,) = os.listdir(tmp_path)
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}


def test_deepspeed_hostfile_with_include(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("deepspeed")
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("# the test hosts\nth1 slots=2\nth2 slots=2  # two CPUs each\nth3 slots=2\n")
    logs = tmp_path / "logs"
    result = deepspeed(
        [os.path.join(EXAMPLES, "deepspeed_train.py"), "--steps", "2"],
        hostfile=str(hostfile),
        include="th1@th2:1",
        ssh_config_file=ssh_hosts.ssh_config,
        # CPU accelerator; its communication op is built once, in a folder every host sees
        env=deepspeed_env(),
        log_dir=str(logs),
    )
    assert result.exit_codes == {"th1": 0, "th2": 0}
    text = _logs(result.log_dir)
    for rank, local_rank in [(0, 0), (1, 1), (2, 0)]:
        assert f"step=1 rank={rank} world=3 local_rank={local_rank}" in text
    assert ssh_hosts.wait_no_leftovers(result.run_id, 10) == {}


def test_basic_mode_trainers_share_a_file(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    share = f"/var/tmp/tlaunch-share-{os.getpid()}"
    script = tmp_path / "trainer.py"
    script.write_text(
        "import os\n"
        "with open(os.environ['TLAUNCH_SHARE_FILE'] + '.' + os.environ['RANK'], 'w') as f:\n"
        "    f.write(os.uname().nodename + ' ' + os.environ['WORLD_SIZE'])\n"
    )
    try:
        result = basic(
            [str(script)], 4, ["th1", "th2"], share_file=share, ssh_config_file=ssh_hosts.ssh_config
        )
        found = {}
        for rank in range(4):
            with open(f"{share}.{rank}") as f:
                found[rank] = f.read()
        assert found == {0: "th1 4", 1: "th2 4", 2: "th1 4", 3: "th2 4"}
        assert ssh_hosts.wait_no_leftovers(result.run_id, 10) == {}
    finally:
        for rank in range(4):
            if os.path.exists(f"{share}.{rank}"):
                os.unlink(f"{share}.{rank}")


def sleep_long() -> None:
    print("sleeping", flush=True)
    time.sleep(120)


def test_a_lost_host_gives_agent_failed_error(ssh_hosts, tmp_path) -> None:  # type: ignore[no-untyped-def]
    from tlaunch.torch import AgentFailedError

    outcome: dict[str, object] = {}

    def job() -> None:
        try:
            launch(
                sleep_long, hostnames=["th1", "th2"], workers_per_host=1, backend=None,
                ssh_config_file=ssh_hosts.ssh_config, log_dir=str(tmp_path), echo_ranks=None,
            )  # fmt: skip
        except BaseException as exc:
            outcome["error"] = exc
            outcome["at"] = time.monotonic()

    thread = threading.Thread(target=job)
    thread.start()
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        runs = os.listdir(tmp_path)
        if runs and os.path.exists(os.path.join(tmp_path, runs[0], "th2[0].log")):
            break
        time.sleep(0.1)
    run_id = os.listdir(tmp_path)[0]
    assert ssh_hosts.crash("th2", run_id)
    lost_at = time.monotonic()
    thread.join(60)
    assert isinstance(outcome.get("error"), AgentFailedError), outcome
    assert outcome["error"].host == "th2"  # type: ignore[attr-defined]
    assert outcome["at"] - lost_at < 30  # type: ignore[operator]  # the heartbeat timeout is 10 s
    assert ssh_hosts.wait_no_leftovers(run_id, 10) == {}
