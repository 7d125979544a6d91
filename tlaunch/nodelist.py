"""SLURM node lists (``n[1-3,5]``, ``gpu[01-02],cpu7``) expanded into host names (pure)."""

from __future__ import annotations

import re

from tlaunch.errors import LaunchError

__all__ = ["expand_nodelist"]

_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def expand_nodelist(nodelist: str) -> list[str]:
    """Expand a SLURM node list (``n[1-3,5]``, ``gpu[01-02],cpu7``, ``a[1-2]-b[3-4]``) into host names.

    Raises:
        LaunchError: an unbalanced bracket, a bad range, or an empty list.
    """
    text = nodelist.strip()
    if not text:
        raise LaunchError("the SLURM node list is empty; expected e.g. 'node[01-04],gpu7'")
    names: list[str] = []
    for item in _split_top(text, nodelist):
        names.extend(_expand_one(item, nodelist))
    return names


def _split_top(text: str, whole: str) -> list[str]:
    """``text`` split at commas outside brackets."""
    items, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "[":
            depth += 1
            if depth > 1:
                raise LaunchError(f"SLURM node list {whole!r}: nested '[' at position {i}")
        elif ch == "]":
            depth -= 1
            if depth < 0:
                raise LaunchError(f"SLURM node list {whole!r}: ']' without '[' at position {i}")
        elif ch == "," and depth == 0:
            items.append(text[start:i])
            start = i + 1
    if depth:
        raise LaunchError(f"SLURM node list {whole!r}: a '[' is never closed")
    items.append(text[start:])
    bad = [it for it in items if not it.strip()]
    if bad:
        raise LaunchError(f"SLURM node list {whole!r} has an empty entry (two commas in a row?)")
    return [it.strip() for it in items]


def _expand_one(item: str, whole: str) -> list[str]:
    open_ = item.find("[")
    if open_ < 0:
        return [item]
    close = item.index("]", open_)
    prefix, ranges, rest = item[:open_], item[open_ + 1 : close], item[close + 1 :]
    tails = _expand_one(rest, whole) if rest else [""]
    out: list[str] = []
    for part in ranges.split(","):
        m = _RANGE.match(part.strip())
        if not m:
            raise LaunchError(f"SLURM node list {whole!r}: {part!r} is not a number or a range like '01-04'")
        lo, hi = m.group(1), m.group(2) or m.group(1)
        if int(hi) < int(lo):
            raise LaunchError(f"SLURM node list {whole!r}: range {part!r} goes down")
        width = len(lo)  # SLURM pads to the width of the range's first number: [08-10] -> 08, 09, 10
        for n in range(int(lo), int(hi) + 1):
            out.extend(f"{prefix}{str(n).zfill(width)}{tail}" for tail in tails)
    return out
