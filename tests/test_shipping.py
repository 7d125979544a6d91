"""What a launch ships, without hosts: ignore rules (git itself as the oracle), the size limit and
its message, the launcher's own modules, values several nodes share, and the notes that say so."""

from __future__ import annotations

import importlib.util
import io
import os
import pickle
import subprocess
import sys
import tarfile
import textwrap
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tlaunch import lp_ssh as lp
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.errors import LaunchError
from tlaunch.plan import make_plan, placed_nodes
from tlaunch.runtime.bundle import Bundle
from tlaunch.runtime.packing import heavy_notes, pickle_nodes, pickle_nodes_shared
from tlaunch.ssh.sync import TAR_END, pack_dir, select


def write(root: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


# A tree that exercises the rules of git that matter: nested .gitignore files, negation,
# directory-only and anchored patterns, ** and a re-included file in a kept folder.
TREE: dict[str, str | bytes] = {
    ".gitignore": "data/\n*.ckpt\n!keep.ckpt\n/top.log\nbuild\n**/tmp/**\n",
    "train.py": "print('train')\n",
    "keep.ckpt": "k",
    "model.ckpt": "m",
    "top.log": "t",
    "sub/top.log": "kept: /top.log is anchored to the root",
    "sub/.gitignore": "*.csv\n!wanted.csv\nlocal/\n",
    "sub/a.csv": "a",
    "sub/wanted.csv": "w",
    "sub/local/x.txt": "x",
    "sub/data": "a file named data: data/ only matches folders",
    "data/big.bin": b"\0" * 4096,
    "deep/data/more.bin": b"\0" * 10,
    "build": "a file: 'build' matches files and folders",
    "src/build/out.o": "o",
    "src/tmp/scratch/x": "x",
    "src/pkg/__init__.py": "",
    ".venv/lib/site.py": "never shipped",
    "pkg/__pycache__/m.cpython-311.pyc": "never shipped",
}


def git_files(root: Path) -> set[str]:
    """What git itself keeps: tracked and untracked files its ignore rules do not drop."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=root, capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    return set(out.split())


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "proj"
    root.mkdir()
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    write(root, TREE)
    return root


def test_the_files_shipped_are_those_git_keeps(repo: Path) -> None:
    shipped = {p for p, _ in select(str(repo)).files}
    expected = {p for p in git_files(repo) if not p.startswith((".venv/", "pkg/__pycache__/"))}
    assert shipped == expected
    assert {"train.py", "keep.ckpt", "sub/top.log", "sub/wanted.csv", "sub/data"} <= shipped
    assert not {"model.ckpt", "top.log", "sub/a.csv", "data/big.bin", "build"} & shipped


def test_a_subfolder_of_a_work_tree_gets_the_rules_above_it(repo: Path) -> None:
    (repo / "sub" / "data").unlink()
    write(repo, {"sub/data/x.bin": "x", "sub/model.ckpt": "m", "sub/run.py": "r"})
    shipped = {p for p, _ in select(str(repo / "sub")).files}
    expected = {p.removeprefix("sub/") for p in git_files(repo) if p.startswith("sub/")}
    assert shipped == expected
    assert "run.py" in shipped and "data/x.bin" not in shipped and "model.ckpt" not in shipped


def test_tlaunchignore_wins_where_it_says_something(repo: Path) -> None:
    write(repo, {".tlaunchignore": "sub/\n!model.ckpt\n"})
    selection = select(str(repo))
    shipped = {p for p, _ in selection.files}
    assert "model.ckpt" in shipped  # git ignores it; .tlaunchignore brings it back
    assert not any(p.startswith("sub/") for p in shipped)  # git keeps it; .tlaunchignore leaves it out
    left = {path: source for path, source, _, _ in selection.left_out}
    assert left["sub/"] == ".tlaunchignore" and left["data/"] == ".gitignore"


def test_outside_a_work_tree_the_files_are_read_all_the_same(tmp_path: Path) -> None:
    write(
        tmp_path,
        {".gitignore": "data/\n", "a.py": "", "data/x": "x", "b/.tlaunchignore": "*.bin\n", "b/y.bin": ""},
    )
    assert {p for p, _ in select(str(tmp_path)).files} == {".gitignore", "a.py", "b/.tlaunchignore"}


def test_the_summary_says_what_is_shipped_and_what_was_left_out(repo: Path) -> None:
    text = select(str(repo)).summary()
    assert text.startswith(f"{len(git_files(repo)) - 2} files, ")
    assert "left out: " in text and "data/ (4.0 KiB, 1 file)" in text and "by .gitignore" in text


def test_a_big_working_dir_names_its_largest_entries_and_the_ways_out(tmp_path: Path) -> None:
    write(tmp_path, {"train.py": "x", "ckpt/a.pt": b"\0" * (3 << 20), "ckpt/b.pt": b"\0" * (2 << 20)})
    write(tmp_path, {"notes.bin": b"\0" * (1 << 20), ".gitignore": "notes.bin\n"})
    with pytest.raises(LaunchError) as info:
        pack_dir(str(tmp_path), 4 << 20)
    text = str(info.value)
    assert "holds 5.0 MiB to ship (the ignore files left out notes.bin (1.0 MiB))" in text
    assert "over the limit of 4 MiB" in text
    assert "the largest: ckpt/ (5.0 MiB), .gitignore (10 B), train.py (1 B)" in text
    assert ".tlaunchignore" in text and "working_dir=False" in text and "--no-ship" in text
    assert "working_dir_limit_mib" in text
    (tmp_path / ".tlaunchignore").write_text("ckpt/\n")
    packed = pack_dir(str(tmp_path), 4 << 20)
    with tarfile.open(fileobj=io.BytesIO(packed.members + TAR_END)) as tar:
        assert sorted(tar.getnames()) == [".gitignore", ".tlaunchignore", "train.py"]


def test_working_dir_true_is_refused() -> None:
    with pytest.raises(LaunchError, match=r"working_dir=True: give a folder .* or False"):
        SSHOptions.from_kwargs({"working_dir": True}, "ssh")
    with pytest.raises(LaunchError, match=r"shared_paths=\('train.py',\) must be a list of absolute paths"):
        SSHOptions.from_kwargs({"working_dir": False, "shared_paths": ("train.py",)}, "ssh")


def test_no_ship_and_working_dir_together_are_refused() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tlaunch.cli.main", "torchrun", "--hosts", "th1", "--no-ship",
         "--working-dir", "/srv/x", "train.py"],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert (
        "--no-ship ships nothing and --working-dir '/srv/x' ships a folder: give one of them" in done.stderr
    )
    assert "Traceback" not in done.stderr


# -- the launcher's own modules -------------------------------------------------


def test_the_launchers_folder_and_imported_modules_travel(tmp_path: Path) -> None:
    """A script's folder: its modules and packages (their .py files only, ignore files honoured)."""
    write(
        tmp_path / "app",
        {
            "launcher.py": "import sys; sys.path.insert(0, sys.argv[1]); import elsewhere\n"
            "from tlaunch.backends.ssh.modules import local_modules\n"
            "m = local_modules()\nprint(sorted(n for _, n in m.files)); print(m.summary())\n",
            "helper.py": "VALUE = 1\n",
            "mypkg/__init__.py": "",
            "mypkg/core.py": "",
            "mypkg/weights.bin": "data is not Python",
            "mypkg/sub/__init__.py": "",
            "notapkg/x.py": "no __init__.py: not importable as a package",
            "ignored.py": "",
            "this.py": "a standard library name: never shipped (it would shadow the library)",
            "fast.cpython-311-x86_64-linux-gnu.so": "",
            ".gitignore": "ignored.py\n",
        },
    )
    write(tmp_path / "lib", {"elsewhere.py": "VALUE = 2\n", "never_imported.py": ""})
    done = subprocess.run(
        [sys.executable, str(tmp_path / "app" / "launcher.py"), str(tmp_path / "lib")],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    names, summary = done.stdout.splitlines()
    assert eval(names) == [  # the launcher's own script is __main__: pickled by value, not shipped
        "elsewhere.py", "helper.py", "mypkg/__init__.py", "mypkg/core.py", "mypkg/sub/__init__.py"
    ]  # fmt: skip
    assert summary.startswith("elsewhere.py, helper.py, mypkg/ (5 files, "), summary


def test_more_source_than_the_limit_stays_behind_and_is_named(tmp_path: Path) -> None:
    write(
        tmp_path,
        {
            "launcher.py": "import sys; sys.path.insert(0, sys.argv[1]); import big, small\n"
            "from tlaunch.backends.ssh.modules import local_modules\n"
            "m = local_modules(limit=int(sys.argv[2]))\nprint(m.names); print(m.summary())\n",
            "beside.py": "x = 1\n" * 100,
        },
    )
    write(tmp_path / "lib", {"big.py": "x = 1\n" * 2000, "small.py": "x = 1\n"})

    def names_and_summary(limit: int) -> tuple[str, str]:
        done = subprocess.run(
            [sys.executable, "launcher.py", str(tmp_path / "lib"), str(limit)],
            capture_output=True, text=True, check=True, cwd=tmp_path,
        )  # fmt: skip
        names, summary = done.stdout.splitlines()
        return names, summary

    assert names_and_summary(1 << 20)[0] == "('big.py', 'small.py', 'beside.py')"
    names, summary = names_and_summary(12_100)  # big and small fit, with beside.py they do not
    assert names == "('big.py', 'small.py')"
    assert (
        f"not shipped, over 11.8 KiB of source: the Python files of {tmp_path} (12.3 KiB with the rest)"
        in summary
    )
    names, summary = names_and_summary(1000)
    assert names == "('small.py',)" and "big (11.7 KiB)" in summary and ".tlaunchignore" in summary


def test_a_compiled_module_is_named_and_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import _json  # a compiled module of the standard library, copied as if it were the user's

    from tlaunch.backends.ssh.modules import local_modules

    if not str(getattr(_json, "__file__", "")).endswith(".so"):
        pytest.skip("_json is built into this interpreter")
    (tmp_path / "userext.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    fake = type(sys)("userfast")  # as the import system makes it, not executed (not a real .so)
    fake.__file__ = str(tmp_path / "userfast.cpython-311-x86_64-linux-gnu.so")
    fake.__spec__ = importlib.util.spec_from_file_location("userfast", fake.__file__)
    Path(fake.__file__).write_bytes(b"")
    monkeypatch.setitem(sys.modules, "userfast", fake)
    found = local_modules()
    assert "userfast" in found.compiled and "compiled, not shipped: userfast" in found.summary()
    assert not any(name.startswith("userfast") for _, name in found.files)


# -- values several nodes share ---------------------------------------------------


def shared_program(array: np.ndarray, hosts: list[str]) -> lp.Program:
    program = lp.Program("shared")
    with program.group("n"):
        for i, host in enumerate(hosts):
            program.add_node(lp.PyNode(np.sum, array).to_host(host))
            del i
    return program


def test_four_nodes_sharing_an_array_carry_one_copy_of_it() -> None:
    array = np.arange(8 << 20, dtype=np.uint8)  # 8 MiB
    program = shared_program(array, ["th1", "th1", "th2", "th2"])
    make_plan(program)
    nodes = {n.key or "": n for n in placed_nodes(program)}
    in_band = pickle_nodes(nodes)
    assert sum(map(len, in_band.values())) > 4 * array.nbytes  # what every node carried before
    shared = pickle_nodes_shared(nodes)
    assert len(shared.blobs) == 1 and all(len(p) < 4096 for p in shared.payloads.values())
    ((digest, blob),) = shared.blobs.items()
    assert blob.nbytes == array.nbytes and set(shared.buffers.values()) == {(digest,)}
    assert all(shared.size(k) < array.nbytes + 4096 for k in nodes)


def test_distinct_and_small_values_and_the_round_trip(tmp_path: Path) -> None:
    big, other, small = np.ones(1 << 18), np.zeros(1 << 18), np.arange(10)
    program = lp.Program("mixed")
    program.add_node(lp.PyNode(print, big, small, big).to_host("th1"), label="a")
    program.add_node(lp.PyNode(print, other, big).to_host("th1"), label="b")
    make_plan(program)
    nodes = {n.key or "": n for n in placed_nodes(program)}
    shared = pickle_nodes_shared(nodes)
    assert len(shared.blobs) == 2  # small stays in band; big is one blob however often it appears
    for digest, blob in shared.blobs.items():
        (tmp_path / digest).write_bytes(blob)
    files = {k: tuple(str(tmp_path / d) for d in ds) for k, ds in shared.buffers.items()}
    bundle = pickle.loads(pickle.dumps(Bundle(None, "", shared.payloads, files)))  # type: ignore[arg-type]
    a, b = bundle.node("a/0"), bundle.node("b/0")
    x, s, y = a._args
    assert np.array_equal(x, big) and np.array_equal(s, small) and np.array_equal(b._args[0], other)
    assert y is x  # one object in the node, as in the launcher
    x[0] = 5.0  # arrays made over the shipped bytes can be written, as before
    assert x[0] == 5.0


def test_the_notes_say_once_per_host_and_warn_of_heavy_hosts() -> None:
    array = np.zeros(100 << 20, dtype=np.uint8)
    program = shared_program(array, ["th1", "th1", "th1", "th2"])
    plan = make_plan(program)
    nodes = {n.key or "": n for n in placed_nodes(program)}
    shared = pickle_nodes_shared(nodes)
    notes = heavy_notes(plan, shared.payloads, shared)
    assert notes == ["1 value that several nodes share (100.0 MiB) travels once per host, not once per node"]
    three = np.ones(100 << 20, dtype=np.uint8), np.ones(100 << 20, dtype=np.uint8) * 2, array
    program = lp.Program("heavy")
    for i, a in enumerate(three):
        program.add_node(lp.PyNode(np.sum, a).to_host("th1"), label=f"n{i}")
    plan = make_plan(program)
    nodes = {n.key or "": n for n in placed_nodes(program)}
    shared = pickle_nodes_shared(nodes)
    (warning,) = heavy_notes(plan, shared.payloads, shared)
    assert warning.startswith("warning: the nodes' arguments take 300 MiB on host th1")
    in_band = pickle_nodes(nodes)
    (warning,) = heavy_notes(plan, in_band, None)
    assert "every node process gets its own copy" in warning


def notebook(cells: list[str], cwd: Path) -> list[str]:
    """Run ``cells`` in a real IPython kernel; each cell's text (streams, displays, errors)."""
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    client = nbclient.NotebookClient(nb, timeout=180, kernel_name="python3", allow_errors=True)
    env = {**os.environ, "JUPYTER_PLATFORM_DIRS": "1"}
    with client.setup_kernel(env=env, cwd=str(cwd)):
        for i, cell in enumerate(nb.cells):
            client.execute_cell(cell, i)
    texts = []
    for cell in nb.cells:
        text = ""
        for o in cell.outputs:
            text += o.get("text", "") + o.get("data", {}).get("text/plain", "")
            if o.get("output_type") == "error":
                text += f"{o['ename']}: {o['evalue']}"
        texts.append(text)
    return texts


def test_the_size_warning_reaches_a_notebook_cell(tmp_path: Path) -> None:
    """Said on the launch's display (logged too), so it reaches the cell wherever logging was configured."""
    cell = textwrap.dedent(
        """
        import logging, os
        import numpy as np
        from tlaunch import lp_ssh as lp
        logging.basicConfig(stream=open(os.devnull, "w"), force=True)  # the kernel logs elsewhere

        data = np.ones(70 << 20, dtype=np.uint8)
        p = lp.Program("heavy")
        with p.group("n"):
            for _ in range(4):
                p.add_node(lp.PyNode(np.sum, data))
        lp.launch(p, launch_type="local_mp")
        """
    )
    (out,) = notebook([cell], tmp_path)
    assert "tlaunch: warning: the nodes' arguments take 280 MiB (n/" in out, out
    assert "every node process gets its own copy" in out


def test_a_job_package_is_what_a_launch_would_ship(tmp_path: Path) -> None:
    """``tlaunch job submit DIR`` uploads the tracked files: an ignored data folder stays here."""
    from tlaunch.jobs.client import pack_dir as pack_package

    files = {
        ".gitignore": "data/\n*.ckpt\n",
        "train.py": "print('hi')\n",
        "requirements.txt": "\n",
        "data/big.bin": "x" * 1000,
        "model.ckpt": "weights",
        "lib/util.py": "X = 1\n",
        ".git/HEAD": "ref: refs/heads/main\n",
        ".tlaunch/runs/r/log": "old",
        "__pycache__/train.cpython-311.pyc": "",
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    names = zipfile.ZipFile(io.BytesIO(pack_package(str(tmp_path)))).namelist()
    assert sorted(names) == [".gitignore", "lib/util.py", "requirements.txt", "train.py"]


@pytest.mark.parametrize("size", [1000, 300 << 10])
def test_a_small_shipment_goes_as_plain_tar_a_large_one_gzipd_and_both_unpack(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    """Below ``COMPRESS_FROM`` the stream is plain tar (no ``gzip`` on the host); from it on, gzip.
    Either way GNU tar, run as a host runs it, unpacks the common files and the host's own (0600)."""
    from tlaunch.backends.ssh.shipping import COMPRESS_FROM, Shipment

    work, home = tmp_path / "work", tmp_path / "home"
    payload = np.random.default_rng(0).integers(0, 256, size, dtype=np.uint8).tobytes()
    write(work, {"train.py": "print('hi')\n", "data.bin": payload})
    home.mkdir()
    monkeypatch.chdir(work)
    shipment = Shipment.make(SSHOptions(working_dir=str(work), ship_modules=False), ".tlaunch/runs/r")
    assert shipment.compressed == (size >= COMPRESS_FROM)
    stream = shipment.archive([("0.node", b"node file")], [0])
    assert stream[:2] == b"\x1f\x8b" if shipment.compressed else stream[:2] != b"\x1f\x8b"
    unpack = shipment.unpack()
    assert ("tar -xzf" in unpack) == shipment.compressed
    (home / ".tlaunch/runs").mkdir(parents=True)  # as preflight made it; the archive makes the rest
    subprocess.run(["sh", "-c", f"umask 022; {unpack}"], cwd=home, input=stream, check=True)
    run = home / ".tlaunch/runs/r"
    assert {(run / d).stat().st_mode & 0o777 for d in ("", "logs", "work")} == {0o700}
    assert (run / "work/data.bin").read_bytes() == payload
    assert (run / "0.node").read_bytes() == b"node file"
    assert (run / "0.node").stat().st_mode & 0o777 == 0o600
    assert run.stat().st_mode & 0o777 == 0o700 and (run / "logs").is_dir()
