"""Node processes' PYTHONPATH follows Python's rule for the launcher's first path entry."""

from __future__ import annotations

import os
import subprocess
import sys

PRINT_PATH = "from tlaunch.backends.nodeprocs import launcher_python_path; print(launcher_python_path())"


def _path(cwd: str, *argv: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    argv = [sys.executable, *argv]
    out = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, env=env, check=True)
    return out.stdout.strip().split(os.pathsep)


def test_a_module_run_with_dash_m_puts_the_working_directory_first_not_its_package(tmp_path) -> None:
    """``python -m pkg.cli.main`` (as ``tlaunchrun --backend slurm`` runs tlaunch): never ``pkg/cli``.

    ``tlaunch/cli`` on the nodes' path made ``import torch`` find ``tlaunch/cli/torch.py``.
    """
    package = tmp_path / "pkg" / "cli"
    package.mkdir(parents=True)
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (package / "__init__.py").write_text("")
    (package / "main.py").write_text(PRINT_PATH + "\n")
    (package / "torch.py").write_text("raise ImportError('the wrong torch')\n")
    path = _path(str(tmp_path), "-m", "pkg.cli.main")
    assert path[0] == str(tmp_path)
    assert str(package) not in path


def test_a_script_puts_its_folder_first(tmp_path) -> None:
    folder = tmp_path / "scripts"
    folder.mkdir()
    (folder / "launch.py").write_text(PRINT_PATH + "\n")
    assert _path(str(tmp_path), str(folder / "launch.py"))[0] == str(folder)


def test_dash_c_puts_the_working_directory_first_and_dash_p_nothing(tmp_path) -> None:
    assert _path(str(tmp_path), "-c", PRINT_PATH)[0] == str(tmp_path)
    assert str(tmp_path) not in _path(str(tmp_path), "-P", "-c", PRINT_PATH)
