"""Where the examples run: ``--hosts`` (ssh-config names), or test hosts made on this machine.

python examples/trans_types/star_type.py                    # makes 4 SSH test hosts (root)
python examples/trans_types/star_type.py --hosts=a,b,c,d    # your own hosts (~/.ssh/config)

Not run by itself: a helper that the examples import (each of their runs uses it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from absl import flags

flags.DEFINE_list("hosts", [], "Hosts to run on (ssh-config names); empty: make SSH test hosts here.")
flags.DEFINE_string("ssh_config", None, "ssh config file (default ~/.ssh/config).")
FLAGS = flags.FLAGS


@contextlib.contextmanager
def example_hosts(n: int) -> Iterator[tuple[list[str], str | None]]:
    """``n`` host names and the ssh config to reach them."""
    if FLAGS.hosts:
        hosts = list(FLAGS.hosts)
        yield (hosts * n)[:n] if len(hosts) < n else hosts, FLAGS.ssh_config
        return
    from tlaunch.testing.hosts import SSHTestHosts, hosts_unavailable

    reason = hosts_unavailable()
    if reason:
        raise SystemExit(f"no --hosts given and no test hosts can be made here ({reason})")
    with SSHTestHosts(n) as test_hosts:
        yield [h.name for h in test_hosts.hosts], test_hosts.ssh_config
