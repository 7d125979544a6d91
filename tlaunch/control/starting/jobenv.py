"""The environment a job starts with when a server starts it: a clean one, never the server's own.

A job server holds secrets in its environment (``$TLAUNCH_SERVER_TOKEN``,
``$PGPASSWORD``, ``$TLAUNCH_SERVER_DB``, a cloud's credentials): a job that
inherited them could act as the server. :func:`job_environ` is what a job's
launcher (or ``sbatch``) is started with instead::

    server's os.environ ──▶ job_environ() ──▶ the job's launcher ──▶ its ranks (+ the job's env,
                           (a few names kept,                       RANK, WORLD_SIZE... that the
                            HOME/USER/TLAUNCH_HOME set)              launch methods add)

Kept from the server's environment: what finds programs and libraries and how
text is read (:data:`BASE`), and the names an administrator chose to pass
(``tlaunch server --job-env NAME``, shell-style patterns); set: ``HOME``,
``USER``, ``LOGNAME`` (the account the job runs as) and ``TLAUNCH_HOME``
(where its run is recorded). Everything else a job has comes from its spec.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence

__all__ = ["BASE", "job_environ"]

BASE = (
    "PATH",
    "LANG",
    "LANGUAGE",
    "LC_*",
    "TZ",
    "TMPDIR",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "SLURM_CONF",
)
"""What a job keeps of its server's environment (patterns): how programs, libraries, text and a cluster
are found. No secret belongs in these."""


def job_environ(
    source: Mapping[str, str],
    *,
    home: str,
    user: str,
    user_home: str,
    keep: Sequence[str] = (),
) -> dict[str, str]:
    """The environment of a job's launcher.

    Args:
        source: the server's environment.
        home: the job's ``TLAUNCH_HOME`` (where its run is recorded).
        user: the account the job runs as (``USER``, ``LOGNAME``).
        user_home: that account's home (``HOME``: its ``~/.ssh`` reaches its SSH hosts).
        keep: more names (or patterns) of ``source`` to pass on.
    """
    patterns = (*BASE, *keep)
    env = {k: v for k, v in source.items() if any(fnmatch.fnmatchcase(k, p) for p in patterns)}
    env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
    env.update(HOME=user_home, USER=user, LOGNAME=user, TLAUNCH_HOME=home)
    return env
