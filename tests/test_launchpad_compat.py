"""Launchpad programs on tlaunch: each behaviour from Launchpad's documented semantics.

Scripts run both ways a Launchpad user can: with the import changed
(``from tlaunch import lp_ssh as lp``) and unchanged through the alias
(``python -m tlaunch.compat script.py``). In-process tests use the same API.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest
from pathlib import Path
from typing import Any

import pytest

import tlaunch.compat
from tlaunch import lp_ssh as lp
from tlaunch.compat.launchpad.launch import worker_manager
from tlaunch.compat.launchpad.launch.test_multi_threading import address_builder
from tlaunch.errors import PicklingError, RunFailedError

ROUTES = ("import", "alias")
IMPORTS = {"import": "from tlaunch import lp_ssh as lp", "alias": "import launchpad as lp"}


def run_script(
    tmp_path: Path,
    route: str,
    body: str,
    *args: str,
    name: str = "prog.py",
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``body`` (``{IMPORT}`` becomes the route's import) as a script, the route's way."""
    script = tmp_path / name
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(textwrap.dedent(body).replace("{IMPORT}", IMPORTS[route]))
    cmd = [sys.executable, *(["-m", "tlaunch.compat"] if route == "alias" else []), str(script), *args]
    full_env = {**os.environ, "PYTHONPATH": os.getcwd(), **(env or {})}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=full_env, check=False)


# -- flags ------------------------------------------------------------------

FLAG_SCRIPT = """
    import os
    from absl import app, flags
    {IMPORT}

    NUM = flags.DEFINE_integer("num", 1, "a flag of the user's program")
    FLAGS = flags.FLAGS
    LAUNCHER = os.getpid()

    def node():
        same = os.getpid() == LAUNCHER
        print(f"node: same_process={same} type={lp.get_context().launch_type} num={FLAGS.num}", flush=True)

    def main(_):
        print(f"flag: {lp.LAUNCH_TYPE.value} local={lp.is_local_launch_or_test(lp.LAUNCH_TYPE.value)}")
        p = lp.Program("flags")
        p.add_node(lp.PyNode(node), label="n")
        run = lp.launch(p)
        run.wait()

    if __name__ == "__main__":
        app.run(main)
"""


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("launch_type", ["local_mt", "local_mp", "test_mt", "test_mp"])
def test_lp_launch_type_flag_and_user_flags_reach_nodes(tmp_path: Path, route: str, launch_type: str) -> None:
    """``--lp_launch_type`` picks the launch type; the launcher's flags hold in every node, FLAGS pickles."""
    out = run_script(tmp_path, route, FLAG_SCRIPT, f"--lp_launch_type={launch_type}", "--num=7")
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"flag: {launch_type} local=True" in out.stdout
    threads = launch_type.endswith("_mt")
    assert f"node: same_process={threads} type={launch_type} num=7" in out.stdout


@pytest.mark.parametrize(("route", "default"), [("import", "local_mp"), ("alias", "local_mt")])
def test_default_launch_type(tmp_path: Path, route: str, default: str) -> None:
    """Without the flag: Launchpad's default (threads) through the alias, tlaunch's (processes) by import."""
    out = run_script(tmp_path, route, FLAG_SCRIPT)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"flag: {default} local=True" in out.stdout
    assert f"type={default} num=1" in out.stdout


def test_lp_terminal_flag(tmp_path: Path) -> None:
    body = """
        from absl import app
        {IMPORT}

        def main(_):
            p = lp.Program("t")
            p.add_node(lp.PyNode(print, "into the log"), label="n")
            print("logs:", lp.launch(p, launch_type="local_mp").log_dir)

        if __name__ == "__main__":
            app.run(main)
    """
    out = run_script(tmp_path, "import", body, "--lp_terminal=output_to_files")
    assert out.returncode == 0, out.stderr
    assert "into the log" not in out.stdout
    log_dir = out.stdout.split("logs:", 1)[1].strip()
    assert "into the log" in (Path(log_dir) / "n_0.log").read_text()


def test_flags_name_and_unpicklable_state_is_named(tmp_path: Path) -> None:
    """A node holding something that cannot pickle is named with its label, before anything starts."""
    p = lp.Program("bad")
    p.add_node(lp.PyNode(print, threading.Lock()), label="locked")
    with pytest.raises(RuntimeError, match="The nodes associated to the label 'locked'"):
        lp.launch(p, launch_type="test_mt")


# -- names ----------------------------------------------------------------

