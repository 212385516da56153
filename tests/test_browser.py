"""A lecture in a real browser: JupyterLab in headless Chromium renders a slider as a widget, and moving
it redraws the figure under it (gpclab.slider_figure). Needs Chromium and its driver (Debian's packages
`chromium chromium-driver`) and the `selenium` package; skipped, with the reason, where they are missing.
.ci/run installs them."""
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LECTURE = "sec3_01_linear_models_and_gp_prior.ipynb"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver") or shutil.which("chromium-driver")

selenium = pytest.importorskip("selenium", reason="the browser test needs the selenium package")
psutil = pytest.importorskip("psutil", reason="the browser test needs psutil (to end the processes it starts)")
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="the browser test needs chromium and chromedriver (Debian: chromium chromium-driver)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _end(pid, stop, grace=20):
    """Run stop() (a polite shutdown), then kill whatever is left of pid and every process under it.
    The descendants are listed first: a kernel runs in its own session, so it is no process-group
    member of the server, and an orphan is no child of anybody's."""
    try:
        tree = [psutil.Process(pid)]
        tree += tree[0].children(recursive=True)
    except psutil.NoSuchProcess:
        tree = []
    try:
        stop()
    finally:
        _, alive = psutil.wait_procs(tree, timeout=grace)
        for p in alive:
            try:
                p.kill()
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(alive, timeout=10)


@pytest.fixture
def lab(tmp_path):
    """A JupyterLab server on loopback over a copy of one lecture, with its own config folders."""
    work = tmp_path / "lectures"
    work.mkdir()
    shutil.copy(os.path.join(ROOT, "lectures", LECTURE), work)
    port, token = _free_port(), "gpclab-browser-test"
    env = dict(os.environ, GPCLAB_QUICK="1", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[var] = str(tmp_path / var.lower())
    env.pop("MPLBACKEND", None)                      # the kernel's inline backend, as a student gets it
    log = tmp_path / "jupyter.log"                   # a file, not a pipe nobody reads (a full pipe blocks the server)
    with open(log, "w") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
             f"--ServerApp.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
             "--ServerApp.disable_check_xsrf=True", "--allow-root"],
            env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT)

    def stop():
        if server.poll() is None:
            server.terminate()                           # SIGTERM: jupyter server shuts its kernels down, then exits
            try:
                server.wait(timeout=20)
            except subprocess.TimeoutExpired:
                server.kill()

    try:
        deadline = time.time() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail("jupyter lab exited:\n" + log.read_text()[-3000:])
                if time.time() > deadline:
                    pytest.fail("jupyter lab did not start within 120 s:\n" + log.read_text()[-3000:])
                time.sleep(0.5)
        yield f"http://127.0.0.1:{port}/lab/tree/{LECTURE}?token={token}"
    finally:
        _end(server.pid, stop)


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    # As root (CI) Chromium needs --no-sandbox; the machine may have no network, so nothing in the
    # background may try to reach it.
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(flag)
    service = Service(DRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        _end(service.process.pid, driver.quit, grace=10)


def _wait(predicate, seconds, what):
    deadline = time.time() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            pytest.fail(f"waited {seconds} s for {what}")
        time.sleep(0.5)


# The notebook's state, read from JupyterLab's own model (not the DOM: cells out of view may not be
# rendered): the kernel's status, how many code cells have run, and the first error output.
NOTEBOOK_STATE = """
const nb = window.jupyterapp.shell.currentWidget;
const cells = Array.from({length: nb.content.model.cells.length}, (_, i) => nb.content.model.cells.get(i))
    .filter(c => c.type === 'code');
let error = null;
for (const c of cells) {
    for (const o of c.outputs.toJSON()) {
        if (o.output_type === 'error' && error === null) error = o.ename + ': ' + o.evalue;
    }
}
return {status: nb.sessionContext.session.kernel.status, code: cells.length,
        ran: cells.filter(c => c.executionCount !== null).length, error: error};
"""


def test_slider_renders_and_redraws_the_figure(lab, browser):
    """Run the whole lecture in JupyterLab; the prior-width slider of Figure 3.1 is a widget (not 'Error
    displaying widget'), the figure under it shows; a key press on the slider changes its value and the
    figure, which is replaced in place (still one image)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(lab)
    _wait(lambda: browser.execute_script(
        "const a = window.jupyterapp; return a && a.shell.currentWidget && a.shell.currentWidget.context "
        "&& a.shell.currentWidget.sessionContext.session && a.shell.currentWidget.sessionContext.session.kernel "
        "&& a.shell.currentWidget.sessionContext.session.kernel.connectionStatus === 'connected';"),
        120, "the notebook and its kernel")
    start = browser.execute_script(NOTEBOOK_STATE)
    assert start["code"] > 0 and start["ran"] == 0, f"the lecture is committed without outputs: {start}"
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")

    def finished():
        state = browser.execute_script(NOTEBOOK_STATE)
        if state["error"]:
            pytest.fail(f"a cell of {LECTURE} failed in JupyterLab: {state['error']}")
        return state["status"] == "idle" and state["ran"] == state["code"]

    _wait(finished, 300, "every cell to run")
    # ipywidgets shows a widget it cannot display as this text, or (a model whose class does not load) as
    # an error widget
    assert "Error displaying widget" not in browser.execute_script("return document.body.textContent;")
    assert not browser.find_elements(By.CSS_SELECTOR, ".jupyter-widgets-error-widget"), "an error widget rendered"
    sliders = browser.find_elements(By.CSS_SELECTOR, ".widget-slider .noUi-handle")
    assert sliders, "no slider widget rendered"
    handle = sliders[0]
    cell = handle.find_element(By.XPATH, "./ancestor::div[contains(@class, 'jp-CodeCell')]")
    readout = cell.find_element(By.CSS_SELECTOR, ".widget-readout")

    def figures():
        """The src of each loaded image in the slider's cell's outputs."""
        browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", cell)
        return browser.execute_script(
            "return [...arguments[0].querySelectorAll('.jp-OutputArea-output img')]"
            ".filter(i => i.complete && i.naturalWidth > 0).map(i => i.src);", cell)

    before = _wait(figures, 30, "the figure under the slider")
    assert len(before) == 1 and before[0].startswith("data:image/png"), f"{len(before)} images under the slider"
    value = readout.text
    handle.click()
    handle.send_keys(Keys.ARROW_RIGHT)
    _wait(lambda: readout.text != value, 30, "the slider's value to change")
    after = _wait(lambda: (lambda f: f if f != before else None)(figures()), 60, "the figure to be redrawn")
    assert len(after) == 1, f"the redraw added an image instead of replacing it: {len(after)} images"
