"""What an SSH launch ships to each host, and where nodes find it.

Each host gets one tar stream on the stdin of the command that starts its
nodes (one round trip): what every host gets, then its own node files (mode
0600). The stream is gzip'd (what every host gets compressed once) where what
every host gets is 256 KiB or more: below that, compression saves less time
on a network than it costs each host (a ``gzip`` exec). Three things can travel besides, each said on the
launch's display with its size:

- the **working directory** (``working_dir="path"``): its files but those
  ``.gitignore``/``.tlaunchignore`` leave out (:mod:`tlaunch.ssh.sync`), to
  ``~/.tlaunch/runs/<id>/work``, where nodes start; refused over
  ``working_dir_limit_mib`` with the largest entries named;
- the launcher's **own modules** (:mod:`tlaunch.backends.ssh.modules`), to
  ``.../modules``, on the nodes' ``PYTHONPATH``;
- **shared values**: each large buffer of the nodes' arguments (``RunSpec.blobs``)
  once per host (over SFTP, before), to ``.../blobs/<digest>``, hard-linked once per node that
  uses it (``<digest>.<node index>``); each supervisor removes its node's links
  when the node is done, and the last one frees the file.

With ``working_dir=False`` (a **shared filesystem**) nothing is shipped: nodes
start in the launcher's working directory, its modules' folders go on the
nodes' ``PYTHONPATH`` as they are, and preflight checks that every host sees
those paths (and ``shared_paths``).
"""

from __future__ import annotations

import gzip
import os
import shlex
import tarfile
from collections.abc import Sequence
from dataclasses import dataclass

from tlaunch.backends.base import RunSpec
from tlaunch.backends.ssh.modules import local_modules
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.runtime.supervisor import NodeFile
from tlaunch.ssh import Connection
from tlaunch.ssh.sync import TAR_END, pack_dir, tar_file

__all__ = ["COMPRESS_FROM", "Shipment"]

COMPRESS_FROM = 256 << 10
"""What every host gets is gzip'd from this size (bytes of tar) on."""


