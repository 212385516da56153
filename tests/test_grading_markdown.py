"""A student's Markdown, raw cells and cell metadata are shown as HTML in the instructor's logged-in
formgrader and in the feedback: after autograde nothing of them is active (grading_sandbox.InertCells)."""
import html.parser
import os
import sys

import nbformat
import pytest
from nbconvert import HTMLExporter
from nbformat.v4 import new_markdown_cell, new_notebook, new_raw_cell

import grading_toy as T

sys.path.insert(0, T.COURSE)
import grading_sandbox as G  # noqa: E402

# every payload would run "pwn" in a browser if rendered as HTML
HOSTILE = [
    "<script>pwn()</script>",
    "An answer <img src=x onerror=pwn()> inline",
    "<svg onload=pwn()><circle r=1></circle></svg>",
    "<iframe src=\"javascript:pwn()\"></iframe>",
    "<div>\n<script>pwn()</script>\n</div>",
    "- a list <b onmouseover=pwn()>item</b>\n- two",
    "> a quote <a href=\"javascript:pwn()\">link</a>",
    "| a | b |\n|---|---|\n| <img src=x onerror=pwn()> | 2 |",
    "<scr<script>ipt>pwn()</script>",
    "<style>body{background:url(javascript:pwn())}</style>",
    "<details open ontoggle=pwn()><summary>x</summary></details>",
    "<details><summary>x</summary>\n<img src=x onerror=pwn()>\n</details>",
    "<b>a</b><b onclick=pwn()>b</b>",
    "[click](javascript:pwn())",
    "<javascript:pwn()>",
    "<!-- --><script>pwn()</script>",
    "<form action=\"javascript:pwn()\"><input type=submit></form>",
    "<object data=\"javascript:pwn()\"></object><embed src=\"javascript:pwn()\">",
    "<base href=\"javascript:pwn()//\">",
]
# Markdown students write, unchanged
BENIGN = [
    "The evidence rises when $a<b$ and falls when $b > a$.",
    "> quoted: the mode is **not** the mean\n\n1. first\n2. second",
    "Code: `<i>not html</i>` and ``a < b``",
    "```\n<script>in a fence</script>\n```",
    "A link <https://gaussianprocess.org/gpml/> and [the book](https://gaussianprocess.org)",
    "$$\\sigma(z) < 1 \\quad\\text{for all } z$$",
    "x < y and y > z, 3 <4",
    "<details><summary>A hint</summary>\n\nLook at (3.26).\n\n</details>",
    "H<sub>2</sub>O<br>and <b>bold</b> <kbd>Ctrl</kbd>-<kbd>C</kbd>",
]
ACTIVE_TAGS = {"script", "iframe", "object", "embed", "svg", "form", "base", "frame", "frameset", "style", "math"}


class _Active(html.parser.HTMLParser):
    """What of `marker` is live in an HTML page: a script or style holding it, a tag whose
    attributes hold it (an event handler, a `javascript:` URL), and any tag that runs or loads
    content (none is part of nbconvert's or nbgrader's pages)."""

    def __init__(self, marker):
        super().__init__()
        self.marker, self.found, self._in = marker, [], None

    def handle_starttag(self, tag, attrs):
        text = " ".join(f"{k}={v}" for k, v in attrs)
        if self.marker in text:             # an event handler or a script URL of the student's
            self.found.append((tag, text))
        if tag in ACTIVE_TAGS and tag not in ("script", "style"):
            self.found.append((tag, text))
        self._in = tag if tag in ("script", "style") else None

    def handle_endtag(self, tag):
        self._in = None

    def handle_data(self, data):
        if self._in and self.marker in data:
            self.found.append((self._in, data))


def active(page, marker="pwn"):
    p = _Active(marker)
    p.feed(page)
    return p.found


def _formgrade_page(nb):
    """The page the formgrader shows for a notebook (its exporter and template)."""
    from nbgrader.server_extensions.formgrader import handlers
    exporter = HTMLExporter(template_name="formgrade", extra_template_basedirs=[handlers.template_path])
    return exporter.from_notebook_node(nb, resources=dict(
        assignment_id=T.A, notebook_id=T.A, submission_id="s", index=0, total=1, base_url="",
        student="mallory", last_name="", first_name="", notebook_path="x"))[0]


