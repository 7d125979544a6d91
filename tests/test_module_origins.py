"""Which entries of ``sys.modules`` travel to SSH hosts: only those whose name, ``__spec__`` and
file agree (``tlaunch.backends.ssh.origins``). Each kind of entry that does not, as Python
itself makes it, is judged without a crash; what cannot travel is named, once.

``import torch`` puts ``sys.modules["__mp_main__"]``, an alias of ``__main__``; shipping once
turned it into ``<script's folder>/__mp_main__.py`` and a ``FileNotFoundError``: the last test
runs a script as a user would, in a new process, to see that the summary holds it."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import subprocess
import sys
import zipfile
import zipimport
from pathlib import Path
from types import ModuleType

import pytest

from tlaunch.backends.ssh.origins import Origins, Source, installed_dirs, origins

INSTALLED = installed_dirs()


def load(name: str, path: Path) -> ModuleType:
    """A module named ``name`` executed from ``path``, as ``importlib`` makes it (not registered)."""
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def judge(modules: dict[str, object], *on_path: Path) -> Origins:
    return origins(modules, INSTALLED, frozenset(os.path.realpath(p) for p in on_path))


@pytest.fixture
def helper(tmp_path: Path) -> ModuleType:
    (tmp_path / "helper.py").write_text("def f():\n    return 1\n")
    return load("helper", tmp_path / "helper.py")


@pytest.fixture
def script(tmp_path: Path) -> ModuleType:
    """The launcher's ``__main__`` as ``python script.py`` makes it: a file, no spec."""
    (tmp_path / "script.py").write_text("x = 1\n")
    main = ModuleType("__main__")
    main.__file__ = str(tmp_path / "script.py")
    return main


def test_a_module_whose_name_spec_and_file_agree_travels(tmp_path: Path, helper: ModuleType) -> None:
    assert judge({"helper": helper}, tmp_path) == Origins(
        sources=(Source(str(tmp_path), "helper", "module"),)
    )


def test_mp_main_an_alias_of_main_is_the_script_pickled_by_value(tmp_path: Path, script: ModuleType) -> None:
    """What ``import torch`` (and multiprocessing's spawn) adds: nothing to ship, nothing to say."""
    assert judge({"__main__": script, "__mp_main__": script}, tmp_path) == Origins()


def test_main_under_any_other_name_is_not_shipped(tmp_path: Path, script: ModuleType) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "mod.py").write_text("")
    pkg = load("pkg", tmp_path / "pkg" / "__init__.py")
    as_m = load("pkg.mod", tmp_path / "pkg" / "mod.py")  # python -m pkg.mod registering itself
    modules = {"__main__": script, "script": script, "pkg": pkg, "pkg.mod": as_m, "__mod_main__": as_m}
    modules["__main__"] = as_m
    found = judge(modules, tmp_path)
    assert found.sources == (Source(str(tmp_path), "pkg", "package"),)
    # ``script`` is no longer __main__ here: a module named script, from script.py, without a spec
    assert found.unshippable == (f"script (no import spec: made by hand from {tmp_path}/script.py)",)


def test_an_alias_added_by_hand_is_named_and_its_module_goes_by_its_own_name(
    tmp_path: Path, helper: ModuleType
) -> None:
    found = judge({"helper": helper, "cfg": helper}, tmp_path)
    assert found.sources == (Source(str(tmp_path), "helper", "module"),)
    assert found.unshippable == ("cfg (an alias of helper)",)


def test_an_alias_of_an_installed_module_says_nothing(tmp_path: Path) -> None:
    import _pytest.python  # an installed module, under a second name (as nacl's _sodium is)

    assert judge({"_py": _pytest.python}, tmp_path) == Origins()


def test_a_module_made_in_memory_is_named_only_when_it_holds_code(tmp_path: Path) -> None:
    empty = ModuleType("cython_runtime")  # what compiled packages leave in sys.modules
    config = ModuleType("config")
    exec("def lr():\n    return 0.1\n", config.__dict__)  # a user's module made by hand
    config.lr.__module__ = "config"
    assert judge({"cython_runtime": empty, "config": config}, tmp_path) == Origins(
        unshippable=("config (made in memory, no file)",)
    )


def test_a_file_loaded_under_another_name_is_named(tmp_path: Path) -> None:
    (tmp_path / "other.py").write_text("")
    plugin = load("plugin", tmp_path / "other.py")  # spec_from_file_location, by hand
    found = judge({"plugin": plugin}, tmp_path)
    assert found == Origins(
        unshippable=(f"plugin (loaded from {tmp_path}/other.py, which is not named plugin)",)
    )


def test_a_module_from_a_folder_not_on_sys_path_is_named(tmp_path: Path, helper: ModuleType) -> None:
    found = judge({"helper": helper})
    assert found == Origins(unshippable=(f"helper (loaded from {tmp_path}, which is not on sys.path)",))


def test_a_module_whose_file_is_gone_is_named(tmp_path: Path, helper: ModuleType) -> None:
    (tmp_path / "helper.py").unlink()
    found = judge({"helper": helper}, tmp_path)
    assert found == Origins(unshippable=(f"helper (its file {tmp_path}/helper.py is gone)",))


def test_a_namespace_package_travels_folder_by_folder(tmp_path: Path) -> None:
    for where in ("a", "b"):
        (tmp_path / where / "utils").mkdir(parents=True)
        (tmp_path / where / "utils" / f"from_{where}.py").write_text("")
    spec = importlib.machinery.PathFinder.find_spec("utils", [str(tmp_path / "a"), str(tmp_path / "b")])
    assert spec is not None and spec.origin is None  # a namespace package: no __init__.py
    utils = importlib.util.module_from_spec(spec)
    inner = load("utils.from_a", tmp_path / "a" / "utils" / "from_a.py")
    found = judge({"utils": utils, "utils.from_a": inner}, tmp_path / "a", tmp_path / "b")
    assert found == Origins(
        sources=(
            Source(str(tmp_path / "a"), "utils", "namespace"),
            Source(str(tmp_path / "b"), "utils", "namespace"),
        )
    )


