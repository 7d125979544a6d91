"""What sealing runtime environments costs (``tlaunch server --unix-users``), against what it replaces.

    python bench/envseal.py [--runs 3] [--asks 200] [--out bench/results/envseal.json]   # as root

1. **The seal, once per environment.** Root's copy of what a user built
   (:func:`tlaunch.server.sealcopy.copy_sealed`: a walk by descriptors, new
   files, root's modes) of real package trees of this interpreter's
   site-packages (``idna``, ``numpy``, ``torch``), against ``cp -a`` of the
   same tree in the same run (the copy any tool makes), medians of
   ``--runs``; the page cache warm for both (each tree read once first).
2. **The look-up, once per job.** A job whose environment is sealed asks the
   server's store over its socket (:mod:`tlaunch.control.starting.sealedenv`:
   connect, ask, the lock taken, the answer), from a process of a test
   account; the reference is what a launcher of one account does instead,
   :func:`tlaunch.runtime.pyenv.find` (a stat and a touch), in the same
   process. Medians and p99 of ``--asks``.

Writes the JSON and a plot beside it (``.png``).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
TREES = ("idna", "numpy", "torch")
ASKER = """
import json, sys, time
from tlaunch.control.starting.sealedenv import prepare_sealed
from tlaunch.runtime.pyenv import RuntimeEnv, find
socket_path, root, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
env = RuntimeEnv("/", "bench-key", pip=("six",))
sealed, found = [], []
for _ in range(n):
    t = time.perf_counter(); prepare_sealed(socket_path, env); sealed.append(time.perf_counter() - t)
    t = time.perf_counter(); assert find(root, "bench-key"); found.append(time.perf_counter() - t)
print(json.dumps({"sealed": sealed, "find": found}))
"""


def _tree_size(path: str) -> tuple[int, int]:
    files = size = 0
    for top, _, names in os.walk(path):
        for name in names:
            files += 1
            size += os.lstat(os.path.join(top, name)).st_size
    return files, size


def seal_costs(runs: int, scratch: str) -> list[dict[str, Any]]:
    """Seconds of :func:`copy_sealed` and of ``cp -a`` for each tree of :data:`TREES`."""
    import site

    from tlaunch.server.sealcopy import copy_sealed

    base = site.getsitepackages()[0]
    out = []
    for name in TREES:
        tree = os.path.join(scratch, "built", name)
        os.makedirs(tree)
        src = os.path.join(base, name)
        if os.path.isdir(src):
            shutil.copytree(src, tree, symlinks=True, dirs_exist_ok=True)
        else:
            shutil.copy(src, tree)
        files, size = _tree_size(tree)
        times: dict[str, list[float]] = {"copy_sealed": [], "cp -a": []}
        for i in range(runs):
            for what, took in times.items():
                target = os.path.join(scratch, f"copy-{i}-{what.replace(' ', '')}")
                t = time.perf_counter()
                if what == "copy_sealed":
                    copy_sealed(tree, target, max_bytes=1 << 40, owner=os.getuid())
                else:
                    subprocess.run(["cp", "-a", tree, target], check=True)
                took.append(time.perf_counter() - t)
                shutil.rmtree(target)
        shutil.rmtree(tree)
        medians = {k: statistics.median(v) for k, v in times.items()}
        out.append({"tree": name, "files": files, "bytes": size, "runs": times, "median_s": medians,
                    "ratio": medians["copy_sealed"] / medians["cp -a"]})  # fmt: skip
        print(f"{name}: {files} files, {size / 1e6:.0f} MB: copy_sealed {medians['copy_sealed']:.3f} s, "
              f"cp -a {medians['cp -a']:.3f} s", file=sys.stderr)  # fmt: skip
    return out


def lookup_costs(asks: int, scratch: str) -> dict[str, Any]:
    """Seconds of a sealed environment's look-up through the store, and of ``find`` (the reference)."""
    from tlaunch.control.starting.sealedenv import SEALER_VARIABLE
    from tlaunch.runtime.pyenv import MARKER, env_dir
    from tlaunch.server.envstore import EnvStore
    from tlaunch.server.unixusers import UnixUsers
    from tlaunch.testing.accounts import TestAccounts

    home = os.path.join(scratch, "home")
    os.makedirs(home, mode=0o711)
    os.chmod(scratch, 0o711)
    with TestAccounts("bench") as accounts:
        account = accounts["bench"]
        unix = UnixUsers(home, [account.name])
        unix.prepare()
        store = EnvStore(unix, max_bytes=1 << 30)
        store.start()
        try:
            sealed = env_dir(unix.envs_of(account.name), "bench-key")  # as the asker names it
            os.makedirs(os.path.join(sealed, "bin"))
            with open(os.path.join(sealed, MARKER), "w") as f:
                json.dump({"key": "bench-key", "bytes": 0}, f)
            own = os.path.join(home, "users", account.name, "envs")  # an environment of the account's own
            made = env_dir(own, "bench-key")
            os.makedirs(os.path.join(made, "bin"))
            for path in (os.path.join(made, MARKER), os.path.join(made, "bin", "python")):
                open(path, "w").close()
            for top in (own, made, os.path.join(made, "bin")):
                os.chown(top, account.uid, account.gid)
            for path in (os.path.join(made, MARKER), os.path.join(made, "bin", "python")):
                os.chown(path, account.uid, account.gid)
            os.symlink(sys.executable, os.path.join(sealed, "bin", "python"))
            done = subprocess.run(
                [sys.executable, "-c", ASKER, unix.sealer, own, str(asks)],
                capture_output=True, text=True, check=True, cwd="/",
                env={"PATH": os.environ["PATH"], "HOME": account.home, SEALER_VARIABLE: unix.sealer,
                     "PYTHONPATH": os.path.dirname(HERE)},
                **account.drop(),
            )  # fmt: skip
        finally:
            store.close()
    said = json.loads(done.stdout)
    out: dict[str, Any] = {"asks": asks}
    for name, values in said.items():
        values.sort()
        out[name] = {
            "median_ms": statistics.median(values) * 1e3,
            "p99_ms": values[int(len(values) * 0.99)] * 1e3,
        }
    print(f"look-up: sealed {out['sealed']['median_ms']:.3f} ms, find {out['find']['median_ms']:.3f} ms",
          file=sys.stderr)  # fmt: skip
    return out


