"""A terminal for a remote pdb: :func:`relay` (``tlaunch debug``; a notebook cell that launched the run).

It prints what the node's pdb writes and gives each trailing prompt (``(Pdb) ``) to
:func:`input`, so line editing and history (readline) work as in a local pdb, and a
Jupyter kernel asks its frontend for each line. The session ends when the node goes on
(``c``, ``q``: the node closes it), or with Ctrl-D or Ctrl-C here (the node goes on too).
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import ssl
import sys
import threading

__all__ = ["relay"]

_PROMPTS = ("(Pdb) ", "(com) ", ">>> ", "... ")  # pdb's, its `commands`', `interact`'s
_PROMPT_QUIET = 0.03  # s without more output after which a trailing prompt is one
_PARTIAL_QUIET = 1.0  # ... and after which any other trailing partial line is taken for one


def relay(sock: ssl.SSLSocket | socket.socket, prompt: str | None = None) -> bool:
    """Be the terminal of the pdb at the other end of ``sock`` (with :func:`input`, its prompts
    given to it) until either side ends the session; ``prompt``: one it has written already.

    Returns:
        Whether the node refused the connection (it is not of its run's key).
    """
    with contextlib.suppress(ImportError):
        import readline  # noqa: F401  (input() gets line editing and history)
    out = _Output(sock, prompt)
    reader = threading.Thread(target=out.run, name="tlaunch-debug-reader", daemon=True)
    reader.start()
    try:
        while True:
            prompt = out.next_prompt()
            if prompt is None:
                break
            try:
                line = input(prompt)
            except EOFError:  # Ctrl-D: leave; the node goes on
                sys.stdout.write("\n")
                break
            except KeyboardInterrupt:  # Ctrl-C here, or the node ended the session (see _Output)
                if out.ended.is_set():
                    break
                sys.stdout.write("\n")
                break
            try:
                sock.sendall(line.encode() + b"\n")
            except OSError:
                break
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(2)
        reader.join(2.0)
    return out.refused


class _Output:
    """The reader of the node's side: prints what comes, hands a trailing prompt to ``input``."""

    def __init__(self, sock: ssl.SSLSocket | socket.socket, prompt: str | None = None) -> None:
        self._sock = sock
        self._cond = threading.Condition()
        self._prompt: str | None = prompt
        self.ended = threading.Event()
        self.refused = False
        self._waiting = False  # the main thread is in input()
        self._main = threading.main_thread().ident

    def next_prompt(self) -> str | None:
        """The node's next prompt, once it asks; None once the session has ended."""
        with self._cond:
            self._waiting = False
            self._cond.wait_for(lambda: self._prompt is not None or self.ended.is_set())
            if self._prompt is None:
                return None
            prompt, self._prompt = self._prompt, None
            self._waiting = True
            return prompt

    def run(self) -> None:
        pending = ""
        got_any = False
        try:
            while True:
                pending_ = getattr(self._sock, "pending", None)  # TLS: decrypted already, unseen by select
                buffered = pending_ is not None and pending_() > 0
                # A line may come in parts (pdb writes a value, then its newline): only a known
                # prompt is taken at once.
                wait = (
                    None if not pending else _PROMPT_QUIET if pending.endswith(_PROMPTS) else _PARTIAL_QUIET
                )
                ready = buffered or bool(select.select([self._sock], [], [], wait)[0])
                if not ready:  # quiet after a partial line: a prompt
                    with self._cond:
                        self._prompt, pending = pending, ""
                        self._cond.notify_all()
                    continue
                try:
                    data = self._sock.recv(65536).decode("utf-8", "replace")
                except ssl.SSLError:
                    self.refused = not got_any
                    data = ""
                except OSError:
                    data = ""
                if not data:
                    break
                got_any = True
                text = pending + data
                head, nl, pending = text.rpartition("\n")
                if nl:
                    sys.stdout.write(head + nl)
                    sys.stdout.flush()
        finally:
            if pending:
                sys.stdout.write(pending + "\n")
                sys.stdout.flush()
            with self._cond:
                self.ended.set()
                waiting = self._waiting
                self._cond.notify_all()
            if waiting and self._main is not None:  # wake input() in the main thread
                with contextlib.suppress(ProcessLookupError, OSError):
                    signal.pthread_kill(self._main, signal.SIGINT)
