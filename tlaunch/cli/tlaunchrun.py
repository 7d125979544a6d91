"""``tlaunchrun``: submit a distributed job to Kubernetes as an LPJob, and follow it.

::

    tlaunchrun --lpjob_name ppo --image repo/img:1 --gpu 1 --gpu_memory 8000 \\
        torchrun --nnodes 2:4 --nproc_per_node 8 train.py --lr 3e-4
    tlaunchrun --lpjob_name ppo --image repo/img:1 --dry-run -o yaml basic --num_trainer 2 train.py
    tlaunchrun ls | status ppo | logs ppo | delete ppo

Every argument of the seed (``lpjob_name``, ``namespace``, ``image``,
``image_pull_policy``, ``gpu``, ``gpu_memory``, ``gpu_cores``,
``set_save_path``, ``set_checkpoint_path``; the launch method ``basic``,
``torchrun`` or ``deepspeed`` with its own) is checked before anything is
sent (:class:`tlaunch.jobs.JobSpec`). The methods' commands and their flags
come from the method table (:data:`tlaunch.runtime.methods.METHODS`: those
that run in pods, each with its settings: ``command`` too). The cluster is the one
:mod:`tlaunch.k8s.client` finds (``$KUBECONFIG``, the pod's service account,
``~/.kube/config``); the operator (``tlaunch k8s manifests | kubectl apply -f
-``) does the rest. Run inside a TPod (the seed's way), the job goes to the
pod's namespace with the pod's ``/TData`` claim and the current folder's place
in it as working directory, unless ``--namespace``/``--tdata_claim`` say
otherwise (:mod:`tlaunch.k8s.incluster`). Every command is a renderer over
:mod:`tlaunch.control`: submitting is ``control.submit(job, Kubernetes())``
(the job is recorded in the run store: ``tlaunch ps`` lists it), and ``ls``,
``status``, ``logs`` and ``delete`` read an LPJob as a run
(``control.list_lpjobs``, ``find_lpjob``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from typing import Any

from tlaunch import control
from tlaunch.backends.k8s import pod_phase
from tlaunch.cli.methods import setting_flag
from tlaunch.cli.tlaunchrun_slurm import submit_slurm
from tlaunch.cli.torch import env_pairs
from tlaunch.errors import LaunchError, TLaunchError
from tlaunch.extras import require
from tlaunch.jobs import JobSpec
from tlaunch.k8s.children import children
from tlaunch.k8s.client import namespace_of
from tlaunch.k8s.crd import GPU_STACKS, GROUP, PULL_POLICIES, RESTART_POLICIES
from tlaunch.k8s.incluster import InPod, here
from tlaunch.runtime.methods import METHODS, SETTINGS, get_method

__all__ = ["main", "parser"]


def _flag(p: argparse._ActionsContainer, name: str, **kw: Any) -> None:
    """``--some_name`` (the seed's spelling) and ``--some-name`` alike."""
    names = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    p.add_argument(*names, **{"dest": name, **kw})


class _Group:
    """An argument group whose arguments default to SUPPRESS (given again after the method)."""

    def __init__(self, group: argparse._ArgumentGroup, suppress: bool) -> None:
        self._group, self._suppress = group, suppress

    def add_argument(self, *names: str, **kw: Any) -> None:
        kw.pop("required", None)
        if self._suppress:
            kw["default"] = argparse.SUPPRESS
        self._group.add_argument(*names, **kw)


def _choice(
    p: argparse._ActionsContainer, name: str, choices: tuple[str, ...], default: str, text: str
) -> None:
    """``--name`` taking one of ``choices``."""
    _flag(p, name, default=default, metavar="{" + ",".join(choices) + "}", help=text)


def _job_arguments(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    g: Any = _Group(p.add_argument_group("the job (before or after the launch method)"), suppress)
    _flag(g, "lpjob_name", required=True, help="the job's name: lower case, digits, '-' (e.g. ppo-run-1)")
    _flag(g, "namespace", help="the job's namespace (default: the credentials' own: in a pod its own, "
          "else the kubeconfig context's, else default)")  # fmt: skip
    _flag(g, "image", required=True, help="the image of every pod (e.g. pytorch/pytorch:2.4.0)")
    _choice(
        g,
        "image_pull_policy",
        PULL_POLICIES,
        "IfNotPresent",
        "when the kubelet pulls the image: Always (resolve the tag every start), IfNotPresent "
        "(only when missing; default), Never (the image must be on the node)",
    )
    _flag(g, "gpu", type=int, default=0, help="GPUs per pod")
    _flag(g, "gpu_memory", type=int, help="MiB of each GPU (vGPU: a share of its memory)")
    _flag(g, "gpu_cores", type=int, help="percent of each GPU's cores, 1-100 (vGPU)")
    _choice(
        g,
        "gpu_stack",
        GPU_STACKS,
        "hami",
        "the cluster's vGPU stack: hami (nvidia.com/gpu, gpumem, gpucores; default) or volcano "
        "(volcano.sh/vgpu-number, -memory, -cores)",
    )
    _flag(g, "gang", action="store_true", help="gang scheduling with Volcano: no pod starts until all can")
    _flag(
        g,
        "set_save_path",
        action="store_true",
        help="make a folder for the model and add --save_path pointing at it to every trainer's arguments: "
        "/TData/models/<job> in pods, ./tlaunch-models/<job> of this folder on SLURM",
    )
    _flag(
        g,
        "set_checkpoint_path",
        action="store_true",
        help="add --checkpoint_path <that folder>/last.tar.gz to every trainer's arguments "
        "(checkpoints for restarts and elasticity)",
    )
    _flag(
        g,
        "tdata_claim",
        help="the persistent volume claim mounted at /TData (the user's TPod claim; in a TPod, found there)",
    )
    _choice(
        g,
        "restart_policy",
        RESTART_POLICIES,
        "Never",
        "Never (a failed pod fails the job; default) or OnFailure (the operator replaces it)",
    )
    _flag(g, "backoff_limit", type=int, default=0, help="restarts allowed with OnFailure")
    _flag(
        g,
        "env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="an environment variable of every pod",
    )
    g.add_argument(
        "--backend",
        choices=("kubernetes", "slurm"),
        default="kubernetes",
        help="kubernetes (an LPJob; default) or slurm (an sbatch job running the method on its nodes)",
    )
    _flag(g, "partition", help="slurm: the partition")
    _flag(g, "time", help="slurm: the time limit ('1:00:00')")
    _flag(g, "account", help="slurm: the account")
    _flag(g, "qos", help="slurm: the QOS")
    _flag(g, "sbatch_arg", action="append", default=[], help="slurm: one more sbatch option (repeatable)")
    g.add_argument("--dry-run", action="store_true", help="print what would be created; create nothing")
    g.add_argument("-o", "--output", choices=("yaml", "json"), default="yaml", help="the --dry-run format")
    g.add_argument(
        "--show-children",
        action="store_true",
        help="with --dry-run: also print what the operator will create from the LPJob (pods, service...)",
    )


def parser() -> argparse.ArgumentParser:
    """The ``tlaunchrun`` argument parser."""
    top = argparse.ArgumentParser(
        prog="tlaunchrun",
        description="Submit a distributed job (an LPJob) to Kubernetes, and follow it.",
        epilog="The job's arguments come before the launch method; the trainer's program and its "
        "arguments come last.",
    )
    _job_arguments(top)
    sub = top.add_subparsers(dest="command", required=True, metavar="METHOD|COMMAND")
    for method in METHODS.values():  # those whose jobs run in pods
        if method.pods is None:
            continue
        p = sub.add_parser(method.name, help=method.summary, description=method.summary)
        _job_arguments(p, suppress=True)
        _flag(p, "num_trainer", type=int, default=0, help="trainer pods, one per node (default: 1; "
              "a method whose nodes follow a setting, such as torchrun's --nnodes, counts them)")  # fmt: skip
        for name in sorted(method.settings):
            setting_flag(p, SETTINGS[name], _flag)
        p.add_argument("script", nargs=argparse.REMAINDER, help="the trainer's program and its arguments")
    ls = sub.add_parser("ls", help="list LPJobs")
    ls.add_argument("-n", "--namespace", default=None, help="one namespace (default: all)")
    for name, text in (
        ("status", "an LPJob's state and pods"),
        ("logs", "its pods' logs"),
        ("delete", "delete it"),
    ):
        p = sub.add_parser(name, help=text)
        p.add_argument("name")
        p.add_argument(
            "-n",
            "--namespace",
            help="its namespace (default: the credentials' own: in a pod its own, else the kubeconfig's)",
        )
        if name == "logs":
            p.add_argument("-f", "--follow", action="store_true", help="follow the logs until the job ends")
    return top


def _spec(args: argparse.Namespace) -> JobSpec:
    needed = _NEEDED[args.backend]
    missing = [f"--{n}" for n in needed if not getattr(args, n, None)]
    if missing:
        raise LaunchError(f"{' and '.join(missing)} must be given (e.g. --lpjob_name ppo --image repo/img:1)")
    env = env_pairs(args.env)
    script = [s for s in args.script if s != "--"] if args.script else []
    if not script:
        raise LaunchError(
            f"{args.command}: give the trainer's program last, e.g. `{args.command} ... train.py --lr 3e-4`"
        )
    claim, working_dir = args.tdata_claim, None
    pod = _WHERE[args.backend]()
    if pod is not None and args.namespace in (None, pod.namespace) and claim in (None, pod.tdata_claim):
        claim = pod.tdata_claim  # in a pod (a TPod) whose namespace the job's is: its /TData claim,
        working_dir = pod.working_dir(os.getcwd()) if claim else None  # and this folder in it
    method = get_method(args.command)
    return JobSpec(
        lpjob_name=args.lpjob_name,
        script=script,
        image=args.image or "none",
        namespace=args.namespace,  # None: the credentials' own (in a pod: its own)
        image_pull_policy=args.image_pull_policy,
        method=method.name,
        num_trainer=args.num_trainer,
        gpu=args.gpu,
        gpu_memory=args.gpu_memory,
        gpu_cores=args.gpu_cores,
        gpu_stack=args.gpu_stack,
        gang=args.gang,
        set_save_path=args.set_save_path,
        set_checkpoint_path=args.set_checkpoint_path,
        tdata_claim=claim,
        working_dir=working_dir,
        restart_policy=args.restart_policy,
        backoff_limit=args.backoff_limit,
        env=env,
        **{name: getattr(args, name) for name in method.settings},
    )


_NEEDED = {"kubernetes": ("lpjob_name", "image"), "slurm": ("lpjob_name",)}
"""The job arguments each ``--backend`` needs."""
_WHERE: dict[str, Callable[[], InPod | None]] = {"kubernetes": here, "slurm": lambda: None}
"""Where this process runs, for each ``--backend``: a pod (a TPod) gives the job's namespace and claim."""


def _dump(docs: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        return json.dumps(
            docs[0] if len(docs) == 1 else {"kind": "List", "apiVersion": "v1", "items": docs}, indent=2
        )
    yaml = require("yaml", "tlaunchrun --dry-run -o yaml (or use -o json)")
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def _submit(args: argparse.Namespace) -> int:
    return _TARGETS[args.backend](args, _spec(args))


def _submit_kubernetes(args: argparse.Namespace, spec: JobSpec) -> int:
    """The job's LPJob (``--dry-run``: printed, with what the operator makes of it)."""
    if args.dry_run:
        lpjob = spec.to_lpjob()
        lpjob["metadata"]["namespace"] = namespace_of(spec.namespace)  # where submit would create it
        docs = [lpjob]
        if args.show_children:
            docs += children({**lpjob, "metadata": {**lpjob["metadata"], "uid": "<the LPJob's uid>"}})
        print(_dump(docs, args.output))
        return 0
    run = control.submit(spec, control.Kubernetes())
    print(f"lpjob.{GROUP}/{spec.lpjob_name} created in namespace {run.snapshot().refs.get('namespace')}")
    return 0


_TARGETS: dict[str, Callable[[argparse.Namespace, JobSpec], int]] = {
    "kubernetes": _submit_kubernetes,
    "slurm": submit_slurm,
}
"""What ``--backend`` submits to."""


def _ls(args: argparse.Namespace) -> int:
    rows = [("NAMESPACE", "NAME", "STATE", "ROLES", "RESTARTS")]
    for run in control.list_lpjobs(args.namespace):
        refs = run.snapshot().refs
        rows.append((refs["namespace"], refs["lpjob"], refs["phase"], refs["roles_ready"], refs["restarts"]))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _status(args: argparse.Namespace) -> int:
    snap = control.find_lpjob(args.name, args.namespace).snapshot()
    refs = snap.refs
    ready = refs.get("roles_ready") or "?"
    print(f"{args.name}: {refs.get('phase', 'unknown')} ({ready} ready, {refs.get('restarts', 0)} restarts)")
    if snap.reason:
        print(f"  {snap.reason}")
    if snap.failure is not None and snap.failure.exception:
        print(f"  {snap.failure.node} raised {snap.failure.exception}")
    for node in snap.nodes:
        print(f"  pod {node.host}: {pod_phase(node.state)}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    for line in control.find_lpjob(args.name, args.namespace).logs(follow=args.follow):
        print(line, flush=args.follow)
    return 0


def _delete(args: argparse.Namespace) -> int:
    control.find_lpjob(args.name, args.namespace).stop()
    print(f"lpjob.{GROUP}/{args.name} deleted (the operator removed its pods)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``tlaunchrun``."""
    args = parser().parse_args(argv)
    try:
        handler = {"ls": _ls, "status": _status, "logs": _logs, "delete": _delete}.get(args.command, _submit)
        return handler(args)
    except TLaunchError as exc:
        print(f"tlaunchrun: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
