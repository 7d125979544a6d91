"""The job server's Python client: ``Client(url, token)`` (``$TLAUNCH_SERVER``, ``$TLAUNCH_TOKEN``).

::

    from tlaunch.jobs import Client

    c = Client()                                   # $TLAUNCH_SERVER, $TLAUNCH_TOKEN
    pkg = c.upload("./quick_start")                # a folder, zipped; stored once by content
    c.submit("quickstart", pkg, entry_point="trainer.py", num_trainer=2, hosts=["gpu1", "gpu2"])
    for line in c.logs("quickstart", follow=True): # until the job ends
        print(line["text"])
    c.wait("quickstart")                           # the job, once ended

Errors of the server come back as :class:`JobServerError` (its status and message).
"""

from __future__ import annotations

import builtins
import io
import json
import os
import sys
import time
import zipfile
from collections.abc import Iterator
from typing import Any

from tlaunch.errors import TLaunchError
from tlaunch.jobs.debugging import RemoteSession, open_session
from tlaunch.jobs.errors import JobServerError
from tlaunch.runtime.debugger import SERVER_JOB
from tlaunch.ssh.ignore import walk

__all__ = ["IN_JOB", "Client", "JobServerError", "pack_dir", "submit_self"]

IN_JOB = SERVER_JOB
"""Set (to the job's name) in the environment of every process of a job the server started."""
_SKIP = ".tlaunch/"  # a run's own files, when a folder is both a package and a working directory
_ENDED = ("SUCCEEDED", "FAILED", "STOPPED", "LOST")
_PAGE = 500  # jobs per request of list(): the server's largest page


def pack_dir(path: str) -> bytes:
    """``path`` as a zip of what a launch would ship from it.

    Its ``.gitignore`` and ``.tlaunchignore`` files are honoured (a data folder
    git ignores stays here), as are VCS folders, caches and virtual environments
    (:mod:`tlaunch.ssh.ignore`).
    """
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as z:
        for entry in walk(path, lambda rel, is_dir: rel != _SKIP):
            if entry.ignored_by is None:
                z.write(entry.full, entry.path)
    return buf.getvalue()


