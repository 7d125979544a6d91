"""Launchpad's own examples and API tests, run on dm-launchpad 0.5.2 and on tlaunch.

    python bench/launchpad_compat.py [--launchpad-python PATH] [--modes launchpad,import,alias]
                                     [--only SUBSTRING] [--out bench/results/launchpad_compat.json]

The files are Launchpad 0.5.2's, read from the reference environment
(bench/make_launchpad_env.sh) and copied, as a user's project would hold them,
into a scratch checkout (``launchpad/examples/...``, ``launchpad/.../*_test.py``,
with empty package ``__init__`` files). Each case runs in its own interpreter:

* ``launchpad``: the files as they are, under dm-launchpad 0.5.2 (Python 3.10);
* ``import``: under tlaunch with only the imports changed (``import launchpad as lp``
  becomes ``from tlaunch import lp_ssh as lp``; ``from launchpad.X import Y`` of
  Launchpad's own modules becomes ``from tlaunch.compat.launchpad.X import Y``;
  ``import courier`` becomes ``from tlaunch.compat import courier``);
* ``alias``: under tlaunch with no change at all (``python -m tlaunch.compat FILE``).

A case passes when its interpreter exits 0 within the time limit and, for an
example, printed no traceback. Processes a case leaves behind (found by an
environment marker) are counted, reported and killed by pid.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import plots  # bench/plots.py, beside this script

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

EXAMPLES = ("hello_world", "program_wait", "batching", "consumer_producers")
LAUNCH_TYPES = ("local_mt", "local_mp", "test_mt")
TESTS = (
    "examples/consumer_producers/launch_test.py",
    "program_test.py",
    "nodes/courier/node_test.py",
    "nodes/multi_threading_colocation/node_test.py",
    "launch/test_multi_threading/launch_test.py",
    "launch/test_multi_processing/launch_test.py",
)
SUPPORT = ("examples/consumer_producers/program.py", "launch/serialization_test.py")
USER_MODULES = ("launchpad.examples", "launchpad.launch.serialization_test")
MARKER = "LAUNCHPAD_COMPAT_CASE"


def cases() -> list[tuple[str, str, list[str]]]:
    """(name, file under launchpad/, arguments) of every case."""
    out = [
        (f"examples/{ex}[{lt}]", f"examples/{ex}/launch.py", [f"--lp_launch_type={lt}"])
        for ex in EXAMPLES
        for lt in LAUNCH_TYPES
    ]
    return out + [(test, test, []) for test in TESTS]


def change_imports(source: str) -> str:
    """The ``import`` mode's edit: Launchpad's imports become tlaunch's, nothing else."""

    def from_import(m: re.Match[str]) -> str:
        module, names = m.group(1), m.group(2)
        first = f"{module}.{names.split(',')[0].split(' as ')[0].strip()}"
        if any(first == u or first.startswith(u + ".") or module.startswith(u) for u in USER_MODULES):
            return m.group(0)  # the user's own module, in the checkout
        target = "tlaunch.compat.launchpad" + module[len("launchpad") :]
        return f"from {target} import {names}"

    source = re.sub(r"^import launchpad as lp$", "from tlaunch import lp_ssh as lp", source, flags=re.M)
    source = re.sub(r"^import courier$", "from tlaunch.compat import courier", source, flags=re.M)
    return re.sub(r"^from (launchpad(?:\.[\w.]+)?) import (.+)$", from_import, source, flags=re.M)


def make_checkout(src: Path, dest: Path, edit: bool) -> None:
    """Copy the cases' files (and the modules they import) to ``dest/launchpad``."""
    for rel in {c[1] for c in cases()} | set(SUPPORT):
        target = dest / "launchpad" / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (src / rel).read_text()
        target.write_text(change_imports(text) if edit else text)
        for parent in target.relative_to(dest).parents:
            if str(parent) != ".":
                (dest / parent / "__init__.py").touch()


def leftovers(marker: str) -> list[int]:
    """Pids of live processes whose environment holds ``marker``."""
    found = []
    needle = f"{MARKER}={marker}".encode()
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(entry))
        except OSError:
            continue
    return found


