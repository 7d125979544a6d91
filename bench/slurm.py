"""SLURM backend benchmark on the SLURM test cluster (2 nodes), tlaunch against plain SLURM in the same run.

    python bench/slurm.py [--reps 5] [--out bench/results/slurm.json]
    python bench/slurm.py --baseline DIR [--rounds 3] [--reps 9]   # first replies, two trees

With ``--baseline DIR`` (a folder holding another ``tlaunch/`` package, e.g.
``git archive COMMIT tlaunch | tar -x -C DIR``), only ``first_reply`` is
measured, for both trees in alternating allocations, each beside plain srun.

* ``first_reply``: inside ``salloc -N2``, seconds from ``launch(program,
  launch_type="slurm", wait=False)`` to the first reply of a node on each of the
  two nodes (a CourierNode each, called from the launcher). Reference: a plain
  ``srun -N1 -n1 -w NODE --overlap`` of the same Python (importing tlaunch, so
  the import cost is on both sides) on each node at once, timed to its first
  line of output.
* ``submit_to_running``: seconds from submitting to SLURM reporting RUNNING:
  ``launch(..., submit=True)`` (checks, script, sbatch) against ``sbatch --wrap``
  of a one-line script; both polled with ``scontrol show job`` every 20 ms.
* ``submit_to_done``: the same, to the job's end (a program of 2 nodes that
  return at once against ``sbatch --wrap 'srun -N2 python -c pass'``).

Medians of ``--reps``. Needs root (the cluster's nodes are network namespaces)
and Debian's slurmctld, slurmd, slurm-client and munge.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class Echo:
    def ping(self) -> str:
        import socket

        return socket.gethostname()


def _inner(reps: int) -> dict[str, Any]:
    """Run inside the allocation: tlaunch's first replies and plain srun, alternating."""
    from tlaunch import lp_ssh as lp

    nodes = ["th1", "th2"]
    tl, plain = [], []
    for _ in range(reps):
        program = lp.Program("echo")
        handles = [
            program.add_node(lp.CourierNode(Echo).to_host(n), label=f"echo{i}") for i, n in enumerate(nodes)
        ]
        t0 = time.perf_counter()
        run = lp.launch(program, launch_type="slurm", wait=False, terminal="output_to_files")
        answers = [h.dereference().ping() for h in handles]
        tl.append(time.perf_counter() - t0)
        assert answers == nodes, answers
        run.stop()

        t0 = time.perf_counter()
        code = "import tlaunch.runtime.node_main, socket; print(socket.gethostname(), flush=True)"
        procs = []
        for n in nodes:
            argv = ["srun", "-N1", "-n1", f"-w{n}", "--overlap", "--quiet", sys.executable, "-c", code]
            procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
        got = [p.stdout.readline().strip() for p in procs if p.stdout is not None]
        plain.append(time.perf_counter() - t0)
        assert got == nodes, got
        for p in procs:
            p.wait()
    return {"tlaunch": tl, "srun": plain}


def _poll(job_id: str, env: dict[str, str], until: tuple[str, ...]) -> str:
    while True:
        argv = ["scontrol", "show", "-o", "job", job_id]
        out = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
        state = next((f.split("=", 1)[1] for f in out.stdout.split() if f.startswith("JobState=")), "")
        if state in until:
            return state
        time.sleep(0.02)


