"""A lecture in a real browser: JupyterLab in headless Chromium renders a slider as a widget, and moving
it redraws the figure under it (gpclab.slider_figure). Needs Chromium and its driver (Debian's packages
`chromium chromium-driver`) and the `selenium` package; skipped, with the reason, where they are missing.
.ci/run installs them.

What the test relies on in JupyterLab is what its versions keep: the server's REST API (/api/sessions:
the notebook's session, its kernel's execution_state and connections), the command
'notebook:run-all-cells', and the notebook's model found by its path among the main area's widgets.
It no longer asks the front end's internals whether the kernel is there: the shell's currentWidget
(the widget holding the focus, which a headless page need not have) and the kernel object's
connectionStatus. On a fresh install (JupyterLab 4.6.6, Chromium 150) that wait ran out after 120 s
while the server's log showed the kernel started and connected 5 s after the page opened.
Waits are generous (a kernel's start and the lecture's cells on a loaded machine) and each failure says
what it saw last and ends with the server's log.
"""
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Generous limits: on a machine whose two cores six processes share, a kernel's start (numba, matplotlib)
# took minutes; the limits only bound a test that would otherwise hang
START_S = 600           # the server answering, the notebook open and its kernel connected
RUN_S = 900             # every cell of the lecture

LECTURE = "sec3_01_linear_models_and_gp_prior.ipynb"
# The layout a figure must read in: a 1400 x 900 window with the file browser open beside the notebook.
# There, every output image shows at >= MIN_RATIO of its natural width, and the smallest text the course
# allows (STYLE_PT = 9 pt, gpclab.check_figure_style) shows >= MIN_TEXT_PX CSS pixels tall (1 CSS px =
# 1/96 in: 10 px is 7.5 pt on a screen at its nominal resolution). The output column there is about
# 950 CSS px, so a figure w inches wide that fills it shows 9-pt text at 9 * 950 / (72 w) px whatever its
# dpi: 10 px for the course's widest (12 in, about 11.9 in once cropped), 11 px for 10.8 in.
WINDOW = (1400, 900)
MIN_RATIO = 0.9
STYLE_PT = 9
MIN_TEXT_PX = 10
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
        deadline = time.time() + START_S
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if server.poll() is not None:
                    pytest.fail("jupyter lab exited:\n" + log.read_text()[-3000:])
                if time.time() > deadline:
                    pytest.fail(f"jupyter lab did not start within {START_S} s:\n" + log.read_text()[-3000:])
                time.sleep(0.5)
        yield Lab(f"http://127.0.0.1:{port}", token, log)
    finally:
        _end(server.pid, stop)


class Lab:
    """The server of the lab fixture: the page of the lecture, its REST API and its log."""

    def __init__(self, base, token, log):
        self.base, self.token, self.log = base, token, log
        self.url = f"{base}/lab/tree/{LECTURE}?token={token}"

    def api(self, path):
        req = urllib.request.Request(f"{self.base}/api/{path}", headers={"Authorization": f"token {self.token}"})
        with urllib.request.urlopen(req, timeout=30) as r:
            import json
            return json.load(r)

    def kernel(self):
        """The lecture's kernel as the server sees it ({} before its session exists): its
        execution_state ('starting', 'idle', 'busy') and connections (open websockets)."""
        for session in self.api("sessions"):
            if session.get("path", "").endswith(LECTURE) and session.get("kernel"):
                return session["kernel"]
        return {}

    def tail(self):
        return "\n--- jupyter lab's log ---\n" + self.log.read_text()[-3000:]


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
                 "--disable-dev-shm-usage", f"--window-size={WINDOW[0]},{WINDOW[1]}", f"--user-data-dir={tmp_path / 'chromium'}"):
        opts.add_argument(flag)
    service = Service(DRIVER, log_output=str(tmp_path / "chromedriver.log"))
    driver = webdriver.Chrome(service=service, options=opts)
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(30)
    try:
        yield driver
    finally:
        _end(service.process.pid, driver.quit, grace=10)


