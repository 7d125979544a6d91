"""A plain ``pip install tlaunch`` (no extras): every optional part says what to install, in one line.

A fresh virtual environment gets tlaunch with its own dependencies only; each
console entry point that reaches an optional part is run there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bare(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A venv with tlaunch and its required dependencies, nothing optional."""
    venv = tmp_path_factory.mktemp("bare") / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    done = subprocess.run([*pip, "-e", str(ROOT)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    for optional in ("yaml", "kubernetes", "kopf", "torch", "fastapi", "httpx", "psycopg"):
        check = subprocess.run(
            [str(venv / "bin" / "python"), "-c", f"import {optional}"], capture_output=True
        )
        assert check.returncode != 0, f"{optional} is installed in the bare venv"
    yield venv


@pytest.mark.parametrize(
    ("argv", "extra"),
    [
        (
            ["tlaunchrun", "--lpjob_name", "x", "--image", "i", "--dry-run", "-o", "yaml", "basic", "t.py"],
            "k8s",
        ),
        (["tlaunchrun", "--lpjob_name", "x", "--image", "i", "basic", "t.py"], "k8s"),
        (["tlaunchrun", "ls"], "k8s"),
        (["tlaunch", "k8s", "manifests"], "k8s"),
        (["tlaunch", "k8s", "operator"], "k8s"),
        (["tlaunch", "server", "--port", "0"], "server"),
        (["tlaunch", "job", "ls"], "server"),
    ],
)
def test_an_optional_part_without_its_extra_says_what_to_install(
    bare: Path, argv: list[str], extra: str
) -> None:
    exe = bare / "bin" / argv[0]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run([str(exe), *argv[1:]], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode != 0, done.stdout
    assert f"pip install 'tlaunch[{extra}]'" in done.stderr, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_core_works_without_any_extra(bare: Path, tmp_path: Path) -> None:
    script = tmp_path / "prog.py"
    script.write_text(
        "from tlaunch import lp_ssh as lp\n"
        "p = lp.Program('bare')\n"
        "p.add_node(lp.PyNode(print, 'ran without extras'), label='n')\n"
        "lp.launch(p, launch_type='local_mp', terminal='current_terminal').wait()\n"
    )
    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "TLAUNCH_HOME": str(tmp_path / "h")}
    done = subprocess.run(
        [str(bare / "bin" / "python"), str(script)], capture_output=True, text=True, timeout=120, env=env
    )
    assert done.returncode == 0 and "ran without extras" in done.stdout, done.stdout + done.stderr