class Client:
    """A client of one job server.

    Args:
        url: the server (default ``$TLAUNCH_SERVER``, else ``http://127.0.0.1:8765``).
        token: the user's token (default ``$TLAUNCH_TOKEN``).
        timeout: seconds a request may take (following logs has none).
    """

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 120.0) -> None:
        try:
            import httpx
        except ImportError:
            raise TLaunchError("the job server's client needs httpx: pip install 'tlaunch[server]'") from None
        self.url = (url or os.environ.get("TLAUNCH_SERVER") or "http://127.0.0.1:8765").rstrip("/")
        token = token or os.environ.get("TLAUNCH_TOKEN")
        self._token = token
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        """Close the connections."""
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, method: str, path: str, *, idempotent: bool | None = None, **kwargs: Any) -> Any:
        """Ask the server; its JSON answer.

        A request that may be sent twice (GET, DELETE; ``idempotent``) is sent once more
        when the connection it went on was closed under it (a kept-alive connection the
        server closed as the request left): never twice for a submit.
        """
        import httpx

        again = method in ("GET", "HEAD", "PUT", "DELETE") if idempotent is None else idempotent
        while True:
            try:
                r = self._http.request(method, path, **kwargs)
                break
            except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError) as exc:
                if again:  # once: the connection was closed under it; a new one is opened
                    again = False
                    continue
                raise JobServerError(
                    0, f"the job server at {self.url} closed the connection: {exc}"
                ) from None
            except httpx.TransportError as exc:
                raise JobServerError(0, f"cannot reach the job server at {self.url}: {exc}") from None
        if r.status_code >= 400:
            try:
                message = r.json()["error"]["message"]
            except (ValueError, KeyError, TypeError):
                message = r.text[:500]
            raise JobServerError(r.status_code, message)
        return r.json()

    def version(self) -> str:
        """The server's version."""
        return str(self._call("GET", "/v1/version")["version"])

    def upload(self, path: str) -> str:
        """Upload a folder (zipped here) or an archive file; its package id."""
        data = pack_dir(path) if os.path.isdir(path) else open(path, "rb").read()  # noqa: SIM115
        # Stored by content: sent twice, it is stored once.
        return str(self._call("POST", "/v1/package", content=data, idempotent=True)["package_id"])

    def submit(self, job_name: str, trainer_package: str, **fields: Any) -> dict[str, Any]:
        """Submit a job (fields as ``POST /v1/trainer/job`` takes them); the job."""
        body = {"job_name": job_name, "trainer_package": trainer_package, **fields}
        return dict(self._call("POST", "/v1/trainer/job", json=body))

    def page(
        self,
        state: str | None = None,
        label: dict[str, str] | None = None,
        *,
        limit: int = 50,
        offset: int = 0,
        owner: str | None = None,
    ) -> dict[str, Any]:
        """One page of the jobs, newest first: ``{"jobs": [...], "total": N}`` (``total``: of every page)."""
        params: dict[str, Any] = {"label": [f"{k}={v}" for k, v in (label or {}).items()]}
        params.update(limit=limit, offset=offset)
        if state:
            params["state"] = state
        if owner:
            params["owner"] = owner
        return dict(self._call("GET", "/v1/jobs", params=params))

    def list(
        self,
        state: str | None = None,
        label: dict[str, str] | None = None,
        *,
        limit: int | None = None,
        owner: str | None = None,
    ) -> list[dict[str, Any]]:
        """Every job (at most ``limit``), newest first, following the server's pages.

        A job submitted while the pages are read may shift a later page: it is not
        listed twice (the newest pages come first; a job in two of them is kept once).
        """
        jobs: dict[str, dict[str, Any]] = {}
        offset = 0
        while limit is None or len(jobs) < limit:
            size = _PAGE if limit is None else max(1, min(_PAGE, limit - len(jobs)))
            page = self.page(state, label, limit=size, offset=offset, owner=owner)
            for job in page["jobs"]:
                jobs.setdefault(job["name"], job)
            offset += len(page["jobs"])
            if not page["jobs"] or offset >= page["total"]:
                break
        return list(jobs.values())[:limit]

    def get(self, name: str) -> dict[str, Any]:
        """One job: state, message, exit code, nodes, refs, failure (``name``, or ``owner/name``:
        an admin naming another user's job)."""
        path, owner = _job(name)
        return dict(self._call("GET", path, params=owner))

    def stop(self, name: str) -> dict[str, Any]:
        """Stop a job (idempotent)."""
        path, owner = _job(name)
        return dict(self._call("POST", f"{path}/stop", params=owner, idempotent=True))

    def delete(self, name: str, force: bool = False) -> None:
        """Forget a job (``force``: stop it first if it runs)."""
        path, owner = _job(name)
        self._call("DELETE", path, params={"force": str(force).lower(), **owner})

    def paused(self, name: str) -> builtins.list[dict[str, Any]]:
        """The nodes of job ``name`` (or ``owner/name``) that wait in a debugger: ``node``, ``host``,
        ``at`` (``train.py:42``), ``kind`` (``breakpoint``, ``post-mortem``), ``since``, ``attached``."""
        path, owner = _job(name)
        return list(self._call("GET", f"{path}/paused", params=owner)["paused"])

    def debug(self, name: str, node: str, *, wait: float = 0.0) -> RemoteSession:
        """Attach to node ``node``'s pdb of job ``name`` through the server (which holds the run's
        key); ``wait``: seconds to wait for it to pause first. Its ``sock`` is pdb's terminal
        (:func:`tlaunch.runtime.debugger.terminal.relay` is one); closing it lets the node go on.

        Raises:
            JobServerError: no such job or node of yours, not paused, or the server refused.
        """
        path, owner = _job(name)
        return open_session(self.url, self._token, path, owner, node, wait)

    def pool(self) -> dict[str, Any]:
        """The server's pool of hosts: each host's GPUs (and the job on each), CPUs, memory; the queue."""
        return dict(self._call("GET", "/v1/pool"))

    def set_priority(self, name: str, priority: int) -> dict[str, Any]:
        """Set a waiting job's priority in the pool's queue (an admin's; ``name`` or ``owner/name``)."""
        path, owner = _job(name)
        return dict(self._call("POST", f"{path}/priority", params=owner, json={"priority": priority}))

    def wait(self, name: str, timeout: float | None = None, poll: float = 1.0) -> dict[str, Any]:
        """Block until the job has ended; the job.

        Raises:
            TimeoutError: it had not ended after ``timeout`` s.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(name)
            if job["state"] in _ENDED:
                return job
            if deadline is not None and time.monotonic() > deadline:
                raise TimeoutError(f"job {name} is still {job['state']} after {timeout} s")
            time.sleep(poll)

    def logs(
        self, name: str, node: str | None = None, follow: bool = False, tail: int | None = None
    ) -> Iterator[dict[str, Any]]:
        """The job's log lines (``node``, ``host``, ``text``); with ``follow``, until the job ends."""
        import httpx

        path, owner = _job(name)
        params: dict[str, Any] = {"follow": str(follow).lower(), **owner}
        if node:
            params["node"] = node
        if tail:
            params["tail"] = tail
        try:
            with self._http.stream("GET", f"{path}/logs", params=params, timeout=httpx.Timeout(None)) as r:
                if r.status_code >= 400:
                    r.read()
                    self._call("GET", f"{path}/logs", params={"tail": 1, **owner})  # the server's error
                event = "message"
                for line in r.iter_lines():
                    if line.startswith("event: "):
                        event = line[7:]
                    elif line.startswith("data: ") and event == "message":
                        yield json.loads(line[6:])
                    elif not line:
                        event = "message"
        except httpx.TransportError as exc:  # not reached, or gone while following
            raise JobServerError(0, f"cannot read the logs of {name!r} from {self.url}: {exc}") from None


def _job(name: str) -> tuple[str, dict[str, str]]:
    """The path of job ``name`` (``owner/name``: another user's, for an admin) and its ``owner`` parameter."""
    owner, _, job = name.rpartition("/")
    return f"/v1/jobs/{job}", ({"owner": owner} if owner else {})


def submit_self(job_name: str, *, client: Client | None = None, **fields: Any) -> dict[str, Any] | None:
    """The seed's "submit from the training script itself": package this script's folder and submit it.

    In the job (the server set ``$TLAUNCH_SERVER_JOB``) it does nothing and
    returns None: the script goes on to train. Run by hand, it uploads the
    folder of ``sys.argv[0]``, submits it with that script as the entry point
    and its arguments, and returns the job; the script should then exit::

        if submit_self("quickstart", num_trainer=4, hosts=["gpu1", "gpu2"]):
            sys.exit()
        train()
    """
    if os.environ.get(IN_JOB):
        return None
    script = os.path.abspath(sys.argv[0])
    c = client or Client()
    package = c.upload(os.path.dirname(script))
    fields.setdefault("entry_point", os.path.basename(script))
    fields.setdefault("args", sys.argv[1:])
    return c.submit(job_name, package, **fields)
