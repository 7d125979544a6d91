"""The tree shows the architecture: imports only point down the layers, and there is no cycle.

Every import counts, wherever it is: at module level, inside a function (lazy
imports) and under ``TYPE_CHECKING``. See ``docs/how-it-works.md`` for the layers.

Over the whole tree too, with no exemption: nothing outside a backend branches on
a backend's name or a ``launch_type``; nothing outside the method table compares
or lists launch methods' names (tables keyed by method are checked against it);
no code string names a module of a higher layer, and none outside ``tlaunch.cli``
and ``tlaunch.control`` names them; only registries import by name; no runner
takes ``job: Any``; no call spreads a dict of options into ``launch()``.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import tlaunch

ROOT = Path(tlaunch.__file__).parent

# Lowest first: a module may import modules of lower layers, and its own package.
BACKENDS = (
    "tlaunch.backends.threads",
    "tlaunch.backends.local",
    "tlaunch.backends.ssh",
    "tlaunch.backends.slurm",
    "tlaunch.backends.k8s",
)
LAYERS: list[tuple[str, ...]] = [
    ("tlaunch.errors", "tlaunch.launch_types", "tlaunch.pickling", "tlaunch.lazy"),
    ("tlaunch.extras",),
    (
        "tlaunch.procs",
        "tlaunch.sockets",
        "tlaunch.accounts",
        "tlaunch.hosts",
        "tlaunch.flags",
        "tlaunch.nodelist",
        "tlaunch.allocation",
    ),
    ("tlaunch.rpc",),
    ("tlaunch.context",),
    ("tlaunch.nodes",),
    ("tlaunch.program",),
    ("tlaunch.plan",),
    ("tlaunch.runtime",),
    ("tlaunch.ssh", "tlaunch.k8s"),
    ("tlaunch.pool",),  # the job server's pool of SSH hosts: a pure core, and its probe over SSH
    ("tlaunch.jobs",),
    ("tlaunch.backends.handle", "tlaunch.backends.reaching"),
    ("tlaunch.backends.runstates",),
    ("tlaunch.backends.observed",),
    ("tlaunch.backends.logfiles",),
    ("tlaunch.backends.runspec",),
    ("tlaunch.backends.base", "tlaunch.backends.tmux"),
    ("tlaunch.backends.traits",),
    ("tlaunch.backends.nodeprocs",),
    ("tlaunch.backends.recorded",),
    BACKENDS,
    ("tlaunch.backends",),
    ("tlaunch.options", "tlaunch.display", "tlaunch.launchpad_args", "tlaunch.hints"),
    ("tlaunch.workers",),
    ("tlaunch.run_end",),
    ("tlaunch.run",),
    ("tlaunch.launcher",),
    ("tlaunch.lp_ssh", "tlaunch"),
    ("tlaunch.torch",),
    ("tlaunch.compat",),
    ("tlaunch.testing",),
    ("tlaunch.control",),  # what happens to a run after it starts, whatever started it
    ("tlaunch.cli", "tlaunch.server"),  # siblings on the top floor: neither imports the other
]
BACKEND_NAMES = {"local_mp", "local_mt", "test_mp", "test_mt", "ssh", "slurm", "k8s", "kubernetes"}


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


MODULES = {module_of(p): p for p in ROOT.rglob("*.py")}


def group(module: str) -> tuple[int, str]:
    """(layer, group prefix) of ``module``: the longest prefix listed in LAYERS."""
    best: tuple[int, str] | None = None
    for rank, prefixes in enumerate(LAYERS):
        for prefix in prefixes:
            if (module == prefix or module.startswith(prefix + ".")) and (
                best is None or len(prefix) > len(best[1])
            ):
                best = (rank, prefix)
    assert best is not None, f"{module} is in no layer of LAYERS"
    return best


def imports(module: str) -> set[str]:
    """The tlaunch modules ``module`` imports, anywhere in its file."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join([*parts[: len(parts) - node.level + 1], base]).strip(".")
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        found.update(n for n in names if n in MODULES)
    # A submodule's import of its own package (run first anyway) is no edge.
    return {n for n in found if n != module and not module.startswith(n + ".")}


