"""A lecture in a real browser: JupyterLab in headless Chromium renders a slider as a widget, and moving
it redraws the figure under it (gpclab.slider_figure). Needs Chromium and its driver (Debian's packages
`chromium chromium-driver`) and the `selenium` package; skipped, with the reason, where they are missing."""
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
pytestmark = pytest.mark.skipif(not (CHROMIUM and DRIVER),
                                reason="the browser test needs chromium and chromedriver (Debian: chromium chromium-driver)")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    server = subprocess.Popen(
        [sys.executable, "-m", "jupyterlab", "--no-browser", f"--port={port}", "--ip=127.0.0.1",
         f"--ServerApp.token={token}", f"--ServerApp.root_dir={work}", "--LabApp.expose_app_in_browser=True",
         "--ServerApp.disable_check_xsrf=True", "--allow-root"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while time.time() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            if server.poll() is not None:
                pytest.fail("jupyter lab exited: " + server.stderr.read())
            time.sleep(0.5)
    else:
        server.kill()
        pytest.fail("jupyter lab did not start within 120 s")
    yield f"http://127.0.0.1:{port}/lab/tree/{LECTURE}?token={token}"
    server.terminate()
    try:
        server.wait(timeout=20)
    except subprocess.TimeoutExpired:
        server.kill()


@pytest.fixture
def browser(tmp_path):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(flag)
    driver = webdriver.Chrome(service=Service(DRIVER), options=opts)
    yield driver
    driver.quit()


def _wait(predicate, seconds, what):
    deadline = time.time() + seconds
    while time.time() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.5)
    pytest.fail(f"waited {seconds} s for {what}")


def test_slider_renders_and_redraws_the_figure(lab, browser):
    """Run the whole lecture in JupyterLab; the prior-width slider of Figure 3.1 is a widget (not 'Error
    displaying widget'), the figure under it shows; a key press on the slider changes its value and the figure."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(lab)
    _wait(lambda: browser.execute_script(
        "const a = window.jupyterapp; return a && a.shell.currentWidget && a.shell.currentWidget.context "
        "&& a.shell.currentWidget.sessionContext.session && a.shell.currentWidget.sessionContext.session.kernel "
        "&& a.shell.currentWidget.sessionContext.session.kernel.connectionStatus === 'connected';"),
        120, "the notebook and its kernel")
    browser.execute_script("window.jupyterapp.commands.execute('notebook:run-all-cells');")
    _wait(lambda: browser.execute_script(
        "const s = window.jupyterapp.shell.currentWidget.sessionContext.session.kernel.status;"
        "const cells = document.querySelectorAll('.jp-InputArea-prompt');"
        "return s === 'idle' && cells.length > 0 && [...cells].every(c => !c.textContent.includes('*'));"),
        300, "every cell to run")
    page = browser.find_element(By.TAG_NAME, "body").text
    assert "Error displaying widget" not in page
    assert "Traceback" not in page, "a cell failed"
    sliders = browser.find_elements(By.CSS_SELECTOR, ".widget-slider")
    assert sliders, "no slider widget rendered"
    cell = sliders[0].find_element(By.XPATH, "./ancestor::div[contains(@class, 'jp-CodeCell')]")
    label = cell.find_element(By.CSS_SELECTOR, ".widget-readout")

    def figure():
        imgs = cell.find_elements(By.CSS_SELECTOR, ".jp-OutputArea-output img")
        return imgs[0].get_attribute("src") if imgs else None

    before = _wait(figure, 30, "the figure under the slider")
    value = label.text
    handle = cell.find_element(By.CSS_SELECTOR, ".noUi-handle")
    handle.click()
    handle.send_keys(Keys.ARROW_RIGHT)
    _wait(lambda: label.text != value, 30, "the slider's value to change")
    _wait(lambda: figure() not in (None, before), 60, "the figure to be redrawn")
