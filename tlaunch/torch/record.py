"""Run a training script under torch's error recording: ``python -m tlaunch.torch.record RUN SCRIPT``.

torchrun reports a failing rank's traceback only when the script's entry point
is wrapped in ``@record``; tlaunch starts every rank through this module
instead, so users need not add it. An exception is written where torch's
elastic agent reads it (``TORCHELASTIC_ERROR_FILE``, torch's own
``ErrorHandler``) and, for tlaunch's root-cause report, as JSON in
``$TLAUNCH_TORCH_REPORTS/<rank>.json`` (with its time, host, ranks and
traceback). ``SCRIPT`` may be ``-m MODULE``. The run id in the command line
lets tlaunch's leftover checks find every process of the run.
"""

from __future__ import annotations

import json
import os
import runpy
import socket
import sys
import time
import traceback

__all__ = ["main"]


def _report(exc: BaseException) -> None:
    folder = os.environ.get("TLAUNCH_TORCH_REPORTS")
    if not folder:
        return
    rank = os.environ.get("RANK", "?")
    record = {
        "time": time.time(),
        "host": os.environ.get("TLAUNCH_HOST") or socket.gethostname(),
        "rank": int(rank) if rank.isdigit() else None,
        "local_rank": int(os.environ.get("LOCAL_RANK", "0")),
        "restart": int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")),
        "type": type(exc).__name__,
        "message": str(exc),
        "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
    }
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"{rank}-{record['restart']}.json")
    with open(path + ".part", "w", encoding="utf-8") as f:
        json.dump(record, f)
    os.replace(path + ".part", path)


def _close_process_group() -> None:
    """Destroy a process group the script left open, before the interpreter exits.

    Left to interpreter shutdown, gloo's threads (DeepSpeed's CPU comm op too)
    can be torn down while running, and the rank then aborts in C++
    ("terminate called without an active exception") after it has finished.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    try:
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass


def main(argv: list[str] | None = None) -> None:
    """Run the script of ``argv`` (``RUN_ID SCRIPT ARGS...`` or ``RUN_ID -m MODULE ARGS...``)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if len([a for a in args if not a.startswith("--local_rank")]) < 2:
        raise SystemExit(
            "usage: python -m tlaunch.torch.record RUN_ID SCRIPT [ARGS...] | RUN_ID -m MODULE [ARGS...]"
        )
    # DeepSpeed's per-node launcher puts --local_rank=N right after the module it runs
    # (this one); the user's script expects it right after its own name.
    n = 0
    while n < len(args) and args[n].startswith("--local_rank"):
        n += 1
    local, args = args[:n], args[n + 1 :]  # the run id is only there to be seen in `ps`
    if local:
        at = 2 if args[0] == "-m" else 1
        args[at:at] = local
    module = None
    if args[0] == "-m":
        module, rest = args[1], args[2:]
        sys.argv = [module, *rest]
    else:
        sys.argv = list(args)
    try:
        if module is not None:
            runpy.run_module(module, run_name="__main__", alter_sys=True)
        else:
            sys.path.insert(0, os.path.dirname(os.path.abspath(args[0])))
            runpy.run_path(args[0], run_name="__main__")
        _close_process_group()
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _report(exc)
        else:
            _close_process_group()
        raise
    except BaseException as exc:
        _report(exc)
        try:
            from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

            ErrorHandler().record_exception(exc)
        except ImportError:
            pass
        raise


def _exit_quietly(code: int) -> None:
    """End a rank that has finished: its exit handlers run, then the process ends without C++ teardown.

    Python's shutdown destroys torch's and DeepSpeed's native objects, whose
    threads may still run (gloo, DeepSpeed's CPU comm op): a finished rank then
    aborted with "terminate called without an active exception" (SIGABRT) now
    and then, and its launcher reported the job failed.
    """
    import atexit

    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    try:
        main()
    except SystemExit as exc:
        if exc.code in (None, 0):
            _exit_quietly(0)
        raise
    _exit_quietly(0)