def test_every_import_points_down_the_layers() -> None:
    wrong = []
    for module in sorted(MODULES):
        rank, prefix = group(module)
        for target in sorted(imports(module)):
            target_rank, target_prefix = group(target)
            if target_rank > rank or (target_rank == rank and target_prefix != prefix):
                wrong.append(f"{module} (layer {rank}) imports {target} (layer {target_rank})")
    assert not wrong, "\n".join(wrong)


def test_a_backend_imports_no_other_backend() -> None:
    backends = BACKENDS
    wrong = [
        f"{module} imports {target}"
        for module in MODULES
        for target in imports(module)
        if group(module)[1] in backends and group(target)[1] in backends and group(target) != group(module)
    ]
    assert not wrong, wrong


def test_no_import_cycles() -> None:
    graph = {m: imports(m) for m in MODULES}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for m in sorted(graph):
        if m not in index:
            visit(m)
    assert not cycles, cycles


def test_modules_stay_small() -> None:
    """Most modules stay under ~400 lines; the few above say why in their docstring."""
    big = {m: len(p.read_text().splitlines()) for m, p in MODULES.items()}
    allowed = {
        "tlaunch.rpc.transmit": 420,  # three table kinds and their checkpoint format, one protocol
        "tlaunch.runtime.coordinator": 420,  # the registry, the node state machine, its long polls: one lock
        "tlaunch.runtime.pyenv": 480,  # runs alone, one file, where tlaunch is not installed (a pod's init)
    }
    over = {m: n for m, n in big.items() if n > allowed.get(m, 400)}
    assert not over, over


def _strings(node: ast.AST) -> set[str]:
    """The string constants of an expression (a tuple's too)."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


def _trees() -> Iterator[tuple[str, ast.Module]]:
    for module, path in sorted(MODULES.items()):
        yield module, ast.parse(path.read_text())


def test_only_a_backend_branches_on_a_backend_name() -> None:
    """``record.backend == "ssh"`` (or ``launch_type == "test_mp"``) outside the backend is a capability
    missing from its protocol."""
    wrong = []
    for module, tree in _trees():
        if module.startswith("tlaunch.backends.") or module == "tlaunch.backends":
            continue
        for node in ast.walk(tree):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = set().union(*(_strings(side) for side in sides)) & BACKEND_NAMES
            if names and any(w in ast.unparse(side) for side in sides for w in ("backend", "launch_type")):
                wrong.append(f"{module}: {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


# -- the launch methods: one table owns every difference between them ---------------------

_METHOD_TABLE = "tlaunch.runtime.methods"


def _method_names() -> set[str]:
    from tlaunch.runtime.methods import METHODS

    return set(METHODS)


def method_name_comparisons() -> list[str]:
    """Every comparison with a launch method's name outside the method table (``method == "torchrun"``)."""
    names = _method_names()
    found = []
    for module, tree in _trees():
        if module == _METHOD_TABLE:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                if set().union(*(_strings(side) for side in (node.left, *node.comparators))) & names:
                    found.append(f"{module}: {ast.unparse(node)}")
    return found


def method_name_lists() -> list[str]:
    """Every hand-written list of two or more method names (a tuple, list, set, dict's keys or
    ``Literal``) outside the method table."""
    names = _method_names()
    found = []
    for module, tree in _trees():
        if module == _METHOD_TABLE:
            continue
        exported = {  # __all__ (function names), and the tables keyed by method
            id(n.value)
            for n in tree.body
            if isinstance(n, (ast.Assign, ast.AnnAssign))
            for target in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if ast.unparse(target) == "__all__" or (module, ast.unparse(target)) in _KEYED_BY_METHOD
        }
        for node in ast.walk(tree):
            if id(node) in exported:
                continue
            if isinstance(node, (ast.Tuple, ast.List, ast.Set)):  # ("basic", ...), (("basic", help), ...)
                items: list[ast.expr | None] = [
                    e.elts[0] if isinstance(e, ast.Tuple) and e.elts else e for e in node.elts
                ]
            elif isinstance(node, ast.Dict):
                items = list(node.keys)
            else:
                continue
            listed = [i.value for i in items if isinstance(i, ast.Constant) and i.value in names]
            if len(listed) >= 2:
                found.append(f"{module}: {ast.unparse(node)[:60]}")
    return found


