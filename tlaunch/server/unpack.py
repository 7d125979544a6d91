"""Unpacking a package's archive (a zip or a tar, optionally compressed) into a folder, safely.

:class:`Unpacker` refuses what could escape the folder or exhaust the disk:
absolute paths, ``..``, symbolic and hard links, device files and FIFOs, more
than ``max_members`` members or ``max_bytes`` bytes once unpacked (a zip
bomb); and what it cannot unpack is refused the same way, saying why
(:class:`BadPackage`, never another error): a member twice, a file that is
also a folder, a name too long for the filesystem, an encrypted member or an
unknown compression method, a damaged member (its CRC), a truncated or
corrupt archive.
"""

from __future__ import annotations

import errno
import lzma
import os
import shutil
import stat
import tarfile
import zipfile
import zlib
from dataclasses import dataclass, field
from pathlib import PurePosixPath
from typing import BinaryIO

__all__ = ["BadPackage", "Unpacker"]


class BadPackage(ValueError):
    """An upload that is not a package the store can keep (the message says why)."""


class Unpacker:
    """Unpacks archives of at most ``max_members`` members and ``max_bytes`` bytes unpacked."""

    def __init__(self, max_bytes: int, max_members: int) -> None:
        self.max_bytes = max_bytes
        self.max_members = max_members

    def unpack(self, path: str, dest: str) -> None:
        """Unpack the archive in file ``path`` into the (empty) folder ``dest``.

        Raises:
            BadPackage: see the module docstring.
        """
        with open(path, "rb") as archive:
            try:
                self._unpack(archive, dest)
            except _UNREADABLE as exc:
                raise BadPackage(f"the package cannot be unpacked: {_reason(exc)}") from None
            except OSError as exc:
                if exc.errno is not None and exc.errno not in _BAD_NAMES:
                    raise  # the server's own disk (a corrupt stream's error has no errno)
                raise BadPackage(f"the package cannot be unpacked: {_reason(exc)}") from None

    def _unpack(self, data: BinaryIO, dest: str) -> None:
        if zipfile.is_zipfile(data):
            data.seek(0)
            self._unzip(data, dest)
            return
        data.seek(0)
        try:
            with tarfile.open(fileobj=data, mode="r:*") as archive:
                self._untar(archive, dest)
        except tarfile.TarError as exc:
            raise BadPackage(f"the package is neither a zip nor a readable tar archive ({exc})") from None

    def _check(self, name: str, count: int, total: int, seen: _Seen, is_dir: bool) -> str | None:
        """The member's path in the package (None: the package's folder itself, ``./``).

        Raises:
            BadPackage: see the module docstring.
        """
        if count > self.max_members:
            raise BadPackage(f"the package has more than {self.max_members} members")
        if total > self.max_bytes:
            raise BadPackage(f"the package unpacks to more than {self.max_bytes} bytes")
        path = PurePosixPath(name)
        if path.is_absolute() or ".." in path.parts or name.startswith(("/", "\\")) or "\\" in name:
            raise BadPackage(f"member {name!r} would leave the package's folder")
        if not path.parts and is_dir:
            return None
        if "\0" in name or not path.parts:
            raise BadPackage(f"member {name!r} is not a name a file can have")
        long = [p for p in path.parts if len(p.encode()) > _NAME_MAX]
        if long or len(name.encode()) > _PATH_MAX:
            raise BadPackage(
                f"member {name[:80]!r}... has a name too long for a file ({len(name)} characters; "
                f"at most {_NAME_MAX} bytes a part, {_PATH_MAX} in all)"
            )
        rel = str(path)
        for parent in path.parents:
            if str(parent) in seen.files:
                raise BadPackage(f"member {name!r} is under {str(parent)!r}, which is a file of the package")
        if rel in seen.files or (not is_dir and rel in seen.dirs):
            raise BadPackage(f"member {name!r} is in the package twice (or as a file and a folder)")
        if is_dir:
            seen.dirs.add(rel)
        else:
            seen.files.add(rel)
        seen.dirs.update(str(p) for p in path.parents)
        return rel

    def _unzip(self, data: BinaryIO, dest: str) -> None:
        with zipfile.ZipFile(data) as archive:
            total = 0
            seen = _Seen()
            for count, info in enumerate(archive.infolist(), 1):
                total += info.file_size
                rel = self._check(info.filename, count, total, seen, info.is_dir())
                if rel is None:
                    continue
                kind = stat.S_IFMT(info.external_attr >> 16)
                if kind and kind not in (stat.S_IFREG, stat.S_IFDIR):
                    raise BadPackage(f"member {info.filename!r} is a link or a device, not a file")
                if info.flag_bits & 0x1:
                    raise BadPackage(f"member {info.filename!r} is encrypted; upload it unencrypted")
                if info.compress_type not in _ZIP_METHODS:
                    raise BadPackage(
                        f"member {info.filename!r} is compressed with method {info.compress_type}, which "
                        "is not one of stored (0), deflate (8), bzip2 (12) or lzma (14)"
                    )
                target = os.path.join(dest, rel)
                if info.is_dir():
                    os.makedirs(target, mode=0o700, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
                written = 0
                with (
                    archive.open(info) as src,
                    open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out,
                ):
                    while chunk := src.read(1 << 20):
                        written += len(chunk)
                        if written > info.file_size or total - info.file_size + written > self.max_bytes:
                            raise BadPackage(f"member {info.filename!r} unpacks to more than it says")
                        out.write(chunk)

    def _untar(self, archive: tarfile.TarFile, dest: str) -> None:
        total = 0
        seen = _Seen()
        for count, member in enumerate(archive, 1):
            total += member.size
            rel = self._check(member.name, count, total, seen, member.isdir())
            if rel is None:
                continue
            if not (member.isfile() or member.isdir()):
                raise BadPackage(f"member {member.name!r} is a link or a device, not a file")
            target = os.path.join(dest, rel)
            if member.isdir():
                os.makedirs(target, mode=0o700, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), mode=0o700, exist_ok=True)
            src = archive.extractfile(member)
            assert src is not None
            with src, open(os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as out:
                shutil.copyfileobj(src, out)


@dataclass
class _Seen:
    """The members an archive has had so far: its files, and its folders (named, or under a file)."""

    files: set[str] = field(default_factory=set)
    dirs: set[str] = field(default_factory=set)


_NAME_MAX, _PATH_MAX = 255, 1024
_ZIP_METHODS = (zipfile.ZIP_STORED, zipfile.ZIP_DEFLATED, zipfile.ZIP_BZIP2, zipfile.ZIP_LZMA)
_UNREADABLE = (
    zipfile.BadZipFile,  # a bad CRC, a truncated member, a bad header
    zipfile.LargeZipFile,
    tarfile.TarError,
    EOFError,  # a compressed stream cut short
    zlib.error,
    lzma.LZMAError,
    NotImplementedError,  # a compression zipfile has no decoder for
    RuntimeError,  # zipfile: an encrypted member
    ValueError,  # an embedded NUL
    UnicodeError,
)
_BAD_NAMES = {errno.ENAMETOOLONG, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EILSEQ, errno.EINVAL}
"""What unpacking a member can meet that is the archive's fault (gzip/bz2 data errors are other OSErrors)."""


def _reason(exc: BaseException) -> str:
    return str(exc) or type(exc).__name__