def _wait(predicate, seconds, what, seen=lambda: "", lab=None):
    """predicate()'s first true value within seconds; else fail, saying what was seen last."""
    deadline = time.time() + seconds
    while True:
        value = predicate()
        if value:
            return value
        if time.time() > deadline:
            pytest.fail(f"waited {seconds} s for {what}; last seen: {seen()}" + (lab.tail() if lab else ""))
        time.sleep(0.5)


# The lecture's notebook panel, found by its path among the main area's widgets (not the shell's
# currentWidget, which is the focused widget: none in a page without focus).
FIND_NOTEBOOK = """
const app = window.jupyterapp;
if (!app || !app.shell) return null;
const nb = Array.from(app.shell.widgets('main')).find(
    w => w.context && w.context.path && w.context.path.endsWith(arguments[0]) && w.content && w.content.model);
"""

# The notebook's state, read from JupyterLab's own model (not the DOM: cells out of view may not be
# rendered): how many code cells have run, and the first error output.
NOTEBOOK_STATE = FIND_NOTEBOOK + """
if (!nb) return null;
const cells = Array.from({length: nb.content.model.cells.length}, (_, i) => nb.content.model.cells.get(i))
    .filter(c => c.type === 'code');
let error = null;
for (const c of cells) {
    for (const o of c.outputs.toJSON()) {
        if (o.output_type === 'error' && error === null) error = o.ename + ': ' + o.evalue;
    }
}
return {code: cells.length, ran: cells.filter(c => c.executionCount !== null).length, error: error};
"""

# Run every cell of the lecture's notebook: made the active widget first, since the command acts on
# the notebook tracker's current one.
RUN_ALL = FIND_NOTEBOOK + """
if (!nb) return 'no notebook ' + arguments[0];
app.shell.activateById(nb.id);
app.commands.execute('notebook:run-all-cells');    // its promise ends with the last cell: not awaited
return true;
"""


# Every output image of the notebook, each scrolled into view first (JupyterLab may skip the layout of
# cells out of view): its natural and displayed (CSS px) width and its PNG as a data URI.
OUTPUT_IMAGES = """
return [...document.querySelectorAll('.jp-OutputArea-output img')].map(i => {
    i.scrollIntoView({block: 'center'});
    return {natural: i.naturalWidth, shown: i.getBoundingClientRect().width, src: i.src};
});
"""

# The left sidebar's open panel (the file browser): its width in CSS px, 0 when closed.
SHOW_FILE_BROWSER = """
window.jupyterapp.shell.activateById('filebrowser');
const fb = document.getElementById('filebrowser');
return {panel: fb ? fb.getBoundingClientRect().width : 0, window: window.innerWidth,
        dpr: window.devicePixelRatio};
"""


def _png_dpi(src):
    """The resolution (dots per inch) a PNG data URI states in its pHYs chunk (matplotlib writes the dpi
    it rendered at there); None if it states none."""
    import base64
    import io

    from PIL import Image

    assert src.startswith("data:image/png;base64,"), f"not a PNG data URI: {src[:40]}"
    info = Image.open(io.BytesIO(base64.b64decode(src.split(",", 1)[1]))).info
    return info["dpi"][0] if "dpi" in info else None


def figure_legibility(images):
    """For each output image (natural and displayed width, PNG source): the ratio displayed / natural
    width, the PNG's dpi, and the displayed height in CSS px of STYLE_PT-point text (STYLE_PT / 72 inches
    of the figure is STYLE_PT * dpi / 72 image pixels, shown at ratio)."""
    rows = []
    for k, im in enumerate(images):
        dpi = _png_dpi(im["src"])
        ratio = im["shown"] / im["natural"]
        rows.append({"index": k, "natural": im["natural"], "shown": round(im["shown"], 1), "ratio": round(ratio, 3),
                     "dpi": dpi, "text_px": None if dpi is None else round(STYLE_PT * dpi / 72 * ratio, 2)})
    return rows


