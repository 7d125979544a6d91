"""The ``program`` launch method's pieces: a package's ``FILE:FUNCTION`` made into a program."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from tlaunch.errors import LaunchError
from tlaunch.jobs.program import PSERVER_GROUP, ProgramRef, check_reference, load_program, place_program
from tlaunch.launcher import launch
from tlaunch.program import Program

PACKAGE = textwrap.dedent(
    """
    import tlaunch
    from tlaunch import lp_ssh as lp

    RAN = []

    def serve(i):
        RAN.append(i)

    def make_program(pservers: int = 1):
        p = lp.Program("ps-demo")
        with p.group("pserver"):
            for i in range(pservers):
                p.add_node(lp.PyNode(serve, i))
        with p.group("trainer"):
            p.add_node(lp.PyNode(print, "training"))
        return p

    def no_pservers():
        return make_program(1)

    def wrong_count(pservers):
        return make_program(pservers + 1)

    def not_a_program():
        return 42

    if __name__ == "__main__":
        raise SystemExit("imported as a module, never run as a script")
    """
)


@pytest.fixture
def pkg(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text(PACKAGE)
    (tmp_path / "broken.py").write_text("def make_program(:\n")
    return tmp_path


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("train.py", "is not FILE.py:FUNCTION"),
        ("train.py:", "is not FILE.py:FUNCTION"),
        ("train:make_program", "is not FILE.py:FUNCTION"),
        ("train.py:make-program", "is not FILE.py:FUNCTION"),
        ("../train.py:make_program", "is not a file inside the package"),
        ("/etc/train.py:make_program", "is not a file inside the package"),
    ],
)
def test_bad_references_are_refused(text: str, why: str) -> None:
    with pytest.raises(LaunchError, match=why):
        ProgramRef.parse(text)


def test_a_reference_is_checked_without_running_the_package(pkg: Path) -> None:
    (pkg / "side_effect.py").write_text("open('ran', 'w').close()\ndef make_program(pservers): ...\n")
    check_reference(str(pkg), ProgramRef.parse("side_effect.py:make_program"), pservers=2)
    assert not (pkg / "ran").exists() and not Path("ran").exists()
    check_reference(str(pkg), ProgramRef.parse("train.py:make_program"), pservers=3)
    with pytest.raises(LaunchError, match=r"the package has no file 'nope\.py'"):
        check_reference(str(pkg), ProgramRef.parse("nope.py:make_program"))
    with pytest.raises(LaunchError, match=r"defines no function 'make' at its top level"):
        check_reference(str(pkg), ProgramRef.parse("train.py:make"))
    with pytest.raises(LaunchError, match=r"broken\.py does not parse: line 1"):
        check_reference(str(pkg), ProgramRef.parse("broken.py:make_program"))
    with pytest.raises(LaunchError, match=r"pservers=2: no_pservers\(\) takes no 'pservers' parameter"):
        check_reference(str(pkg), ProgramRef.parse("train.py:no_pservers"), pservers=2)


def test_pservers_is_the_replica_count_of_the_pserver_group(pkg: Path) -> None:
    program = load_program(str(pkg), ProgramRef.parse("train.py:make_program"), pservers=3)
    assert isinstance(program, Program) and len(program.groups[PSERVER_GROUP]) == 3
    assert len(load_program(str(pkg), ProgramRef.parse("train.py:make_program")).groups[PSERVER_GROUP]) == 1
    with pytest.raises(LaunchError, match="group 'pserver' has 3 nodes; it must have 2"):
        load_program(str(pkg), ProgramRef.parse("train.py:wrong_count"), pservers=2)
    with pytest.raises(LaunchError, match="returned int, not a tlaunch Program"):
        load_program(str(pkg), ProgramRef.parse("train.py:not_a_program"))


def test_unplaced_nodes_are_spread_over_the_hosts(pkg: Path) -> None:
    program = load_program(str(pkg), ProgramRef.parse("train.py:make_program"), pservers=2)
    place_program(program, ["localhost"])
    assert all(n.host is None for n in program.get_all_nodes())  # this machine: nothing to place
    program.groups["trainer"][0].to_host("h9")
    place_program(program, ["h1", "h2"])
    assert [str(n.host) for n in program.get_all_nodes()] == ["h1", "h2", "h9"]


def test_a_loaded_program_runs(pkg: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TLAUNCH_HOME", str(tmp_path / "home"))
    program = load_program(str(pkg), ProgramRef.parse("train.py:make_program"), pservers=2)
    run = launch(program, launch_type="local_mp", terminal="output_to_files")
    assert run.done and {n.state for n in run.snapshot().nodes} == {"done"}
    with pytest.raises(LaunchError, match=r"run_id='\.\./escape' is not a valid run id"):
        launch(program, launch_type="local_mp", run_id="../escape")
    with pytest.raises(LaunchError, match=f"run_id={run.run_id!r}: a run of that id exists"):
        launch(program, launch_type="local_mp", run_id=run.run_id)
