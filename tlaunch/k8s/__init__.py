"""Kubernetes: the LPJob resource, what it becomes, its operator, TPods, and where a process runs.

* :mod:`tlaunch.k8s.crd` defines ``lpjobs.tlaunch.io``; :mod:`tlaunch.k8s.children`
  turns an LPJob into its pods, headless service, hostfile and PodGroup;
  :mod:`tlaunch.k8s.status` gives its status from its pods. All three are pure:
  they build manifests and statuses, they reach no cluster.
* :mod:`tlaunch.k8s.operator` is the LPJob operator (kopf): it makes an LPJob's
  children and follows its pods (``python -m tlaunch.k8s.operator``).
* :mod:`tlaunch.k8s.deploy` gives the manifests that install the operator and
  make a user's TPod (pure); :mod:`tlaunch.k8s.incluster` finds, in a pod, its
  namespace and ``/TData`` claim (``tlaunchrun`` run inside a TPod).
* :mod:`tlaunch.k8s.client` is the one place that finds a cluster's
  credentials (a kubeconfig, or a pod's service account), for every client.
* :mod:`tlaunch.k8s.pod` is what the pods of a Launchpad program run; the
  backend that launches programs as LPJobs is :mod:`tlaunch.backends.k8s`.

Creating an LPJob is as powerful as creating pods in its namespace (the
operator makes them): grant ``create`` on ``lpjobs`` only to whom may create
pods there (``docs/security.md``).
"""