def _submissions(cluster: Any, reps: int) -> dict[str, Any]:
    from tlaunch import lp_ssh as lp

    env = cluster.env
    os.environ["SLURM_CONF"] = cluster.conf
    os.environ["TLAUNCH_HOME"] = os.path.join(cluster.shared_dir, "home")
    ended = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL")
    out: dict[str, list[float]] = {
        k: [] for k in ("tlaunch_running", "sbatch_running", "tlaunch_done", "sbatch_done")
    }
    for _ in range(reps):
        program = lp.Program("quick")
        for i in range(2):
            program.add_node(lp.PyNode(int, "1"), label=f"n{i}")
        t0 = time.perf_counter()
        job = lp.launch(program, launch_type="slurm", submit=True, nodes=2)
        _poll(job.job_id, env, ("RUNNING", *ended))
        out["tlaunch_running"].append(time.perf_counter() - t0)
        assert _poll(job.job_id, env, ended) == "COMPLETED", job.logs()
        out["tlaunch_done"].append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        argv = ["sbatch", "--parsable", "-N2", f"--output={cluster.shared_dir}/plain-%j.out",
                f"--wrap=srun -N2 {sys.executable} -c pass"]  # fmt: skip
        job_id = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout.strip()
        _poll(job_id, env, ("RUNNING", *ended))
        out["sbatch_running"].append(time.perf_counter() - t0)
        assert _poll(job_id, env, ended) == "COMPLETED"
        out["sbatch_done"].append(time.perf_counter() - t0)
    return out


def _first_replies(cluster: Any, tree: str, reps: int) -> dict[str, list[float]] | None:
    """``reps`` first replies of tlaunch (the one in ``tree``) and of plain srun, in one allocation."""
    done = subprocess.run(
        ["salloc", "-N2", sys.executable, os.path.abspath(__file__), "--inner", f"--reps={reps}"],
        env={**cluster.env, "PYTHONPATH": tree}, capture_output=True, text=True, timeout=600, check=False,
        cwd=cluster.shared_dir,  # not a checkout: `python -m`/`-c` put the cwd first on sys.path
    )  # fmt: skip
    if done.returncode != 0:
        print(done.stdout, done.stderr, file=sys.stderr)
        return None
    got: dict[str, list[float]] = json.loads(done.stdout.strip().splitlines()[-1])
    return got


def _against(cluster: Any, baseline: str, args: argparse.Namespace) -> int:
    """First replies of this tree and of ``baseline``, alternating allocations, each beside srun."""
    med = statistics.median
    rounds: list[dict[str, Any]] = []
    for tree in (baseline, ROOT):  # the nodes write no bytecode: a tree without any compiles at each start
        compileall.compile_dir(os.path.join(tree, "tlaunch"), quiet=1)
    for r in range(args.rounds):
        for name, tree in (("before", baseline), ("tlaunch", ROOT)):
            got = _first_replies(cluster, tree, args.reps)
            if got is None:
                return 1
            # The first launch of a process pays its imports and key making: not counted.
            tl, plain = med(got["tlaunch"][1:]), med(got["srun"][1:])
            rounds.append(
                {"round": r, "variant": name, "tlaunch_s": tl, "srun_s": plain, "ratio": tl / plain}
            )
            print(
                name, r, {k: round(v, 4) for k, v in rounds[-1].items() if isinstance(v, float)}, flush=True
            )
    result = {
        "what": "SLURM test cluster, 2 nodes: launch to the first reply of a node on each, against "
        "plain srun in the same allocation; the trees alternating",
        "reps": args.reps,
        "baseline": baseline,
        "rounds": rounds,
        "median_ratio": {
            v: med(x["ratio"] for x in rounds if x["variant"] == v) for v in ("before", "tlaunch")
        },
    }
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.splitext(args.out)[0] + ".png")
    print("median ratio", {k: round(v, 3) for k, v in result["median_ratio"].items()})
    return 0


