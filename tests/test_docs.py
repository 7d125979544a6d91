"""Every shell and Python block of the README and of docs/ runs as a user would run it.

Each block is a new process (``bash`` for a shell block, ``python FILE`` for Python), from
its page's own folder (where ``examples/`` is the repository's, as in a clone), with a
timeout, against the SSH test hosts, the SLURM test cluster, the stand-in Kubernetes API
server or a job server where its ``needs=`` says; what it prints is checked where the page
shows output, and after it no process of it is left on this machine and nothing of its runs
on any test host. A block that cannot run here is
marked in its page (``<!-- docs-test: skip "why" -->``) and listed as skipped with that
reason: ``pytest -ra`` prints every one. ``tests/docblocks.py`` says how blocks are marked.

The blocks of one page run in its order and share its folder (a block saved with
``file=NAME`` is there for the ones after it) and its ``$TLAUNCH_HOME``.
"""

from __future__ import annotations

import contextlib
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, os.path.dirname(__file__))
from docblocks import PYTHONS, Block, all_blocks, output_mismatch
from extensions import deepspeed_env
from userpath import own_runs, processes_of

ROOT = Path(__file__).resolve().parent.parent
HOSTS_SEE = "/var/tmp"  # this machine's, which every SSH test host sees
BLOCKS = list(all_blocks(ROOT))
RUNNABLE = [b for b in BLOCKS if b.runnable]
_MARK = "TLAUNCH_DOCS_BLOCK"  # in every block's environment: what carries it after the block is left over


def _params() -> list[Any]:
    params = []
    for block in BLOCKS:
        if not block.runnable and "file" not in block.options:
            continue
        marks = [pytest.mark.slow] if block.needs else []
        if any(n in block.needs for n in ("hosts", "slurm", "root")):
            marks.append(pytest.mark.ssh)
        if "slurm" in block.needs:
            marks.append(pytest.mark.slurm)
        params.append(pytest.param(block, id=block.id, marks=marks))
        if "rest" in block.options:
            params.append(pytest.param(block, id=f"{block.id}[rest]"))
    return params


@dataclass
class Page:
    """What the blocks of one page share: the folder Python blocks run in, and a TLaunch home."""

    folder: Path
    home: Path


@pytest.fixture(scope="session")
def pages() -> dict[str, Page]:
    """Each page's folder and home, made as its first block runs."""
    return {}


def _page(pages: dict[str, Page], block: Block, request: pytest.FixtureRequest) -> Page:
    if block.page not in pages:
        name = block.page.replace("/", "_").replace(".md", "")
        if "slurm" in block.needs:  # on a filesystem every node sees, as a cluster's shared home
            shared = Path(request.getfixturevalue("slurm_cluster").shared_dir)
            folder = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=shared))
            (folder / "home").mkdir()
            pages[block.page] = Page(folder, folder / "home")
        elif any("hosts" in b.needs for b in BLOCKS if b.page == block.page):
            # On a filesystem every SSH test host sees (their /tmp and homes are their own), as
            # a shared home: a trainer's shared file there is one file for all.
            folder = Path(tempfile.mkdtemp(prefix=f"tlaunch-docs-{name}-", dir=HOSTS_SEE))
            request.getfixturevalue("shared_pages").append(folder)
            (folder / "home").mkdir()
            pages[block.page] = Page(folder / "page", folder / "home")
            (folder / "page").mkdir()
        else:
            factory = request.getfixturevalue("tmp_path_factory")
            pages[block.page] = Page(factory.mktemp(name), factory.mktemp(f"{name}-home"))
        (pages[block.page].folder / "examples").symlink_to(ROOT / "examples")  # as in a clone
    return pages[block.page]


@pytest.fixture(scope="session")
def shared_pages() -> Iterator[list[Path]]:
    """The page folders made where the test hosts see them: removed at the session's end."""
    made: list[Path] = []
    yield made
    for folder in made:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(scope="session")