LAUNCHPAD_NAMES = """
    Address AbstractAddressBuilder CourierClient CourierHandle CourierNode LAUNCH_TYPE LaunchType
    MultiProcessingColocation MultiThreadingColocation Program PyClassNode PyNode PythonProcess
    SimpleLocalAddressBuilder batched_handler context flags get_port_from_address is_local_launch
    is_local_launch_or_test launch make_program_stopper register_stop_handler stop stop_event
    unregister_stop_handler wait_for_stop
""".split()


def test_launchpad_names() -> None:
    import tlaunch.compat.launchpad as alias_lp

    for module in (lp, alias_lp):
        missing = [n for n in LAUNCHPAD_NAMES if not hasattr(module, n)]
        assert not missing, (module.__name__, missing)
    assert lp.LaunchType.TEST_MULTI_PROCESSING.value == "test_mp"
    assert lp.is_local_launch("local_mp") and lp.is_local_launch(lp.LaunchType.LOCAL_MULTI_THREADING)
    assert not lp.is_local_launch("test_mt") and lp.is_local_launch_or_test("test_mp")
    assert alias_lp.context.LaunchType is lp.LaunchType
    assert callable(alias_lp.launch) and alias_lp.launch is lp.launch
    with pytest.raises(AttributeError, match="Reverb nodes are not supported"):
        alias_lp.ReverbNode


def test_unsupported_launch_types_are_named() -> None:
    p = lp.Program("x")
    p.add_node(lp.PyNode(print), label="n")
    with pytest.raises(lp.LaunchError, match=r"'vertex_ai' .* tlaunch does not run it"):
        lp.launch(p, launch_type=lp.LaunchType.VERTEX_AI)


def test_addresses() -> None:
    """Launchpad's addressing: allocate, bind to a free local port, resolve, take its port."""
    address = lp.Address()
    node = lp.PyNode(print)
    node.allocate_address(address)
    address_builder.bind_addresses([node])
    host, port = address.resolve().rsplit(":", 1)
    assert host == "localhost" and lp.get_port_from_address(address.resolve()) == int(port) > 0


# -- launch() arguments and what it returns ------------------------------------


class Echo:
    def echo(self, x: Any) -> Any:
        return x

    def __call__(self, x: int) -> int:
        return x + 1


def _noop() -> None:
    pass


def _block() -> None:
    while not lp.wait_for_stop(timeout_secs=2):
        pass


def _fail() -> None:
    raise ValueError("Some error.")


def _env_and_flag(out: str) -> None:
    from absl import flags

    Path(out).write_text(f"{os.environ.get('GROUP_ENV')} {flags.FLAGS.group_flag}")


