"""Plots of the bench scripts that make no plot of their own code: each writes ``<result>.png``.

    python bench/plots.py bench/results/transmit.json [...]   # a result file again, as a plot

``footprint.py``, ``k8s_operator.py``, ``launchpad_compat.py``, ``root_cause.py``,
``server.py`` and ``transmit.py`` call :func:`plot_file` on the JSON they wrote; the
kind of plot is the result's name up to its first ``_s<N>`` or ``_ab`` suffix
(``server_ab.json`` is a ``server`` result).
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable
from typing import Any


def _pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _bars(ax: Any, groups: list[str], series: dict[str, list[float]], ylabel: str, log: bool = False) -> None:
    """Grouped bars: one group per ``groups`` entry, one bar per series, each bar labelled with its value."""
    width = 0.8 / max(len(series), 1)
    for i, (name, values) in enumerate(series.items()):
        xs = [g + (i - (len(series) - 1) / 2) * width for g in range(len(groups))]
        bars = ax.bar(xs, values, width, label=name)
        ax.bar_label(bars, labels=[f"{v:.3g}" for v in values], fontsize=7)
    ax.set_xticks(range(len(groups)), groups)
    ax.set_ylabel(ylabel)
    if log:
        ax.set_yscale("log")
    ax.legend(fontsize=8)


def footprint(r: dict[str, Any], plt: Any) -> Any:
    fig, (mem, cpu) = plt.subplots(1, 2, figsize=(9, 3.5))
    parts = ["launcher_before", "launcher", "head", "supervisor", "node"]
    _bars(mem, [p.replace("_", "\n") for p in parts], {"RSS MiB": [r[p]["rss_mib"] for p in parts]}, "MiB")
    mem.set_title(f"memory, a run of {r['hosts']} hosts (supervisor, node: each)", fontsize=9)
    idle = {"launcher": r["launcher_idle_cpu_ms_per_s"], "head": r["head_idle_cpu_ms_per_s"]}
    _bars(cpu, list(idle), {"CPU ms per s": list(idle.values())}, "ms of CPU per second, idle")
    cpu.set_title(f"an idle run of {r['hosts']} hosts ({r['date'][:10]})", fontsize=9)
    return fig


def k8s_operator(r: dict[str, Any], plt: Any) -> Any:
    sizes = [k for k in r if k.isdigit()]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    series = {
        "operator (LPJob -> pods)": [r[s]["operator_s"] for s in sizes],
        "plain client loop": [r[s]["plain_client_s"] for s in sizes],
    }
    _bars(ax, [f"{s} replicas" for s in sizes], series, "seconds to all pods created (median)", log=True)
    ax.set_title(f"LPJob operator against a plain client, stand-in API server ({r['reps']} reps)", fontsize=9)
    return fig


def launchpad_compat(r: dict[str, Any], plt: Any) -> Any:
    passed = r["passed"]
    names = {
        "launchpad": "dm-launchpad 0.5.2",
        "import": "tlaunch, imports changed",
        "alias": "tlaunch, no change",
    }
    fig, ax = plt.subplots(figsize=(6, 3.2))
    modes = [m for m in names if m in passed]
    _bars(
        ax, [names[m] for m in modes], {"cases passed": [passed[m]["count"] for m in modes]}, "cases passed"
    )
    total = max(passed[m]["of"] for m in modes)
    ax.axhline(total, color="grey", linestyle=":", linewidth=1)
    ax.set_title(f"Launchpad 0.5.2's own examples and API tests ({total} cases)", fontsize=9)
    return fig


def root_cause(r: dict[str, Any], plt: Any) -> Any:
    cases = r["cases"]
    where = [w for w in ("local_mp", "ssh") if f"{w} tlaunch" in cases]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    series = {
        who: [cases[f"{w} {who}"]["raised_s_median"] or 0.0 for w in where]
        for who in ("tlaunch", "reference")
        if all(f"{w} {who}" in cases for w in where)
    }
    _bars(ax, where, series, "seconds from SIGKILL to launch() raising")
    ax.set_title(f"root cause: a node killed while another sleeps ({r['date'][:10]})", fontsize=9)
    return fig


def server(r: dict[str, Any], plt: Any) -> Any:
    if "floor" in r:  # bench/server.py since issue 44: the 1,000-job floor, and Ray Jobs when measured
        return _server_floor(r, plt)
    runs = r["runs"]
    fig, (rate, lat) = plt.subplots(1, 2, figsize=(9, 3.5))
    dbs = [run["db"] for run in runs]
    _bars(rate, dbs, {"requests/s": [run["load"]["requests_per_s"] for run in runs]}, "requests per second")
    rate.set_title(f"the job server under load, {r.get('cpus', '?')} CPUs", fontsize=9)
    calls = ["list", "status", "submit"]
    series = {f"{run['db']} p50": [run["load"][c]["p50_ms"] for c in calls] for run in runs}
    series |= {f"{run['db']} p99": [run["load"][c]["p99_ms"] for c in calls] for run in runs}
    _bars(lat, calls, series, "milliseconds")
    lat.set_title("latency per call", fontsize=9)
    return fig


def _server_floor(results: dict[str, Any], plt: Any) -> Any:
    """Times and requests/s under 50 clients (tlaunch against Ray Jobs), and the floor's costs."""
    vs = results.get("against_ray") or {}
    panels = (["times", "ray"] if vs.get("summary") else []) + ["floor"]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4.4))
    axes = axes if len(panels) > 1 else [axes]
    for ax, panel in zip(axes, panels, strict=True):
        if panel == "times":
            s = vs["summary"]
            measures = {"submit p50\n(50 at once)": ("submit_p50_ms", 1), "submit p99\n(50 at once)": ("submit_p99_ms", 1),
                     "submit\n(one client)": ("submit_one_client_p50_ms", 1),
                     "first log\nline": ("first_log_line_s", 1e3), "submit to\nSUCCEEDED": ("submit_to_succeeded_s", 1e3)}  # fmt: skip
            series = {
                name: [(s[system][k] or 0) * scale for k, scale in measures.values()]
                for name, system in (("tlaunch", "tlaunch"), (f"Ray Jobs {vs['ray_version']}", "ray"))
            }
            _bars(ax, list(measures), series, "milliseconds (median of rounds)", log=True)
            ax.tick_params(axis="x", labelsize=7)
            ax.set_title("submit and start (lower is better; targets: submit p50 < 50 ms, p99 < 200 ms)",
                         fontsize=9)  # fmt: skip
        elif panel == "ray":
            s = vs["summary"]
            kinds = ["status of a running job", "list all", "list page", "cheapest GET"]
            xs = list(range(len(kinds)))
            ax.bar(
                [x - 0.2 for x in xs], [s["tlaunch"][f"{k} per_s"] or 0 for k in kinds], 0.4, label="tlaunch"
            )
            ax.bar([x + 0.2 for x in xs], [s["ray"][f"{k} per_s"] or 0 for k in kinds], 0.4,
                   label=f"Ray Jobs {vs['ray_version']}")  # fmt: skip
            ax.set_xticks(
                list(xs), ["status\n(running)", "list all", "list page\n(Ray: all)", "health /\n/api/version"]
            )
            ax.set_ylabel("requests/s, 50 clients (median of rounds)")
            ax.set_title(
                f"requests/s (higher is better); memory {s['tlaunch']['memory_mib']:.0f} vs "
                f"{s['ray']['memory_mib']:.0f} MiB",
                fontsize=9,
            )
            ax.legend(fontsize=8)
        else:
            runs = results["floor"]
            kinds = [k for k in runs[0]["cost_vs_health"] if k != "health"]
            width = 0.8 / len(runs)
            for i, run in enumerate(runs):
                at = [j + (i - (len(runs) - 1) / 2) * width for j in range(len(kinds))]
                ax.bar(at, [run["cost_vs_health"][k] for k in kinds], width, label=run["db"])
            ax.axhline(2.0, color="grey", linestyle="--", label="target: 2x health")
            ax.axhline(1.0, color="black", linewidth=0.8)
            ax.set_xticks(range(len(kinds)), [k.replace(" of a ", "\n") for k in kinds], fontsize=8)
            ax.set_ylabel("cost per request / health's (50 clients)")
            ax.set_title(f"{runs[0]['jobs_in_store']} jobs in the store", fontsize=9)
            ax.legend(fontsize=8)
    return fig


