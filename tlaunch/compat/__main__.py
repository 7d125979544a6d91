"""``python -m tlaunch.compat script.py [args]`` / ``-m module [args]``: run it with ``launchpad`` aliased."""

from __future__ import annotations

import os
import runpy
import sys

from tlaunch.compat import AliasError, install

_USAGE = "usage: python -m tlaunch.compat script.py [args...] | -m module [args...]"


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        raise SystemExit(_USAGE if argv else f"tlaunch.compat: nothing to run\n{_USAGE}")
    try:
        if argv[0] == "-m":
            if len(argv) < 2:
                raise SystemExit(f"tlaunch.compat: -m needs a module name\n{_USAGE}")
            install()
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            return
        script = argv[0]
        if not os.path.isfile(script):
            raise SystemExit(f"tlaunch.compat: no such script: {script!r}\n{_USAGE}")
        install(script)
    except AliasError as exc:
        raise SystemExit(f"tlaunch.compat: {exc}") from None
    sys.argv = [script, *argv[1:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # as `python script.py` would
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1:])