class LaunchArgumentsTest(unittest.TestCase):
    """Launchpad's launch arguments, with a test case as its tests pass one."""

    def test_list_of_programs_launches_the_first(self) -> None:
        first, second = lp.Program("first"), lp.Program("second")
        first.add_node(lp.PyNode(_noop), label="a")
        second.add_node(lp.PyNode(_noop), label="b")
        run = lp.launch([first, second], launch_type="test_mt", test_case=self, xm_resources={"ignored": 1})
        run.wait()
        self.assertEqual(list(run.status()), ["a/0"])

    def test_local_resources_env_and_args(self) -> None:
        scratch = tempfile.TemporaryDirectory()  # (TestCase.enterContext is 3.11+)
        self.addCleanup(scratch.cleanup)
        out = Path(scratch.name) / "seen"
        p = lp.Program("res")
        p.add_node(lp.PyNode(_env_and_flag, str(out)), label="g")
        resources = {"g": lp.PythonProcess(env={"GROUP_ENV": "yes"}, args={"group_flag": 5})}
        lp.launch(p, launch_type="test_mp", test_case=self, local_resources=resources).wait()
        self.assertEqual(out.read_text(), "yes 5")

    def test_serialize_py_nodes(self) -> None:
        p = lp.Program("ser")
        p.add_node(lp.PyNode(print, threading.Event()), label="my_node")
        with self.assertRaisesRegex(RuntimeError, "The nodes associated to the label 'my_node'"):
            lp.launch(p, launch_type="test_mt", test_case=self)
        lp.launch(p, launch_type="test_mt", test_case=self, serialize_py_nodes=False).wait()

    def test_test_mt_returns_at_once_and_handles_work_in_the_launcher(self) -> None:
        p = lp.Program("handles")
        handle = p.add_node(lp.CourierNode(Echo), label="echo")
        run = lp.launch(p, launch_type="test_mt", test_case=self)
        client = handle.dereference()
        self.assertEqual(client.echo("hi"), "hi")
        self.assertEqual(client(1), 2)  # a client is callable: the object's __call__
        self.assertEqual(client.futures(2).result(), 3)
        self.assertIsInstance(client, lp.CourierClient)
        self.assertFalse(run.wait(0.1))  # still serving: the test case's cleanup stops it

    def test_wait_for_some_groups(self) -> None:
        for launch_type in ("test_mt", "test_mp"):
            p = lp.Program("some")
            with p.group("main"):
                p.add_node(lp.PyNode(_noop))
            with p.group("daemon"):
                p.add_node(lp.PyNode(_block))
            run = lp.launch(p, launch_type=launch_type, test_case=self)
            run.wait(["main"])
            self.assertEqual(run.status()["main/0"]["state"], "done")
            self.assertNotIn(run.status()["daemon/0"]["state"], ("done", "stopped"))

    def test_wait_for_some_sees_a_failure_anywhere(self) -> None:
        p = lp.Program("fail")
        with p.group("main"):
            p.add_node(lp.PyNode(_block))
        with p.group("daemon"):
            p.add_node(lp.PyNode(_fail))
        run = lp.launch(p, launch_type="test_mp", test_case=self)
        with self.assertRaisesRegex(RuntimeError, "One of the workers exited") as info:
            run.wait(["main"])
        self.assertIsInstance(info.exception, RunFailedError)
        self.assertIn("ValueError: Some error.", info.exception.remote_traceback or "")

    def test_active_workers_by_group(self) -> None:
        p = lp.Program("groups")
        with p.group("foo"):
            p.add_node(lp.PyNode(_noop))
        with p.group("bar"):
            for _ in range(2):
                p.add_node(lp.PyNode(_noop))
        run = lp.launch(p, launch_type="test_mp", test_case=self)
        workers = run._active_workers
        self.assertEqual(sorted(workers), ["bar", "foo"])
        self.assertEqual(len(workers["bar"]), 2)
        workers["foo"][0].wait()
        self.assertEqual(workers["foo"][0].returncode, 0)

    def test_program_stopper_in_a_node(self) -> None:
        for launch_type in ("test_mt", "test_mp"):
            p = lp.Program("stopper")
            p.add_node(lp.PyNode(_block), label="block")
            p.add_node(lp.PyNode(_call, lp.make_program_stopper(launch_type)), label="stop")
            lp.launch(p, launch_type=launch_type, test_case=self).wait(timeout=60)


@pytest.mark.parametrize("launch_type", ["local_mp", "test_mt"])
def test_a_nodes_error_keeps_its_type(launch_type: str) -> None:
    """``except ValueError`` catches a node's ValueError, as in one process (and Launchpad's threads)."""
    p = lp.Program("typed")
    p.add_node(lp.PyNode(_fail), label="bad")
    with pytest.raises(ValueError, match="Some error") as info:
        terminal = "output_to_files" if launch_type == "local_mp" else None
        lp.launch(p, launch_type=launch_type, terminal=terminal, wait=True)
    assert isinstance(info.value, RunFailedError) and info.value.node == "bad/0"


def _call(fn: Any) -> None:
    fn()


@pytest.mark.parametrize("route", ROUTES)
def test_local_mt_returns_at_once_and_the_interpreter_waits(tmp_path: Path, route: str) -> None:
    body = """
        import time
        {IMPORT}

        def slow():
            time.sleep(0.5)
            print("node done", flush=True)

        p = lp.Program("mt")
        p.add_node(lp.PyNode(slow), label="slow")
        lp.launch(p, launch_type="local_mt")
        print("launch returned", flush=True)
    """
    out = run_script(tmp_path, route, body)
    assert out.returncode == 0, out.stderr
    if sys.version_info >= (3, 12):  # no new thread at shutdown there: launch() waits instead
        assert out.stdout.index("node done") < out.stdout.index("launch returned")
    else:
        assert out.stdout.index("launch returned") < out.stdout.index("node done")


# -- nodes ----------------------------------------------------------------


def test_colocation_nested_first_completed_and_errors() -> None:
    manager = worker_manager.WorkerManager(register_in_thread=True)
    try:
        slow_go, slow_done = threading.Event(), threading.Event()
        quick = lp.PyNode(_noop)
        slow = lp.PyNode(lambda: (slow_go.wait(), slow_done.set()))
        lp.MultiThreadingColocation([quick, slow], return_on_first_completed=True).run()
        assert not slow_done.is_set()  # returned when the quick one completed
        slow_go.set()
        assert slow_done.wait(10)
        with pytest.raises(ValueError, match="Some error"):
            lp.MultiThreadingColocation([lp.PyNode(_fail), lp.PyNode(_block)]).run()
    finally:
        manager.cleanup_after_test()


