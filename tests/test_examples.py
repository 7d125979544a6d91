"""Every file in ``examples/`` is run the way its docstring says a user runs it.

Each command is a line of the example's own docstring (the test checks that the
line is there, word for word), run in a new process from the folder the docstring
implies, with a timeout; then what it printed is checked, and that nothing of its
runs is left on this machine or on any SSH test host. Where the docstring writes
the user's own things (``--hosts=a,b``, ``h1``, ``/shared``), the
test puts this machine's in their place, and says so in :data:`EXAMPLES`: hosts
are the session's SSH test hosts (``th1``..``th4``), reached through
``$TLAUNCH_SSH_CONFIG`` as a user's ``~/.ssh/config`` would be. A slow command that a
page of ``docs/`` runs as written (``run_in_docs``: DeepSpeed's) is run there, once: the
test checks that the page's block still runs it and shows what is expected here.

A file that is not run by itself says why in a line of its own that starts
``Not run by itself:``; the test reads that line and lists the file as skipped
with it (``pytest -ra`` shows the list). A new file in ``examples/`` without
either fails :func:`test_every_example_is_run_or_says_why`.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from userpath import EXAMPLES as FOLDER
from userpath import ROOT, assert_nothing_left, own_runs, run_as_user, says

NOT_RUN = re.compile(r"^\W*Not run by itself: (.+)$", re.MULTILINE)
SHARED = "/var/tmp"  # every SSH test host sees this machine's /var/tmp (their /tmp and homes are their own)


@dataclass(frozen=True)
class Example:
    """One documented way to run an example.

    Attributes:
        documented: the command as the example's docstring writes it (a comment after it aside).
        argv: what runs: ``documented`` with this machine's hosts and files in place of the user's.
        where: the folder it runs from, relative to the repository.
        expect: lines (or parts of lines) its output must hold.
        needs: ``ssh`` (the SSH test hosts), ``server`` (a job server, ``$TLAUNCH_SERVER``).
        env: more environment, as the docstring asks (``DS_ACCELERATOR=cpu``).
        in_logs: the output goes to the run's logs (a tmux window per node), not to stdout.
        then: commands run after it, from the same folder (``tlaunch job logs -f ...``).
        documented_in: the file whose docstring has ``documented``, when another's (``hosts_flag.py``).
        timeout: seconds.
        run_in_docs: a page whose block runs ``argv`` as written and shows every ``expect`` line
            in its output (``tests/test_docs.py`` runs it and checks them): this test checks
            that the page still does, and does not run the same slow command a second time.
    """

    documented: str
    argv: str
    where: str = "."
    expect: tuple[str, ...] = ()
    needs: tuple[str, ...] = ()
    env: dict[str, str] = field(default_factory=dict)
    in_logs: bool = False
    then: tuple[str, ...] = ()
    documented_in: str | None = None
    timeout: float = 180
    run_in_docs: str | None = None


HOSTS4 = "--hosts=th1,th2,th3,th4"
EXAMPLES: dict[str, list[Example]] = {
    "commands/run_cmd.py": [
        Example(
            "python examples/commands/run_cmd.py",
            f"python examples/commands/run_cmd.py {HOSTS4}",
            expect=("== th1 (exit 0)", "== th4 (exit 0)", "no GPU", "gathered 4 hosts"),
            needs=("ssh",),
        )
    ],
    "consumer_producer/run.py": [
        Example(
            "python examples/consumer_producer/run.py",
            "python examples/consumer_producer/run.py",
            expect=("[consumer/0] [0, 1, 4, 9]",),
        ),
        Example(
            "python examples/consumer_producer/run.py --lp_launch_type=local_mt",
            "python examples/consumer_producer/run.py --lp_launch_type=local_mt",
            expect=("[0, 1, 4, 9]",),
        ),
        Example(
            "python examples/consumer_producer/run.py --lp_terminal=tmux_session",
            "python examples/consumer_producer/run.py --lp_terminal=tmux_session",
            expect=("[0, 1, 4, 9]",),
            in_logs=True,
        ),
    ],
    "job_server/quick_start/trainer.py": [
        Example(
            "python trainer.py --steps 5",
            "python trainer.py --steps 5",
            where="examples/job_server/quick_start",
            expect=("submitted job quick-start", "rank 0/2 step 4 loss", "rank 1/2 step 4 loss"),
            needs=("server",),
            then=("tlaunch job logs -f quick-start", "tlaunch job rm quick-start"),
        ),
        Example(
            "tlaunch job submit . --name quick-start --num-trainer 2 -- python trainer.py --steps 5",
            "tlaunch job submit . --name quick-start --num-trainer 2 -- python trainer.py --steps 5",
            where="examples/job_server/quick_start",
            expect=("submitted job quick-start", "rank 0/2 step 4 loss", "rank 1/2 step 4 loss"),
            needs=("server",),
            then=("tlaunch job logs -f quick-start", "tlaunch job rm quick-start"),
        ),
    ],
    "torch/deepspeed_train.py": [
        Example(  # DeepSpeed's runs are slow (~100 s on 2 CPUs): docs/torch.md's block is this one
            'tlaunch deepspeed --hostfile hostfile --include "h1@h2:0" '
            "examples/torch/deepspeed_train.py --deepspeed_config ds.json",
            'tlaunch deepspeed --hostfile hostfile --include "th1@th2:0" '
            "examples/torch/deepspeed_train.py --deepspeed_config ds.json",
            expect=("step=2 rank=0 world=3 local_rank=0", "step=2 rank=2 world=3 local_rank=0"),
            needs=("ssh",),
            run_in_docs="docs/torch.md",
        )
    ],
    "torch/ds.json": [],  # deepspeed_train.py's config: its example above runs with it
    "torch/basic_train.py": [  # (this machine and SLURM: tests/test_torch_basic.py, test_torch_slurm.py)
        Example(
            "tlaunch basic --num-trainer 2 --hosts h1,h2 --share-file /shared/tiny "
            "examples/torch/basic_train.py --steps 3",
            "tlaunch basic --num-trainer 2 --hosts th1,th2 --share-file {shared}/tiny "
            "examples/torch/basic_train.py --steps 3",
            expect=("rank 1 of 2 (arguments: rank 1 of 2) met by file://", "the same on every rank"),
            needs=("ssh",),
        ),
        Example(
            "tlaunch basic --num-trainer 2 --hosts h1,h2 examples/torch/basic_train.py --steps 3",
            "tlaunch basic --num-trainer 2 --hosts th1,th2 examples/torch/basic_train.py --steps 3",
            expect=("rank 1 of 2 (arguments: rank 1 of 2) met by env://", "the same on every rank"),
            needs=("ssh",),
        ),
    ],
    "torch/elastic_train.py": [
        Example(
            "tlaunch torchrun --hosts h1,h2,h3 --nnodes 2:3 --nproc-per-node 2 --max-restarts 3 "
            "examples/torch/elastic_train.py --steps 30 --checkpoint /shared/ckpt.pt",
            "tlaunch torchrun --hosts th1,th2,th3 --nnodes 2:3 --nproc-per-node 2 --max-restarts 3 "
            "examples/torch/elastic_train.py --steps 30 --checkpoint {shared}/ckpt.pt",
            expect=("step=29 rank=0 world=", "done rank=0 world="),
            needs=("ssh",),
            timeout=240,
        )
    ],
    "torch/function_launch.py": [
        Example(
            "python examples/torch/function_launch.py --hosts=a,b",
            "python examples/torch/function_launch.py --hosts=th1,th2",
            expect=("[th1 0] rank 0 of 4 on th1: done", "weights [[1.0, -2.0, 3.0, 0.5]], test error 0.0"),
            needs=("ssh",),
        )
    ],
    "trans_types/star_type.py": [
        Example(  # the one example run as documented first: it makes its own 4 SSH test hosts
            "python examples/trans_types/star_type.py",
            "python examples/trans_types/star_type.py",
            expect=('RESULT {"consumer": "root", "host": "th1", "received": 3000, "unique": 3000',),
            needs=("ssh",),
        ),
        Example(
            "python examples/trans_types/star_type.py --hosts=a,b,c,d",
            f"python examples/trans_types/star_type.py {HOSTS4}",
            expect=('RESULT {"consumer": "root", "host": "th1", "received": 3000, "unique": 3000',),
            needs=("ssh",),
            documented_in="hosts_flag.py",
        ),
    ],
    "trans_types/tree_type.py": [
        Example(
            "python examples/trans_types/tree_type.py",
            f"python examples/trans_types/tree_type.py {HOSTS4}",
            expect=('"host": "th1", "received": 2000, "unique": 2000, "duplicates": 0',),
            needs=("ssh",),
        )
    ],
    "trans_types/net_type.py": [
        Example(
            "python examples/trans_types/net_type.py",
            f"python examples/trans_types/net_type.py {HOSTS4}",
            expect=tuple(
                f'"host": "th{i}", "received": 2000, "unique": 2000, "duplicates": 0' for i in "1234"
            ),
            needs=("ssh",),
        )
    ],
}


def example_files() -> list[str]:
    return sorted(
        str(p.relative_to(FOLDER)) for p in FOLDER.rglob("*") if p.is_file() and "__pycache__" not in p.parts
    )


def not_run() -> dict[str, str]:
    """Each file that says ``Not run by itself: <why>``, with its why."""
    found = {}
    for name in example_files():
        said = NOT_RUN.search((FOLDER / name).read_text(errors="replace"))
        if said:
            found[name] = said.group(1).strip()
    return found


def test_every_example_is_run_or_says_why() -> None:
    files = set(example_files())
    listed, why = set(EXAMPLES), not_run()
    assert listed <= files, f"examples listed here that do not exist: {sorted(listed - files)}"
    assert not listed & set(why), f"run, and yet said not to be: {sorted(listed & set(why))}"
    missing = files - listed - set(why)
    assert not missing, (
        f"{sorted(missing)}: an example must be run here (EXAMPLES in {__file__}) "
        "or say why not in a line 'Not run by itself: <why>'"
    )


@pytest.mark.parametrize("name", sorted(not_run()))
def test_an_example_not_run_by_itself(name: str) -> None:
    pytest.skip(f"examples/{name}: {not_run()[name]}")


CASES = [
    pytest.param(
        name,
        i,
        id=f"{name}[{i}]",
        marks=[pytest.mark.ssh] if "ssh" in form.needs and not form.run_in_docs else [],
    )
    for name, forms in EXAMPLES.items()
    for i, form in enumerate(forms)
]


@pytest.fixture
def shared() -> Iterator[str]:
    """A folder every SSH test host sees (the docstrings' ``/shared``), removed after the test."""
    path = Path(SHARED) / f"tlaunch-example-{os.getpid()}-{os.urandom(3).hex()}"
    path.mkdir()
    try:
        yield str(path)
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture(scope="module")
def job_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    """A job server, and the environment its users set (``$TLAUNCH_SERVER``, ``$TLAUNCH_TOKEN``)."""
    pytest.importorskip("fastapi")
    from server_helpers import ALICE, Server

    srv = Server(tmp_path_factory.mktemp("examples-server") / "home")
    try:
        yield {"TLAUNCH_SERVER": srv.url, "TLAUNCH_TOKEN": ALICE, "home": str(srv.home)}
    finally:
        srv.stop()


@pytest.mark.parametrize(("name", "form"), CASES)
def test_an_example_as_its_docstring_runs_it(
    name: str, form: int, request: pytest.FixtureRequest, shared: str
) -> None:
    example = EXAMPLES[name][form]
    text = (FOLDER / (example.documented_in or name)).read_text()
    flat = " ".join(text.replace("\\\n", " ").split())
    documented = " ".join(example.documented.split())
    assert documented in flat, f"examples/{name} no longer documents {documented!r}"
    if example.run_in_docs:
        _assert_run_in_docs(example)
        return
    env = dict(example.env)
    hosts = None
    if "ssh" in example.needs:
        hosts = request.getfixturevalue("ssh_hosts")
        env["TLAUNCH_SSH_CONFIG"] = hosts.ssh_config
    home = os.environ["TLAUNCH_HOME"]
    if "server" in example.needs:
        server = request.getfixturevalue("job_server")
        env.update({k: server[k] for k in ("TLAUNCH_SERVER", "TLAUNCH_TOKEN")})
        home = server["home"]
    argv = shlex.split(example.argv.format(shared=shared))
    before = set(own_runs(home))
    cwd = ROOT / example.where
    logs_before = _torch_logs(cwd)
    done = run_as_user(argv, cwd, example.timeout, env)
    out = done.stdout
    try:
        assert done.returncode == 0, says(done)
        assert "Traceback" not in done.stderr, says(done)
        for then in example.then:
            more = run_as_user(shlex.split(then), cwd, example.timeout, env)
            assert more.returncode == 0, says(more)
            out += more.stdout
        runs = sorted(set(own_runs(home)) - before)
        if example.in_logs:
            logs = [p for run in runs for p in (Path(home) / "runs" / run / "logs").iterdir()]
            out += "".join(p.read_text() for p in logs)
        for line in example.expect:
            assert line in out, f"{line!r} not in the output of {example.argv}\n{says(done)}\n{out[-3000:]}"
        assert_nothing_left(hosts, runs)
    finally:
        _remove_torch_logs(cwd, logs_before)


def _assert_run_in_docs(example: Example) -> None:
    """``example.run_in_docs`` has a block that runs ``example.argv`` and shows its ``expect`` lines."""
    from docblocks import page_blocks

    page = ROOT / str(example.run_in_docs)
    argv = " ".join(example.argv.split())
    blocks = [b for b in page_blocks(ROOT, page) if b.runnable and argv in " ".join(b.script().split())]
    assert blocks, f"{example.run_in_docs} has no block that runs {argv!r} (it must, or run it here)"
    (block,) = blocks
    assert block.skip is None, f"{block.id} runs {argv!r} but is skipped: {block.skip}"
    shown = block.expected() or ""
    for line in example.expect:
        assert line in shown, f"{block.id} runs {argv!r} but does not show {line!r} after it"


def _torch_logs(cwd: Path) -> set[str]:
    """The runs' folders of ``./tlaunch_logs`` (torch commands' and launches' default log dir)."""
    folder = cwd / "tlaunch_logs"
    return set(os.listdir(folder)) if folder.is_dir() else set()


def _remove_torch_logs(cwd: Path, before: set[str]) -> None:
    """The logs a torch run wrote under the repository (``./tlaunch_logs/<run>``) while it ran."""
    folder = cwd / "tlaunch_logs"
    for name in _torch_logs(cwd) - before:
        shutil.rmtree(folder / name, ignore_errors=True)
    if not before and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
