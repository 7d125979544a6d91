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
sent (:class:`tlaunch.jobs.JobSpec`). The cluster is the kubeconfig's
(``$KUBECONFIG``), or in a pod its service account's; the operator (``tlaunch
k8s manifests | kubectl apply -f -``) does the rest. Run inside a TPod (the
seed's way), the job goes to the pod's namespace with the pod's ``/TData``
claim and the current folder's place in it as working directory, unless
``--namespace``/``--tdata_claim`` say otherwise (:mod:`tlaunch.k8s.incluster`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

from tlaunch.cli.torch import env_pairs
from tlaunch.errors import LaunchError
from tlaunch.extras import require
from tlaunch.jobs import JobSpec
from tlaunch.k8s.children import LABEL_JOB, children
from tlaunch.k8s.crd import GPU_STACKS, GROUP, PLURAL, PULL_POLICIES, RESTART_POLICIES, VERSION
from tlaunch.k8s.incluster import here, load_config

__all__ = ["main", "parser"]

_INSTALL = "tlaunchrun needs the kubernetes client: pip install 'tlaunch[k8s]'"


def _flag(p: argparse._ActionsContainer, name: str, **kw: Any) -> None:
    """``--some_name`` (the seed's spelling) and ``--some-name`` alike."""
    names = [f"--{name}"] + ([f"--{name.replace('_', '-')}"] if "_" in name else [])
    p.add_argument(*names, dest=name, **kw)


class _Group:
    """An argument group whose arguments default to SUPPRESS (given again after the method)."""

    def __init__(self, group: argparse._ArgumentGroup, suppress: bool) -> None:
        self._group, self._suppress = group, suppress

    def add_argument(self, *names: str, **kw: Any) -> None:
        kw.pop("required", None)
        if self._suppress:
            kw["default"] = argparse.SUPPRESS
        self._group.add_argument(*names, **kw)


def _job_arguments(p: argparse.ArgumentParser, suppress: bool = False) -> None:
    g: Any = _Group(p.add_argument_group("the job (before or after the launch method)"), suppress)
    _flag(g, "lpjob_name", required=True, help="the job's name: lower case, digits, '-' (e.g. ppo-run-1)")
    _flag(g, "namespace", help="the job's namespace (default: in a pod its own, else default)")
    _flag(g, "image", required=True, help="the image of every pod (e.g. pytorch/pytorch:2.4.0)")
    _flag(
        g,
        "image_pull_policy",
        default="IfNotPresent",
        metavar="{" + ",".join(PULL_POLICIES) + "}",
        help="when the kubelet pulls the image: Always (resolve the tag every start), IfNotPresent "
        "(only when missing; default), Never (the image must be on the node)",
    )
    _flag(g, "gpu", type=int, default=0, help="GPUs per pod")
    _flag(g, "gpu_memory", type=int, help="MiB of each GPU (vGPU: a share of its memory)")
    _flag(g, "gpu_cores", type=int, help="percent of each GPU's cores, 1-100 (vGPU)")
    _flag(
        g,
        "gpu_stack",
        default="hami",
        metavar="{" + ",".join(GPU_STACKS) + "}",
        help="the cluster's vGPU stack: hami (nvidia.com/gpu, gpumem, gpucores; default) or volcano "
        "(volcano.sh/vgpu-number, -memory, -cores)",
    )
    _flag(g, "gang", action="store_true", help="gang scheduling with Volcano: no pod starts until all can")
    _flag(
        g,
        "set_save_path",
        action="store_true",
        help="make /TData/models/<job> and add --save_path pointing at it to every trainer's arguments",
    )
    _flag(
        g,
        "set_checkpoint_path",
        action="store_true",
        help="add --checkpoint_path /TData/models/<job>/last.tar.gz to every trainer's arguments "
        "(checkpoints for restarts and elasticity)",
    )
    _flag(
        g,
        "tdata_claim",
        help="the persistent volume claim mounted at /TData (the user's TPod claim; in a TPod, found there)",
    )
    _flag(
        g,
        "restart_policy",
        default="Never",
        metavar="{" + ",".join(RESTART_POLICIES) + "}",
        help="Never (a failed pod fails the job; default) or OnFailure (the operator replaces it)",
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
    for method, text in (
        ("basic", "N trainer pods with RANK and WORLD_SIZE; the program shares what it needs"),
        ("torchrun", "torch's elastic agent in every pod, c10d rendezvous through the job's service"),
        ("deepspeed", "DeepSpeed's per-node launcher in every pod, with the job's hostfile"),
    ):
        p = sub.add_parser(method, help=text, description=text)
        _job_arguments(p, suppress=True)
        if method == "torchrun":  # (the seed's torchrun has none: its pods follow --nnodes)
            _flag(p, "num_trainer", type=int, default=0, help="trainer pods (default: the MAX of --nnodes)")
        else:
            _flag(p, "num_trainer", type=int, default=1, help="trainer pods (one per node)")
        if method == "basic":
            _flag(
                p,
                "set_share_file",
                action="store_true",
                help="TLAUNCH_SHARE_FILE points at a file all trainers see",
            )
        if method == "torchrun":
            _flag(p, "nnodes", help="N or MIN:MAX nodes (elastic): MAX pods (default: 1)")
            _flag(p, "max_restarts", type=int, default=0, help="restarts of the worker group")
        if method in ("torchrun", "deepspeed"):
            _flag(p, "nproc_per_node", type=int, default=1, help="workers per pod (usually its GPUs)")
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
        p.add_argument("-n", "--namespace", default="default")
    return top


def _spec(args: argparse.Namespace) -> JobSpec:
    needed = (
        ("lpjob_name", "image") if getattr(args, "backend", "kubernetes") == "kubernetes" else ("lpjob_name",)
    )
    missing = [f"--{n}" for n in needed if not getattr(args, n, None)]
    if missing:
        raise LaunchError(f"{' and '.join(missing)} must be given (e.g. --lpjob_name ppo --image repo/img:1)")
    env = env_pairs(args.env)
    script = [s for s in args.script if s != "--"] if args.script else []
    if not script:
        raise LaunchError(
            f"{args.command}: give the trainer's program last, e.g. `{args.command} ... train.py --lr 3e-4`"
        )
    namespace, claim, working_dir = args.namespace or "default", args.tdata_claim, None
    pod = here() if getattr(args, "backend", "kubernetes") == "kubernetes" else None
    if pod is not None:  # in a pod (a TPod): its namespace, its /TData claim, this folder in it
        namespace = args.namespace or pod.namespace
        if namespace == pod.namespace and claim in (None, pod.tdata_claim):
            claim = pod.tdata_claim
            working_dir = pod.working_dir(os.getcwd()) if claim else None
    return JobSpec(
        lpjob_name=args.lpjob_name,
        script=script,
        image=args.image or "none",
        namespace=namespace,
        image_pull_policy=args.image_pull_policy,
        method=args.command,
        num_trainer=args.num_trainer,
        set_share_file=getattr(args, "set_share_file", False),
        nnodes=getattr(args, "nnodes", None),
        nproc_per_node=getattr(args, "nproc_per_node", 1),
        max_restarts=getattr(args, "max_restarts", 0),
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
        backend=getattr(args, "backend", "kubernetes"),
    )


def _dump(docs: list[dict[str, Any]], output: str) -> str:
    if output == "json":
        return json.dumps(
            docs[0] if len(docs) == 1 else {"kind": "List", "apiVersion": "v1", "items": docs}, indent=2
        )
    yaml = require("yaml", "tlaunchrun --dry-run -o yaml (or use -o json)")
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def _client() -> Any:
    try:
        import kubernetes
    except ImportError:
        raise SystemExit(_INSTALL) from None
    try:
        load_config(kubernetes)
    except (kubernetes.config.ConfigException, OSError) as exc:
        raise SystemExit(f"tlaunchrun: no cluster to talk to ({exc}); set KUBECONFIG") from None
    return kubernetes


def _submit(args: argparse.Namespace) -> int:
    spec = _spec(args)
    if args.backend == "slurm":
        from tlaunch.cli.tlaunchrun_slurm import submit_slurm

        return submit_slurm(args, spec)
    lpjob = spec.to_lpjob()
    if args.dry_run:
        docs = [lpjob]
        if args.show_children:
            docs += children({**lpjob, "metadata": {**lpjob["metadata"], "uid": "<the LPJob's uid>"}})
        print(_dump(docs, args.output))
        return 0
    k = _client()
    try:
        made = k.client.CustomObjectsApi().create_namespaced_custom_object(
            GROUP, VERSION, spec.namespace, PLURAL, lpjob
        )
    except k.client.ApiException as exc:
        raise SystemExit(
            f"tlaunchrun: the cluster refused LPJob {args.lpjob_name!r}: "
            f"{exc.status} {exc.reason}: {exc.body}"
        ) from None
    print(f"lpjob.{GROUP}/{made['metadata']['name']} created in namespace {spec.namespace}")
    return 0


def _ls(args: argparse.Namespace) -> int:
    k = _client()
    api = k.client.CustomObjectsApi()
    if args.namespace:
        items = api.list_namespaced_custom_object(GROUP, VERSION, args.namespace, PLURAL)["items"]
    else:
        items = api.list_cluster_custom_object(GROUP, VERSION, PLURAL)["items"]
    rows = [("NAMESPACE", "NAME", "STATE", "ROLES", "RESTARTS")]
    for job in items:
        st = job.get("status") or {}
        meta = job["metadata"]
        rows.append(
            (
                meta["namespace"],
                meta["name"],
                st.get("phase", ""),
                st.get("rolesReady", ""),
                str(st.get("restarts", 0)),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("   ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    return 0


def _status(args: argparse.Namespace) -> int:
    k = _client()
    try:
        job = k.client.CustomObjectsApi().get_namespaced_custom_object(
            GROUP, VERSION, args.namespace, PLURAL, args.name
        )
    except k.client.ApiException as exc:
        raise SystemExit(
            f"tlaunchrun: no LPJob {args.name!r} in namespace {args.namespace} ({exc.status})"
        ) from None
    st = job.get("status") or {}
    print(
        f"{args.name}: {st.get('phase', 'unknown')} "
        f"({st.get('rolesReady', '?')} ready, {st.get('restarts', 0)} restarts)"
    )
    if st.get("reason"):
        print(f"  {st['reason']}")
    pods = (
        k.client.CoreV1Api()
        .list_namespaced_pod(args.namespace, label_selector=f"{LABEL_JOB}={args.name}")
        .items
    )
    for pod in pods:
        print(f"  pod {pod.metadata.name}: {pod.status.phase if pod.status else 'unknown'}")
    return 0


def _logs(args: argparse.Namespace) -> int:
    k = _client()
    core = k.client.CoreV1Api()
    pods = core.list_namespaced_pod(args.namespace, label_selector=f"{LABEL_JOB}={args.name}").items
    if not pods:
        raise SystemExit(f"tlaunchrun: LPJob {args.name!r} has no pods in namespace {args.namespace}")
    for pod in pods:
        text = core.read_namespaced_pod_log(pod.metadata.name, args.namespace)
        for line in str(text).splitlines():
            print(f"[{pod.metadata.name}] {line}")
    return 0


def _delete(args: argparse.Namespace) -> int:
    k = _client()
    try:
        k.client.CustomObjectsApi().delete_namespaced_custom_object(
            GROUP, VERSION, args.namespace, PLURAL, args.name
        )
    except k.client.ApiException as exc:
        raise SystemExit(
            f"tlaunchrun: cannot delete LPJob {args.name!r}: {exc.status} {exc.reason}"
        ) from None
    print(f"lpjob.{GROUP}/{args.name} deleted (the operator removes its pods)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run ``tlaunchrun``."""
    args = parser().parse_args(argv)
    try:
        handler = {"ls": _ls, "status": _status, "logs": _logs, "delete": _delete}.get(args.command, _submit)
        return handler(args)
    except LaunchError as exc:
        print(f"tlaunchrun: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
