"""Kubernetes: the LPJob resource, what it becomes, and (next) its operator.

:mod:`tlaunch.k8s.crd` defines ``lpjobs.tlaunch.io``; :mod:`tlaunch.k8s.children`
turns an LPJob into its pods, headless service, hostfile and PodGroup. Both are
pure: they build manifests, they reach no cluster.
"""