def job_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A job server on this machine, as docs/server.md starts one; yields the client's environment."""
    pytest.importorskip("fastapi")
    folder = tmp_path_factory.mktemp("docs-server")
    token = secrets.token_hex(16)
    (folder / "tokens").write_text(f"{token} docs admin\n")
    (folder / "tokens").chmod(0o600)  # the server refuses a token file others can read
    env = dict(os.environ, TLAUNCH_HOME=str(folder / "home"), **{_MARK: "server"})
    port = _free_port()
    argv = [_bin("tlaunch"), "server", "--port", str(port), "--token-file", str(folder / "tokens")]
    log = open(folder / "server.log", "wb")  # closed below
    proc = subprocess.Popen(
        argv, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    url = f"http://127.0.0.1:{port}"
    try:
        import httpx

        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, (folder / "server.log").read_text()
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/v1/health", timeout=1).status_code < 500:
                    break
            assert time.monotonic() < deadline, "the job server did not answer in 30 s"
            time.sleep(0.2)
        yield {"TLAUNCH_SERVER": url, "TLAUNCH_TOKEN": token}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    return os.path.join(os.path.dirname(sys.executable), name)


def _marked(token: str) -> list[int]:
    """The processes of this machine whose environment carries ``token`` (test hosts' included)."""
    needle = f"{_MARK}={token}".encode()
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/environ", "rb") as f:
                if needle in f.read().split(b"\0"):
                    found.append(int(pid))
    return found


def _describe(pids: list[int]) -> list[str]:
    out = []
    for pid in pids:
        with contextlib.suppress(OSError):
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                argv = f.read().replace(b"\0", b" ").decode(errors="replace")
                out.append(f"{pid}: {argv[:200]}")
    return out


def _fresh_venv(folder: Path) -> dict[str, str]:
    """A virtualenv with nothing installed, as on a fresh machine; its environment."""
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    path = os.environ.get("PATH", "").split(os.pathsep)
    path = [p for p in path if p != os.path.dirname(sys.executable)]
    return {"PATH": os.pathsep.join([str(venv / "bin"), *path]), "VIRTUAL_ENV": str(venv)}


def _environment(block: Block, page: Page, request: pytest.FixtureRequest, token: str) -> dict[str, str]:
    env = dict(os.environ)
    for name in ("PYTHONPATH", "PYTEST_CURRENT_TEST", "PYTEST_VERSION", "COV_CORE_SOURCE"):
        env.pop(name, None)
    env.setdefault("USER", "root" if os.geteuid() == 0 else str(os.geteuid()))
    env.setdefault("HOME", os.path.expanduser("~"))
    # As in a shell where the project's virtualenv is active.
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "/usr/bin:/bin")])
    env["VIRTUAL_ENV"] = sys.prefix
    env["TLAUNCH_HOME"] = str(page.home)
    env[_MARK] = token
    if "hosts" in block.needs:
        env["TLAUNCH_SSH_CONFIG"] = request.getfixturevalue("ssh_hosts").ssh_config
    if "slurm" in block.needs:
        cluster = request.getfixturevalue("slurm_cluster")
        env["SLURM_CONF"] = cluster.env["SLURM_CONF"]
    if "kube" in block.needs:
        request.getfixturevalue("cluster")
        env["KUBECONFIG"] = os.environ["KUBECONFIG"]
    if "server" in block.needs:
        env.update(request.getfixturevalue("job_server"))
    if "torch" in block.needs:
        pytest.importorskip("torch")
    if "deepspeed" in block.needs:
        pytest.importorskip("deepspeed")
        env.update(deepspeed_env())  # on this machine's CPUs; its op built once, never waited on
    if "root" in block.needs and os.geteuid() != 0:
        pytest.skip(f"{block.id} makes SSH test hosts: it needs root")
    if block.options.get("venv") == "fresh":
        env.update(_fresh_venv(Path(tempfile.mkdtemp(prefix="docs-venv-", dir=page.folder))))
    return env


def _files_before(block: Block) -> list[Block]:
    """The blocks of ``block``'s page saved as files up to it (itself included)."""
    same = [b for b in BLOCKS if b.page == block.page and b.line <= block.line]
    return [b for b in same if "file" in b.options and b.skip is None]