def plot(result: dict[str, Any], path: str) -> None:
    """A PNG of ``result``: tlaunch's first replies against plain srun's (and the goal, 1.15x
    srun); with ``--baseline``, each round's two trees beside their own srun."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4))
    if "rounds" in result:
        for variant, color in (("before", "tab:green"), ("tlaunch", "tab:red")):
            rows = [x for x in result["rounds"] if x["variant"] == variant]
            label = "baseline tree" if variant == "before" else "this tree"
            ax.plot(
                [x["round"] for x in rows],
                [x["tlaunch_s"] * 1000 for x in rows],
                "o-",
                color=color,
                label=label,
            )
            ax.plot(
                [x["round"] for x in rows], [x["srun_s"] * 1000 for x in rows], "x--", color=color,
                label=f"plain srun ({label}'s allocations)",
            )  # fmt: skip
            ax.plot(
                [x["round"] for x in rows], [1.15 * x["srun_s"] * 1000 for x in rows], ":", color=color,
                label=f"goal: 1.15x that srun ({label})",
            )  # fmt: skip
        ax.set_xlabel("round (the trees' allocations alternating)")
        ratios = result["median_ratio"]
        ax.set_title(
            f"SLURM, launch to both nodes' first replies (median of each allocation)\n"
            f"median ratio to srun: baseline {ratios['before']:.3f}, this tree {ratios['tlaunch']:.3f}",
            fontsize=10,
        )
    else:
        raw = result["raw"]["first_reply"]
        ax.boxplot([[t * 1000 for t in raw["tlaunch"]], [t * 1000 for t in raw["srun"]]])
        ax.set_xticks([1, 2], ["tlaunch", "plain srun"])
        ax.axhline(
            1.15 * result["first_reply_s"]["plain_srun"] * 1000, color="grey", linestyle=":", label="goal"
        )
        ax.set_title("SLURM, launch to both nodes' first replies", fontsize=10)
    ax.set_ylabel("ms")
    ax.legend(fontsize=7, ncol=2, loc="lower center", bbox_to_anchor=(0.5, -0.45))
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--out", default=os.path.join(HERE, "results", "slurm.json"))
    parser.add_argument("--baseline", help="a folder with another tlaunch/ package: first replies of both")
    parser.add_argument(
        "--rounds", type=int, default=3, help="with --baseline: rounds, the trees alternating"
    )
    parser.add_argument("--inner", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replot", metavar="JSON", help="only draw the plot of results written before")
    args = parser.parse_args()
    if args.replot:
        with open(args.replot) as f:
            plot(json.load(f), os.path.splitext(args.replot)[0] + ".png")
        return 0
    if args.inner:
        print(json.dumps(_inner(args.reps)))
        return 0
    sys.path.insert(0, ROOT)
    from tlaunch.testing.slurm import SlurmTestCluster, slurm_unavailable

    reason = slurm_unavailable()
    if reason:
        print(f"cannot make a SLURM test cluster here: {reason}", file=sys.stderr)
        return 1
    baseline = os.path.abspath(args.baseline) if args.baseline else None
    with SlurmTestCluster(2, also_expose=[baseline] if baseline else None) as cluster:
        if baseline:
            from trees import check_seen

            check_seen(cluster.hosts, baseline)  # a tree they do not see: they would run this checkout's
            return _against(cluster, baseline, args)
        first = _first_replies(cluster, ROOT, args.reps)
        if first is None:
            return 1
        subs = _submissions(cluster, args.reps)
    med = statistics.median
    result = {
        "what": "SLURM test cluster, 2 nodes (slurmd in network namespaces on one machine), medians",
        "reps": args.reps,
        "first_reply_s": {"tlaunch": med(first["tlaunch"]), "plain_srun": med(first["srun"])},
        "submit_to_running_s": {
            "tlaunch": med(subs["tlaunch_running"]),
            "plain_sbatch": med(subs["sbatch_running"]),
        },
        "submit_to_done_s": {"tlaunch": med(subs["tlaunch_done"]), "plain_sbatch": med(subs["sbatch_done"])},
        "raw": {"first_reply": first, "submissions": subs},
    }
    for key in ("first_reply_s", "submit_to_running_s", "submit_to_done_s"):
        pair = list(result[key].values())
        result[key]["ratio"] = pair[0] / pair[1]
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    plot(result, os.path.splitext(args.out)[0] + ".png")
    for key in ("first_reply_s", "submit_to_running_s", "submit_to_done_s"):
        print(key, {k: round(v, 3) for k, v in result[key].items()})
    return 0


if __name__ == "__main__":
    sys.exit(main())