@dataclass(frozen=True)
class Shipment:
    """What goes to every host, made once per launch (:meth:`make`), shipped per host (:meth:`ship`).

    Attributes:
        run_dir: the run's folder on the hosts, relative to the home directory.
        common: what every host gets (working directory, modules): tar blocks,
            as a gzip member where ``compressed`` (empty: nothing).
        compressed: whether the stream is gzip'd.
        workdir: where nodes start (relative to home, or absolute; None: home).
        pythonpath: folders for the nodes' ``PYTHONPATH``.
        check_paths: paths every host must see (shared-filesystem mode).
        notes: what to tell the user.
    """

    run_dir: str
    common: bytes = b""
    compressed: bool = False
    workdir: str | None = None
    pythonpath: tuple[str, ...] = ()
    check_paths: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @classmethod
    def make(cls, opts: SSHOptions, run_dir: str) -> Shipment:
        """Pack what ``opts`` ship (see the module docstring).

        Raises:
            LaunchError: the working directory is not one, or is over its limit.
        """
        notes: list[str] = []
        if opts.working_dir is False:
            here = os.getcwd()
            mods = local_modules() if opts.ship_modules else None
            roots = mods.roots if mods is not None else ()
            notes.append(f"shared filesystem (working_dir=False): nothing shipped; nodes start in {here}")
            return cls(
                run_dir,
                workdir=here,
                pythonpath=tuple(r for r in roots if r != here),
                check_paths=tuple(dict.fromkeys([here, *roots, *opts.shared_paths])),
                notes=tuple(notes),
            )
        blocks = []
        workdir = None
        top = os.path.basename(run_dir)  # named from the runs folder, as archive() names its own
        if isinstance(opts.working_dir, str):
            packed = pack_dir(opts.working_dir, int(opts.working_dir_limit_mib * 2**20), f"{top}/work/")
            blocks += [_folder(f"{top}/work"), packed.members]
            workdir = f"{run_dir}/work"
            notes.append(f"working dir {opts.working_dir}: {packed.selection.summary()}")
        pythonpath: tuple[str, ...] = ()
        if opts.ship_modules:
            mods = local_modules(opts.working_dir if isinstance(opts.working_dir, str) else None)
            if mods.files:
                blocks += [_folder(f"{top}/modules"), mods.pack(f"{top}/modules/")]
                pythonpath = (f"{run_dir}/modules",)
            if mods.files or mods.compiled or mods.unshippable or mods.dropped:
                notes.append(f"modules: {mods.summary()}")
        common = b"".join(blocks)
        compressed = len(common) >= COMPRESS_FROM
        if compressed:
            common = gzip.compress(common, compresslevel=1)
        return cls(run_dir, common, compressed, workdir, pythonpath, notes=tuple(notes))

    def ship(self, conn: Connection, run: RunSpec, nodes: Sequence[tuple[int, str]]) -> tuple[int, list[str]]:
        """Send ``conn``'s host the shared values its ``nodes`` (index, key) use (where each
        node finds them: :meth:`buffer_files`).

        Returns:
            The bytes sent, and the shell commands to run once :meth:`archive` is
            unpacked, before the nodes start.
        """
        d = shlex.quote(self.run_dir)
        digests: dict[str, None] = {}
        links: list[str] = []
        for i, key in nodes:
            taken = run.buffers.get(key, ())
            digests.update(dict.fromkeys(taken))
            links += [f"ln -f {d}/blobs/{digest} {d}/blobs/{digest}.{i}" for digest in dict.fromkeys(taken)]
        if not digests:
            return 0, []
        sent = 0
        conn.run(["sh", "-c", f"mkdir -p -m 700 {d} {d}/blobs && chmod 700 {d}"])
        for digest in digests:
            conn.write_file(f"{self.run_dir}/blobs/{digest}", run.blobs[digest], mode=0o600)
            sent += run.blobs[digest].nbytes
        # A link per node that uses it, then its first name goes: the last link removed frees it.
        return sent, [*links, "rm -f " + " ".join(f"{d}/blobs/{digest}" for digest in digests)]

    def buffer_files(self, run: RunSpec, nodes: Sequence[tuple[int, str]]) -> dict[str, tuple[str, ...]]:
        """Where each of ``nodes`` (index, key) finds the shared values it uses once
        :meth:`ship` sent them, in order, by key (nothing is sent)."""
        return {
            key: tuple(f"{self.run_dir}/blobs/{digest}.{i}" for digest in run.buffers.get(key, ()))
            for i, key in nodes
        }

    def node_file(
        self, spec: NodeFile, index: int, buffers: tuple[str, ...], alone: bool = False
    ) -> NodeFile:
        """``spec`` with where its node finds what was shipped, and what it removes as it leaves
        (``alone``: its host's only node, which needs no marker)."""
        return spec._replace(
            workdir=self.workdir,
            pythonpath=self.pythonpath,
            buffers=buffers,
            alive=f"{self.run_dir}/alive/{index}" if self.common and not alone else None,
            shipped=tuple(f"{self.run_dir}/{d}" for d in ("work", "modules") if self.common),
        )

    def archive(
        self, files: Sequence[tuple[str, bytes]], markers: Sequence[int], fifos: Sequence[str] = ()
    ) -> bytes:
        """What a host gets on the stdin of its start command: the run's folder and its ``logs``
        (0700: the archive makes them, first), :attr:`common`, ``files`` (0600), ``fifos`` (0600),
        and a marker per node (``alive/<index>``) when something is shared by more than one (see
        ``NodeFile.alive``). ``files`` and ``fifos`` are named within the run's folder."""
        top = os.path.basename(self.run_dir)
        dirs = _folder(top) + _folder(f"{top}/logs")
        own = b"".join(tar_file(f"{top}/{name}", data) for name, data in files)
        own += b"".join(tar_file(f"{top}/{name}", b"", 0o600, tarfile.FIFOTYPE) for name in fifos)
        if self.common and len(markers) > 1:
            own += _folder(f"{top}/alive")
            own += b"".join(tar_file(f"{top}/alive/{i}", b"") for i in markers)
        if not self.compressed:
            return dirs + self.common + own + TAR_END
        return (
            gzip.compress(dirs, compresslevel=1) + self.common + gzip.compress(own + TAR_END, compresslevel=1)
        )

    def unpack(self) -> str:
        """The shell command that unpacks :meth:`archive` from stdin, which makes the run's folder
        (with no ``mkdir`` of its own: an exec less a host) in the runs folder preflight checked."""
        z = "z" if self.compressed else ""
        return f"tar -x{z}f - --no-same-owner -C {shlex.quote(os.path.dirname(self.run_dir))}"


def _folder(name: str) -> bytes:
    """A folder of the archive, 0700."""
    return tar_file(name, b"", 0o700, tarfile.DIRTYPE)
