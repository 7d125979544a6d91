"""Fake GPUs on SSH test hosts: a stand-in ``nvidia-smi`` on each host's ``PATH``.

The machines tests run on have no GPU. As the SLURM test cluster fakes GRES
with device files, :func:`install_fake_gpus` gives each host of an
:class:`~tlaunch.testing.hosts.SSHTestHosts` ``count`` GPUs: a folder of its
own, bind-mounted over ``/usr/local/sbin`` in the host's mount namespace only
(root's ``PATH`` has it; this machine's stays empty), holding

- ``fake-gpu<i>``: one file per GPU, its "device". A process uses GPU ``i``
  while it holds that file open, as a CUDA process holds ``/dev/nvidia<i>``
  (:func:`open_visible_gpus` does it for a job's ``CUDA_VISIBLE_DEVICES``);
- ``fake-gpus.json``: each GPU's index, name, memory and UUID;
- ``nvidia-smi``: answers ``-L``, ``--query-gpu=...`` and
  ``--query-compute-apps=...`` (``--format=csv[,noheader][,nounits]``) from
  them, the compute apps found by looking for open files on the devices in
  ``/proc/*/fd`` (by inode: another host's files are other files).

::

    with SSHTestHosts(4) as hosts:
        install_fake_gpus(hosts, 2)   # ssh th1 nvidia-smi -L  ->  GPU 0: NVIDIA Fake A100 (UUID: GPU-...)
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from typing import IO

from tlaunch.testing.hosts import SSHTestHosts

__all__ = ["FAKE_BIN", "install_fake_gpus", "open_visible_gpus"]

FAKE_BIN = "/usr/local/sbin"
"""Where each test host finds its fake ``nvidia-smi`` and GPUs."""

_SMI = r'''
import csv, io, json, os, sys

HERE = os.path.dirname(os.path.realpath(__file__))
with open(os.path.join(HERE, "fake-gpus.json")) as f:
    GPUS = json.load(f)
UNITS = {"memory.total": "MiB", "used_memory": "MiB"}


def users():
    """(gpu, pid, exe) of every open file on a GPU's device, by inode."""
    devices = {}
    for g in GPUS:
        st = os.stat(os.path.join(HERE, f"fake-gpu{g['index']}"))
        devices[(st.st_dev, st.st_ino)] = g
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        seen = set()
        for fd in fds:
            try:
                st = os.stat(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            g = devices.get((st.st_dev, st.st_ino))
            if g is not None and g["index"] not in seen:
                seen.add(g["index"])
                try:
                    exe = os.readlink(f"/proc/{pid}/exe")
                except OSError:
                    exe = "[unknown]"
                found.append((g, int(pid), exe))
    return found


def table(fields, rows, header, units):
    out = io.StringIO()
    w = csv.writer(out, lineterminator="\n")
    if header:
        w.writerow([f + (f" [{UNITS[f]}]" if f in UNITS and units else "") for f in fields])
    for row in rows:
        w.writerow([f"{row[f]} {UNITS[f]}" if units and f in UNITS else row[f] for f in fields])
    sys.stdout.write(out.getvalue().replace(",", ", "))


def main(argv):
    if argv == ["-L"]:
        for g in GPUS:
            print(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        return 0
    query = [a for a in argv if a.startswith("--query-")]
    form = [a.split("=", 1)[1].split(",") for a in argv if a.startswith("--format=")]
    if len(query) != 1 or len(form) != 1 or "csv" not in form[0] or len(argv) != 2:
        print(f"fake nvidia-smi: {argv}: use -L, or one --query-gpu=/--query-compute-apps= with --format=csv",
              file=sys.stderr)
        return 2
    kind, _, fields = query[0][len("--query-"):].partition("=")
    fields = fields.split(",")
    header, units = "noheader" not in form[0], "nounits" not in form[0]
    valid = {"gpu": ("index", "name", "memory.total", "uuid"),
             "compute-apps": ("gpu_uuid", "gpu_name", "pid", "process_name", "used_memory")}
    if kind not in valid:
        print(f"fake nvidia-smi: --query-{kind} is not faked", file=sys.stderr)
        return 2
    bad = [f for f in fields if f not in valid[kind]]
    if bad:
        print(f'Field "{bad[0]}" is not a valid field to query.', file=sys.stderr)
        return 2
    if kind == "gpu":
        rows = [{"index": g["index"], "name": g["name"], "memory.total": g["memory"], "uuid": g["uuid"]}
                for g in GPUS]
    else:
        rows = [{"gpu_uuid": g["uuid"], "gpu_name": g["name"], "pid": pid, "process_name": exe,
                 "used_memory": 512} for g, pid, exe in users()]
    table(fields, rows, header, units)
    return 0


sys.exit(main(sys.argv[1:]))
'''


def install_fake_gpus(hosts: SSHTestHosts, count: int, name: str = "NVIDIA Fake A100-SXM4-80GB") -> None:
    """Give every host of ``hosts`` (up) ``count`` fake GPUs and an ``nvidia-smi`` on its ``PATH``.

    Their UUIDs are new on every call. They go with the hosts (the folders are
    in the hosts' state directory; the mounts in their namespaces).
    """
    for host in hosts.hosts:
        folder = os.path.join(hosts.state_dir, host.name, "fake-nvidia")
        os.makedirs(folder, exist_ok=True)
        gpus = [
            {"index": i, "name": name, "memory": 81920, "uuid": f"GPU-{uuid.uuid4()}"} for i in range(count)
        ]
        for g in gpus:
            with open(os.path.join(folder, f"fake-gpu{g['index']}"), "w") as f:
                f.write(f"{g['uuid']}\n")
        with open(os.path.join(folder, "fake-gpus.json"), "w") as f:
            json.dump(gpus, f)
        smi = os.path.join(folder, "nvidia-smi")
        with open(smi, "w") as f:
            f.write(f"#!{sys.executable} -I\n{_SMI}")
        os.chmod(smi, 0o755)
        # In the host's own mount namespace: its sshd's (what its sessions inherit).
        mount = ["mount", "--bind", folder, FAKE_BIN]
        argv = ["nsenter", f"--mount=/proc/{host.sshd_pid}/ns/mnt", *mount]
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{host.name}: {shlex.join(argv)} failed: {done.stderr.strip()}")


def open_visible_gpus() -> list[IO[str]]:
    """Open the fake devices of ``$CUDA_VISIBLE_DEVICES`` (UUIDs or indices): this process uses them now.

    For a trainer on a test host; keep the files open as long as it "computes".

    Raises:
        RuntimeError: no fake GPUs here, or a visible device that is not one of them.
    """
    smi = shutil.which("nvidia-smi") or os.path.join(FAKE_BIN, "nvidia-smi")
    folder = os.path.dirname(os.path.realpath(smi))
    try:
        with open(os.path.join(folder, "fake-gpus.json")) as f:
            gpus = json.load(f)
    except OSError as exc:
        raise RuntimeError(f"no fake GPUs on this host ({exc})") from None
    files: list[IO[str]] = []
    for item in filter(None, os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")):
        found = [g for g in gpus if item.strip() in (g["uuid"], str(g["index"]))]
        if not found:
            raise RuntimeError(f"CUDA_VISIBLE_DEVICES names {item!r}, which is not a GPU of this host")
        files.append(open(os.path.join(folder, f"fake-gpu{found[0]['index']}")))  # noqa: SIM115 - held open
    return files
