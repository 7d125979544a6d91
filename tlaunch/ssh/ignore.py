"""Which files of a folder a launch ships: git's ignore rules, and ``.tlaunchignore``.

A folder is walked once. Each directory's ``.gitignore`` and ``.tlaunchignore``
add patterns (gitignore syntax, matched by ``pathspec``'s ``GitIgnoreSpec``)
relative to that directory, as git reads them:

- a deeper file's patterns win over a shallower one's, and within a file the
  last pattern that matches wins (``!keep.bin`` after ``*.bin`` keeps it);
- ``dir/`` matches directories only, ``/top`` only at the file's own level,
  ``**`` any depth;
- an excluded directory is not entered: nothing inside it can be brought
  back (git's rule);
- ``.gitignore`` files above the folder, up to the root of its git work
  tree, and that tree's ``.git/info/exclude`` apply too.

``.tlaunchignore`` (as ``.rayignore`` and ``.skyignore`` elsewhere) is read the
same way and wins where it says something: ``data/`` there leaves out a
folder git tracks, ``!model.ckpt`` ships a file git ignores. Whatever the
files say, :data:`EXCLUDED` folders (VCS, caches, virtualenvs) are never shipped.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import pathspec

__all__ = ["EXCLUDED", "IGNORE_FILES", "Entry", "walk"]

EXCLUDED = frozenset(
    {".git", ".hg", ".svn", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache", ".tox"}
)
IGNORE_FILES = (".tlaunchignore", ".gitignore")  # the first wins where both match


@dataclass(frozen=True)
class Entry:
    """A file or folder met by :func:`walk`.

    Attributes:
        path: relative to the walked folder, ``/``-separated; a folder's ends with ``/``.
        full: its absolute path.
        size: a file's size in bytes (0 for a folder).
        ignored_by: None when shipped, else the ignore file (relative path) or
            ``"default"`` (:data:`EXCLUDED`) that left it out.
    """

    path: str
    full: str
    size: int
    ignored_by: str | None


@dataclass(frozen=True)
class _Rules:
    """The patterns of one ignore file, and where they apply."""

    name: str  # the ignore file's kind (".gitignore" or ".tlaunchignore")
    source: str  # where it is, for messages
    spec: pathspec.GitIgnoreSpec
    base: str  # the walked folder's path relative to the file's own folder ("" or "a/b/")
    strip: int  # characters of a walked path before the part under the file's folder

    def verdict(self, path: str) -> bool | None:
        """True: ``path`` is ignored; False: re-included (``!``); None: no pattern matches."""
        result = self.spec.check_file(self.base + path[self.strip :])
        return None if result.include is None else bool(result.include)


def _read(path: str, source: str, base: str, strip: int, name: str) -> _Rules | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError:
        return None
    if not any(line.strip() and not line.startswith("#") for line in lines):
        return None
    return _Rules(name, source, pathspec.GitIgnoreSpec.from_lines(lines), base, strip)


def _above(root: str) -> list[_Rules]:
    """The git rules from outside ``root``: ``.gitignore`` files of its parents in the same work tree."""
    parents: list[str] = []
    top = None
    here = root
    while True:
        if os.path.exists(os.path.join(here, ".git")):
            top = here
            break
        parent = os.path.dirname(here)
        if parent == here:
            return []
        parents.append(parent)
        here = parent
    rules: list[_Rules] = []
    if top != root:
        for folder in reversed(parents):  # the top first: deeper files come later and win
            base = os.path.relpath(root, folder).replace(os.sep, "/") + "/"
            found = _read(
                os.path.join(folder, ".gitignore"), os.path.join(folder, ".gitignore"), base, 0, ".gitignore"
            )
            if found is not None:
                rules.append(found)
    base = "" if top == root else os.path.relpath(root, top).replace(os.sep, "/") + "/"
    exclude = os.path.join(top, ".git", "info", "exclude")
    found = _read(exclude, exclude, base, 0, ".gitignore")
    return ([found] if found is not None else []) + rules


def _decide(rules: list[_Rules], path: str) -> str | None:
    """The ignore file that leaves ``path`` out, or None; ``.tlaunchignore`` first, the deepest first."""
    for name in IGNORE_FILES:
        for r in reversed(rules):
            if r.name != name:
                continue
            verdict = r.verdict(path)
            if verdict is not None:
                return r.source if verdict else None
    return None


def walk(root: str, keep: Callable[[str, bool], bool] | None = None) -> Iterator[Entry]:
    """Every file under ``root`` (symlinks and special files aside), and every folder left out.

    ``keep(path, is_dir)`` narrows the walk further (a folder it refuses is
    not entered, and is not reported). Shipped folders are not yielded, their
    files are; a left-out folder is yielded once, not its content.

    Raises:
        OSError: ``root`` cannot be read.
    """
    root = os.path.abspath(root)
    top_rules = _above(root)

    def visit(folder: str, rel: str, rules: list[_Rules]) -> Iterator[Entry]:
        here = list(rules)
        for name in reversed(IGNORE_FILES):
            found = _read(os.path.join(folder, name), rel + name, "", len(rel), name)
            if found is not None:
                here.append(found)
        with os.scandir(folder) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            is_dir = e.is_dir(follow_symlinks=False)
            if not is_dir and not e.is_file(follow_symlinks=False):
                continue  # symlinks, sockets, fifos
            path = rel + e.name + ("/" if is_dir else "")
            if keep is not None and not keep(path, is_dir):
                continue
            by = "default" if is_dir and e.name in EXCLUDED else _decide(here, path)
            if by is not None:
                yield Entry(path, e.path, 0 if is_dir else e.stat(follow_symlinks=False).st_size, by)
            elif is_dir:
                yield from visit(e.path, path, here)
            else:
                yield Entry(path, e.path, e.stat(follow_symlinks=False).st_size, None)

    yield from visit(root, "", top_rules)
