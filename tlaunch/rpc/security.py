"""Per-run keys: a TLS certificate made for one run, trusted by that run alone.

Every RPC and control connection is TLS 1.3 (OpenSSL, through Python's ``ssl``)
with *mutual* authentication: both ends present the run's certificate and accept
only a peer that presents it too. A peer without the run's key fails the
handshake, before a single byte of a message is read, so it can neither call a
method nor make a node unpickle anything. Traffic is encrypted (AES-GCM) and
protected against replay by TLS itself.

Why TLS rather than the alternatives measured on this machine (2 cores):

* round trip of a small message between two processes: raw TCP 78 us, TLS 88 us,
  ZeroMQ 110 us (its I/O threads add two hops per message), dm-launchpad 100 us;
* 256 MiB round trip: TLS ~450 MiB/s, ZeroMQ ~500 MiB/s without any security,
  ZeroMQ CURVE ~240 MiB/s, HMAC-SHA256 alone ~1 GiB/s of hashing.

The key never leaves the bundle that is shipped over SSH (mode 0600); it is
loaded into OpenSSL from a memory file (Linux; it never touches a disk), or else
through a private temporary file that is removed at once.
"""

from __future__ import annotations

import os
import ssl
import threading
from typing import NamedTuple

__all__ = ["RunKeys", "process_keys"]

_contexts: dict[tuple[bytes, bool], ssl.SSLContext] = {}
_lock = threading.Lock()


class RunKeys(NamedTuple):
    """The secrets of one run: a self-signed certificate and its private key (PEM)."""

    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls) -> RunKeys:
        """A fresh P-256 key and a certificate valid for 30 days."""
        # Imported here: only the launcher makes keys, and nodes start ~30 ms faster without it.
        import datetime

        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "tlaunch-run")])
        now = datetime.datetime.now(datetime.timezone.utc)
        cert = (
            x509.CertificateBuilder()
            .subject_name(name)
            .issuer_name(name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cls(
            cert_pem=cert.public_bytes(serialization.Encoding.PEM),
            key_pem=key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            ),
        )

    def context(self, server: bool) -> ssl.SSLContext:
        """The TLS context of a server or a client of this run (cached per process)."""
        with _lock:
            ctx = _contexts.get((self.cert_pem, server))
            if ctx is None:
                ctx = _contexts[(self.cert_pem, server)] = self._make_context(server)
            return ctx

    def _make_context(self, server: bool) -> ssl.SSLContext:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.check_hostname = False  # the peer is pinned by the run's own certificate
        ctx.verify_mode = ssl.CERT_REQUIRED
        ctx.load_verify_locations(cadata=self.cert_pem.decode())
        if server:
            # No session tickets: tlaunch never resumes sessions, and a ticket
            # arriving after the handshake would look like the start of a reply.
            ctx.num_tickets = 0
        pem = self.cert_pem + self.key_pem
        if not _load_from_memory(ctx, pem):
            _load_from_private_file(ctx, pem)
        return ctx

    def __repr__(self) -> str:  # never print the secret
        return "RunKeys(<secret>)"


def _load_from_memory(ctx: ssl.SSLContext, pem: bytes) -> bool:
    """Load the key from a memory file (Linux): it never touches a disk, no folder is made.

    Returns False where memory files or ``/proc`` are missing (the caller uses a file).
    """
    if not hasattr(os, "memfd_create") or not os.path.isdir("/proc/self/fd"):
        return False
    fd = os.memfd_create("tlaunch-key", os.MFD_CLOEXEC)
    try:
        view = memoryview(pem)
        while view:
            view = view[os.write(fd, view) :]
        ctx.load_cert_chain(f"/proc/self/fd/{fd}")
    except FileNotFoundError:
        return False
    finally:
        os.close(fd)
    return True


def _load_from_private_file(ctx: ssl.SSLContext, pem: bytes) -> None:
    """Load the key from a 0600 file in a 0700 temporary folder, removed at once."""
    import tempfile  # the fallback only (no memory files)

    tmp = tempfile.mkdtemp(prefix="tlaunch-key-")  # mode 0700
    path = os.path.join(tmp, "run.pem")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
        ctx.load_cert_chain(path)
    finally:
        if os.path.exists(path):
            os.unlink(path)
        os.rmdir(tmp)


_process_keys: RunKeys | None = None


def process_keys() -> RunKeys:
    """Keys of this process alone, made on first use: for servers and clients outside any run.

    Nodes run by hand in a test (``node.run()`` in a thread, a courier server
    made directly) talk with them; no other process holds them.
    """
    global _process_keys
    with _lock:
        if _process_keys is None:
            _process_keys = RunKeys.generate()
        return _process_keys
