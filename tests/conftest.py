from __future__ import annotations

import contextlib
import gc
import os
import signal
import ssl
import sys
import threading
import time
import traceback
from collections.abc import Iterator
from typing import Any

import pytest

_SHM = "/dev/shm"

# A test session started in the background of a shell without job control (`cmd &` in a
# script, nohup) inherits SIGINT ignored, and so would every launcher a test starts: the
# Ctrl-C tests would press a key nobody hears. A handled signal is reset to its default at
# exec, so the test's processes start as they would from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


def _shared_files() -> set[str]:
    """The buffers in this machine's /dev/shm that may be this session's, and in each test host's own.

    The machine's /dev/shm is everyone's: a name is ``tlaunch-<pid of its maker>-...``, and
    one whose maker is alive and not of this session (another engineer's tests, a job
    server's jobs: not this process's descendants) is not this test's to answer for.
    """
    from tlaunch.testing.hosts import live_shm_dirs

    found: set[str] = set()
    for folder in (_SHM, *live_shm_dirs()):
        with contextlib.suppress(OSError):
            names = [n for n in os.listdir(folder) if n.startswith("tlaunch-")]
            found |= {os.path.join(folder, n) for n in names if folder != _SHM or not _foreign(n)}
    return found


def _foreign(name: str) -> bool:
    """Whether the maker of buffer ``name`` lives, and is not this process or one it started."""
    maker = name.split("-")[1] if name.count("-") >= 2 else ""
    if not maker.isdigit():
        return False
    pid, me = int(maker), os.getpid()
    for _ in range(64):  # up its parents
        if pid == me:
            return False
        try:
            with open(f"/proc/{pid}/stat") as f:
                pid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return pid != int(maker)  # gone (the buffer was left: this test's to answer for) or reparented
        if pid <= 1:
            return True
    return True


class _TracedSSLSocket(ssl.SSLSocket):
    """An SSLSocket that knows where it was made: one collected unclosed writes that on stderr,
    beside the ResourceWarning that fails its test. A leak that CI met twice in
    ``test_kill9_coordinator`` did not come back in any run here, so the next one should say
    where it came from."""

    def __del__(self) -> None:
        made = self.__dict__.get("_made")
        if made is not None and self.fileno() != -1:
            sys.stderr.write(f"an SSLSocket collected unclosed was made at:\n{made}")
        super().__del__()  # type: ignore[misc]  # the socket's own: its ResourceWarning, its fd closed


def _traced_wrap(context: ssl.SSLContext, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
    made = "".join(traceback.format_stack(limit=16)[:-1]) + f"(thread {threading.current_thread().name})\n"
    sock = _wrap_socket(context, *args, **kwargs)
    sock.__dict__["_made"] = made
    return sock


_wrap_socket = ssl.SSLContext.wrap_socket
ssl.SSLContext.sslsocket_class = _TracedSSLSocket
ssl.SSLContext.wrap_socket = _traced_wrap  # type: ignore[method-assign,assignment]


@pytest.fixture(autouse=True)
def _leaks_found_where_made() -> Iterator[None]:
    """Collect the garbage once each test and its fixtures are done (this fixture's teardown
    runs last): a socket or file it left unclosed is reported (ResourceWarning, an error
    here) at the test that left it, not at whichever later test the collector ran in."""
    yield
    gc.collect()


@pytest.fixture(autouse=True)
def _tlaunch_home(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """Keep every test's runs out of the real ~/.tlaunch."""
    monkeypatch.setenv("TLAUNCH_HOME", str(tmp_path_factory.mktemp("tlaunch-home")))


@pytest.fixture(autouse=True)
def _no_test_modules_left(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Forget modules a test imported from its temporary folders (``load_program`` keeps them).

    Left in ``sys.modules`` and ``sys.path``, they would make a later test's launcher
    ship (or, on a shared filesystem, require on every host) a folder long gone.
    """
    path, modules = list(sys.path), set(sys.modules)
    yield
    base = str(tmp_path_factory.getbasetemp().parent)
    for name in set(sys.modules) - modules:
        file = getattr(sys.modules[name], "__file__", None) or ""
        if file.startswith(base):
            del sys.modules[name]
    sys.path[:] = path


@pytest.fixture(autouse=True)
def _no_shared_memory_left() -> Iterator[None]:
    """No buffer sent through /dev/shm outlives the test that sent it."""
    before = _shared_files()
    yield
    deadline = time.monotonic() + 5  # a receiver may still be taking its last buffer
    while left := _shared_files() - before:
        if time.monotonic() > deadline:
            pytest.fail(f"shared-memory buffers left: {sorted(left)}")
        time.sleep(0.05)


@pytest.fixture(scope="session")
def ssh_hosts():  # type: ignore[no-untyped-def]
    """Four SSH test hosts (th1..th4) for the whole session; skips without root."""
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        pytest.skip(reason)
    with SSHTestHosts(4) as hosts:
        yield hosts


@pytest.fixture(scope="session")
def gpu_hosts():  # type: ignore[no-untyped-def]
    """Four SSH test hosts (th1..th4) with 2 fake GPUs each (a stand-in nvidia-smi) for the session."""
    from tlaunch.testing.gpus import install_fake_gpus
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        pytest.skip(reason)
    with SSHTestHosts(4) as hosts:
        install_fake_gpus(hosts, 2)
        yield hosts


@pytest.fixture(scope="session")
def slurm_cluster():  # type: ignore[no-untyped-def]
    """A real SLURM cluster of 2 nodes (th1, th2), one fake GPU each; skips without root or SLURM."""
    from tlaunch.testing.slurm import SlurmTestCluster, slurm_unavailable

    reason = slurm_unavailable()
    if reason:
        pytest.skip(reason)
    with SlurmTestCluster(2) as cluster:
        yield cluster


@pytest.fixture
def cluster(monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    """A Kubernetes cluster for programs: the stand-in API server with the LPJob CRD, the real operator
    (kopf) against it, and a stand-in kubelet that runs its pods as processes here; yields (api, kubelet).
    Skips without kopf and the kubernetes client."""
    kubernetes = pytest.importorskip("kubernetes")
    testing = pytest.importorskip("kopf.testing")
    from tlaunch.k8s.crd import crd
    from tlaunch.testing.kube import StandInAPIServer
    from tlaunch.testing.kube.kubelet import LocalKubelet

    no_account = tmp_path_factory.mktemp("no-service-account") / "none"  # not in a pod, whatever runs this
    monkeypatch.setenv("TLAUNCH_SERVICE_ACCOUNT_DIR", str(no_account))
    with StandInAPIServer() as api:
        monkeypatch.setenv("KUBECONFIG", api.kubeconfig)
        kubernetes.config.load_kube_config(api.kubeconfig)
        kubernetes.client.ApiextensionsV1Api().create_custom_resource_definition(crd())
        operator = ["run", "--standalone", "--all-namespaces", "-m", "tlaunch.k8s.operator"]
        with testing.KopfRunner(operator) as runner:
            deadline = time.monotonic() + 15
            while api.requests < 6:
                assert time.monotonic() < deadline, "the operator did not start"
                time.sleep(0.05)
            with LocalKubelet(api) as kubelet:
                yield api, kubelet
                deadline = time.monotonic() + 10
                while kubelet.pids() and time.monotonic() < deadline:
                    time.sleep(0.1)
                assert kubelet.pids() == [], "pods' processes left"
        assert runner.exception is None, runner.stdout
