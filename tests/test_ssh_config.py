"""ssh configs as users write them (Include, Match, ProxyCommand, HostKeyAlias) on the SSH test hosts."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tlaunch import lp_ssh as lp
from tlaunch.ssh import connect_all, resolve_target
from tlaunch.ssh.config import ConfigFile

pytestmark = pytest.mark.ssh


def host_block(ssh_hosts: Any, name: str, address: str, extra: str = "") -> str:
    return (
        f"Host {name}\n  HostName {address}\n  User root\n  IdentityFile {ssh_hosts.client_key}\n"
        f"  IdentitiesOnly yes\n  UserKnownHostsFile {ssh_hosts.known_hosts}\n{extra}"
    )


def split_config(ssh_hosts: Any, tmp_path: Path) -> Path:
    """The test hosts' config as many users keep theirs: a main file that includes the rest."""
    conf_d = tmp_path / "conf.d"
    conf_d.mkdir()
    for h in ssh_hosts.hosts:
        (conf_d / f"{h.name}.conf").write_text(host_block(ssh_hosts, h.name, h.address))
    main = tmp_path / "config"
    main.write_text(f"Include {conf_d}/*.conf\n\nHost *\n  ServerAliveInterval 5\n")
    return main


def where(conn: Any) -> list[str]:
    return conn.run(["sh", "-c", "hostname; echo $SSH_CONNECTION"]).stdout.split()


