"""tlaunch.torch on GPUs with NCCL: every mode on this machine's GPUs (skipped where there is none).

CI has no GPU: these run on a GPU machine (``bench/gpu_check.sh`` runs them
there with the launch benchmark). Each rank takes the GPU of its local rank;
NCCL allows one rank a GPU, so the world is as large as the GPUs visible.
"""

from __future__ import annotations

import importlib.util
import os
from typing import Any

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("no GPU visible here (CUDA is not available to torch)", allow_module_level=True)

from test_torch import _left  # noqa: E402  (nothing of a run left in `ps`)

from tlaunch.torch import basic, deepspeed, launch, torchrun  # noqa: E402

pytestmark = pytest.mark.timeout(300)

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples", "torch")
GPUS = torch.cuda.device_count()


def _logs(folder: str) -> str:
    text = ""
    for root, _, files in os.walk(folder):
        for name in sorted(files):
            with open(os.path.join(root, name), errors="replace") as f:
                text += f.read()
    return text


def reduce_on_gpu() -> dict[str, object]:
    import torch.distributed as dist

    t = torch.tensor([float(dist.get_rank() + 1)], device="cuda")
    dist.all_reduce(t)
    return {
        "backend": dist.get_backend(),
        "device": torch.cuda.current_device(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "sum": t.item(),
    }


def test_function_launch_puts_a_rank_on_each_gpu_with_nccl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # backend "auto" and workers "gpu": what a user on a GPU machine writes.
    result = launch(reduce_on_gpu, hostnames=["localhost"], workers_per_host="gpu", log_dir=str(tmp_path))
    assert result.world_size == GPUS
    for rank in range(GPUS):
        value = result.rank(rank)
        assert value["backend"] == "nccl"
        assert value["device"] == value["local_rank"] == rank
        assert value["sum"] == GPUS * (GPUS + 1) / 2
    assert _left(result.run_id) == []


def raises_after_a_gpu_reduce() -> None:
    import torch.distributed as dist

    t = torch.ones(1, device="cuda")
    dist.all_reduce(t)
    raise ValueError(f"rank {dist.get_rank()} saw {t.item()}")


def test_a_raise_after_nccl_work_comes_back_as_itself(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=f"saw {float(GPUS)}") as info:
        launch(
            raises_after_a_gpu_reduce, hostnames=["localhost"], workers_per_host="gpu", log_dir=str(tmp_path)
        )
    assert info.value.host == "localhost"  # type: ignore[attr-defined]
    assert "raise ValueError" in info.value.remote_traceback  # type: ignore[attr-defined]
    (run_id,) = os.listdir(tmp_path)
    assert _left(run_id) == []


def test_torchrun_mode_trains_with_nccl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    result = torchrun(
        [os.path.join(EXAMPLES, "elastic_train.py"), "--steps", "3", "--step-time", "0"],
        hostnames=["localhost"],
        nproc_per_node="gpu",
        log_dir=str(tmp_path),
    )
    assert result.exit_codes == {"localhost": 0}
    logs = _logs(str(tmp_path))
    assert f"start step=0 rank=0 world={GPUS} restart=0 backend=nccl" in logs
    assert f"done rank=0 world={GPUS}" in logs
    assert _left(result.run_id) == []


def test_deepspeed_mode_trains_on_the_gpus(tmp_path) -> None:  # type: ignore[no-untyped-def]
    if importlib.util.find_spec("deepspeed") is None:
        pytest.skip("deepspeed is not installed (pip install 'tlaunch[deepspeed]')")
    result = deepspeed(
        [os.path.join(EXAMPLES, "deepspeed_train.py"), "--steps", "2"],
        hostnames=["localhost"],
        num_gpus=GPUS,
        log_dir=str(tmp_path),
    )
    assert result.exit_codes == {"localhost": 0}
    logs = _logs(result.log_dir)
    for rank in range(GPUS):
        assert f"step=1 rank={rank} world={GPUS} local_rank={rank}" in logs
    assert _left(result.run_id) == []


TRAINER = """
import os, torch, torch.distributed as dist
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
torch.cuda.set_device(rank % torch.cuda.device_count())
dist.init_process_group("nccl", init_method="file://" + os.environ["TLAUNCH_SHARE_FILE"], rank=rank,
                        world_size=world)
t = torch.ones(1, device="cuda")
dist.all_reduce(t)
print(f"trainer {rank} of {world} summed {t.item()} on cuda:{torch.cuda.current_device()}", flush=True)
dist.destroy_process_group()
"""


def test_basic_mode_trainers_meet_through_the_share_file_with_nccl(tmp_path) -> None:  # type: ignore[no-untyped-def]
    script = tmp_path / "trainer.py"
    script.write_text(TRAINER)
    share = tmp_path / "share"
    result = basic([str(script)], GPUS, ["localhost"], share_file=str(share), log_dir=str(tmp_path / "logs"))
    assert result.exit_codes == {"localhost": 0}
    logs = _logs(str(tmp_path / "logs"))
    for rank in range(GPUS):
        assert f"trainer {rank} of {GPUS} summed {float(GPUS)} on cuda:{rank}" in logs
    assert _left(result.run_id) == []


def what_i_see() -> tuple[int, list[str]]:
    """The GPUs this worker sees: how many, and their UUIDs."""
    count = torch.cuda.device_count()
    return count, [str(torch.cuda.get_device_properties(i).uuid) for i in range(count)]


def test_two_jobs_given_disjoint_slots_by_the_pool_see_only_their_own_gpus(ssh_hosts: Any) -> None:
    """The job server's pool gives each job its GPUs (TLAUNCH_POOL_SLOTS, applied by the supervisor of
    each node on an SSH host; the test hosts share this machine's GPUs)."""
    import json
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from tlaunch.runtime.slots import SLOTS

    if GPUS < 2:
        pytest.skip(f"needs 2 GPUs for two disjoint jobs; {GPUS} here")
    listed = subprocess.run(
        ["nvidia-smi", "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        check=True,
    )
    uuids = [line.split(",")[1].strip() for line in listed.stdout.splitlines() if line.strip()]

    def job(host: str, mine: str) -> Any:
        slots = {host: {"gpus": mine, "cpus": ""}}  # as the pool gives it: this host's GPU
        return launch(what_i_see, hostnames=[host], workers_per_host=1, backend=None,
                      ssh_config_file=ssh_hosts.ssh_config, env={SLOTS: json.dumps(slots)})  # fmt: skip

    with ThreadPoolExecutor(2) as pool:  # both at once
        first, second = pool.map(job, ["th1", "th2"], [uuids[0], uuids[1]])
    for result, mine in ((first, uuids[0]), (second, uuids[1])):
        count, seen = result.rank(0)
        assert count == 1 and mine.endswith(seen[0]), (mine, seen)
