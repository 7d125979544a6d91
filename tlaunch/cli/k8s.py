"""``tlaunch k8s``: the operator's manifests, the operator itself, and users' TPods."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from typing import Any

from tlaunch.extras import require
from tlaunch.k8s.deploy import OPERATOR_NAMESPACE, operator_manifests, tpod_manifests

__all__ = ["add_k8s_commands"]

DEFAULT_IMAGE = "ghcr.io/tlaunch/tlaunch:0.1.0"


def _yaml(docs: list[dict[str, Any]]) -> str:
    yaml = require("yaml", "tlaunch k8s")
    return "---\n".join(yaml.safe_dump(d, sort_keys=False) for d in docs)


def _emit(docs: list[dict[str, Any]], apply: bool) -> int:
    text = _yaml(docs)
    if not apply:
        sys.stdout.write(text)
        return 0
    done = subprocess.run(["kubectl", "apply", "-f", "-"], input=text, text=True, check=False)
    return done.returncode


def _manifests(args: argparse.Namespace) -> int:
    return _emit(operator_manifests(args.image, args.namespace), args.apply)


def _operator(args: argparse.Namespace) -> int:
    require("kopf", "the LPJob operator")
    require("kubernetes", "the LPJob operator")
    from tlaunch.k8s.operator import main

    return main([x for n in (args.namespace or []) for x in ("--namespace", n)])


def _tpod(args: argparse.Namespace) -> int:
    key = args.ssh_key
    if os.path.isfile(os.path.expanduser(key)):
        with open(os.path.expanduser(key)) as f:
            key = f.read()
    docs = tpod_manifests(
        args.user,
        key,
        args.image,
        cpu=args.cpu,
        gpu=args.gpu,
        memory=args.memory,
        storage=args.storage,
        storage_class=args.storage_class,
        gpu_resource=args.gpu_resource,
    )
    return _emit(docs, args.apply)


def add_k8s_commands(sub: Any) -> None:
    """Add ``tlaunch k8s manifests|operator|tpod create``."""
    k8s = sub.add_parser("k8s", help="Kubernetes: install the LPJob operator, run it, make TPods")
    ks = k8s.add_subparsers(dest="k8s_command", required=True)
    man = ks.add_parser(
        "manifests",
        help="print the operator's CRD, RBAC and Deployment (| kubectl apply -f -)",
        description="The LPJob CRD, the operator's namespace, service account, least-privilege ClusterRole "
        "and Deployment. Install with: tlaunch k8s manifests | kubectl apply -f -",
    )
    man.add_argument("--image", default=DEFAULT_IMAGE, help="an image with tlaunch[k8s] installed")
    man.add_argument("--namespace", default=OPERATOR_NAMESPACE, help="the operator's namespace")
    man.add_argument("--apply", action="store_true", help="kubectl apply them instead of printing")
    man.set_defaults(func=_manifests)
    op = ks.add_parser("operator", help="run the operator here (with the kubeconfig's cluster)")
    op.add_argument("--namespace", "-n", action="append", help="watch these namespaces (default: all)")
    op.set_defaults(func=_operator)
    tpod = ks.add_parser("tpod", help="a user's TPod: namespace, quota, /TData claim, SSH development pod")
    tps = tpod.add_subparsers(dest="tpod_command", required=True)
    create = tps.add_parser("create", help="print (or --apply) a user's TPod")
    create.add_argument("user", help="the user's name (a DNS label, e.g. alice)")
    create.add_argument(
        "--ssh-key", required=True, help="the user's public key, or a file holding it (~/.ssh/id_ed25519.pub)"
    )
    create.add_argument("--cpu", default="8", help="CPU quota (default 8)")
    create.add_argument("--gpu", type=int, default=0, help="GPU quota (default 0)")
    create.add_argument("--memory", default="32Gi", help="memory quota (default 32Gi)")
    create.add_argument("--storage", default="100Gi", help="the /TData claim's size (default 100Gi)")
    create.add_argument("--storage-class", help="the claim's storage class (ReadWriteMany)")
    create.add_argument("--gpu-resource", default="nvidia.com/gpu", help="the GPU resource name of the quota")
    create.add_argument(
        "--image", default=DEFAULT_IMAGE, help="the development pod's image (tlaunch and sshd)"
    )
    create.add_argument("--apply", action="store_true", help="kubectl apply them instead of printing")
    create.set_defaults(func=_tpod)