def _run(block: Block, page: Page, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    cwd = ROOT / block.options["cwd"] if "cwd" in block.options else page.folder
    if block.lang in PYTHONS:
        (page.folder / "snippet.py").write_text(block.script())
        argv = ["python", "snippet.py" if cwd == page.folder else str(page.folder / "snippet.py")]
    else:
        argv = ["bash", "-e", "-o", "pipefail", "-c", block.script()]
    argv[0] = shutil.which(argv[0], path=env["PATH"]) or argv[0]
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=block.timeout)
        if block.lang in PYTHONS:
            (page.folder / "snippet.py").unlink()  # not shipped by the next block's launch
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGINT)  # as a user's Ctrl-C: the launcher tears its run down
        try:
            out, _ = proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
        pytest.fail(f"{block.id} did not end in {block.timeout:.0f} s; it printed:\n{out[-6000:]}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # what it left in the background in its own group
    return subprocess.CompletedProcess(argv, proc.returncode, out, "")


def _leftovers(
    block: Block, token: str, page: Page, runs_before: list[str], env: dict[str, str], request: Any
) -> list[str]:
    """What ``block`` left: its processes here, its runs' on the test hosts; all of it ended here."""
    deadline = time.monotonic() + 15
    while (left := _marked(token)) and time.monotonic() < deadline:
        time.sleep(0.2)
    found = [f"process {p}" for p in _describe(left)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    hosts = request.getfixturevalue("ssh_hosts") if "hosts" in block.needs else None
    for run_id in sorted(set(own_runs(str(page.home))) - set(runs_before)):
        left_on = hosts.wait_no_leftovers(run_id, timeout=15) if hosts is not None else {}
        here = processes_of(run_id)
        if left_on or here:
            found.append(f"run {run_id}: on the test hosts {sorted(left_on)}, here {here}")
            subprocess.run([_bin("tlaunch"), "stop", run_id], env=env, capture_output=True, timeout=60)
    return found


@pytest.mark.parametrize("block", _params())
def test_doc_block(block: Block, pages: dict[str, Page], request: pytest.FixtureRequest) -> None:
    if request.node.callspec.id.endswith("[rest]"):
        pytest.skip(f"{block.id}, lines after {block.options['lines']}: {block.options['rest']}")
    if block.skip is not None:
        pytest.skip(f"{block.id}: {block.skip}")
    page = _page(pages, block, request)
    files = _files_before(block)
    for saved in files:  # what the page told the user to save (again, if only this block was picked)
        (page.folder / saved.options["file"]).write_text(saved.code)
    if not block.runnable:  # a file the blocks after it use
        return
    token = secrets.token_hex(8)
    env = _environment(block, page, request, token)
    runs_before = own_runs(str(page.home))
    try:
        done = _run(block, page, env)
    finally:
        left = _leftovers(block, token, page, runs_before, env, request)
    assert done.returncode == block.exit, (
        f"{block.id} exited with {done.returncode}, expected {block.exit}; it printed:\n{done.stdout[-6000:]}"
    )
    assert not left, f"{block.id} left behind: {left}; it printed:\n{done.stdout[-3000:]}"
    expected = block.expected()
    if expected is not None:
        missing = output_mismatch(expected, done.stdout, ordered="unordered" not in block.options)
        assert missing is None, (
            f"{block.id}: the page shows {missing!r}, which it did not print (in that order); "
            f"it printed:\n{done.stdout[-6000:]}"
        )


def test_every_skipped_block_says_why() -> None:
    """A block that does not run names its reason (listed by ``pytest -ra``), never an empty one."""
    silent = [b.id for b in BLOCKS if b.skip is not None and not b.skip.strip()]
    assert not silent, f"blocks skipped without a reason: {silent}"
    assert RUNNABLE, "no runnable block found: the extraction is broken"


def test_every_page_is_in_the_site_nav() -> None:
    """A page under docs/ that the nav of mkdocs.yml does not list would be built but unreachable."""
    import yaml

    config = (ROOT / "mkdocs.yml").read_text()
    nav = yaml.safe_load(config[config.index("\nnav:") :])["nav"]

    def pages(entry: Any) -> Iterator[str]:
        if isinstance(entry, str):
            yield entry
        elif isinstance(entry, dict):
            for value in entry.values():
                yield from pages(value)
        elif isinstance(entry, list):
            for item in entry:
                yield from pages(item)

    listed = set(pages(nav))
    docs = ROOT / "docs"
    missing = sorted(p.relative_to(docs).as_posix() for p in docs.rglob("*.md"))
    missing = [p for p in missing if p not in listed]
    assert not missing, f"pages not in mkdocs.yml's nav: {missing} (add each under its section)"


def _error_classes() -> dict[str, str]:
    """Every class of the package that derives, by name, from TLaunchError: name -> module file."""
    import ast

    bases: dict[str, tuple[str, list[str]]] = {}
    for path in sorted((ROOT / "tlaunch").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                names = [b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases]
                bases[node.name] = (path.relative_to(ROOT).as_posix(), names)
    found: dict[str, str] = {}
    changed = True
    while changed:
        changed = False
        for name, (path, parents) in bases.items():
            if name not in found and (name == "TLaunchError" or any(p in found for p in parents)):
                found[name] = path
                changed = True
    return found


def test_the_exceptions_page_names_every_error() -> None:
    """docs/exceptions.md's tree is true to the code: every TLaunchError subclass is in it."""
    page = (ROOT / "docs" / "exceptions.md").read_text()
    start = page.index("```text\nTLaunchError")
    tree = page[start : page.index("```", start + 3)]
    errors = _error_classes()
    assert len(errors) > 20, errors
    missing = {name: path for name, path in errors.items() if not re.search(rf"\b{name}\b", tree)}
    assert not missing, f"exceptions not in docs/exceptions.md's tree: {missing}"