def _stop_now() -> None:
    lp.stop()


@pytest.mark.parametrize("launch_type", ["test_mt", "local_mp"])
def test_nested_colocation_stops(launch_type: str) -> None:
    p = lp.Program("nested")
    inner = lp.MultiThreadingColocation([lp.PyNode(_block), lp.PyNode(_stop_now)])
    p.add_node(lp.MultiThreadingColocation([lp.PyNode(_block), inner]), label="node")
    run = lp.launch(p, launch_type=launch_type, wait=False)
    assert run.wait(timeout=60)


def test_courier_node_outside_a_launch_serves_its_own_server() -> None:
    """Launchpad's node test: bind addresses by hand, run the node in a thread, call it (and ``__call__``)."""

    class Server:
        def __init__(self) -> None:
            self.server: Any = None
            self.pinged, self.called = threading.Event(), threading.Event()

        def ping(self) -> str:
            self.pinged.set()
            return "pong"

        def __call__(self) -> str:
            self.called.set()
            return "called"

        def set_courier_server(self, server: Any) -> None:
            self.server = server

        def run(self) -> None:
            self.server.Start()
            self.pinged.wait()
            self.called.wait()
            self.server.Stop()  # the call in flight still gets its reply

    for _ in range(20):  # the reply racing Stop() once lost it
        node = lp.CourierNode(Server)
        handle = node.create_handle()
        address_builder.bind_addresses([node])
        thread = threading.Thread(target=node.run)
        thread.start()
        client = handle.dereference()
        assert client.ping() == "pong"
        assert client() == "called"
        thread.join(10)


def test_courier_module_server_and_client() -> None:
    from tlaunch.compat import courier

    got = threading.Event()
    server = courier.Server(port=0)
    server.Bind("ping", got.set)
    server.Bind("add", lambda a, b: a + b)
    server.Start()
    try:
        client = courier.Client(server.address)
        client.ping()
        assert got.is_set() and client.add(2, 3) == 5
    finally:
        server.Stop()


def test_batched_handler_batches_concurrent_calls() -> None:
    sizes: list[int] = []

    class Summer:
        def __init__(self) -> None:
            self.compute = lp.batched_handler(batch_size=4)(self.compute)

        def compute(self, values: list[int]) -> list[int]:
            sizes.append(len(values))
            time.sleep(0.05)
            return [v * 10 for v in values]

    p = lp.Program("batch")
    handle = p.add_node(lp.CourierNode(Summer), label="server")
    with lp.launch(p, launch_type="local_mt", wait=False):
        client = handle.dereference()
        futures = [client.futures.compute(i) for i in range(8)]
        assert [f.result() for f in futures] == [i * 10 for i in range(8)]
    assert max(sizes) > 1 and sum(sizes) == 8


def test_program_labels_as_launchpad() -> None:
    p = lp.Program("labels")
    # Launchpad's own patterns (regular expressions, as its tests give them).
    with pytest.raises(ValueError, match=r"Label should not be empty."):
        p.add_node(lp.PyNode(_noop))
    with pytest.raises(ValueError, match="label does not match the current group"), p.group("foo"):
        p.add_node(lp.PyNode(_noop), label="bar")
    with pytest.raises(ValueError, match=r"group\(\) cannot be nested."), p.group("a"), p.group("b"):
        pass
    node = lp.PyNode(_noop)
    p.add_node(node, "x")
    with p.group("y"):
        p.add_node(node)  # Launchpad lets a program hold a node twice
    assert p.groups["x"] == [node] and p.groups["y"] == [node]
    with pytest.raises(lp.ProgramError, match="added 2 times \\(as 'x/0', 'y/0'\\)"):
        lp.launch(p, launch_type="test_mt")  # but no launch can place it twice


# -- the alias --------------------------------------------------------------

