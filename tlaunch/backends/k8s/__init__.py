"""Kubernetes: a Launchpad program as an LPJob (``launch(program, launch_type="k8s", image=...)``).

:class:`K8sBackend` places the run (the coordinator in a pod, a pod per node,
each group's pods as ``group_config`` says: :mod:`tlaunch.backends.k8s.groups`);
:class:`LPJobRun` is an LPJob as a run, whoever created it (this backend,
``tlaunchrun``, ``tlaunch.control.submit``), found again from its record or by
its name (:mod:`tlaunch.backends.k8s.lpjobs`). The kubernetes client is
imported when a cluster is first used (``pip install 'tlaunch[k8s]'``).
"""

from tlaunch.backends.k8s.backend import K8sBackend
from tlaunch.backends.k8s.groups import Config, Container, Resource, ResourceRange
from tlaunch.backends.k8s.lpjobs import find_lpjob, list_lpjobs, submit_lpjob
from tlaunch.backends.k8s.observe import pod_phase
from tlaunch.backends.k8s.options import K8sOptions
from tlaunch.backends.k8s.run import LPJobRun

__all__ = [
    "Config",
    "Container",
    "K8sBackend",
    "K8sOptions",
    "LPJobRun",
    "Resource",
    "ResourceRange",
    "find_lpjob",
    "list_lpjobs",
    "pod_phase",
    "submit_lpjob",
]
