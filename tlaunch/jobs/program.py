"""The ``program`` and ``function`` launch methods: a function of the job's package, named ``FILE:FUNCTION``.

A job names the function as ``FILE:FUNCTION`` (``train.py:make_program``);
the function returns a :class:`tlaunch.Program`, and the job launches that
program on its target. The contract:

- ``FUNCTION`` is defined at the top level of ``FILE`` (a ``.py`` file of the
  package); it is called with no arguments, or with ``pservers=N`` when the
  job gives ``pservers`` (the seed's parameter servers), and returns a
  :class:`~tlaunch.program.Program`;
- given ``pservers=N``, the program's group ``pserver`` must have ``N``
  nodes (the replica count of its parameter-server group);
- nodes the program does not place (``.to_host``) are spread over the job's
  hosts round-robin, in program order.

:func:`check_reference` checks a reference without running the package's code
(the job server does, before it accepts a job): the file, the function, and
a ``pservers`` parameter when ``pservers`` is given. :func:`load_program`
runs it (in the job's launcher, never in the server).
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from tlaunch.errors import LaunchError
from tlaunch.program import Program

__all__ = ["PSERVER_GROUP", "ProgramRef", "check_reference", "load_function", "load_program", "place_program"]

PSERVER_GROUP = "pserver"
"""The label of a program's parameter-server group (its size is the job's ``pservers``)."""


@dataclass(frozen=True)
class ProgramRef:
    """``FILE:FUNCTION``: the function of a package's file that makes the job's program."""

    file: str
    function: str

    @classmethod
    def parse(cls, text: str) -> ProgramRef:
        """``train.py:make_program`` as a reference.

        Raises:
            LaunchError: not ``FILE.py:FUNCTION``, or a file outside the package.
        """
        file, sep, function = str(text).rpartition(":")
        if not sep or not file.endswith(".py") or not function.isidentifier():
            raise LaunchError(
                f"program {text!r} is not FILE.py:FUNCTION; name the package's file and the function "
                "that returns the program, e.g. 'train.py:make_program'"
            )
        norm = os.path.normpath(file)
        if os.path.isabs(norm) or norm.split(os.sep)[0] == "..":
            raise LaunchError(f"program {text!r}: {file!r} is not a file inside the package")
        return cls(norm, function)

    def __str__(self) -> str:
        return f"{self.file}:{self.function}"


def check_reference(folder: str, ref: ProgramRef, pservers: int = 0) -> None:
    """Check ``ref`` against the package in ``folder`` without running any of its code.

    Raises:
        LaunchError: no such file, it does not parse, it defines no such function at
            its top level, or the function takes no ``pservers`` while ``pservers`` is given.
    """
    path = os.path.join(folder, ref.file)
    if not os.path.isfile(path):
        raise LaunchError(f"program {ref}: the package has no file {ref.file!r}")
    with open(path, "rb") as f:
        source = f.read()
    try:
        tree = ast.parse(source, filename=ref.file)
    except SyntaxError as exc:
        raise LaunchError(f"program {ref}: {ref.file} does not parse: line {exc.lineno}: {exc.msg}") from None
    defs = [
        node
        for node in tree.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == ref.function
    ]
    if not defs:
        known = [n.name for n in tree.body if isinstance(n, ast.FunctionDef)]
        raise LaunchError(
            f"program {ref}: {ref.file} defines no function {ref.function!r} at its top level "
            f"(its functions: {known or 'none'})"
        )
    if pservers:
        args = defs[-1].args
        names = {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}
        if "pservers" not in names and args.kwarg is None:
            raise LaunchError(
                f"pservers={pservers}: {ref.function}() takes no 'pservers' parameter, so the program "
                f"cannot be told how many parameter servers to make; add `pservers: int` to "
                f"{ref.function} (the replica count of its group {PSERVER_GROUP!r}), or leave pservers 0"
            )


def load_function(folder: str, ref: ProgramRef) -> Callable[..., Any]:
    """``ref``'s function: its file imported as a module (``folder`` on ``sys.path``).

    Raises:
        LaunchError: the reference does not check (:func:`check_reference`).
    """
    check_reference(folder, ref)
    path = os.path.abspath(os.path.join(folder, ref.file))
    name = os.path.splitext(ref.file)[0].replace(os.sep, ".")
    if os.path.abspath(folder) not in sys.path:
        sys.path.insert(0, os.path.abspath(folder))
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # its nodes pickle by reference where the package is (shipped)
    spec.loader.exec_module(module)
    function: Callable[..., Any] = getattr(module, ref.function)
    return function


def load_program(folder: str, ref: ProgramRef, pservers: int = 0) -> Program:
    """Run ``ref``'s function (see :func:`load_function`); its program.

    Raises:
        LaunchError: the reference does not check (:func:`check_reference`), the function
            returns something else than a :class:`Program`, or its ``pserver`` group has
            not ``pservers`` nodes.
    """
    check_reference(folder, ref, pservers)
    function = load_function(folder, ref)
    if pservers:
        bound = inspect.signature(function).bind_partial(pservers=pservers)
        program = function(*bound.args, **bound.kwargs)
    else:
        program = function()
    if not isinstance(program, Program):
        raise LaunchError(
            f"program {ref}: {ref.function}() returned {type(program).__name__}, not a tlaunch Program; "
            "return the program it builds (p = tlaunch.Program('name'); ...; return p)"
        )
    if pservers:
        have = len(program.groups.get(PSERVER_GROUP, []))
        if have != pservers:
            raise LaunchError(
                f"pservers={pservers}: {ref.function}(pservers={pservers}) made a program whose group "
                f"{PSERVER_GROUP!r} has {have} nodes; it must have {pservers} (with "
                f"p.group({PSERVER_GROUP!r}): add one node per parameter server)"
            )
    return program


def place_program(program: Program, hosts: Sequence[str]) -> None:
    """Put the nodes ``program`` does not place on ``hosts``, round-robin in program order.

    Nothing is placed when every host is this machine (the program runs here).
    """
    from tlaunch.hosts import parse_host

    if all(parse_host(h).is_local for h in hosts):
        return
    unplaced = [n for n in program.get_all_nodes() if n.host is None]
    for i, node in enumerate(unplaced):
        node.to_host(hosts[i % len(hosts)])