def _nb(sources):
    return new_notebook(cells=[new_markdown_cell(s) for s in sources])


def test_the_checker_sees_every_hostile_cell_as_it_is():
    """Without InertCells each hostile cell is live in the page, links to `javascript:` included
    (nbconvert allows every protocol), so the checks below can fail."""
    page_of = lambda s: HTMLExporter(template_name="classic").from_notebook_node(_nb([s]))[0]  # noqa: E731
    live = [s for s in HOSTILE if active(page_of(s))]
    assert live == HOSTILE
    assert active(page_of("plain")) == []                     # the page itself: nothing of the student
    assert active(page_of("plain"), marker="MathJax")         # and its own scripts are seen


@pytest.mark.parametrize("source", HOSTILE)
def test_hostile_markdown_is_text(source):
    page = HTMLExporter(template_name="classic").from_notebook_node(_nb([G.inert_markdown(source)]))[0]
    assert active(page) == [], source
    assert "pwn()" in page or "#unsafe-link" in page, "the cell still shows what the student wrote"


@pytest.mark.parametrize("source", BENIGN)
def test_benign_markdown_is_unchanged(source):
    assert G.inert_markdown(source) == source


def test_missing_attachment_does_not_stop_the_export():
    nb = _nb(["![plot](attachment:missing.png) and ![ok](attachment:there.png)"])
    nb.cells[0].attachments = {"there.png": {"image/png": "iVBORw0KGgo="}}
    with pytest.raises(Exception, match="missing attachment"):
        HTMLExporter(template_name="classic").from_notebook_node(nb)
    nb.cells[0].source = G.inert_markdown(nb.cells[0].source, nb.cells[0].attachments)
    assert "attachment:there.png" in nb.cells[0].source
    HTMLExporter(template_name="classic").from_notebook_node(nb)


# an image whose metadata would put an event handler into the page (nbconvert writes width and
# height unquoted), and one whose `filenames` would point it anywhere
PAINTER = """from IPython.display import display
display({"image/png": "iVBORw0KGgo=", "text/plain": "fig"}, raw=True,
        metadata={"image/png": {"width": "1 onerror=pwn() x", "height": 20}})
display({"image/jpeg": "/9j/4AAQ", "text/plain": "photo"}, raw=True,
        metadata={"height": "2 onload=pwn()", "filenames": {"image/jpeg": "/api/pwn"}})
def add(a, b):
    return a + b"""
# an output shown before the first hidden test, rewritten by the student's function while a
# hidden test calls it (update_display), with the test's code, and 50 MiB more
UPDATER_A = """from IPython.display import display, update_display
display("placeholder", display_id="leak1")
display("small", display_id="big1")
def add(a, b):
    import sys, linecache
    f = sys._getframe(1)
    update_display("LEAK" + "".join(linecache.getlines(f.f_code.co_filename)).encode().hex(), display_id="leak1")
    return a + b"""
UPDATER_B = """display("again", display_id="leak1")
update_display({"text/plain": "A" * (50 * 2 ** 20)}, raw=True, display_id="big1")
def mul(a, b):
    return a * b"""


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """A submission with hostile Markdown, a raw HTML cell and a forged grade id, autograded with
    the course's configuration, then its feedback generated."""
    course = str(tmp_path_factory.mktemp("md") / "course")
    env = T.make_course(course)
    T.submit(course, "mallory")
    path = os.path.join(course, "submitted", "mallory", T.A, f"{T.A}.ipynb")
    nb = nbformat.read(path, as_version=4)
    nb.cells.insert(3, new_markdown_cell("\n\n".join(HOSTILE)))
    raw = new_raw_cell("<script>pwn()</script><img src=x onerror=pwn()>")
    raw.metadata["format"] = "text/html"
    nb.cells.insert(4, raw)
    forged = new_markdown_cell("my notes")
    forged.metadata["nbgrader"] = {"grade_id": 'x"><script>pwn()</script>', "solution": False, "grade": False,
                                   "locked": False, "schema_version": 3}
    nb.cells.insert(5, forged)
    nbformat.write(nb, path)
    T.submit(course, "painter", {"partA_answer": PAINTER})
    T.submit(course, "updater", {"partA_answer": UPDATER_A, "partB_answer": UPDATER_B})
    T.nbgrader(course, env, "autograde", T.A)
    T.nbgrader(course, env, "generate_feedback", T.A)
    return course