def plot(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    seals = result["seal"]
    names = [f"{s['tree']}\n{s['files']} files, {s['bytes'] / 1e6:.0f} MB" for s in seals]
    width = 0.38
    for i, what in enumerate(("copy_sealed", "cp -a")):
        xs = [g + (i - 0.5) * width for g in range(len(seals))]
        bars = left.bar(xs, [s["median_s"][what] for s in seals], width, label=what)
        left.bar_label(bars, labels=[f"{s['median_s'][what]:.3g}" for s in seals], fontsize=7)
    left.set_xticks(range(len(seals)), names)
    left.set_yscale("log")
    left.set_ylabel("seconds (median)")
    left.set_title("sealing an environment, once (root's copy vs cp -a)")
    left.legend()
    look = result["lookup"]
    labels = ["sealed store\n(socket, lock)", "pyenv.find\n(one account)"]
    values = [look["sealed"]["median_ms"], look["find"]["median_ms"]]
    bars = right.bar(labels, values)
    right.bar_label(bars, labels=[f"{v:.3g} ms (p99 {look[k]['p99_ms']:.3g})" for v, k in
                                  zip(values, ("sealed", "find"), strict=True)], fontsize=7)  # fmt: skip
    right.set_ylabel("milliseconds (median)")
    right.set_title(f"finding a built environment, per job ({look['asks']} asks)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--asks", type=int, default=200)
    p.add_argument("--out", default=os.path.join(HERE, "results", "envseal.json"))
    args = p.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("run it as root: the seal and the store are root's (tlaunch server --unix-users)")
    scratch = tempfile.mkdtemp(prefix="envseal-", dir="/var/tmp")
    try:
        result = {"python": sys.executable, "seal": seal_costs(args.runs, scratch),
                  "lookup": lookup_costs(args.asks, scratch)}  # fmt: skip
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.splitext(args.out)[0] + ".png")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
