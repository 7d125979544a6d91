"""What an SSH launch ships to each host, besides the node files, and where nodes find it.

Three things can travel, each said on the launch's display with its size:

- the **working directory** (``working_dir="path"``): its files but those
  ``.gitignore``/``.tlaunchignore`` leave out (:mod:`tlaunch.ssh.sync`), to
  ``~/.tlaunch/runs/<id>/work``, where nodes start; refused over
  ``working_dir_limit_mib`` with the largest entries named;
- the launcher's **own modules** (:mod:`tlaunch.backends.ssh.modules`), to
  ``.../modules``, on the nodes' ``PYTHONPATH``;
- **shared values**: each large buffer of the nodes' arguments (``RunSpec.blobs``)
  once per host, to ``.../blobs/<digest>``, hard-linked once per node that
  uses it (``<digest>.<node index>``); each supervisor removes its node's links
  when the node is done, and the last one frees the file.

With ``working_dir=False`` (a **shared filesystem**) nothing is shipped: nodes
start in the launcher's working directory, its modules' folders go on the
nodes' ``PYTHONPATH`` as they are, and preflight checks that every host sees
those paths (and ``shared_paths``).
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from tlaunch.backends.base import RunSpec
from tlaunch.backends.ssh.modules import local_modules
from tlaunch.backends.ssh.options import SSHOptions
from tlaunch.ssh import Connection
from tlaunch.ssh.sync import pack_dir

__all__ = ["Shipment"]


@dataclass(frozen=True)
class Shipment:
    """What goes to every host, made once per launch (:meth:`make`), shipped per host (:meth:`ship`).

    Attributes:
        run_dir: the run's folder on the hosts, relative to the home directory.
        work: the working directory packed (None: none shipped).
        modules: the launcher's own modules packed (None: none).
        workdir: where nodes start (relative to home, or absolute; None: home).
        pythonpath: folders for the nodes' ``PYTHONPATH``.
        check_paths: paths every host must see (shared-filesystem mode).
        notes: what to tell the user.
    """

    run_dir: str
    work: bytes | None = None
    modules: bytes | None = None
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
        work = workdir = None
        if isinstance(opts.working_dir, str):
            packed = pack_dir(opts.working_dir, int(opts.working_dir_limit_mib * 2**20))
            work, workdir = packed.data, f"{run_dir}/work"
            notes.append(f"working dir {opts.working_dir}: {packed.selection.summary()}")
        modules = None
        pythonpath: tuple[str, ...] = ()
        if opts.ship_modules:
            mods = local_modules(opts.working_dir if isinstance(opts.working_dir, str) else None)
            if mods.files:
                modules, pythonpath = mods.pack(), (f"{run_dir}/modules",)
                notes.append(f"modules: {mods.summary()}")
            elif mods.compiled or mods.dropped:
                notes.append(f"modules: {mods.summary()}")
        return cls(run_dir, work, modules, workdir, pythonpath, notes=tuple(notes))

    def ship(
        self, conn: Connection, run: RunSpec, nodes: Sequence[tuple[int, str]]
    ) -> tuple[dict[str, tuple[str, ...]], int, list[str]]:
        """Send ``conn``'s host the folders and the shared values its ``nodes`` (index, key) use.

        Returns:
            The files of each node's out-of-band buffers, in order, by key; the
            bytes sent; and the shell commands that put them in place, to run
            before the nodes start (in the same exec: one round trip less).
        """
        d = shlex.quote(self.run_dir)
        steps = []
        sent = 0
        for name, data in (("work", self.work), ("modules", self.modules)):
            if data is not None:
                conn.write_file(f"{self.run_dir}/{name}.tgz", data, mode=0o600)
                sent += len(data)
                tgz = f"{d}/{name}.tgz"
                steps.append(f"mkdir -p -m 700 {d}/{name} && tar -xzf {tgz} -C {d}/{name} && rm {tgz}")
        files: dict[str, tuple[str, ...]] = {}
        digests: dict[str, None] = {}
        links: list[str] = []
        for i, key in nodes:
            taken = run.buffers.get(key, ())
            files[key] = tuple(f"{self.run_dir}/blobs/{digest}.{i}" for digest in taken)
            digests.update(dict.fromkeys(taken))
            links += [f"ln -f {d}/blobs/{digest} {d}/blobs/{digest}.{i}" for digest in dict.fromkeys(taken)]
        if digests:
            conn.run(["mkdir", "-p", "-m", "700", f"{self.run_dir}/blobs"])
            for digest in digests:
                conn.write_file(f"{self.run_dir}/blobs/{digest}", run.blobs[digest], mode=0o600)
                sent += run.blobs[digest].nbytes
            # A link per node that uses it, then its first name goes: the last link removed frees it.
            steps += [*links, "rm -f " + " ".join(f"{d}/blobs/{digest}" for digest in digests)]
        return files, sent, steps
