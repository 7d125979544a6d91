"""Pack a working directory for shipping to hosts (no shared filesystem assumed)."""

from __future__ import annotations

import io
import os
import tarfile

from tlaunch.errors import LaunchError

__all__ = ["EXCLUDED", "pack_dir"]

EXCLUDED = frozenset({".git", "__pycache__", ".venv", ".mypy_cache", ".pytest_cache", ".ruff_cache"})


def pack_dir(path: str, limit_bytes: int) -> bytes:
    """A gzipped tar of ``path`` without VCS and cache folders.

    Raises:
        LaunchError: ``path`` is not a directory, or holds more than ``limit_bytes``.
    """
    root = os.path.abspath(os.path.expanduser(path))
    if not os.path.isdir(root):
        raise LaunchError(f"working_dir {path!r} is not a directory; give the folder to ship to every host")
    total = 0
    files: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED)
        for name in sorted(filenames):
            full = os.path.join(dirpath, name)
            if os.path.islink(full) or not os.path.isfile(full):
                continue
            total += os.path.getsize(full)
            files.append(full)
    if total > limit_bytes:
        raise LaunchError(
            f"working_dir {path!r} holds {total / 2**20:.1f} MiB, over the limit of "
            f"{limit_bytes / 2**20:.0f} MiB; move data out of it (ship data another way) or "
            f"raise working_dir_limit_mib"
        )
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=1) as tar:
        for full in files:
            tar.add(full, arcname=os.path.relpath(full, root))
    return buf.getvalue()
