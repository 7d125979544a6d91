"""Launchpad's command-line flags, defined when tlaunch's Launchpad API is imported.

``--lp_launch_type`` chooses the launch type when ``launch()`` is given none;
``--lp_terminal`` the terminal of ``local_mp``; ``--lp_termination_notice_secs``
is accepted for Launchpad's scripts. Flags parsed in the launcher reach every
node, in other processes and on other hosts (:func:`parsed_flags`,
:func:`restore_flags`).
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from absl import flags

from tlaunch.launch_types import LaunchType

__all__ = [
    "DEFAULT_LAUNCH_TYPE",
    "FLAGS",
    "LAUNCH_TYPE",
    "TERMINAL",
    "chosen",
    "flag_values",
    "kind_of",
    "parsed_flags",
    "restore_flags",
]

log = logging.getLogger(__name__)

FLAGS = flags.FLAGS

DEFAULT_LAUNCH_TYPE = "local_mp"
LAUNCH_TYPE = flags.DEFINE_enum(
    "lp_launch_type",
    DEFAULT_LAUNCH_TYPE,
    [t.value for t in LaunchType],
    "How launch() starts a program when it is given no launch_type (tlaunch's default: "
    "local_mp, or ssh when a node has a remote host; Launchpad's, under tlaunch.compat: local_mt).",
    allow_override=True,
)
TERMINAL = flags.DEFINE_string(
    "lp_terminal",
    None,
    "Where local_mp output goes when launch() is given no terminal: current_terminal, "
    "output_to_files or tmux_session.",
    allow_override=True,
)
_DEFAULTS = {"lp_launch_type": DEFAULT_LAUNCH_TYPE, "lp_terminal": None}
TERMINATION_NOTICE = flags.DEFINE_integer(
    "lp_termination_notice_secs",
    10,
    "Accepted for Launchpad's scripts; tlaunch's grace is launch(stop_grace=...).",
    allow_override=True,
)


def chosen(holder: flags.FlagHolder[Any]) -> Any:
    """A flag's value if it was chosen (on the command line, or a default set anew), else None.

    A script that never parsed its flags (Launchpad's examples may not) has
    ``--lp_*`` flags read from ``sys.argv`` here, leaving the others alone.
    """
    flag = FLAGS[holder.name]
    if not FLAGS.is_parsed() and any(a.startswith("--lp_") for a in sys.argv[1:]):
        FLAGS(sys.argv, known_only=True)
    if flag.present or flag.default != _DEFAULTS.get(holder.name, flag.default):
        return flag.value
    return None


_KINDS = {bool: "boolean", int: "integer", float: "float", str: "string", list: "list"}


def kind_of(value: Any) -> str | None:
    """The absl kind of flag that holds ``value`` (None: no simple kind)."""
    return next((k for t, k in _KINDS.items() if type(value) is t), None)


def flag_values(given: Mapping[str, Any] | Sequence[str]) -> dict[str, tuple[str, Any]]:
    """Flags for some nodes, as :func:`restore_flags` takes them: name -> (kind, value).

    ``given`` is a mapping (``{"batch_size": 8}``) or command-line flags
    (``["--batch_size=8", "--debug", "--nocheck"]``); a flag the launcher has
    defined is parsed by its definition, another one is a string (``--x``: True).

    Raises:
        ValueError: an item that is not ``--name``, ``--noname`` or ``--name=value``.
    """
    if isinstance(given, Mapping):
        return {str(k): (kind_of(v) or "string", v if kind_of(v) else str(v)) for k, v in given.items()}
    out: dict[str, tuple[str, Any]] = {}
    for item in given:
        name, eq, text = str(item).lstrip("-").partition("=")
        value: Any
        if not str(item).startswith("--") or not name:
            raise ValueError(f"flag {item!r} is not --name=value, --name or --noname")
        if (
            not eq
            and name.startswith("no")
            and name[2:] in FLAGS
            and kind_of(FLAGS[name[2:]].value) == "boolean"
        ):
            name, value = name[2:], False
        elif not eq:
            value = True
        elif name in FLAGS:
            value = FLAGS[name].parser.parse(text)
        else:
            value = text
        out[name] = (kind_of(value) or "string", value if kind_of(value) else str(value))
    return out


def parsed_flags() -> dict[str, tuple[str, Any]] | None:
    """The launcher's parsed absl flags, to ship to nodes: name -> (kind, value); None if unparsed."""
    if not FLAGS.is_parsed():
        return None
    out: dict[str, tuple[str, Any]] = {}
    for name in FLAGS:
        flag = FLAGS[name]
        kind = kind_of(flag.value)
        if kind is not None and name == flag.name:  # not a short alias
            out[name] = (kind, flag.value)
    return out


def restore_flags(values: dict[str, tuple[str, Any]]) -> None:
    """In a node process: define the launcher's flags that are not defined here, set every value.

    The user's flags are defined by their script, which a node process never
    imports; their values come from the launcher, so ``FLAGS.x`` reads the same in every node.
    """
    define: dict[str, Any] = {
        "boolean": flags.DEFINE_boolean,
        "integer": flags.DEFINE_integer,
        "float": flags.DEFINE_float,
        "string": flags.DEFINE_string,
        "list": flags.DEFINE_list,
    }
    for name, (kind, value) in values.items():
        if name not in FLAGS:
            define[kind](name, value, "a flag of the launcher's program", allow_override=True)
        else:
            try:
                FLAGS[name].value = value
            except Exception as exc:  # a value this process's definition refuses: keep its own
                log.warning("flag --%s=%r from the launcher not taken: %s", name, value, exc)
    FLAGS.mark_as_parsed()