DEEP = """
    import courier
    import launchpad as lp
    from launchpad import context, program
    from launchpad.launch import worker_manager
    from launchpad.launch.test_multi_processing import launch as test_mp
    from launchpad.launch.test_multi_threading import address_builder, launch as test_mt
    from launchpad.nodes import base
    from launchpad.nodes.courier import courier_utils, node as courier_node
    from launchpad.nodes.python import local_multi_processing, node as python
    from launchpad.program_stopper import program_stopper
    from launchpad.stop_program import stop
    from launchpad.examples.mine.program import Producer, make_program

    assert program.Program is lp.Program and python.PyNode is lp.PyNode
    assert courier_node.CourierNode is lp.CourierNode and base.Node is lp.PyNode.__mro__[1]
    assert test_mt.worker_manager is worker_manager and courier.Server and courier.Client
    assert local_multi_processing.PythonProcess is lp.PythonProcess and stop.stop is lp.stop
    assert context.LaunchType.TEST_MULTI_PROCESSING.value == "test_mp"
    lp.launch(make_program(), launch_type="local_mp")  # the node process unpickles the user's module too
"""

PROGRAM = """
    import launchpad as lp

    class Producer:
        def run(self):
            print("produced by", __name__, flush=True)

    def make_program():
        p = lp.Program("mine")
        p.add_node(lp.CourierNode(Producer), label="producer")
        return p
"""


def test_alias_serves_deep_modules_and_the_users_checkout(tmp_path: Path) -> None:
    """A script inside a ``launchpad/`` checkout imports tlaunch's modules and its own ones."""
    checkout = tmp_path / "launchpad" / "examples" / "mine"
    checkout.mkdir(parents=True)
    (checkout / "program.py").write_text(textwrap.dedent(PROGRAM))
    out = run_script(tmp_path, "alias", DEEP, name="launchpad/examples/mine/launch.py")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "produced by launchpad.examples.mine.program" in out.stdout


def test_alias_is_refused_beside_dm_launchpad(tmp_path: Path) -> None:
    site = tmp_path / "site"
    dist = site / "dm_launchpad-0.5.2.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: dm-launchpad\nVersion: 0.5.2\n")
    out = run_script(tmp_path, "alias", "import launchpad\n", env={"PYTHONPATH": f"{os.getcwd()}:{site}"})
    assert out.returncode != 0
    assert "dm-launchpad 0.5.2 is installed" in out.stderr and "pip uninstall dm-launchpad" in out.stderr
    assert "Traceback" not in out.stderr


def test_install_after_launchpad_was_imported_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    import types

    monkeypatch.setitem(sys.modules, "launchpad", types.ModuleType("launchpad"))
    with pytest.raises(tlaunch.compat.AliasError, match=r"imported before tlaunch\.compat\.install"):
        tlaunch.compat.install()
    assert not tlaunch.compat.installed()


def test_lru_cache_of_a_local_function_reaches_a_process_node(tmp_path: Path) -> None:
    out = tmp_path / "out"

    def make() -> Any:
        import functools

        @functools.lru_cache(maxsize=2)
        def square(x: int) -> int:
            return x * x

        return square

    p = lp.Program("lru")
    square = make()
    p.add_node(lp.PyNode(lambda: out.write_text(str(square(4)))), label="n")
    lp.launch(p, launch_type="local_mp", terminal="output_to_files")
    assert out.read_text() == "16"


def test_pickling_error_stays_a_launch_error() -> None:
    assert issubclass(PicklingError, lp.LaunchError) and issubclass(PicklingError, RuntimeError)


class CleanupTest(unittest.TestCase):
    def test_a_failure_nobody_waited_for_fails_the_test(self) -> None:
        """Launchpad's test cleanup raises a node's failure that ``wait()`` did not raise."""
        for launch_type in ("test_mt", "test_mp"):
            p = lp.Program("unseen")
            p.add_node(lp.PyNode(_fail), label="bad")
            run = lp.launch(p, launch_type=launch_type)
            deadline = time.monotonic() + 30
            while run.failure() is None and time.monotonic() < deadline:
                time.sleep(0.05)
            with self.assertRaisesRegex(RunFailedError, "Some error"):
                run.cleanup_after_test(self)
            raised = lp.launch(p, launch_type=launch_type, test_case=self)
            with self.assertRaises(RunFailedError):
                raised.wait()
            raised.cleanup_after_test(self)  # raised once already: the cleanup passes


@pytest.mark.parametrize(
    ("launch_type", "line"), [("local_mt", "[0, 1, 4, 9]"), ("local_mp", "[consumer/0] [0, 1, 4, 9]")]
)
def test_the_readme_example_under_lp_launch_type(launch_type: str, line: str) -> None:
    example = Path(__file__).parent.parent / "examples" / "consumer_producer" / "run.py"
    out = subprocess.run(
        [sys.executable, str(example), f"--lp_launch_type={launch_type}"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert line in out.stdout.splitlines()