def test_include_is_followed(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = split_config(ssh_hosts, tmp_path)
    conns = connect_all(["th1", "th3"], ssh_config=str(config))
    try:
        assert [where(conns[h])[0] for h in ("th1", "th3")] == ["th1", "th3"]
    finally:
        for c in conns.values():
            c.close()


def test_match_proxycommand_and_hostkeyalias(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    config = split_config(ssh_hosts, tmp_path)
    th1, th2, th4 = ssh_hosts.hosts[0], ssh_hosts.hosts[1], ssh_hosts.hosts[3]
    known = Path(ssh_hosts.known_hosts).read_text().splitlines()
    th4_key = next(line for line in known if line.startswith("th4,")).split(None, 1)[1]
    aliased = tmp_path / "aliased_known_hosts"
    aliased.write_text(f"th4-key-alias {th4_key}\n")
    with open(config, "a") as f:
        f.write(
            # Match: the options come from a block that matches the host name, not the alias.
            f"\nHost by-match\n  HostName {th2.address}\n"
            f"Match host {th2.address}\n  User root\n  IdentityFile {ssh_hosts.client_key}\n"
            f"  IdentitiesOnly yes\n  UserKnownHostsFile {ssh_hosts.known_hosts}\n"
            # ProxyCommand: through th1, with OpenSSH's own tokens.
            + host_block(
                ssh_hosts, "via-proxy", th2.address, f"  ProxyCommand ssh -F {config} -W %h:%p th1\n"
            )
            # HostKeyAlias: the key is known under another name only.
            + host_block(ssh_hosts, "aliased", th4.address).replace(ssh_hosts.known_hosts, str(aliased))
            + "  HostKeyAlias th4-key-alias\n"
        )
    conns = connect_all(["by-match", "via-proxy", "aliased"], ssh_config=str(config))
    try:
        assert where(conns["by-match"])[0] == "th2"
        name, client_address = where(conns["via-proxy"])[:2]
        assert name == "th2" and client_address == th1.address  # it came through th1
        assert where(conns["aliased"])[0] == "th4"
    finally:
        for c in conns.values():
            c.close()
    # The proxied transport's thread has ended with its close (its reads of the proxy's pipe
    # spun until their timeout, then closed a proxy process already reaped: an error in it).
    assert not conns["via-proxy"].transport.is_alive()


def test_without_the_ssh_client_includes_are_still_followed(
    ssh_hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    config = split_config(ssh_hosts, tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))  # no `ssh` here: the file is read by tlaunch itself
    target = resolve_target("th3", str(config))
    assert (target.hostname, target.user, target.keepalive) == (ssh_hosts.hosts[2].address, "root", 5)
    assert target.key_filenames == (ssh_hosts.client_key,) and target.identities_only


def test_a_run_from_the_environments_config_is_found_from_a_fresh_shell(ssh_hosts, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Launched with $TLAUNCH_SSH_CONFIG (an Include-style config); `tlaunch logs/stop` without it."""
    config = split_config(ssh_hosts, tmp_path)
    script = tmp_path / "launcher.py"
    script.write_text(
        textwrap.dedent("""
        import time
        from tlaunch import lp_ssh as lp

        def talk():
            while True:
                print("hello from", lp.get_context().host, flush=True)
                time.sleep(0.2)

        p = lp.Program("envcfg")
        p.add_node(lp.PyNode(talk).to_host("th2"), label="talker")
        run = lp.launch(p, detach=True)
        print("RUN", run.run_id, flush=True)
        """)
    )
    env = {**os.environ, "TLAUNCH_SSH_CONFIG": str(config)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    run_id = next(line.split()[1] for line in out.stdout.splitlines() if line.startswith("RUN "))
    fresh = {k: v for k, v in os.environ.items() if k != "TLAUNCH_SSH_CONFIG"}
    try:
        deadline = time.monotonic() + 20
        while True:
            logs = subprocess.run(
                [sys.executable, "-m", "tlaunch.cli.main", "logs", run_id],
                env=fresh,
                capture_output=True,
                text=True,
                timeout=60,
            )
            assert "Traceback" not in logs.stderr, logs.stderr
            if "hello from th2" in logs.stdout:
                break
            assert time.monotonic() < deadline, logs.stdout + logs.stderr
            time.sleep(0.3)
    finally:
        stopped = subprocess.run(
            [sys.executable, "-m", "tlaunch.cli.main", "stop", run_id],
            env=fresh,
            capture_output=True,
            text=True,
        )
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    assert ssh_hosts.leftovers(run_id) == {}


class UsesALocalModule:
    def run(self) -> None:
        import tl_helper_only_here  # noqa: F401  # on the launcher's path, not on the host's


def test_a_module_missing_on_the_host_gets_a_hint(
    ssh_hosts, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # type: ignore[no-untyped-def]
    (tmp_path / "tl_helper_only_here.py").write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    program = lp.Program("missing")
    program.add_node(lp.PyClassNode(UsesALocalModule).to_host("th2"), label="user")
    with pytest.raises(lp.RunFailedError) as info:
        lp.launch(program, ssh_config=ssh_hosts.ssh_config)
    err = info.value
    assert "ModuleNotFoundError: No module named 'tl_helper_only_here'" in (err.remote_traceback or "")
    assert f"working_dir={str(tmp_path)!r}" in err.hint and "'th2'" in err.hint


PLAIN_CONFIGS = {
    "include and Host *": None,  # the test hosts' config split as users keep it (split_config)
    "patterns, first value wins": """
        Host web-* !web-old
          User deploy
          Port 2222
          IdentityFile {key}
        Host web-1 db-?
          User first-wins
          HostName 10.1.2.3
          IdentitiesOnly yes
          StrictHostKeyChecking accept-new
        Host *.example.com
          ProxyJump jump-1
          ConnectTimeout 7
          HostKeyAlias aliased
        Host jump-1
          HostName 10.9.9.9
          User hop
        Host *
          ServerAliveInterval 9
          UserKnownHostsFile {known} /nonexistent/known_hosts
    """,
    "key=value, tabs, comments, capital keywords": """
        # a comment
        HOST\tweb-1
        \tuser=tabbed
        \tPort = 2022
        Host *
        \tIdentityFile={key}
    """,
    "nothing set": "\n",
}
HOSTS = ["web-1", "web-2", "web-old", "db-3", "a.example.com", "jump-1", "other", "th1", "user@web-2:2200"]


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs OpenSSH's client")
@pytest.mark.parametrize("case", list(PLAIN_CONFIGS))
def test_a_plain_config_read_here_reads_as_ssh_g_reads_it(case: str, tmp_path: Path) -> None:
    """A launch reads a plain config itself (no `ssh -G` per host): the targets must be the same."""
    key = tmp_path / "id_test"
    key.write_text("not a key, but it exists")
    template = PLAIN_CONFIGS[case]
    if template is None:
        (tmp_path / "conf.d").mkdir()
        for i in (1, 2):
            (tmp_path / "conf.d" / f"th{i}.conf").write_text(
                f"Host th{i}\n  HostName 198.18.0.{10 + i}\n  User root\n  IdentityFile {key}\n"
            )
        config = tmp_path / "config"
        config.write_text(f"Include {tmp_path}/conf.d/*.conf\n\nHost *\n  ServerAliveInterval 5\n")
    else:
        config = tmp_path / "config"
        config.write_text(textwrap.dedent(template).format(key=key, known=tmp_path / "known"))
    here, exact = ConfigFile(str(config)), ConfigFile(str(config), exact=True)
    assert here.reads_here()  # not by ssh -G
    for host in HOSTS:
        assert here.target(host) == exact.target(host), host


@pytest.mark.skipif(not shutil.which("ssh"), reason="needs OpenSSH's client")
@pytest.mark.parametrize(
    "text",
    [
        "Host web-1\n  HostName %h.example.com\n",
        "Match host web-1\n  User matched\n",
        "Host *\n  IdentityFile ${HOME}/.ssh/other\n",
        'Host "web 1"\n  User quoted\n',
        "Host web-1\n  Include {d}/inner.conf\n  User after-include\n",
        "Host *\n  CanonicalizeHostname yes\n",
    ],
)
def test_what_only_openssh_evaluates_goes_to_ssh_g(text: str, tmp_path: Path) -> None:
    (tmp_path / "inner.conf").write_text("  Port 2201\n")
    config = tmp_path / "config"
    config.write_text(text.replace("{d}", str(tmp_path)))
    here = ConfigFile(str(config))
    assert not here.reads_here()
    assert here.target("web-1") == ConfigFile(str(config), exact=True).target("web-1")
