"""ssh configs as users write them (Include, Match, ProxyCommand, HostKeyAlias) on the SSH test hosts."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tlaunch import lp_ssh as lp
from tlaunch.ssh import connect_all, resolve_target

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
