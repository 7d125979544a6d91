"""The dashboard's run view in a real headless browser (Debian's chromium, Playwright): each
node's resource charts updating live, hottest first; a node paused in a debugger with its file
and line; the run's times; a node's log downloaded; filters that survive a reload; stop from the
page, confirmed; a failure's traceback with the user's frames first and tlaunch's folded."""

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

from server_helpers import ROOT, Server  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    import time
    from tlaunch import lp_ssh as lp

    def busy():
        until = time.time() + 120
        while time.time() < until and not lp.stop_event().is_set():
            sum(range(10000))

    def learner():
        step = 7
        breakpoint()
        print("learner goes on at step", step, flush=True)

    p = lp.Program("metrics-demo")
    p.add_node(lp.PyNode(busy), label="busy")
    p.add_node(lp.PyNode(learner), label="learner")
    run = lp.launch(p, launch_type="local_mp", wait=False, stop_grace=1)
    print("RUN", run.run_id, flush=True)
    run.wait()
    """
)


@pytest.fixture
def server(tmp_path: Path) -> Iterator[Server]:
    srv = Server(tmp_path / "home")
    try:
        yield srv
    finally:
        srv.stop()


def test_charts_update_and_a_paused_node_shows_where(server: Server, tmp_path: Path) -> None:
    script = tmp_path / "demo.py"
    script.write_text(PROGRAM)
    env = {**os.environ, "TLAUNCH_HOME": str(server.home)}
    launcher = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert launcher.stdout is not None
        run_id = launcher.stdout.readline().split()[1]
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{server.url}/")
                page.fill("#token", ROOT)
                page.click("#login button")
                page.click(f"#runs tr[data-run='{run_id}']", timeout=15_000)
                # The paused node, with its file and line and the command that attaches.
                paused = page.wait_for_selector("#nodes tr[data-paused='learner/0']", timeout=30_000)
                assert paused is not None
                text = paused.inner_text()
                assert f"paused at demo.py:13 (breakpoint): tlaunch debug {run_id} learner/0" in text, text
                # The charts: one a node, the busy one first, and they grow as samples come.
                page.wait_for_selector("#charts .chart[data-key='busy/0']", timeout=20_000)
                before = int(page.get_attribute("#charts .chart[data-key='busy/0']", "data-samples") or 0)
                page.wait_for_function(
                    "Number(document.querySelector('#charts .chart[data-key=\"busy/0\"]').dataset.samples)"
                    f" >= {before + 2}",
                    timeout=20_000,
                )
                keys = page.eval_on_selector_all("#charts .chart", "els => els.map(e => e.dataset.key)")
                assert keys[0] == "busy/0" and set(keys) == {"busy/0", "learner/0"}, keys
                points = page.get_attribute("#charts .chart[data-key='busy/0'] svg.cpu polyline", "points")
                assert points is not None and len(points.split()) >= 3
                times = page.inner_text("#run-times")
                assert times.startswith("submitted ") and " started " in times and " ran " in times, times
                shots = os.environ.get("TLAUNCH_DASHBOARD_SCREENSHOTS")  # docs/: the pictures of the guides
                page.screenshot(path=str(Path(shots or tmp_path) / "dashboard-metrics.png"), full_page=True)
                page.set_viewport_size({"width": 390, "height": 844})  # a phone
                assert page.is_visible("#charts .chart[data-key='busy/0']")
                width = page.evaluate("document.documentElement.scrollWidth")
                assert width <= 420, f"the page is {width} px wide on a 390 px phone"
                if shots:
                    page.screenshot(path=str(Path(shots) / "dashboard-phone.png"), full_page=True)
                page.set_viewport_size({"width": 1280, "height": 900})
                # A node's whole log, downloaded.
                with page.expect_download() as download:
                    page.click("#nodes a.log[data-node='learner/0']")
                saved = tmp_path / "learner.log"
                download.value.save_as(saved)
                assert "waiting for a debugger: tlaunch debug" in saved.read_text()
                # Filters live in the URL: a reload keeps them, and the lists follow them.
                page.select_option("#filter-state", "FAILED")
                page.wait_for_function("!document.querySelector(`#runs tr[data-run]`)", timeout=10_000)
                page.fill("#filter-text", "metrics-demo")
                page.select_option("#filter-state", "RUNNING")
                assert "state=RUNNING" in page.url and "q=metrics-demo" in page.url, page.url
                page.reload()
                assert page.input_value("#filter-state") == "RUNNING"
                assert page.input_value("#filter-text") == "metrics-demo"
                page.wait_for_selector(f"#runs tr[data-run='{run_id}']", timeout=15_000)
                # Stop from the page, once confirmed: the run stops.
                page.on("dialog", lambda dialog: dialog.accept())
                page.click("#stop-run")
                page.wait_for_selector("#state.STOPPED", timeout=30_000)
                assert "stopped: STOPPED" in page.inner_text("#action-result")
            finally:
                browser.close()
        launcher.wait(30)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        if launcher.stdout is not None:
            launcher.stdout.close()


FAILING = textwrap.dedent(
    """
    from tlaunch import lp_ssh as lp

    def compute(x):
        return 1 / x

    def work():
        compute(0)

    p = lp.Program("fold-demo")
    p.add_node(lp.PyNode(work), label="worker")
    run = lp.launch(p, launch_type="local_mp", wait=False)
    print("RUN", run.run_id, flush=True)
    try:
        run.wait()
    except ZeroDivisionError:
        pass
    """
)


def test_a_failures_traceback_shows_the_users_frames_and_folds_tlaunchs(
    server: Server, tmp_path: Path
) -> None:
    script = tmp_path / "fold.py"
    script.write_text(FAILING)
    env = {**os.environ, "TLAUNCH_HOME": str(server.home)}
    out = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=120)
    run_id = out.stdout.split()[1]
    with playwright.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.goto(f"{server.url}/dashboard/#{run_id}")
            page.fill("#token", ROOT)
            page.click("#login button")
            page.click(f"#runs tr[data-run='{run_id}']", timeout=15_000)
            page.wait_for_selector("#failure:not([hidden]) .exception", timeout=20_000)
            assert page.inner_text("#failure .exception") == "ZeroDivisionError: division by zero"
            user = page.inner_text("#failure .user-frames")
            assert "in work" in user and "in compute" in user and "tlaunch" not in user, user
            assert "frames of tlaunch and libraries" in page.inner_text("#failure details summary")
            assert not page.is_visible("#failure details pre")  # folded until opened
        finally:
            browser.close()


def test_a_job_is_stopped_restarted_and_deleted_from_the_page_once_confirmed(server: Server) -> None:
    from server_helpers import ALICE, upload, wait_state

    with server.client() as alice:
        pkg = upload(alice, {"train.py": "import time; print('up', flush=True); time.sleep(120)\n"})
        assert (
            alice.post("/v1/trainer/job", json={"job_name": "long", "trainer_package": pkg}).status_code
            == 201
        )
        wait_state(alice, "long", ("RUNNING",))
        with playwright.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            try:
                page = browser.new_page(viewport={"width": 1280, "height": 900})
                page.goto(f"{server.url}/dashboard/")
                page.fill("#token", ALICE)
                page.click("#login button")
                page.wait_for_selector("#jobs tr[data-job='long'] td.state.RUNNING", timeout=15_000)
                # The first stop and the first restart are not confirmed: nothing happens.
                answers = iter([False, True, False, True, True, True])
                page.on("dialog", lambda dialog: dialog.accept() if next(answers) else dialog.dismiss())
                assert page.is_disabled("#jobs tr[data-job='long'] button.restart-job")  # it runs
                page.click("#jobs tr[data-job='long'] button.stop-job")
                assert alice.get("/v1/jobs/long").json()["state"] == "RUNNING"
                first = alice.get("/v1/jobs/long").json()["refs"]["run_id"]
                page.click("#jobs tr[data-job='long'] button.stop-job")
                page.wait_for_selector("#jobs tr[data-job='long'] td.state.STOPPED", timeout=30_000)
                page.click("#jobs tr[data-job='long'] button.restart-job")
                assert alice.get("/v1/jobs/long").json()["state"] == "STOPPED"
                page.click("#jobs tr[data-job='long'] button.restart-job")  # a new run of the same spec
                page.wait_for_selector("#jobs tr[data-job='long'] td.state.RUNNING", timeout=30_000)
                assert "restarted: long" in page.inner_text("#job-result")
                again = alice.get("/v1/jobs/long").json()
                assert again["state"] == "RUNNING" and again["refs"]["run_id"] not in (None, first)
                page.click("#jobs tr[data-job='long'] button.stop-job")
                page.wait_for_selector("#jobs tr[data-job='long'] td.state.STOPPED", timeout=30_000)
                page.click("#jobs tr[data-job='long'] button.delete-job")
                page.wait_for_selector("#jobs tr[data-job='long']", state="detached", timeout=15_000)
                assert "deleted: long" in page.inner_text("#job-result")
            finally:
                browser.close()
        assert alice.get("/v1/jobs/long").status_code == 404
