"""A function-launch worker: ``python -m tlaunch.torch.worker PAYLOAD OUT_DIR LOCAL_RANK``.

Started by its host's agent before the job's layout is known, it imports torch
and unpickles the function meanwhile, then reads its layout (one JSON line on
stdin: ranks, world size, master address and port, backend), sets the rank
environment, joins the process group and calls the function. Its result, or
the exception it raised, goes to ``OUT_DIR`` as a pickle for the agent; an
exception also exits with code 1 after printing its traceback.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from typing import Any

import cloudpickle

__all__ = ["main"]


def _write(path: str, obj: Any) -> None:
    tmp = path + ".part"
    with open(tmp, "wb") as f:
        cloudpickle.dump(obj, f)
    os.replace(tmp, path)


def _error_record(exc: BaseException) -> dict[str, Any]:
    record: dict[str, Any] = {
        "type": f"{type(exc).__module__}.{type(exc).__qualname__}",
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
        "exception": None,
        "time": time.time(),
    }
    try:
        record["exception"] = cloudpickle.dumps(exc)
    except Exception as why:  # an exception that cannot travel still arrives as text
        record["pickle_error"] = f"{type(why).__name__}: {why}"
    return record


def _join(layout: dict[str, Any]) -> Any:
    """Set the rank environment and (unless backend is None) init the default process group."""
    env = {k: str(v) for k, v in layout["env"].items()}
    os.environ.update(env)
    backend = layout["backend"]
    if backend is None:
        return None
    import datetime

    import torch
    import torch.distributed as dist

    if backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(int(env["LOCAL_RANK"]) % torch.cuda.device_count())
    dist.init_process_group(
        backend=backend,
        init_method=f"tcp://{env['MASTER_ADDR']}:{env['MASTER_PORT']}"
        if ":" not in env["MASTER_ADDR"]
        else f"tcp://[{env['MASTER_ADDR']}]:{env['MASTER_PORT']}",
        rank=int(env["RANK"]),
        world_size=int(env["WORLD_SIZE"]),
        timeout=datetime.timedelta(seconds=float(layout["timeout"])),
    )
    return dist


def main(argv: list[str] | None = None) -> int:
    """Run one worker (see the module docstring); returns its exit code."""
    payload_path, out_dir, local_rank = (argv if argv is not None else sys.argv[1:])[:3]
    dist = None
    try:
        if os.environ.get("TLAUNCH_TORCH_BACKEND", "none") != "none":
            import torch.distributed  # noqa: F401  # the slow import, while the others register
        with open(payload_path, "rb") as f:
            func, args, kwargs = cloudpickle.load(f)
        line = sys.stdin.readline()
        if not line:
            return 3  # the agent went away before the layout was known: nothing to report
        layout = json.loads(line)
        dist = _join(layout)
        result = func(*args, **kwargs)
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt):
            return 130
        sys.stdout.flush()
        traceback.print_exc()
        sys.stderr.flush()
        if os.environ.get("TLAUNCH_DEBUG") == "post-mortem":  # launch(debug=), --debug: as its node's
            from tlaunch.runtime import debugger

            debugger.post_mortem(exc)
        _write(os.path.join(out_dir, f"error-{local_rank}.pkl"), _error_record(exc))
        return 1
    try:
        _write(os.path.join(out_dir, f"result-{local_rank}.pkl"), result)
    except Exception as exc:
        traceback.print_exc()
        _write(
            os.path.join(out_dir, f"error-{local_rank}.pkl"),
            _error_record(TypeError(f"the function's result could not be pickled: {exc}")),
        )
        return 1
    if dist is not None and dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.stdout.flush()
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # no atexit hooks of libraries that may hang on a broken peer
