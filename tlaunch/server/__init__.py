"""The job server: a REST API over the run-control layer (``docs/server.md``).

``python -m tlaunch.server`` (or ``tlaunch server``) serves it; install the
``server`` extra (``pip install 'tlaunch[server]'``). Jobs run as processes
of their own (a detached launcher, or a SLURM job), never as threads of the
server: a server restarted mid-job finds each job through its run.
"""

__all__: list[str] = []
