"""Starting jobs: where a job goes (a target), how its launch method runs, what its launcher does.

Beside run control (:mod:`tlaunch.control.runs`: what happens to a run once it
has started), this folder starts them: :func:`submission.submit` places a
:class:`~tlaunch.jobs.JobSpec` on a target (hosts, a SLURM cluster, Kubernetes),
:mod:`.jobmain` is what a detached job's launcher runs, :mod:`.envs` builds a
job's runtime environment on each host, :mod:`.jobenv` is the clean
environment a server's jobs start with, and :mod:`.programs` runs the
``program`` and ``function`` methods.
"""