def legibility_offences(rows):
    """The rows that break the criterion, as sentences naming the image's index."""
    bad = []
    for r in rows:
        if r["ratio"] < MIN_RATIO:
            bad.append(f"output image {r['index']} shows at {r['ratio']:.0%} of its natural width "
                       f"({r['shown']} of {r['natural']} px; at least {MIN_RATIO:.0%} required)")
        if r["dpi"] is None:
            bad.append(f"output image {r['index']} states no dpi (PNG pHYs chunk), so its text size is unknown")
        elif r["text_px"] < MIN_TEXT_PX:
            bad.append(f"output image {r['index']}: {STYLE_PT}-pt text shows {r['text_px']} CSS px tall "
                       f"({r['dpi']:.0f} dpi at {r['ratio']:.0%}; at least {MIN_TEXT_PX} px required)")
    return bad


def test_legibility_criterion_can_fail():
    """The criterion itself, on made-up measurements: a 14-inch figure at 100 dpi (1400 px) in a 1000-px
    column fails both parts; a 12-inch one at 90 dpi shown in full passes; an image without a stated dpi
    fails."""
    import base64
    import io

    from PIL import Image

    def png(dpi):
        buf = io.BytesIO()
        Image.new("RGB", (4, 4)).save(buf, format="png", **({"dpi": (dpi, dpi)} if dpi else {}))
        return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()

    wide = figure_legibility([{"natural": 1400, "shown": 1000, "src": png(100)}])
    assert wide[0]["ratio"] == pytest.approx(0.714, abs=1e-3) and wide[0]["text_px"] == pytest.approx(8.93, abs=0.01)
    assert len(legibility_offences(wide)) == 2 and "output image 0" in legibility_offences(wide)[0]
    fits = figure_legibility([{"natural": 1080, "shown": 1080, "src": png(90)}])
    assert fits[0]["text_px"] == pytest.approx(11.25) and legibility_offences(fits) == []
    assert "states no dpi" in legibility_offences(figure_legibility([{"natural": 10, "shown": 10, "src": png(None)}]))[0]


def test_slider_renders_and_redraws_the_figure(lab, browser, tmp_path):
    """Run the whole lecture in JupyterLab; the prior-width slider of Figure 3.1 is a widget (not 'Error
    displaying widget'), the figure under it shows; a key press on the slider changes its value and the
    figure, which is replaced in place (still one image). Then, with the file browser open in a 1400 x 900
    window, every output image of the lecture reads: shown at >= 90 % of its natural width, its 9-pt text
    >= 10 CSS px tall (a screenshot is saved beside the test's files)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    browser.get(lab.url)

    def seen():
        return f"kernel {lab.kernel()}, notebook {browser.execute_script(NOTEBOOK_STATE, LECTURE)}"

    # the server's own word: the lecture's kernel has started (idle) and the page holds its websocket
    _wait(lambda: lab.kernel().get("execution_state") == "idle" and lab.kernel().get("connections", 0) >= 1,
          START_S, "the notebook's kernel to start and the page to connect to it", seen, lab)
    start = _wait(lambda: browser.execute_script(NOTEBOOK_STATE, LECTURE), START_S, "the notebook's model",
                  seen, lab)
    assert start["code"] > 0 and start["ran"] == 0, f"the lecture is committed without outputs: {start}"
    ran = browser.execute_script(RUN_ALL, LECTURE)
    assert ran is True, f"notebook:run-all-cells: {ran}"

    def finished():
        state = browser.execute_script(NOTEBOOK_STATE, LECTURE)
        if state and state["error"]:
            pytest.fail(f"a cell of {LECTURE} failed in JupyterLab: {state['error']}")
        return state and state["ran"] == state["code"] and lab.kernel().get("execution_state") == "idle"

    _wait(finished, RUN_S, "every cell to run", seen, lab)
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

    layout = browser.execute_script(SHOW_FILE_BROWSER)
    assert layout["panel"] > 150 and layout["window"] == WINDOW[0], f"the file browser is not open: {layout}"
    rows = figure_legibility(browser.execute_script(OUTPUT_IMAGES))
    shot = tmp_path / "lecture.png"
    browser.save_screenshot(str(shot))
    print(f"layout {layout}; output images: {rows}; screenshot {shot}")
    assert rows, "no output image in the lecture"
    bad = legibility_offences(rows)
    assert not bad, "; ".join(bad) + f" (file browser {layout['panel']:.0f} px wide; screenshot {shot})"