# Tables keyed by method name, each checked against the method table by a test (test_torch_modes.py):
# the method's runner, the method's own ``tlaunch`` command.
_KEYED_BY_METHOD = {("tlaunch.control.starting.runners", "RUNNERS"), ("tlaunch.cli.torch", "_COMMANDS")}


def test_no_method_name_is_compared_outside_the_method_table() -> None:
    """What differs between launch methods is a field of their table: nothing above it compares names."""
    wrong = method_name_comparisons()
    assert not wrong, "\n".join(wrong)


def test_every_list_of_method_names_comes_from_the_table() -> None:
    """The CLI's choices, the server's validators, tlaunchrun's commands: all read the table."""
    wrong = method_name_lists()
    assert not wrong, "\n".join(wrong)


def test_no_job_runner_is_typed_any() -> None:
    """A runner takes a ``JobSpec`` (mypy checks every call), not ``job: Any``."""
    found = [
        f"{module}: {node.name}"
        for module, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
        for arg in (*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs)
        if arg.arg == "job" and arg.annotation is not None and ast.unparse(arg.annotation) == "Any"
    ]
    assert not found, "\n".join(found)


def test_no_call_flattens_options_into_launch() -> None:
    """``launch(program, options=...)`` takes typed options; no call spreads a dict into it."""
    found = [
        f"{module}: {ast.unparse(node)}"
        for module, tree in _trees()
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("launch", "_launch")
        if any(k.arg is None for k in node.keywords)
    ]
    assert not found, "\n".join(found)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def _code_strings(tree: ast.Module) -> Iterator[ast.Constant]:
    """The string constants of ``tree`` that are not documentation (docstrings, attribute docstrings)."""
    docs = _docstrings(tree) | {
        id(n.value) for n in ast.walk(tree) if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant)
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs:
            yield node


_MODULE_NAME = re.compile(r"\btlaunch(?:\.[A-Za-z_]\w*)+")


def strings_naming_higher_layers() -> list[str]:
    """Every code string (no spaces: an import path, ``-m`` argument, ``module:function``) that names a
    module of a higher layer than its own: an import the layer test cannot see."""
    found = []
    for module, tree in _trees():
        rank = group(module)[0]
        for node in _code_strings(tree):
            if any(c.isspace() for c in node.value):
                continue
            for name in _MODULE_NAME.findall(node.value):
                parts = name.split(".")
                while parts and ".".join(parts) not in MODULES:
                    parts.pop()
                if len(parts) > 1 and group(".".join(parts))[0] > rank:
                    found.append(f"{module}: {node.value!r}")
    return found


def test_no_string_names_a_module_of_a_higher_layer() -> None:
    """``"tlaunch.cli.main"`` in a batch script, ``"tlaunch.torch.basic:run_job"`` in a table: an upward
    import in disguise. A lower layer is given what it runs by its caller."""
    wrong = strings_naming_higher_layers()
    assert not wrong, "\n".join(wrong)


def test_nothing_outside_cli_and_control_names_them() -> None:
    """No string that is not documentation names them (``python -m tlaunch.cli...``): what runs a job
    below them is given its command by them. (Imports: the layers above.)"""
    wrong = []
    for module, tree in _trees():
        if module.startswith(("tlaunch.cli", "tlaunch.control")):
            continue
        wrong += [
            f"{module}: {n.value!r}"
            for n in _code_strings(tree)
            if "tlaunch.cli" in n.value or "tlaunch.control" in n.value
        ]
    assert not wrong, "\n".join(wrong)


