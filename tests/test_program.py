"""Unit tests of the program graph, host strings and the launch plan (pure layers)."""

from __future__ import annotations

import pytest

from tlaunch import lp_ssh as lp
from tlaunch.errors import ProgramError
from tlaunch.hosts import HostSpec, parse_host
from tlaunch.plan import make_plan


class Obj:
    def ping(self) -> int:
        return 1


def test_groups_and_labels() -> None:
    p = lp.Program("prog")
    with p.group("actor"):
        a = [p.add_node(lp.CourierNode(Obj)) for _ in range(3)]
    p.add_node(lp.PyNode(print), label="learner")
    p.add_node(lp.PyNode(print), label="learner")  # a repeated label is the same group
    assert list(p.groups) == ["actor", "learner"]
    assert [len(v) for v in p.groups.values()] == [3, 2]
    assert [h.key for h in a] == ["actor/0", "actor/1", "actor/2"]
    assert len(p.get_all_nodes()) == 5


def test_label_errors() -> None:
    p = lp.Program("prog")
    with pytest.raises(ProgramError, match="needs a label"):
        p.add_node(lp.PyNode(print))
    with pytest.raises(ProgramError, match="is empty"):
        p.add_node(lp.PyNode(print), label="")
    with pytest.raises(ProgramError, match="is empty"), p.group(""):
        pass
    with p.group("a"):
        with pytest.raises(ProgramError, match="does not match the current group 'a'"):
            p.add_node(lp.PyNode(print), label="b")
        with pytest.raises(ProgramError, match="cannot be nested"), p.group("c"):
            pass
    with pytest.raises(ProgramError, match="control character"):
        p.add_node(lp.PyNode(print), label="a\nb")
    with pytest.raises(ProgramError, match="takes a node"):
        p.add_node(print, label="x")  # type: ignore[arg-type]


def test_node_added_twice_is_refused() -> None:
    """Launchpad lets a program list one node twice; it cannot run twice, so the launch says so."""
    p = lp.Program("prog")
    node = lp.PyNode(print)
    p.add_node(node, label="x")
    p.add_node(node, label="y")
    assert p.groups == {"x": [node], "y": [node]}
    with pytest.raises(ProgramError, match="added 2 times"):
        lp.launch(p, launch_type="local_mt")


def test_make_program() -> None:
    p = lp.make_program(lp.PyNode(print), lp.CourierNode(Obj))
    assert sorted(p.groups) == ["couriernode", "pynode"]


@pytest.mark.parametrize(
    ("text", "spec"),
    [
        ("host1", HostSpec("host1")),
        ("host1:2222", HostSpec("host1", port=2222)),
        ("alice@host1:22", HostSpec("host1", "alice", 22)),
        ("bob@10-x.example.org", HostSpec("10-x.example.org", "bob")),
        ("[::1]:22", HostSpec("::1", port=22)),
        ("th1", HostSpec("th1")),
    ],
)
def test_parse_host(text: str, spec: HostSpec) -> None:
    assert parse_host(text) == spec
    assert parse_host(str(spec)) == spec


@pytest.mark.parametrize(
    "bad",
    [
        "",
        " host",
        "a'; touch /tmp/x",
        "host name",
        "$(id)",
        "h:0",
        "h:70000",
        "h:ab",
        "u;x@h",
        "a\nb",
        5,
        None,
    ],
)
def test_parse_host_rejects(bad: object) -> None:
    with pytest.raises(ProgramError, match="invalid host") as info:
        parse_host(bad)
    assert repr(bad) in str(info.value)
    assert "valid forms" in str(info.value)


def test_to_host_chains_and_validates() -> None:
    node = lp.SSHNode(Obj).to_host("alice@th2:2200")
    assert node.host == HostSpec("th2", "alice", 2200)
    with pytest.raises(ProgramError):
        lp.PyNode(print).to_host("bad host")


def test_plan_checks_handles() -> None:
    outside = lp.CourierNode(Obj)
    stray = outside.create_handle()
    p = lp.Program("prog")
    p.add_node(lp.PyNode(print, [stray]), label="user")
    with pytest.raises(ProgramError, match="never added to a program"):
        make_plan(p)
    p2 = lp.Program("prog2")
    h = p2.add_node(lp.PyNode(print), label="fn")
    p2.add_node(lp.PyNode(print, {"x": (h,)}), label="user")
    with pytest.raises(ProgramError, match="serves nothing"):
        make_plan(p2)
    with pytest.raises(ProgramError, match="has no nodes"):
        make_plan(lp.Program("empty"))


def test_plan_resolves_nodes() -> None:
    p = lp.Program("prog")
    with p.group("w"):
        h = p.add_node(lp.CourierNode(Obj).to_host("th1"))
    p.add_node(lp.PyNode(print, h), label="c")
    plan = make_plan(p)
    assert [(n.key, n.kind, str(n.host) if n.host else None) for n in plan.nodes] == [
        ("w/0", "CourierNode", "th1"),
        ("c/0", "PyNode", None),
    ]
    assert plan.run_id.startswith("prog-")


def test_handle_outside_a_program_run() -> None:
    p = lp.Program("prog")
    h = p.add_node(lp.CourierNode(Obj), label="x")
    with pytest.raises(ProgramError, match="needs a running program"):
        h.dereference()
    with pytest.raises(ProgramError, match="needs a running program"):
        lp.stop()


def test_public_api_is_sorted_and_complete() -> None:
    import tlaunch

    for mod in (lp, tlaunch):
        assert list(mod.__all__) == sorted(mod.__all__)
        for name in mod.__all__:
            assert hasattr(mod, name), name
    launchpad_names = {
        "Program",
        "PyNode",
        "PyClassNode",
        "CourierNode",
        "MultiThreadingColocation",
        "launch",
        "stop",
        "wait_for_stop",
        "stop_event",
        "register_stop_handler",
        "make_program",
        "LaunchType",
        "get_context",
    }
    assert launchpad_names <= set(lp.__all__)
