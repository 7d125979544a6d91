"""The live dashboard in a real headless browser (Debian's chromium, driven by Playwright).

A real program runs under the server's ``TLAUNCH_HOME`` (a launcher process of
its own, as ``launch()`` from a script is): it appears on the page, its nodes
change state live, a node's log line appears, and its failure shows its root
cause.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("fastapi")
playwright = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.path.exists(CHROMIUM), reason="no chromium (apt-get install chromium)")

from test_server import ROOT, Server  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    import os, sys, time
    from tlaunch import lp_ssh as lp

    class Store:
        def get(self):
            return 42

    def work(store, trigger):
        print("hello from a worker, the store says", store.get(), flush=True)
        while trigger and not os.path.exists(trigger):  # the test has seen the run going
            time.sleep(0.05)
        if trigger:
            raise ValueError("the loss is nan")
        time.sleep(600)

    p = lp.Program("dashboard-demo")
    with p.group("store"):
        store = p.add_node(lp.CourierNode(Store))
    with p.group("worker"):
        p.add_node(lp.PyNode(work, store, sys.argv[1]))  # fails once the test says so
        p.add_node(lp.PyNode(work, store, None))
    run = lp.launch(p, launch_type="local_mp", wait=False, stop_grace=1)
    print("RUN", run.run_id, flush=True)
    try:
        run.wait()
    except ValueError:
        pass
    """
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:  # SQLite: the page does not depend on the database
    srv = Server(tmp_path / "home")
    try:
        yield srv
    finally:
        srv.stop()


def test_a_run_is_watched_live_in_the_browser(server: Server, tmp_path: Path) -> None:
    script = tmp_path / "demo.py"
    script.write_text(PROGRAM)
    trigger = tmp_path / "fail-now"  # worker/0 fails once it exists: the page saw the run going
    launcher = subprocess.Popen(
        [sys.executable, str(script), str(trigger)],
        env={**os.environ, "TLAUNCH_HOME": str(server.home)},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert launcher.stdout is not None
        run_id = launcher.stdout.readline().split()[1]
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 800})
                page.goto(f"{server.url}/")  # redirects to /dashboard/
                page.fill("#token", ROOT)
                page.click("#login button")
                page.click(f"#runs tr[data-run='{run_id}']", timeout=15_000)
                # Nodes change state live: running first...
                page.wait_for_selector(
                    "#graph g.node[data-key='worker/1'][data-state='running']", timeout=20_000
                )
                assert page.locator("#graph path.edge").count() == 2  # both workers hold the store's handle
                page.wait_for_function(
                    "document.getElementById('logs').textContent.includes('the store says 42')",
                    timeout=20_000,
                )
                # ...then the failure, with its root cause.
                trigger.touch()
                page.wait_for_selector("#failure:not([hidden])", timeout=30_000)
                failure = page.inner_text("#failure")
                assert "root cause: node worker/0 on localhost" in failure, failure
                assert "ValueError: the loss is nan" in failure, failure
                page.wait_for_selector("#state.FAILED", timeout=20_000)
                assert page.inner_text("#nodes").count("worker/") == 2
                shot = os.environ.get("TLAUNCH_DASHBOARD_SCREENSHOT")
                page.screenshot(path=shot or str(tmp_path / "dashboard.png"), full_page=True)
            finally:
                browser.close()
        assert launcher.wait(30) == 0
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()
