"""torch's elastic agent, reporting ranks that fail without raising: ``python -m tlaunch.torch.elastic ARGS``.

``ARGS`` are ``torch.distributed.run``'s (``torchrun``'s), and so is what runs.
Every rank starts through :mod:`tlaunch.torch.record`, which reports what it
raises. A rank that ends with a non-zero exit code without a traceback to
show (``os._exit(3)`` or ``sys.exit(3)`` after printing what went wrong, a
signal, an OOM kill) leaves torch's agent nothing but its exit code. When the
agent gives up (``ChildFailedError``), this module writes, for each rank it
names that left no error file of torch's, a report where
:mod:`tlaunch.torch.record` writes its own (``$TLAUNCH_TORCH_REPORTS``): its
exit code and the last lines of its output, read from the agent's per-rank
logs of its last attempt (``--log-dir`` with ``--tee``:
``<log dir>/<run>/attempt_<n>/<local rank>/stdout.log``, ``stderr.log``). It
then ends as torchrun does, with the same exception.

A report of such a rank is dated when it last wrote its output: it died after
that, and before the errors its peers raise because of it (a "connection
reset" in a collective); torch's own record of the failure is dated to the
second, when its agent noticed. Ranks the agent itself ended (SIGTERM, as it
stops the others once one failed) are not reported, unless that is all there is.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import sys
from typing import Any

from tlaunch.runtime.nodelog import TAIL_BYTES, last_lines

__all__ = ["exit_report", "last_attempt", "main", "output_tail"]

_ATTEMPT = re.compile(r"attempt_(\d+)")


def output_tail(folder: str) -> tuple[str, float | None]:
    """The last lines a rank wrote (its ``stdout.log``, then its ``stderr.log``, in ``folder``), and
    when it last wrote either (None: neither is there)."""
    pieces, when = [], None
    for name in ("stdout.log", "stderr.log"):
        path = os.path.join(folder, name)
        with contextlib.suppress(OSError):
            with open(path, "rb") as f:
                f.seek(max(0, os.fstat(f.fileno()).st_size - TAIL_BYTES))
                data = f.read()
                mtime = os.fstat(f.fileno()).st_mtime
            when = mtime if when is None else max(when, mtime)
            if data.strip():
                pieces.append(data if data.endswith(b"\n") else data + b"\n")
    return last_lines(b"".join(pieces)[-TAIL_BYTES:]), when


def exit_report(rank: int, failure: Any, attempt: str | None, host: str) -> dict[str, Any]:
    """The report of ``rank``, which exited as ``failure`` says (torch's ``ProcessFailure``) without
    raising, its output in ``attempt`` (the folder of the agent's last attempt; None: not known)."""
    output, wrote = output_tail(os.path.join(attempt, str(failure.local_rank))) if attempt else ("", None)
    number = _ATTEMPT.search(os.path.basename(attempt or ""))
    return {
        "time": wrote if wrote is not None else float(failure.timestamp),
        "host": host,
        "rank": rank,
        "local_rank": int(failure.local_rank),
        "restart": int(number.group(1)) if number else 0,
        "type": "",
        "message": "",
        "traceback": "",
        "exit_code": int(failure.exitcode),
        "output": output,
    }


def last_attempt(log_dir: str | None) -> str | None:
    """The folder of the agent's last attempt under its ``--log-dir`` (None: none there)."""
    if not log_dir:
        return None
    found = [(int(m.group(1)), p) for p in glob.glob(os.path.join(log_dir, "*", "attempt_*"))
             if (m := _ATTEMPT.fullmatch(os.path.basename(p)))]  # fmt: skip
    return max(found)[1] if found else None


def _report_exits(failures: dict[int, Any], log_dir: str | None) -> None:
    folder = os.environ.get("TLAUNCH_TORCH_REPORTS")
    if not folder:
        return
    host = os.environ.get("TLAUNCH_HOST", "")
    attempt = last_attempt(log_dir)
    own = {r: f for r, f in failures.items() if f.exitcode != -signal.SIGTERM}  # not ended by the agent
    os.makedirs(folder, exist_ok=True)
    for rank, failure in (own or failures).items():
        if os.path.isfile(failure.error_file):  # it raised: tlaunch.torch.record reported it
            continue
        report = exit_report(rank, failure, attempt, host)
        path = os.path.join(folder, f"{rank}-{report['restart']}-exit.json")
        with open(path + ".part", "w", encoding="utf-8") as f:
            json.dump(report, f)
        os.replace(path + ".part", path)


def main(argv: list[str] | None = None) -> None:
    """Run torch's elastic agent with ``argv`` (its own arguments); see the module docstring."""
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import main as torchrun
    from torch.distributed.run import parse_args

    args = sys.argv[1:] if argv is None else list(argv)
    try:
        torchrun(args)
    except ChildFailedError as exc:
        _report_exits(exc.failures, parse_args(args).log_dir)  # type: ignore[no-untyped-call]
        raise


if __name__ == "__main__":
    main()