def transmit(r: dict[str, Any], plt: Any) -> Any:
    t = r["throughput"]
    senders = list(t)
    fig, (rate, weights) = plt.subplots(1, 2, figsize=(9, 3.5), gridspec_kw={"width_ratios": [2, 1]})
    series = {
        "insert": [t[s]["insert"] for s in senders],
        "insert_many (batches)": [t[s]["batch"] for s in senders],
        "plain RPC": [t[s]["rpc"] for s in senders],
    }
    _bars(rate, [f"{s} senders" for s in senders], series, "messages per second", log=True)
    rate.set_title("TransmitNode queue against plain RPC", fontsize=9)
    w = r["weights_64mib_8_readers_s"]
    _bars(weights, list(w), {"seconds": list(w.values())}, "seconds")
    weights.set_title("64 MiB of weights to 8 readers", fontsize=9)
    return fig


PLOTTERS: dict[str, Callable[[dict[str, Any], Any], Any]] = {
    "server_vs_ray": server,
    "footprint": footprint,
    "k8s_operator": k8s_operator,
    "launchpad_compat": launchpad_compat,
    "root_cause": root_cause,
    "server": server,
    "transmit": transmit,
}


def plot_file(path: str, kind: str | None = None) -> str:
    """Plot the result file ``path`` beside it (``.png``); returns the PNG's path."""
    kind = kind or re.sub(r"(_s\d+.*|_ab.*)$", "", os.path.splitext(os.path.basename(path))[0])
    if kind not in PLOTTERS:
        raise SystemExit(
            f"{path}: no plot for results of kind {kind!r}; kinds: {', '.join(sorted(PLOTTERS))}"
        )
    with open(path) as f:
        results = json.load(f)
    plt = _pyplot()
    fig = PLOTTERS[kind](results, plt)
    fig.tight_layout()
    png = os.path.splitext(path)[0] + ".png"
    fig.savefig(png, dpi=110)
    plt.close(fig)
    print(f"wrote {png}")
    return png


if __name__ == "__main__":
    for arg in sys.argv[1:]:
        plot_file(arg)
