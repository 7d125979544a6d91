"""The tree shows the architecture: imports only point down the layers, and there is no cycle.

Every import counts, wherever it is: at module level, inside a function (lazy
imports) and under ``TYPE_CHECKING``. See ``docs/how-it-works.md`` for the layers.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
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
    ("tlaunch.errors", "tlaunch.launch_types", "tlaunch.pickling"),
    ("tlaunch.extras",),
    ("tlaunch.procs", "tlaunch.hosts", "tlaunch.flags", "tlaunch.nodelist", "tlaunch.allocation"),
    ("tlaunch.rpc",),
    ("tlaunch.context",),
    ("tlaunch.nodes",),
    ("tlaunch.program",),
    ("tlaunch.plan",),
    ("tlaunch.runtime",),
    ("tlaunch.ssh", "tlaunch.k8s"),
    ("tlaunch.jobs",),
    ("tlaunch.backends.handle",),
    ("tlaunch.backends.base", "tlaunch.backends.tmux"),
    ("tlaunch.backends.traits",),
    ("tlaunch.backends.nodeprocs",),
    ("tlaunch.backends.recorded",),
    BACKENDS,
    ("tlaunch.backends",),
    ("tlaunch.options", "tlaunch.display", "tlaunch.launchpad_args", "tlaunch.hints"),
    ("tlaunch.workers",),
    ("tlaunch.run",),
    ("tlaunch.launcher",),
    # The entry point of a submitted batch job: a program of its own, which calls launch().
    ("tlaunch.lp_ssh", "tlaunch", "tlaunch.backends.slurm.jobmain"),
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
        "tlaunch.run": 420,  # Launchpad's Run API and the RunHandle view of the same run
        "tlaunch.runtime.coordinator": 420,  # the registry, the node state machine, its long polls: one lock
    }
    over = {m: n for m, n in big.items() if n > allowed.get(m, 400)}
    assert not over, over


def _strings(node: ast.AST) -> set[str]:
    """The string constants of an expression (a tuple's too)."""
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


# A submission target chosen by a flag of tlaunchrun (``--backend slurm``) in the job's spec: it goes
# when JobSpec no longer names its target (tlaunchrun maps the flag to a control.submit target).
_TARGET_FLAGS = {"tlaunch.jobs.spec"}


def test_only_a_backend_branches_on_a_backend_name() -> None:
    """``record.backend == "ssh"`` outside the backend is a capability missing from its protocol."""
    wrong = []
    for module, path in MODULES.items():
        if module.startswith("tlaunch.backends.") or module == "tlaunch.backends" or module in _TARGET_FLAGS:
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Compare):
                continue
            sides = [node.left, *node.comparators]
            names = set().union(*(_strings(side) for side in sides)) & BACKEND_NAMES
            if names and any("backend" in ast.unparse(side) for side in sides):
                wrong.append(f"{module}:{node.lineno}: {ast.unparse(node)}")
    assert not wrong, "\n".join(wrong)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the docstring constants of a module, its classes and functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def test_no_backend_reaches_the_cli() -> None:
    """Not by import, and not by a module name in a string (``python -m tlaunch.cli...``)."""
    wrong = []
    for module, path in MODULES.items():
        if not module.startswith("tlaunch.backends"):
            continue
        tree = ast.parse(path.read_text())
        docs = _docstrings(tree)
        wrong += [f"{module} imports {t}" for t in imports(module) if t.startswith("tlaunch.cli")]
        wrong += [
            f"{module}:{n.lineno} names {n.value!r}"
            for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs
            if "tlaunch.cli" in n.value
        ]
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