def test_a_zip_import_is_named(tmp_path: Path) -> None:
    with zipfile.ZipFile(tmp_path / "app.zip", "w") as z:
        z.writestr("zmod.py", "Y = 2\n")
    spec = zipimport.zipimporter(str(tmp_path / "app.zip")).find_spec("zmod")
    assert spec is not None and spec.loader is not None
    zmod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zmod)
    found = judge({"zmod": zmod}, tmp_path / "app.zip")
    assert found == Origins(unshippable=(f"zmod (from the zip archive {tmp_path}/app.zip)",))


def test_a_frozen_module_is_the_interpreters(tmp_path: Path) -> None:
    import __hello__  # frozen into CPython, outside the standard library's names

    assert __hello__.__spec__.origin == "frozen"
    mine = ModuleType("myfrozen")  # frozen into this interpreter (Tools/freeze) with a file it lacks
    mine.__spec__ = importlib.machinery.ModuleSpec(
        "myfrozen", importlib.machinery.FrozenImporter, origin="frozen"
    )
    mine.__file__ = str(tmp_path / "myfrozen.py")
    assert judge({"__hello__": __hello__, "myfrozen": mine}, tmp_path) == Origins()


def test_a_submodule_from_outside_its_package_folder_is_named(tmp_path: Path) -> None:
    """``pkg.__path__`` extended by hand (``pkgutil.extend_path``): the package's folder lacks it."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "more" / "pkg").mkdir(parents=True)
    (tmp_path / "more" / "pkg" / "extra.py").write_text("")
    pkg = load("pkg", tmp_path / "pkg" / "__init__.py")
    extra = load("pkg.extra", tmp_path / "more" / "pkg" / "extra.py")
    found = judge({"pkg": pkg, "pkg.extra": extra}, tmp_path, tmp_path / "more")
    assert found.sources == (Source(str(tmp_path), "pkg", "package"),)
    assert found.unshippable == (f"pkg.extra (from {tmp_path}/more, outside the folder of pkg)",)


def test_a_compiled_submodule_of_a_package_is_named_compiled(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    so = tmp_path / "pkg" / "fast.cpython-311-x86_64-linux-gnu.so"
    so.write_bytes(b"")
    fast = ModuleType("pkg.fast")
    fast.__spec__ = importlib.util.spec_from_file_location("pkg.fast", so)  # not executed: not a real .so
    fast.__file__ = str(so)
    found = judge({"pkg": load("pkg", tmp_path / "pkg" / "__init__.py"), "pkg.fast": fast}, tmp_path)
    assert found == Origins(sources=(Source(str(tmp_path), "pkg", "package"),), compiled=("pkg.fast",))


def test_a_script_with_every_kind_launches_its_summary_not_a_crash(tmp_path: Path) -> None:
    """A real ``python script.py`` whose ``sys.modules`` holds each kind at once (``__mp_main__`` as
    torch makes it): the shipment packs, the summary names what stays behind."""
    (tmp_path / "app" / "utils").mkdir(parents=True)
    (tmp_path / "app" / "utils" / "data.py").write_text("N = 3\n")  # a namespace package
    (tmp_path / "app" / "helper.py").write_text("")
    with zipfile.ZipFile(tmp_path / "lib.zip", "w") as z:
        z.writestr("zmod.py", "")
    (tmp_path / "app" / "script.py").write_text(
        "import sys, types\n"
        "sys.modules['__mp_main__'] = sys.modules['__main__']  # what import torch does\n"
        f"sys.path.append({str(tmp_path / 'lib.zip')!r})\n"
        "import utils.data, helper, zmod\n"
        "sys.modules['cfg'] = helper\n"
        "from tlaunch.backends.ssh.modules import local_modules\n"
        "m = local_modules()\n"
        "m.pack('x/')\n"
        "print(sorted(n for _, n in m.files)); print(m.summary())\n"
    )
    done = subprocess.run(
        [sys.executable, "script.py"],
        cwd=tmp_path / "app",
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    names, summary = done.stdout.splitlines()
    assert eval(names) == ["helper.py", "utils/data.py"]
    assert summary == (
        "utils/, helper.py (2 files, 6 B); not shipped: "
        f"zmod (from the zip archive {tmp_path}/lib.zip), cfg (an alias of helper)"
    )


def test_a_job_started_by_a_server_ships_nothing_of_the_servers_folder(tmp_path: Path) -> None:
    """A job's launcher is ``python -m tlaunch....`` started where the job server runs: that folder's
    modules are the server's, not the job's (they once went to every host of its jobs)."""
    (tmp_path / "server_settings.py").write_text("TOKEN = 'x'\n")
    code = (
        "import sys\n"
        "from tlaunch.backends.ssh.modules import local_modules\n"
        "import tlaunch.control.starting.jobmain as entry\n"
        "sys.modules['__main__'].__spec__ = entry.__spec__  # as python -m tlaunch.control.starting.jobmain\n"
        "print(local_modules().names)\n"
    )

    def names(code: str) -> str:
        argv = [sys.executable, "-c", code]
        done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    assert names(code) == "()"
    as_a_user = code.replace("sys.modules['__main__'].__spec__ = entry.__spec__", "pass")
    assert names(as_a_user) == "('server_settings.py',)"  # a user's python -c: the folder is theirs
