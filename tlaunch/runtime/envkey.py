"""The key of a runtime environment: the hash of what it installs, not of the package it serves.

Two jobs whose requirements are the same share one environment, whatever else
their packages hold: editing ``train.py`` reuses it, changing a requirement
(or a wheel it names) makes another. The key is the sha256 of:

- the requirement lines, in order, without comments and blank lines (a
  ``--hash=sha256:...`` of a lock is part of its line: another lock, another key);
- the content of every file or folder of the package a line names (``./wheels/x.whl``,
  ``-r base.txt``, whose lines count too, ``-e .``: the package itself, by its own key),
  so a wheel rebuilt under the same name makes another environment. A path out of the
  package (``/opt/wheels/x.whl``, ``../x``) counts by its line only: its content is never
  read (a job server as root reads no file a user names).

Where it is built adds the interpreter and the platform to the folder's name
(:func:`tlaunch.runtime.pyenv.env_dir`): a host with another Python, or
another machine type sharing the folder, gets its own.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterable, Sequence
from typing import Any

__all__ = ["FORMAT", "REQUIREMENTS_FILE", "env_key", "requirement_lines"]

FORMAT = "tlaunch-env 2"
"""Changes when what the key covers changes (every environment is made again once)."""
REQUIREMENTS_FILE = ".tlaunch-requirements.txt"
"""The requirements of a job as they travel beside its package (to an SSH host, a pod): its own
lines (``pip: [...]``), or a line naming the package's requirements file."""
_ARCHIVES = (".whl", ".tar.gz", ".tgz", ".zip", ".tar.bz2")
_FILE_OPTIONS = ("-r", "--requirement", "-c", "--constraint")
_MAX_DEPTH = 8  # -r files including each other


def requirement_lines(lines: Iterable[str]) -> list[str]:
    """The lines that name something: comments (``#`` after a space, or at the start) and blanks dropped."""
    out = []
    for line in lines:
        text = line.strip()
        if text.startswith("#"):
            continue
        text = text.split(" #", 1)[0].split("\t#", 1)[0].strip()
        if text:
            out.append(text)
    return out


def env_key(
    folder: str, lines: Sequence[str], package_key: str | None = None, base: str | None = None
) -> str:
    """The key of the environment that installs ``lines``.

    Args:
        folder: the package's folder: pip runs there, and a path a line names is relative to it.
        lines: the requirements (a requirements file's lines, or a submit's ``pip`` list).
        package_key: the key of ``folder`` itself (its sha256), for a line that names it (``-e .``).
        base: the folder of the requirements file ``lines`` come from, to which its ``-r`` and
            ``-c`` files are relative (default ``folder``).
    """
    digest = hashlib.sha256(f"{FORMAT}\n".encode())
    folder = os.path.abspath(folder)
    _add(digest, folder, os.path.abspath(base or folder), lines, package_key, 0)
    return digest.hexdigest()


def _add(digest: Any, folder: str, base: str, lines: Sequence[str], package_key: str | None,
         depth: int) -> None:  # fmt: skip
    for line in requirement_lines(lines):
        digest.update(f"line {line}\n".encode())
        words = line.replace("=", " ", 1).split() if line.startswith("--") else line.split()
        for i, word in enumerate(words):
            nested = i > 0 and words[i - 1] in _FILE_OPTIONS
            path = _local(folder, base if nested else folder, word.removeprefix("file:"), nested)
            if path is None:
                continue
            if nested and os.path.isfile(path) and depth < _MAX_DEPTH:
                with open(path, encoding="utf-8", errors="replace") as f:
                    inner = f.read().splitlines()
                digest.update(f"file {os.path.relpath(path, folder)}\n".encode())
                _add(digest, folder, os.path.dirname(path), inner, package_key, depth + 1)
            elif os.path.realpath(path) == os.path.realpath(folder) and package_key:
                digest.update(f"package {package_key}\n".encode())
            else:
                digest.update(f"path {os.path.relpath(path, folder)} {_content(path)}\n".encode())


def _local(top: str, base: str, word: str, nested: bool) -> str | None:
    """The file or folder of the package ``top`` that ``word`` names from ``base``, if it names one (pip's
    idea of a path)."""
    if word.startswith("///"):  # file:///abs/path
        word = word[2:]
    looks = nested or word.startswith((".", "/")) or "/" in word or word.endswith(_ARCHIVES)
    if not looks or "://" in word:
        return None
    path = os.path.normpath(os.path.join(base, word))
    inside = path == top or path.startswith(top.rstrip(os.sep) + os.sep)
    return path if inside and os.path.exists(path) else None


def _content(path: str) -> str:
    """The sha256 of a file, or of every file under a folder (by relative path)."""
    digest = hashlib.sha256()
    if os.path.isfile(path):
        files = [(os.path.basename(path), path)]
    else:
        files = []
        for dirpath, dirnames, filenames in os.walk(path):
            dirnames[:] = sorted(d for d in dirnames if d not in ("__pycache__", ".git"))
            files += [(os.path.relpath(os.path.join(dirpath, n), path), os.path.join(dirpath, n))
                      for n in sorted(filenames)]  # fmt: skip
    for name, full in files:
        digest.update(f"{name}\n".encode())
        with open(full, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    return digest.hexdigest()