def test_autograded_notebook_is_inert_in_the_formgrader(graded):
    nb = nbformat.read(os.path.join(graded, "autograded", "mallory", T.A, f"{T.A}.ipynb"), as_version=4)
    page = _formgrade_page(nb)
    assert active(page) == []
    assert "pwn()" in page                       # shown, as text
    assert T.grades(graded, "mallory") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}


def test_feedback_is_inert(graded):
    folder = os.path.join(graded, "feedback", "mallory", T.A)
    pages = [os.path.join(folder, f) for f in os.listdir(folder) if f.endswith(".html")]
    assert pages
    for page in pages:
        with open(page) as fh:
            assert active(fh.read()) == [], page


def test_image_metadata_is_inert(graded):
    """An image output keeps its picture and a numeric size, never metadata that becomes markup."""
    nb = nbformat.read(os.path.join(graded, "autograded", "painter", T.A, f"{T.A}.ipynb"), as_version=4)
    page = _formgrade_page(nb)
    assert active(page) == [] and "src=\"/api/pwn" not in page
    images = [o for c in nb.cells for o in c.get("outputs", []) if "image/png" in o.get("data", {})]
    assert images and images[0]["metadata"] == {"image/png": {"height": 20}}
    assert T.grades(graded, "painter") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
    with open(os.path.join(graded, "feedback", "painter", T.A, f"{T.A}.html")) as fh:
        assert active(fh.read()) == []


def test_image_metadata_without_a_kernel():
    from nbformat.v4 import new_code_cell, new_output
    out = new_output("display_data", data={"image/png": "AAAA", "text/plain": "x"},
                     metadata={"image/png": {"width": "1 onerror=pwn()", "height": "30"}, "width": 5,
                               "filenames": {"image/png": "/api/x"}, "needs_background": "light"})
    nb = new_notebook(cells=[new_code_cell("x", outputs=[out])])
    assert G.neutralise_outputs(nb) == 1
    # (the image's own width, not a number, is dropped; the output-wide one is not used in its place)
    assert nb.cells[0].outputs[0]["metadata"] == {"image/png": {"height": 30}}
    before = HTMLExporter(template_name="classic").from_notebook_node(
        new_notebook(cells=[new_code_cell("x", outputs=[new_output(
            "display_data", data={"image/png": "AAAA"}, metadata={"image/png": {"width": "1 onerror=pwn()"}})])]))[0]
    assert active(before), "the checker sees the handler nbconvert writes"
    assert active(HTMLExporter(template_name="classic").from_notebook_node(nb)[0]) == []


def test_outputs_are_not_rewritten_by_later_cells(graded):
    """update_display from a hidden test's call, or a later cell, changes no earlier output: the
    output before the first hidden test stays as it was shown, the 50 MiB never arrive, and the
    feedback holds nothing of the hidden test."""
    path = os.path.join(graded, "autograded", "updater", T.A, f"{T.A}.ipynb")
    assert os.path.getsize(path) < 2 ** 20
    nb = nbformat.read(path, as_version=4)
    shown = [o["data"]["text/plain"] for c in nb.cells for o in c.get("outputs", []) if "data" in o]
    assert "'placeholder'" in shown and "'small'" in shown and "'again'" in shown
    assert not any("LEAK" in t for t in shown)
    with open(os.path.join(graded, "feedback", "updater", T.A, f"{T.A}.html")) as fh:
        page = fh.read()
    hidden = T.HIDDEN["partA_works"]
    assert hidden.encode().hex()[:40] not in page and "LEAK" + hidden.encode().hex()[:8] not in page
    assert T.grades(graded, "updater") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