# What may import by name (``importlib``), and why: registries and lazy re-exports of a package's own
# modules, the optional dependencies' one door, Launchpad's import hook, a user's own file.
_IMPORTLIB = {
    "tlaunch.backends": "the backend registry (built-in backends imported when first used)",
    "tlaunch.lazy": "a package's names from their modules, when first asked for (PEP 562)",
    "tlaunch.compat": "Launchpad's import names, mapped onto tlaunch's (an import hook)",
    "tlaunch.compat.launchpad": "its own modules, re-exported lazily",
    "tlaunch.extras": "optional dependencies, with an install hint when missing",
    "tlaunch.jobs.program": "a job's own file, loaded from its package (spec_from_file_location)",
    "tlaunch.hints": "whether a module can be found (find_spec), to say how to ship it",
    "tlaunch.torch.function": "whether torch is installed (find_spec)",
    "tlaunch.backends.ssh.origins": "what a module's spec says (importlib.machinery): which modules travel",
    "tlaunch.control.starting.programs": "whether torch is installed (find_spec): a function job's group",
    "tlaunch.server.dashboard": "its static files (importlib.resources)",
}


def test_importlib_only_in_registries() -> None:
    """Importing by a name in a string hides an edge from the layer test: only registries do it."""
    using = {
        module
        for module, tree in _trees()
        for node in ast.walk(tree)
        if (isinstance(node, ast.Import) and any(a.name.startswith("importlib") for a in node.names))
        or (isinstance(node, ast.ImportFrom) and (node.module or "").startswith("importlib"))
    }
    wrong = sorted(using - set(_IMPORTLIB))
    assert not wrong, wrong


def test_what_ranks_and_agents_import_leaves_ssh_and_slurm_out() -> None:
    """Every torch rank and agent imports ``tlaunch.torch``: not paramiko, nor the SSH or SLURM backend."""
    import subprocess
    import sys

    code = (
        "import sys, tlaunch.torch, tlaunch.torch.worker, tlaunch.torch.agent\n"
        "heavy = [m for m in sys.modules if m == 'paramiko' or m.startswith(('tlaunch.backends.ssh.backend', "
        "'tlaunch.backends.slurm.backend', 'tlaunch.ssh'))]\n"
        "print(heavy)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]", done.stdout


_NEVER_ON_A_HOST = {
    "tlaunch.runtime.packing",  # the launcher's pickling
    "tlaunch.rpc.transmit",  # TransmitNode's tables (with hashlib)
    "tlaunch.nodes.transmit",
    "tlaunch.nodes.colocation",
    "hashlib",
    "secrets",
    "random",
    "tempfile",
    "shutil",
    "absl",
}


@pytest.mark.parametrize(
    ("module", "absent"),
    [
        # A supervisor (its node is forked from it) imports what the node unpickles and runs.
        (
            "tlaunch.runtime.supervisor",
            {
                *_NEVER_ON_A_HOST,
                "tlaunch.plan",
                "tlaunch.program",
                "tlaunch.runtime.records",
                "json",
                "ctypes",
            },
        ),
        # The head unpickles no code: no cloudpickle.
        # nor nodes or programs (a plan is data: tlaunch.plan loads them only to make one).
        (
            "tlaunch.runtime.head",
            {*_NEVER_ON_A_HOST, "cloudpickle", "tlaunch.pickling", "tlaunch.program", "tlaunch.nodes.base"},
        ),
    ],
)
def test_the_processes_a_host_starts_import_only_what_they_use(module: str, absent: set[str]) -> None:
    """Every launch pays a host's imports again (~70 ms of CPU a process here): what a supervisor
    or the head never uses stays out (the launcher's side, other node types, hashing)."""
    code = f"import sys, {module}; print(' '.join(sorted(sys.modules)))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert not set(done.stdout.split()) & absent


def test_a_supervisor_reads_the_heads_address_without_json() -> None:
    """``coordinator.addr`` as the head writes it is read without json; anything else with it,
    and a file still being written is an error the supervisor waits past."""
    from tlaunch.runtime.supervisor import address_in

    for address in ("198.18.0.1:4000", "[::1]:5", "head.example:1"):
        assert address_in(json.dumps({"address": address, "pid": 7})) == address
    assert address_in(json.dumps({"pid": 7, "address": "10.0.0.1:2"}, indent=1)) == "10.0.0.1:2"
    assert address_in('{"address": "a\\u0062:1"}') == "ab:1"
    for partial in ("", '{"address": "198.18', '{"address": "198.18.0.1:4000", "pi'):
        with pytest.raises(ValueError):
            address_in(partial)
    with pytest.raises(KeyError):
        address_in("{}")