def run_case(
    mode: str, python: str, checkout: Path, rel: str, args: list[str], timeout: float, n: int
) -> dict:
    script = checkout / "launchpad" / rel
    marker = f"{os.getpid()}-{n}"
    env = {**os.environ, MARKER: marker, "PYTHONUNBUFFERED": "1"}
    env["LAUNCHPAD_LAUNCH_LOCAL_TERMINAL"] = "current_terminal"  # Launchpad otherwise picks tmux
    env.pop("PYTHONPATH", None)
    if mode == "import":
        env["PYTHONPATH"] = str(checkout)  # the checkout's own modules (examples, serialization_test)
    cmd = (
        [python, "-m", "tlaunch.compat", str(script), *args]
        if mode == "alias"
        else [python, str(script), *args]
    )
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=script.parent,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=timeout)
        rc: int | None = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        rc = None
    seconds = time.monotonic() - t0
    time.sleep(0.5)
    left = leftovers(marker)
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    text = out.decode(errors="replace")
    example = rel.startswith("examples/") and rel.endswith("launch.py")
    ok = rc == 0 and not (example and "Traceback" in text)
    return {
        "ok": ok,
        "rc": rc,
        "timed_out": rc is None,
        "traceback": "Traceback" in text,
        "seconds": round(seconds, 2),
        "leftover_processes": len(left),
        "tail": text[-1500:],
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--launchpad-python", default=str(HERE / ".lp-venv" / "bin" / "python"))
    parser.add_argument("--python", default=sys.executable, help="the interpreter with tlaunch")
    parser.add_argument("--modes", default="launchpad,import,alias")
    parser.add_argument("--only", default="", help="run only cases whose name holds this")
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--out", default=str(HERE / "results" / "launchpad_compat.json"))
    args = parser.parse_args()

    lp_python = Path(args.launchpad_python)
    found = subprocess.run(
        [str(lp_python), "-c", "import launchpad, os; print(os.path.dirname(launchpad.__file__))"],
        capture_output=True,
        text=True,
        check=False,
    )
    if found.returncode != 0:
        raise SystemExit(
            f"no dm-launchpad at {lp_python}: run bench/make_launchpad_env.sh ({found.stderr.strip()})"
        )
    src = Path(found.stdout.strip())
    modes = [m for m in args.modes.split(",") if m]
    work = Path(tempfile.mkdtemp(prefix="lpcompat-"))
    results: dict = {"launchpad_source": str(src), "cases": {}, "passed": {}}
    try:
        checkouts = {"launchpad": work / "plain", "alias": work / "plain", "import": work / "import"}
        make_checkout(src, checkouts["launchpad"], edit=False)
        make_checkout(src, checkouts["import"], edit=True)
        selected = [c for c in cases() if args.only in c[0]]
        n = 0
        for name, rel, case_args in selected:
            row = results["cases"].setdefault(name, {})
            for mode in modes:
                n += 1
                python = str(lp_python) if mode == "launchpad" else args.python
                row[mode] = run_case(mode, python, checkouts[mode], rel, case_args, args.timeout, n)
                r = row[mode]
                print(
                    f"{name:55s} {mode:9s} {'pass' if r['ok'] else 'FAIL'} rc={r['rc']} "
                    f"{r['seconds']:.1f}s left={r['leftover_processes']}",
                    flush=True,
                )
        for mode in modes:
            passed = [c for c, row in results["cases"].items() if row[mode]["ok"]]
            results["passed"][mode] = {"count": len(passed), "of": len(selected)}
        if "launchpad" in modes:
            reference = [c for c, row in results["cases"].items() if row["launchpad"]["ok"]]
            for mode in modes:
                if mode != "launchpad":
                    missed = [c for c in reference if not results["cases"][c][mode]["ok"]]
                    results["passed"][mode]["launchpad_passes_missed"] = missed
        print(json.dumps(results["passed"], indent=2))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(results, f, indent=2)
    plots.plot_file(args.out, "launchpad_compat")


if __name__ == "__main__":
    main()
