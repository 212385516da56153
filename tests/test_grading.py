"""Grading a course: exercises/grade.py (parallel autograde) and the bounds and seal of
exercises/grading_sandbox.py.

A small course (tests/grading_toy.py: the shipped configuration, one quick assignment of three
parts with hidden tests) is graded once with `python grade.py toy -j 2`, with short limits (5 s a
cell, 0.5 GiB), for a correct submission and hostile ones: a loop, a loop that ignores SIGINT, a
memory hog, three that read the calling hidden test (IPython's history, the caller's frame,
`inspect` on the frame) and print it or write it to a file, and one that reports its environment.
The parallel grading of real assignments is compared with serial `nbgrader autograde`.
"""
import glob
import json
import os
import re
import shutil
import subprocess
import sys
import warnings

import nbformat
import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import grading_toy as T  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (apt-get install bubblewrap)")

LIMITS = ["--Execute.timeout=5", "--SandboxedKernelManager.memory_limit_gib=0.5"]
SECRET_ENV = "GRADER_SECRET_TOKEN"

HOSTILE = {
    "good": {},
    "loop": {"partA_answer": "def add(a, b):\n    while True:\n        pass"},
    "no_sigint": {"partA_answer": ("import signal\ndef add(a, b):\n"
                                   "    signal.signal(signal.SIGINT, signal.SIG_IGN)\n"
                                   "    while True:\n        pass")},
    "hog": {"partB_answer": "def mul(a, b):\n    hoard = [bytearray(10**7) for _ in range(10**4)]\n    return a * b"},
    # reads the calling (hidden) test from IPython's history, prints it and keeps it for later
    "leak_history": {"partA_answer": ("def add(a, b):\n    global seen\n    seen = In[-1] + str(_ih[-1]) + str(\n"
                                      "        list(get_ipython().history_manager.get_range()))\n"
                                      "    print(seen)\n    return a + b"),
                     "partB_answer": "print('history:', seen)\ndef mul(a, b):\n    return a * b"},
    # the caller's frame: its code object's file, through linecache
    "leak_frame": {"partA_answer": ("import linecache\ndef add(a, b):\n    code = sys._getframe(1).f_code\n"
                                    "    print(''.join(linecache.getlines(code.co_filename)))\n    return a + b")},
    # inspect: the stack's code context and the frame's source, printed later and written to a file
    "leak_inspect": {"partA_answer": ("import inspect\ndef add(a, b):\n    global seen\n"
                                     "    seen = inspect.getsource(sys._getframe(1))\n"
                                     "    print(inspect.stack()[1].code_context)\n    return a + b"),
                     "partC_answer": ("open('stolen.txt', 'w').write(seen)\nprint(repr(seen))\n"
                                      "def neg(a):\n    return -a")},
    "environment": {"partA_answer": ("import json\nprint('ENV=' + json.dumps(sorted(os.environ)))\n"
                                     "def add(a, b):\n    return a + b")},
    # active content for the instructor's browser (formgrader) and the feedback
    "inject": {"partA_answer": (
        "from IPython.display import HTML, Javascript, SVG, Markdown, display\n"
        "display(HTML('<script>document.title = \"pwned\"</script><b>hi</b>'))\n"
        "display(Javascript('document.title = \"pwned\"'))\n"
        "display({'text/html': '<img src=x onerror=alert(1)>', 'text/plain': 'an image'}, raw=True)\n"
        "display({'application/javascript': 'alert(2)'}, raw=True)\n"
        "display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\"><script>alert(3)</script></svg>'))\n"
        "display(Markdown('<script>alert(4)</script>'))\n"
        "display({'application/vnd.jupyter.widget-view+json': {'model_id': 'x', 'version_major': 2, "
        "'version_minor': 0}, 'text/plain': 'a widget'}, raw=True)\n"
        "def add(a, b):\n    return a + b")},
    # cheats: an answer that always compares equal, a float that lies, rebinding AssertionError
    "cheat_eq": {"partA_answer": ("class Yes:\n    def __eq__(self, other):\n        return True\n"
                                  "    __hash__ = object.__hash__\n"
                                  "def add(a, b):\n    return Yes()")},
    "cheat_float": {"partC_answer": ("class Yes(float):\n    def __eq__(self, other):\n        return True\n"
                                     "    __hash__ = float.__hash__\n"
                                     "def neg(a):\n    return Yes(0)")},
    "cheat_assertion": {"partB_answer": ("import builtins\nbuiltins.AssertionError = Warning\n"
                                         "AssertionError = Warning\n"
                                         "def mul(a, b):\n    return a + b")},
}

# ---- sealed feedback: hostile code that finds a hidden test and prints it encoded -----------------------
# Each prints "LEAK:<encoding>:<payload>" lines; the instructor's autograded notebook keeps what the
# substring scrub does not recognise (hex, rot13, zlib), which proves the route found the hidden test.
_EMIT = (
    "import base64, binascii, codecs, zlib\n"
    "def _emit(text, how):\n"
    "    if how == 'chunks':\n"
    "        for i in range(0, len(text), 12):\n"
    "            print('LEAK:chunks:' + text[i:i + 12])\n"
    "    elif how == 'hex':\n"
    "        print('LEAK:hex:' + text.encode().hex())\n"
    "    elif how == 'rot13':\n"
    "        for line in text.splitlines():\n"
    "            print('LEAK:rot13:' + codecs.encode(line, 'rot13'))\n"
    "    else:\n"
    "        print('LEAK:zlib:' + base64.b64encode(zlib.compress(text.encode())).decode())\n")
_ROUTES = {
    # IPython's history (test cells are not in it: this finds the student's own cells)
    "history": "In[-1] + '\\n'.join(_ih) + str(list(get_ipython().history_manager.get_range()))",
    # the calling frame's code: its constants and names, and its source through linecache
    "frame": ("repr(sys._getframe(1).f_code.co_consts) + repr(sys._getframe(1).f_code.co_names) + "
              "''.join(__import__('linecache').getlines(sys._getframe(1).f_code.co_filename))"),
    "inspect": "__import__('inspect').getsource(sys._getframe(1))",
    # every source IPython registered with linecache
    "linecache": ("'\\n'.join(''.join(v[2]) for v in list(__import__('linecache').cache.values()) "
                  "if isinstance(v, tuple) and len(v) > 2 and 'BEGIN HIDDEN' in ''.join(v[2]))"),
}


def _leaker(route, how, later, later_part="partC"):
    """partA's add finds the calling test by `route` and prints it (`how`); a later part prints
    what it kept (`later`: an encoding), or raises it as its error's message ('raise')."""
    answers = {"partA_answer": (_EMIT + "seen = ''\ndef add(a, b):\n    global seen\n"
                                f"    seen = {_ROUTES[route]}\n    _emit(seen, {how!r})\n    return a + b")}
    if later == "raise":
        answers["partB_answer"] = ("def mul(a, b):\n    raise ValueError('LEAK:hex:' + seen.encode().hex())")
    else:
        name, body = ("partB_answer", "def mul(a, b):\n    return a * b") if later_part == "partB" else \
            ("partC_answer", "def neg(a):\n    return -a")
        answers[name] = (f"_emit(seen, {later!r})\nopen('stolen.txt', 'w').write(seen.encode().hex())\n" + body)
    return answers


LEAKERS = {
    "seal_history_chunks": _leaker("history", "chunks", "hex", "partB"),
    "seal_frame_hex": _leaker("frame", "hex", "zlib"),
    "seal_inspect_zlib": _leaker("inspect", "zlib", "raise"),
    "seal_linecache_rot13": _leaker("linecache", "rot13", "chunks"),
}
LEAKERS["seal_linecache_rot13"]["partC_answer"] = (
    "import codecs\ndef neg(a):\n    raise AssertionError('LEAK:rot13:' + codecs.encode(seen, 'rot13'))")
# writes the hidden test into the working folder's timestamp.txt (which nbgrader's feedback would copy)
LEAKERS["seal_tampered_stamp"] = {
    "partA_answer": (_EMIT + "def add(a, b):\n    text = " + _ROUTES["inspect"] + "\n"
                     "    open('timestamp.txt', 'w').write('LEAK:hex:' + text.encode().hex())\n    return a + b")}
HOSTILE.update(LEAKERS)

# ---- hooks that change how cells run --------------------------------------------------------------------
# a trace function that jumps from an assert to the next line that is not an assert (nor blank, nor a comment)
_JUMP = ("def _jump(frame, event, arg):\n"
         "    if event == 'line':\n"
         "        def get(n):\n"
         "            return linecache.getline(frame.f_code.co_filename, n).strip()\n"
         "        if get(frame.f_lineno).startswith('assert'):\n"
         "            n = frame.f_lineno + 1\n"
         "            while n < frame.f_lineno + 200 and (not get(n) or get(n).startswith(('#', 'assert'))):\n"
         "                n += 1\n"
         "            try:\n"
         "                frame.f_lineno = n\n"
         "            except ValueError:\n"
         "                pass\n"
         "    return _jump\n")
WRONG_B, WRONG_C = "def mul(a, b):\n    return 0", "def neg(a):\n    return 0"
HOOKS = {
    # an AST transformer that turns every assert into pass (in the student's cell, before the tests)
    "hook_ast": {"partA_answer": ("import ast\nclass _NoAssert(ast.NodeTransformer):\n"
                                  "    def visit_Assert(self, node):\n        return ast.Pass()\n"
                                  "get_ipython().ast_transformers.append(_NoAssert())\n"
                                  "def add(a, b):\n    return 0"),
                 "partB_answer": WRONG_B, "partC_answer": WRONG_C},
    # an exception handler that shows nothing, and a callback that clears the error
    "hook_callback": {"partA_answer": ("def _quiet(shell, etype, value, tb, tb_offset=None):\n    return []\n"
                                       "get_ipython().set_custom_exc((AssertionError,), _quiet)\n"
                                       "def _clear(result):\n    result.error_in_exec = None\n"
                                       "get_ipython().events.register('post_run_cell', _clear)\n"
                                       "def add(a, b):\n    return 0"),
                      "partB_answer": WRONG_B, "partC_answer": WRONG_C},
    # a trace function that jumps over every assert it can (IPython runs each top-level statement as a
    # code object of its own: only an assert followed by another line of a loop or block can be
    # jumped over, as in partC's hidden test); partC's answer passes the visible test only
    "hook_trace": {"partA_answer": ("import linecache\n"
                                    + _JUMP +
                                    "sys.settrace(lambda frame, event, arg: _jump if frame.f_code.co_name == '<module>' else None)\n"
                                    "def add(a, b):\n    return 0"),
                   "partB_answer": WRONG_B, "partC_answer": "def neg(a):\n    return -1 if a == 1 else 0"},
    # the same trace function, set by the answer when the test calls it (for the test's next statements)
    "hook_trace_in_test": {"partC_answer": ("import linecache\n"
                                            + _JUMP +
                                            "def neg(a):\n"
                                            "    sys.settrace(lambda frame, event, arg: _jump if frame.f_code.co_name == '<module>' else None)\n"
                                            "    return -1 if a == 1 else 0")},
    # the handler and the callback installed by the answer while the test runs
    "hook_exc_in_test": {"partA_answer": ("def _quiet(shell, etype, value, tb, tb_offset=None):\n    return []\n"
                                          "def _clear(result):\n    result.error_in_exec = None\n"
                                          "def add(a, b):\n"
                                          "    get_ipython().set_custom_exc((AssertionError,), _quiet)\n"
                                          "    get_ipython().events.register('post_run_cell', _clear)\n"
                                          "    return 0")},
    # a built-in the hidden test uses, replaced: abs says every difference is 0
    "hook_builtins": {"partB_answer": ("import builtins\nbuiltins.abs = lambda x: 0\n"
                                       "def mul(a, b):\n    return 6 if (a, b) == (2, 3) else -15 if (a, b) == (-3, 5) else 0")},
    # legitimate: magics, extensions, progress bars, warnings filters, a figure
    "legit_magics": {"partA_answer": ("%matplotlib inline\n%load_ext autoreload\n%autoreload 2\n"
                                      "import warnings\nwarnings.filterwarnings('ignore')\n"
                                      "from tqdm import tqdm\nfor _ in tqdm(range(3)):\n    pass\n"
                                      "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\n"
                                      "def add(a, b):\n    return a + b"),
                     "partB_answer": "%%time\ndef mul(a, b):\n    return a * b",
                     "partC_answer": ("import matplotlib.pyplot as plt\n"
                                      "def neg(a):\n    warnings.warn('a warning the filter hides')\n"
                                      "    plt.figure(); plt.close('all')\n    return -a")},
}
HOSTILE.update(HOOKS)

EXPECTED = {  # (A, B, C) points
    "good": (1, 1, 1), "loop": (0, 1, 1), "no_sigint": (0, 1, 1), "hog": (1, 0, 1),
    "leak_history": (1, 1, 1), "leak_frame": (1, 1, 1), "leak_inspect": (1, 1, 1), "environment": (1, 1, 1),
    "inject": (1, 1, 1), "cheat_eq": (0, 1, 1), "cheat_float": (1, 1, 0), "cheat_assertion": (1, 0, 1),
    "seal_history_chunks": (1, 1, 1), "seal_frame_hex": (1, 1, 1), "seal_inspect_zlib": (1, 0, 1),
    "seal_linecache_rot13": (1, 1, 0), "seal_tampered_stamp": (1, 1, 1),
    "hook_ast": (0, 0, 0), "hook_callback": (0, 0, 0), "hook_trace": (0, 0, 0), "hook_trace_in_test": (1, 1, 0),
    "hook_exc_in_test": (0, 1, 1), "hook_builtins": (1, 0, 1), "legit_magics": (1, 1, 1),
}
# the submissions whose tests found their code changing how cells run while a test ran
TAMPERED = {"hook_trace_in_test": ["partC_works"], "hook_exc_in_test": ["partA_works"]}


def _grade(course, env, *args):
    return subprocess.run([sys.executable, "grade.py", *args], cwd=course, capture_output=True, text=True,
                          env=env, timeout=900)


@pytest.fixture(scope="module")
def toy(tmp_path_factory):
    course = str(tmp_path_factory.mktemp("grading") / "course")
    env = T.make_course(course, {SECRET_ENV: "do not pass me on"})
    for student, answers in HOSTILE.items():
        T.submit(course, student, answers)
    out = _grade(course, env, "toy", "-j", "2", "--", *LIMITS)
    assert out.returncode == 0, out.stdout + out.stderr
    fb = T.nbgrader(course, env, "generate_feedback", "toy")
    return dict(course=course, env=env, out=out.stdout, err=out.stderr, feedback=fb.stdout + fb.stderr)


def test_every_submission_graded_with_finished_parts_kept(toy):
    for student, (a, b, c) in EXPECTED.items():
        assert T.grades(toy["course"], student) == {"partA_works": a, "partB_works": b, "partC_works": c}, student


def test_stopped_cells_say_why(toy):
    loop = T.outputs(toy["course"], "loop", "partA_works")
    assert "TimeLimitExceeded" in loop and "stopped after 5 s" in loop
    no_sigint = T.outputs(toy["course"], "no_sigint", "partA_works")
    assert "stopped after 5 s" in no_sigint and "ignored the interrupt" in no_sigint
    hog = T.outputs(toy["course"], "hog", "partB_works")
    assert "MemoryLimitExceeded" in hog and "exceeded 0.5 GiB" in hog
    # the summary names them, with the cell
    assert re.search(rf"graded {len(HOSTILE)}, failed 0, with stopped cells 3", toy["out"]), toy["out"]
    for student in ("loop", "no_sigint", "hog"):
        assert re.search(rf"stopped +toy {student} ", toy["out"]), toy["out"]


def test_hostile_submissions_cost_little_time(toy):
    """A loop costs one cell's limit; one that ignores SIGINT that plus a new kernel."""
    times = {m.group(1): float(m.group(2)) for m in re.finditer(r"stopped +toy (\w+) \((\d+) s\)", toy["out"])}
    assert times["loop"] < 5 + 15 and times["no_sigint"] < 5 + 5 + 30, times


def test_progress_bar_shows_count_rate_and_eta(toy):
    assert f"{len(HOSTILE)}/{len(HOSTILE)}" in toy["err"] and "submission/s" in toy["err"] or "s/submission" in toy["err"], toy["err"][-500:]


def _texts(course, student):
    """What may reach the student: the autograded notebook's outputs (its cells' source is the
    instructor's, hidden tests included), every other file in its folder, and the feedback."""
    out = []
    for path in glob.glob(os.path.join(course, "autograded", student, "toy", "*")) + \
            glob.glob(os.path.join(course, "feedback", student, "toy", "*")):
        if path.endswith(".ipynb"):
            nb = nbformat.read(path, as_version=4)
            out.append((path, json.dumps([c.get("outputs", []) for c in nb.cells])))
            out.append((path, "\n".join(o.get("text", "") + o.get("evalue", "") + "".join(o.get("traceback", []))
                                         for c in nb.cells for o in c.get("outputs", []))))
        else:
            with open(path, errors="replace") as fh:
                out.append((path, fh.read()))
    return out


@pytest.mark.parametrize("student, found", [("leak_history", False), ("leak_frame", True), ("leak_inspect", True)])
def test_hidden_tests_do_not_reach_the_student(toy, student, found):
    """Whatever route looked for the hidden test's code, neither the autograded notebook's
    outputs, the files left in its folder nor the feedback holds it. The history holds no test
    cell at all; the frame and `inspect` find it, and the notice shows their outputs replaced."""
    texts = _texts(toy["course"], student)
    assert any(p.endswith(".html") for p, _ in texts), "feedback was generated"
    for path, text in texts:
        for line in T.HIDDEN.values():
            for piece in (line, line.split(" and ")[0], json.dumps(line)[1:-1]):
                assert piece not in text, (student, path, piece)
    notices = sum("this output repeated code of a hidden test" in t for p, t in texts if p.endswith(".ipynb"))
    assert bool(notices) == found, (student, notices)


def test_history_holds_no_test_cell(toy):
    """Test cells run outside IPython's history: In[-1] inside a test is the student's own cell."""
    nb = nbformat.read(os.path.join(toy["course"], "autograded", "leak_history", "toy", "toy.ipynb"), as_version=4)
    cell = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "partB_answer"][0]
    text = "".join(o.get("text", "") for o in cell.outputs)
    assert "history:" in text and "def add(a, b)" in text and "assert add(1, 2)" not in text, text


def test_kernel_environment_is_a_whitelist(toy):
    printed = json.loads(T.outputs(toy["course"], "environment", "partA_answer"))[0]["text"]
    names = set(json.loads(printed.split("ENV=", 1)[1]))
    assert SECRET_ENV not in names
    allowed = {"PATH", "PYTHONPATH", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ", "HOME", "TMPDIR",
               "PWD", "NBGRADER_EXECUTION", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
               "MPLBACKEND", "PYTHONHASHSEED", "JPY_PARENT_PID", "PYTHONSAFEPATH"}
    # what ipykernel itself sets when it starts (its own terminal and pager settings)
    allowed |= {"TERM", "CLICOLOR", "CLICOLOR_FORCE", "FORCE_COLOR", "PAGER", "GIT_PAGER", "PYDEVD_USE_FRAME_EVAL"}
    extra = {n for n in names if n not in allowed and not n.startswith("NUMBA_")}
    assert not extra, extra
    assert len(os.environ) > len(names)


FAKE_LAUNCHER = """\
# a student's ipykernel_launcher.py beside the notebook: it leaves a mark, then starts the real kernel
import os, sys, runpy
os.environ["HIJACKED"] = "the student's launcher ran"
sys.path = [p for p in sys.path if p not in ("", os.getcwd())]
runpy.run_module("ipykernel_launcher", run_name="__main__", alter_sys=True)
"""


def test_a_launcher_handed_in_beside_the_notebook_is_not_the_kernel(tmp_path):
    """`python -m ipykernel_launcher` would import a student's own ipykernel_launcher.py from the
    working folder (autograde copies every file handed in), and that kernel could, for example, wrap
    each cell in `try: ... except BaseException: pass`: the kernel starts from the installed launcher
    instead, and the unfinished parts score 0."""
    course = str(tmp_path / "course")
    env = T.make_course(course)
    unfinished = {"partA_answer": "def add(a, b):\n    raise NotImplementedError()",
                  "partB_answer": "def mul(a, b):\n    raise NotImplementedError()",
                  "partC_answer": "import os\nprint('mark:', os.environ.get('HIJACKED'))\ndef neg(a):\n    return -a"}
    T.submit(course, "mallory", unfinished)
    with open(os.path.join(course, "submitted", "mallory", T.A, "ipykernel_launcher.py"), "w") as fh:
        fh.write(FAKE_LAUNCHER)
    out = _grade(course, env, "toy", "-j", "1", "--", *LIMITS)
    assert out.returncode == 0, out.stdout + out.stderr
    work = os.path.join(course, "autograded", "mallory", T.A)
    assert os.path.exists(os.path.join(work, "ipykernel_launcher.py"))      # handed in and copied
    mark = T.outputs(course, "mallory", "partC_answer")
    assert "mark: None" in mark and "launcher ran" not in mark, "the student's launcher started the kernel"
    got = T.grades(course, "mallory")
    assert got["partA_works"] == 0 and got["partB_works"] == 0 and got["partC_works"] == 1, got


def test_resume_grades_only_what_is_left(toy):
    course, env = toy["course"], toy["env"]
    # as if the run had been killed: one submission never graded, one half-way (no notebook yet)
    shutil.rmtree(os.path.join(course, "autograded", "good", "toy"))
    os.remove(os.path.join(course, "autograded", "hog", "toy", "toy.ipynb"))
    out = _grade(course, env, "toy", "-j", "2", "--no-progress", "--", *LIMITS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"2 submission(s) to grade ({len(HOSTILE) - 2} graded already, skipped)" in out.stdout, out.stdout
    assert "graded 2, failed 0" in out.stdout
    assert T.grades(course, "good") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
    assert T.grades(course, "hog")["partB_works"] == 0
    again = _grade(course, env, "toy", "--no-progress", "--student", "good", "--force")
    assert "1 submission(s) to grade" in again.stdout and "graded 1, failed 0" in again.stdout, again.stdout


def test_active_outputs_are_neutralised(toy):
    """HTML, JavaScript, SVG, Markdown and widget outputs of student code reach neither the
    autograded notebook (formgrader) nor the feedback as active content; plain text stays."""
    texts = _texts(toy["course"], "inject")
    assert any(p.endswith(".html") for p, _ in texts)
    for path, text in texts:
        if path.endswith(".html"):
            # the feedback's own page has scripts (MathJax, require), and shows the student's
            # code escaped; none of the student's markup is live
            for bad in ("<script>document.title", "<img src=x", "<svg", "<script>alert"):
                assert bad not in text, (path, bad)
        else:
            for bad in ("<script", "onerror", "<svg"):
                assert bad not in text, (path, bad)
    nb = nbformat.read(os.path.join(toy["course"], "autograded", "inject", "toy", "toy.ipynb"), as_version=4)
    types = {k for c in nb.cells for o in c.get("outputs", []) for k in o.get("data", {})}
    assert types == {"text/plain"}, types
    plain = T.outputs(toy["course"], "inject", "partA_answer")
    assert "an image" in plain and "a widget" in plain and "which a browser would run or render" in plain, plain


def test_resubmission_with_old_modification_time_is_graded_again(toy):
    """collect keeps the student's save time: a resubmission saved before the last grading run
    has an older modification time than autograded/, but a new timestamp.txt and content."""
    course, env = toy["course"], toy["env"]
    sub = os.path.join(course, "submitted", "good", "toy")
    with open(os.path.join(sub, "timestamp.txt"), "w") as fh:
        fh.write("2026-01-01 10:00:00.000000 UTC")
    T.submit(course, "good", {"partA_answer": "def add(a, b):\n    return b + a  # resubmitted"})
    for name in os.listdir(sub):
        os.utime(os.path.join(sub, name), (946684800, 946684800))      # 2000-01-01
    out = _grade(course, env, "toy", "--student", "good", "--no-progress", "--", *LIMITS)
    assert "1 submission(s) to grade (0 graded already" in out.stdout and "graded 1, failed 0" in out.stdout, out.stdout
    assert "# resubmitted" in nbformat.read(os.path.join(course, "autograded", "good", "toy", "toy.ipynb"),
                                            as_version=4).cells[2].source
    again = _grade(course, env, "toy", "--student", "good", "--no-progress", "--", *LIMITS)
    assert "0 submission(s) to grade (1 graded already" in again.stdout, again.stdout
    # a new timestamp alone (the same notebooks submitted again) is a new submission too
    with open(os.path.join(sub, "timestamp.txt"), "w") as fh:
        fh.write("2026-01-02 10:00:00.000000 UTC")
    os.utime(os.path.join(sub, "timestamp.txt"), (946684800, 946684800))
    out = _grade(course, env, "toy", "--student", "good", "--no-progress", "--", *LIMITS)
    assert "1 submission(s) to grade (0 graded already" in out.stdout, out.stdout


def test_interrupted_run_resumes(toy):
    """A run stopped by SIGINT after its first graded submission, then started again, grades only
    what is left, and every submission ends up graded as before."""
    import signal
    import time

    course, env = toy["course"], toy["env"]
    before = {s: T.grades(course, s) for s in EXPECTED}
    for s in EXPECTED:                                   # nothing graded yet
        shutil.rmtree(os.path.join(course, "autograded", s, "toy"))
    # (SIGINT as a terminal's Ctrl-C, also when the tests themselves run in the background, where
    # the shell starts them with SIGINT ignored and Python would inherit that)
    proc = subprocess.Popen([sys.executable, "grade.py", "toy", "-j", "1", "--no-progress", "--", *LIMITS],
                            cwd=course, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    t0 = time.time()
    while time.time() - t0 < 300:
        graded = [s for s in EXPECTED if os.path.exists(os.path.join(course, "autograded", s, "toy", "toy.ipynb"))]
        if graded or proc.poll() is not None:
            break
        time.sleep(0.2)
    assert proc.poll() is None and graded, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode != 0 and "interrupted" in out, out + err
    at_stop = [s for s in EXPECTED if os.path.exists(os.path.join(course, "autograded", s, "toy", "toy.ipynb"))]
    assert len(at_stop) < len(EXPECTED), (at_stop, out, err[-3000:])
    again = _grade(course, env, "toy", "-j", "2", "--no-progress", "--", *LIMITS)
    assert again.returncode == 0, again.stdout + again.stderr
    m = re.search(r"(\d+) submission\(s\) to grade \((\d+) graded already", again.stdout)
    assert m and int(m.group(2)) >= 1 and int(m.group(1)) + int(m.group(2)) == len(EXPECTED), again.stdout
    assert int(m.group(1)) >= 1, again.stdout          # something was left to grade
    assert {s: T.grades(course, s) for s in EXPECTED} == before


def test_notebook_budget_stops_the_last_part(toy):
    """Each cell within its limit, but together over the notebook's budget: the cell running when
    the budget is used up is stopped, the parts before keep their points."""
    course, env = toy["course"], toy["env"]
    T.submit(course, "slow", {"partA_answer": "import time\ndef add(a, b):\n    time.sleep(1)\n    return a + b",
                              "partB_answer": "def mul(a, b):\n    time.sleep(1)\n    return a * b",
                              "partC_answer": "def neg(a):\n    time.sleep(5)\n    return -a"})
    out = _grade(course, env, "toy", "--student", "slow", "--no-progress", "--",
                 "--Execute.timeout=10", "--SandboxedExecute.submission_timeout=12")
    assert out.returncode == 0, out.stdout + out.stderr
    assert T.grades(course, "slow") == {"partA_works": 1, "partB_works": 1, "partC_works": 0}
    msg = T.outputs(course, "slow", "partC_works")
    assert "TimeLimitExceeded" in msg and "the notebook's time budget" in msg, msg
    shutil.rmtree(os.path.join(course, "submitted", "slow"))


def test_bad_arguments_are_refused(toy):
    out = _grade(toy["course"], toy["env"], "toy", "-j", "0")
    assert out.returncode != 0 and "-j/--jobs must be at least 1" in out.stderr
    out = _grade(toy["course"], toy["env"], "no_such_assignment")
    assert out.returncode != 0 and "no assignment no_such_assignment in the gradebook" in out.stdout + out.stderr


def test_dask_cluster_grades_like_the_pool(toy, tmp_path):
    distributed = pytest.importorskip("distributed")
    course, env = toy["course"], toy["env"]
    with distributed.LocalCluster(n_workers=1, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster:
        out = _grade(course, env, "toy", "--student", "good", "--student", "loop", "--force", "--no-progress",
                     "--dask", cluster.scheduler_address, "--", *LIMITS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "graded 2, failed 0, with stopped cells 1" in out.stdout, out.stdout
    assert T.grades(course, "loop") == {"partA_works": 0, "partB_works": 1, "partC_works": 1}


# ---- the real course: parallel == serial ------------------------------------------------------------
def _gradebook_rows(course):
    from nbgrader.api import Gradebook

    rows = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
            for a in gb.assignments:
                for sub in a.submissions:
                    for nb in sub.notebooks:
                        for g in nb.grades:
                            rows.add((a.name, sub.student.id, nb.name, g.name, g.auto_score, g.max_score,
                                      g.needs_manual_grade))
                        for c in nb.comments:
                            rows.add((a.name, sub.student.id, nb.name, c.name, c.auto_comment))
    return rows


def _cell_results(path):
    nb = nbformat.read(path, as_version=4)
    out = []
    for c in nb.cells:
        errs = [(o.ename, o.evalue) for o in c.get("outputs", []) if o.get("output_type") == "error"]
        out.append((c.metadata.get("nbgrader", {}).get("grade_id"), c.source, errs))
    return out


def test_parallel_gives_the_gradebook_of_serial_nbgrader(tmp_path):
    """Two real assignments, a few corpus submissions each: `nbgrader autograde` (serial) and
    `grade.py -j 2` leave the same grades, comments, exported CSV and autograded cells."""
    import runpy

    from test_exercises import CORPUS, _submission

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    warm = subprocess.run([sys.executable, "-c", "import gpclab; gpclab.compile_paths(['laplace'])"],
                          cwd=root, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr
    courses = {}
    for kind in ("serial", "parallel"):
        course = str(tmp_path / kind)
        shutil.copytree(os.path.join(root, "exercises"), course, ignore=shutil.ignore_patterns(
            "release", "submitted", "autograded", "feedback", "gradebook.db*", "grading_logs", "__pycache__"))
        env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"])
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
            env[var] = os.path.join(course, ".jupyter", var.lower())
        courses[kind] = (course, env)
        T.nbgrader(course, env, "generate_assignment", "ex3_10_2", "--force")
        T.nbgrader(course, env, "generate_assignment", "ex3_10_4", "--force")
        for a, mistakes in (("ex3_10_2", ["case_major_order"]), ("ex3_10_4", ["K_W_instead_of_W_K"])):
            src = os.path.join(course, "source", a, f"{a}.ipynb")
            release = os.path.join(course, "release", a, f"{a}.ipynb")
            corpus = runpy.run_path(os.path.join(CORPUS, f"{a}.py"))
            subs = {"solved": None, "unsolved": "release"}
            subs.update({f"mistake_{m}": corpus["MISTAKES"][m][1] for m in mistakes})
            for student, answers in subs.items():
                dest = os.path.join(course, "submitted", student, a)
                os.makedirs(dest)
                if answers is None:
                    shutil.copy(src, dest)
                elif answers == "release":
                    shutil.copy(release, dest)
                else:
                    nbformat.write(_submission(release, src, answers), os.path.join(dest, f"{a}.ipynb"))
    serial, senv = courses["serial"]
    T.nbgrader(serial, senv, "autograde", "*")
    parallel, penv = courses["parallel"]
    out = subprocess.run([sys.executable, "grade.py", "--all", "-j", "2", "--no-progress"], cwd=parallel,
                         capture_output=True, text=True, env=penv, timeout=900)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "graded 6, failed 0, with stopped cells 0" in out.stdout, out.stdout
    rows = {k: _gradebook_rows(c) for k, (c, _) in courses.items()}
    assert rows["serial"] == rows["parallel"]
    assert len({r for r in rows["serial"] if len(r) == 7}) > 20
    for kind, (course, env) in courses.items():
        T.nbgrader(course, env, "export", "--to", os.path.join(course, "grades.csv"))
    # the same rows (the order follows the gradebook's insertion order, which parallel grading changes)
    with open(os.path.join(serial, "grades.csv")) as a, open(os.path.join(parallel, "grades.csv")) as b:
        a_rows, b_rows = a.read().splitlines(), b.read().splitlines()
    assert a_rows[0] == b_rows[0] and sorted(a_rows) == sorted(b_rows) and len(a_rows) == 1 + 4 * 2
    for path in glob.glob(os.path.join(serial, "autograded", "*", "*", "*.ipynb")):
        other = path.replace(serial, parallel, 1)
        assert _cell_results(path) == _cell_results(other), path


# ---- a reply that never comes (the widget stall) ----------------------------------------------------
def _poll(reply_after, outputs):
    """SandboxedExecute's wait for a cell's reply when the kernel's output stream has said the cell
    finished (status idle) and the reply comes after `reply_after` seconds (None: never)."""
    import asyncio
    from unittest import mock

    from nbclient.client import NotebookClient
    from nbformat.notebooknode import NotebookNode

    sys.path.insert(0, T.COURSE)
    try:
        from grading_sandbox import SandboxedExecute
    finally:
        sys.path.remove(T.COURSE)

    async def reply(self, msg_id, *args):
        if reply_after is None:
            await asyncio.sleep(3600)
        await asyncio.sleep(reply_after)
        return {"content": {"status": "ok"}, "parent_header": {"msg_id": msg_id}, "from": "kernel"}

    async def run():
        ex = SandboxedExecute(reply_grace=0.5)
        idle = asyncio.ensure_future(asyncio.sleep(0))
        alive = asyncio.ensure_future(asyncio.sleep(3600))
        await idle
        cell = NotebookNode(outputs=[NotebookNode(o) for o in outputs])
        try:
            return await ex._async_poll_for_reply("m1", cell, 60, idle, alive)
        finally:
            alive.cancel()

    with mock.patch.object(NotebookClient, "_async_poll_for_reply", reply):
        return asyncio.run(asyncio.wait_for(run(), 10))


def test_lost_reply_after_idle_counts_as_finished():
    got = _poll(None, [])
    assert got["content"] == {"status": "ok"} and got["parent_header"]["msg_id"] == "m1" and "from" not in got
    err = {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["ValueError: bad"]}
    got = _poll(None, [err])
    assert got["content"]["status"] == "error" and got["content"]["ename"] == "ValueError"


def test_late_reply_within_grace_is_taken():
    assert _poll(0.1, [])["from"] == "kernel"


# ---- the seal against encoded copies (no kernel) ------------------------------------------------------
def _sandbox_module():
    sys.path.insert(0, T.COURSE)
    try:
        import grading_sandbox
    finally:
        sys.path.remove(T.COURSE)
    return grading_sandbox


@pytest.mark.parametrize("how", ["plain", "reversed", "base64", "base64_wrapped", "base64_of_line"])
def test_encoded_copies_of_hidden_tests_are_scrubbed(how):
    """Student code that found a hidden test may print it reversed or in base64 (of the whole
    cell, wrapped at 76 characters, or of one line): the output is replaced all the same; a
    message of the released text is not."""
    import base64

    from nbformat.v4 import new_output

    S = _sandbox_module()
    nb = T.source_notebook()
    cell = [c for c in nb.cells if c.metadata["nbgrader"]["grade_id"] == "partB_works"][0]
    src = cell.source
    text = {"plain": repr(src), "reversed": src[::-1], "base64": base64.b64encode(("x" + src).encode()).decode(),
            "base64_wrapped": base64.encodebytes(("ab" + src).encode()).decode(),
            "base64_of_line": repr(base64.b64encode(T.HIDDEN["partB_works"].encode()))}[how]
    answer = [c for c in nb.cells if c.metadata["nbgrader"]["grade_id"] == "partA_answer"][0]
    answer.outputs = [new_output("stream", name="stdout", text=text),
                      new_output("stream", name="stdout", text=VISIBLE_MSG)]
    assert S.scrub_outputs(nb, S.hidden_fragments(nb)) == 1
    assert answer.outputs[0].text.startswith(S.HIDDEN_NOTICE) and answer.outputs[1].text == VISIBLE_MSG


VISIBLE_MSG = "assert mul(2, 3) == 6 passed; base64 is fun: " + __import__("base64").b64encode(b"assert mul(2, 3) == 6").decode()


def test_active_types_are_dropped_without_a_kernel():
    from nbformat.v4 import new_output

    S = _sandbox_module()
    nb = T.source_notebook()
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    nb.cells[1].outputs = [
        new_output("display_data", data={"text/html": "<script>x</script>", "text/plain": "<HTML>"}),
        new_output("execute_result", data={"image/svg+xml": "<svg onload=alert(1)/>", "image/png": "iVBOR"},
                   execution_count=1),
        new_output("display_data", data={"application/javascript": "alert(1)"})]
    assert S.neutralise_outputs(nb) == 4
    assert [dict(o.data) for o in nb.cells[1].outputs] == [
        {"text/plain": "<HTML>"}, {"image/png": "iVBOR"},
        {"text/plain": S.INERT_NOTICE.format(types="application/javascript")}]
    assert "widgets" not in nb.metadata


# ---- bounds of a whole sandbox: processes it starts, files it writes, output it prints ------------
# (each child holds its memory until every child has reported: all of them at once)
MEM_BOMB = """import os
def mul(a, b):
    kids = []
    release_r, release_w = os.pipe()
    for i in range(8):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            try:
                os.close(r)
                os.close(release_w)
                x = bytearray(200 * 2 ** 20)
                x[::4096] = b'1' * len(x[::4096])       # every page touched
                os.write(w, b'1')
                os.read(release_r, 1)                    # until the parent lets go
            finally:
                os._exit(0)
        os.close(w)
        kids.append((pid, r))
    reported = [len(os.read(r, 1)) for pid, r in kids]     # each has its 200 MiB, or was stopped
    os.close(release_w)
    # a child stopped after it reported did not hold to the end: count those that exited themselves
    status = [os.waitpid(pid, 0)[1] for pid, r in kids]
    held = sum(rep and st == 0 for rep, st in zip(reported, status))
    print(f'{held} of 8 children held 200 MiB each at once')
    return a * b if held == 8 else None"""
PID_BOMB = """import os, time
def neg(a):
    n = 0
    try:
        for i in range(300):
            if os.fork() == 0:
                time.sleep(20)
                os._exit(0)
            n += 1
    except OSError as exc:
        print('fork refused:', exc)
    print(f'started {n} processes')
    return -a if n == 300 else None"""
# 30,000 small files in the working folder and in /tmp
FILES = """import os
os.makedirs('/tmp/t', exist_ok=True)
for i in range(30000):
    open(f'f{i}.txt', 'w').write('x')
    open(f'/tmp/t/f{i}.txt', 'w').write('x')
print('written:', len(os.listdir('.')), len(os.listdir('/tmp/t')))
def add(a, b):
    return a + b"""
# 200 MiB printed
PRINTER = """import sys
for i in range(200):
    sys.stdout.write('x' * 2 ** 20)
def add(a, b):
    return a + b"""
# a 100 MiB file, 6 x 60 MiB in /tmp, a file in /dev
DISK = """import errno, os
def try_write(path, mib):
    try:
        with open(path, 'wb') as fh:
            for i in range(mib):
                fh.write(b'x' * 2 ** 20)
        return 'ok'
    except OSError as exc:
        size = os.path.getsize(path) if os.path.exists(path) else 0
        return f'{errno.errorcode[exc.errno]} at {size // 2 ** 20} MiB'
print('big file:', try_write('big.bin', 100))
print('tmp:', [try_write(f'/tmp/p{i}.bin', 60) for i in range(6)])
print('dev:', try_write('/dev/x.bin', 1))
def add(a, b):
    return a + b"""
BOUNDED = {"good": {}, "mem_bomb": {"partB_answer": MEM_BOMB}, "pid_bomb": {"partC_answer": PID_BOMB},
           "files": {"partA_answer": FILES}, "printer": {"partA_answer": PRINTER},
           "no_sigint": HOSTILE["no_sigint"], "disk": {"partA_answer": DISK}}
BOUND_LIMITS = ["--Execute.timeout=30", "--SandboxedKernelManager.memory_limit_gib=1"]


def _cgroup_parents():
    S = _sandbox_module()
    try:
        return S._cgroup_parents()[1]
    except S.CgroupUnavailable:
        return None


def _sandbox_groups(parents):
    return {(p, n) for p in (parents or {}).values() for n in os.listdir(p) if n.startswith("gpclab-sandbox-")}


def _grade_bounded(tmp_path_factory, name, students, limits):
    """Grade `students` (of BOUNDED) with -j 2, watching the control groups made meanwhile."""
    import threading
    import time

    course = str(tmp_path_factory.mktemp(name) / "course")
    env = T.make_course(course)
    for student in students:
        T.submit(course, student, BOUNDED[student])
    parents = _cgroup_parents()
    before = _sandbox_groups(parents)
    seen, done = set(), threading.Event()

    def watch():
        while not done.is_set():
            seen.update(_sandbox_groups(parents) - before)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    t0 = time.perf_counter()
    try:
        out = _grade(course, env, "toy", "-j", "2", "--no-progress", "--", *limits)
    finally:
        done.set()
        watcher.join()
    wall = time.perf_counter() - t0
    assert out.returncode == 0, out.stdout + out.stderr
    t0 = time.perf_counter()
    fb = T.nbgrader(course, env, "generate_feedback", "toy")
    return dict(course=course, env=env, out=out.stdout, wall=wall, feedback_s=time.perf_counter() - t0,
                feedback=fb.stdout + fb.stderr, seen=seen, left=_sandbox_groups(parents) - before, parents=parents)


@pytest.fixture(scope="module")
def bounded(tmp_path_factory):
    if _cgroup_parents() is None:
        pytest.skip("no control group can be made here (cgroup v1, or a delegated v2)")
    return _grade_bounded(tmp_path_factory, "bounded", list(BOUNDED), BOUND_LIMITS)


@pytest.fixture(scope="module")
def fallback(tmp_path_factory):
    """The same without control groups (as where the grader cannot make one)."""
    return _grade_bounded(tmp_path_factory, "fallback", ["good", "pid_bomb", "files", "disk"],
                          BOUND_LIMITS + ["--SandboxedKernelManager.use_cgroup=False"])


def _stdout(course, student, grade_id):
    return "".join(o.get("text", "") for o in json.loads(T.outputs(course, student, grade_id)))


def test_memory_bomb_stopped_at_the_sandbox_limit(bounded):
    """Eight forked children of 200 MiB each (every one under the per-process limit of 1 GiB):
    together they meet the sandbox's 1 GiB, some are stopped, and the part scores 0."""
    course = bounded["course"]
    assert "sandbox bounds: cgroup" in bounded["out"], bounded["out"]
    assert T.grades(course, "mem_bomb") == {"partA_works": 1, "partB_works": 0, "partC_works": 1}
    text = T.outputs(course, "mem_bomb", "partB_works")
    held = [int(n) for n in re.findall(r"(\d+) of 8 children held 200 MiB each at once", text)]
    # either some children were stopped (at most 1 GiB / 200 MiB of them lived to the end, counted
    # by exit status: a child stopped after it reported its 200 MiB does not count) or the kernel was
    assert (held and max(held) <= 5) or "MemoryLimitExceeded" in text, text


@pytest.mark.parametrize("run", ["bounded", "fallback"])
def test_process_bomb_stopped(run, request):
    """300 forks: refused once the sandbox runs 64 tasks (cgroup pids.max; without a cgroup
    RLIMIT_NPROC in the sandbox's own user namespace, as uid 65534 when the grader is root)."""
    r = request.getfixturevalue(run)
    course = r["course"]
    assert T.grades(course, "pid_bomb") == {"partA_works": 1, "partB_works": 1, "partC_works": 0}
    text = _stdout(course, "pid_bomb", "partC_works")
    started = int(re.search(r"started (\d+) processes", text).group(1))
    assert "fork refused" in text and 0 < started < 64, text
    assert T.grades(course, "good") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
    if run == "fallback":
        expected = "RLIMIT_NPROC 64 in the sandbox" + (" as uid 65534" if os.geteuid() == 0 else "")
        assert expected in r["out"], r["out"]


@pytest.mark.parametrize("run", ["bounded", "fallback"])
def test_files_written_stay_in_the_sandbox(run, request):
    """30,000 files written in the working folder and in /tmp reach neither autograded/ nor the
    feedback, and grading and feedback stay quick."""
    r = request.getfixturevalue(run)
    course = r["course"]
    assert "written: 30001 30000" in _stdout(course, "files", "partA_answer")     # they were written
    assert T.grades(course, "files") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
    assert os.listdir(os.path.join(course, "autograded", "files", "toy")) == ["toy.ipynb"]
    assert os.listdir(os.path.join(course, "feedback", "files", "toy")) == ["toy.html"]
    times = {m.group(1): float(m.group(2)) for m in re.finditer(r"stopped +toy (\w+) \((\d+) s\)", r["out"])}
    assert "files" not in times
    assert r["feedback_s"] < 60, r["feedback_s"]


@pytest.mark.parametrize("run", ["bounded", "fallback"])
def test_disk_is_bounded(run, request):
    """A file stops at 64 MiB (RLIMIT_FSIZE), /tmp at 256 MiB (a tmpfs), /dev is not writable."""
    course = request.getfixturevalue(run)["course"]
    text = _stdout(course, "disk", "partA_answer")
    assert "big file: EFBIG at 64 MiB" in text, text
    assert "tmp: ['ok', 'ok', 'ok', 'ok', 'ENOSPC at 16 MiB', 'ENOSPC at 0 MiB']" in text, text
    assert re.search(r"dev: (EROFS|EACCES)", text), text
    assert T.grades(course, "disk") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}


def test_printed_output_is_capped(bounded):
    """200 MiB printed: the cell keeps 1 MiB and says how much was dropped; the autograded notebook
    and the feedback stay small, and the parts score as they should."""
    course = bounded["course"]
    assert T.grades(course, "printer") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
    path = os.path.join(course, "autograded", "printer", "toy", "toy.ipynb")
    assert os.path.getsize(path) < 1.2 * 2 ** 20, os.path.getsize(path)
    assert os.path.getsize(os.path.join(course, "feedback", "printer", "toy", "toy.html")) < 2 * 2 ** 20
    cell = json.loads(T.outputs(course, "printer", "partA_answer"))
    kept = sum(len(o.get("text", "")) for o in cell if o["output_type"] == "stream")
    assert kept == 2 ** 20, kept
    notice = cell[-1]["data"]["text/plain"]
    assert notice == ("[grading: 199.0 MiB more output of this cell dropped: a cell keeps at most 1 MiB of "
                      "output, the notebook 10 MiB]"), notice


def test_cgroups_removed_after_the_run(bounded):
    """Each sandbox had a control group of its own (seen while grading), and none is left, also
    for the kernel that ignored SIGINT and was killed."""
    assert len(bounded["seen"]) >= 2 and not bounded["left"], (bounded["seen"], bounded["left"])
    assert T.grades(bounded["course"], "no_sigint") == {"partA_works": 0, "partB_works": 1, "partC_works": 1}
    assert "ignored the interrupt" in T.outputs(bounded["course"], "no_sigint", "partA_works")


def test_output_cap_without_a_kernel():
    """A cell keeps `cell_output_mib` of output (here 1 KiB), the notebook `notebook_output_mib`
    (here 1.5 KiB); beyond, streams are cut and then dropped, with one notice that counts what was
    dropped; an error is always kept."""
    S = _sandbox_module()
    nb = T.source_notebook()
    ex = S.SandboxedExecute(cell_output_mib=1 / 1024, notebook_output_mib=1.5 / 1024)
    ex.nb = nb
    ex.reset_execution_trackers()
    ex.clear_before_next_output = False      # as at the start of a cell

    def msg(kind, **content):
        return {"msg_type": kind, "header": {"msg_type": kind}, "parent_header": {"msg_id": "m"}, "content": content}

    outs = []
    for _ in range(3):
        ex.output(outs, msg("stream", name="stdout", text="x" * 600), None, 1)
    assert [len(o.get("text", "")) for o in outs[:2]] == [600, 424]
    assert outs[2]["data"]["text/plain"] == ("[grading: 776 characters more output of this cell dropped: a cell keeps "
                                             "at most 0.000976562 MiB of output, the notebook 0.00146484 MiB]")
    ex.output(outs, msg("error", ename="AssertionError", evalue="y" * 10 ** 6, traceback=["t"] * 10), None, 1)
    assert len(outs) == 4 and outs[3]["ename"] == "AssertionError" and len(outs[3]["evalue"]) < 70 * 1024
    # the next cell has what the notebook has left: 1.5 KiB - 1 KiB (the error's message counts too)
    other = []
    ex.output(other, msg("display_data", data={"text/plain": "z" * 100}, metadata={}), None, 3)
    assert len(other) == 1 and "more output of this cell dropped" in other[0]["data"]["text/plain"]


# ---- hooks that change how cells run: each scores 0 where it acted, and is reported -------------------
def test_hooks_installed_while_a_test_runs_are_reported(toy):
    """A test during which student code installed a hook (a trace function, an exception handler and
    a callback that clears the error) scores 0 with "your code changed how cells run", and grade.py's
    summary lists the submission; correct work with magics, extensions and warnings filters has none."""
    for student, gids in TAMPERED.items():
        assert re.search(rf"tampered toy {student} ", toy["out"]), toy["out"]
        for gid in gids:
            out = T.outputs(toy["course"], student, gid)
            assert "ChangedHowCellsRun" in out and "your code changed how cells run" in out, out
    assert f"changed how cells run {len(TAMPERED)}," in toy["out"], toy["out"]
    for student in ("good", "legit_magics", "hook_ast", "hook_callback"):
        assert not re.search(rf"tampered toy {student} ", toy["out"]), toy["out"]
        for gid in ("partA_works", "partB_works", "partC_works"):
            assert "ChangedHowCellsRun" not in T.outputs(toy["course"], student, gid), (student, gid)


# ---- sealed feedback -----------------------------------------------------------------------------------
def _normal(text):
    return re.sub(r"[^0-9a-z]", "", text.lower())


def _secret_windows(course, student, n=8):
    """Every n-character run of the hidden tests' code (letters and digits only, string literals
    left out: the instructor's messages are shown on purpose), less the runs that also occur in
    what the student sees anyway (the released notebook) or wrote (the submission)."""
    S = _sandbox_module()
    known = []
    for path in (os.path.join(course, "release", T.A, f"{T.A}.ipynb"),
                 os.path.join(course, "submitted", student, T.A, f"{T.A}.ipynb")):
        known.append(_normal("\n".join(c.source for c in nbformat.read(path, as_version=4).cells)))
    known = "\n".join(known)
    out = set()
    for test in T.HIDDEN.values():
        for line in test.splitlines():
            for segment in S._code_segments(line):
                norm = _normal(segment)
                out |= {norm[i:i + n] for i in range(len(norm) - n + 1) if norm[i:i + n] not in known}
    return out


def _html_text(path):
    import html

    with open(path) as fh:
        page = fh.read()
    page = re.sub(r"(?s)<(style|script)\b.*?</\1>", " ", page)
    return html.unescape(re.sub(r"(?s)<[^>]+>", " ", page))


def _student_notebook(course, student):
    """The autograded notebook as the feedback's preprocessor leaves it for the student."""
    S = _sandbox_module()
    nb = nbformat.read(os.path.join(course, "autograded", student, T.A, f"{T.A}.ipynb"), as_version=4)
    nb, _ = S.SealedFeedback().preprocess(nb, {})
    return nb


def _decoded_leaks(text):
    """What the hostile code's LEAK lines say, decoded."""
    import base64
    import codecs
    import zlib

    out = []
    for how, payload in re.findall(r"LEAK:(hex|rot13|zlib):(.*)", text):
        try:
            out.append(bytes.fromhex(payload).decode() if how == "hex" else codecs.decode(payload, "rot13")
                       if how == "rot13" else zlib.decompress(base64.b64decode(payload)).decode())
        except ValueError:
            pass
    return "\n".join(out)


def test_feedback_is_the_html_only(toy):
    """generate_feedback copies nothing but the HTML (and submitted/'s timestamp.txt and
    submission_secret.txt, not the kernel's folder's): files the kernel wrote (stolen.txt, env.json,
    a timestamp.txt) stay in its sandbox (not even the autograded folder has them)."""
    for student in HOSTILE:
        folder = os.path.join(toy["course"], "feedback", student, T.A)
        # (these submissions come without nbgrader's timestamp.txt: a course's exchange round trip,
        # tests/test_course.py, has it)
        assert os.listdir(folder) == [f"{T.A}.html"], student
    # the files the kernel wrote stayed in its sandbox's working folder (a tmpfs): not even the
    # instructor's autograded folder has them
    assert not os.path.exists(os.path.join(toy["course"], "autograded", "seal_frame_hex", T.A, "stolen.txt"))
    stamp = os.path.join(toy["course"], "autograded", "seal_tampered_stamp", T.A, "timestamp.txt")
    if os.path.exists(stamp):
        with open(stamp) as fh:
            assert "LEAK" not in fh.read()


@pytest.mark.parametrize("student", sorted(LEAKERS))
def test_feedback_holds_nothing_of_the_hidden_tests(toy, student):
    """Code that read the calling hidden test (IPython's history, the frame's code and constants,
    `inspect`, `linecache`) and printed it in 12-character chunks, hex, rot13 or zlib, in the test,
    in a later cell, in a file or as its error's message: neither the feedback's HTML nor the
    notebook the student is shown holds an 8-character run of hidden test code, nor any of the
    LEAK lines; the student still sees each part passed or failed."""
    course = toy["course"]
    windows = _secret_windows(course, student)
    assert len(windows) > 100
    html_path = os.path.join(course, "feedback", student, T.A, f"{T.A}.html")
    nb = _student_notebook(course, student)
    seen = {"html": _html_text(html_path), "notebook": json.dumps(nb)}
    for where, text in seen.items():
        norm = _normal(text)
        found = sorted(w for w in windows if w in norm)
        assert not found, (student, where, found[:5])
        # (the student's own code, shown in the HTML, has 'LEAK:hex:' + ...; a printed line has its payload)
        assert not re.search(r"LEAK:\w+:[^'\"\s\\]", text), (student, where)
        assert "[grader] partA_works: passed" in text, (student, where)
    # the route worked: the instructor's autograded notebook holds what the code decoded (except by
    # history, which holds no test cell, and the one that only wrote a file: what the kernel writes
    # stays in its sandbox)
    graded = nbformat.read(os.path.join(course, "autograded", student, T.A, f"{T.A}.ipynb"), as_version=4)
    texts = [o.get("text", "") + "\n" + o.get("evalue", "") for c in graded.cells for o in c.get("outputs", [])]
    stamp = os.path.join(course, "autograded", student, T.A, "timestamp.txt")
    if os.path.exists(stamp):
        with open(stamp) as fh:
            texts.append(fh.read())
    decoded = _normal(_decoded_leaks("\n".join(texts)))
    hidden_here = any(w in decoded for w in windows)
    assert hidden_here == (student not in ("seal_history_chunks", "seal_tampered_stamp")), student
    # outputs of cells that ran after the first hidden test are replaced by a notice
    later = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") in ("partB_answer", "partC_answer")]
    assert student not in ("seal_history_chunks", "seal_frame_hex") or any(S_NOTICE in "".join(o.get("text", "") for o in c.get("outputs", [])) for c in later), student


S_NOTICE = "this cell ran after a hidden test"


def test_feedback_shows_verdicts_and_the_instructors_messages(toy):
    course = toy["course"]
    text = _html_text(os.path.join(course, "feedback", "cheat_eq", T.A, f"{T.A}.html"))
    assert "[grader] partA_works: failed: AssertionError: add misses a hidden case (0 of 1 point)" in text, text[-3000:]
    assert "[grader] partB_works: passed (1 of 1 point)" in text
    # an error message not made of the instructor's texts: its type only
    text = _html_text(os.path.join(course, "feedback", "seal_inspect_zlib", T.A, f"{T.A}.html"))
    assert ("[grader] partB_works: failed: ValueError raised in your code; run the visible tests in your "
            "notebook to see the message (0 of 1 point)") in text
    text = _html_text(os.path.join(course, "feedback", "loop", T.A, f"{T.A}.html"))
    assert "[grader] partA_works: stopped after 5 s (the cell's limit) (0 of 1 point)" in text
    text = _html_text(os.path.join(course, "feedback", "hook_exc_in_test", T.A, f"{T.A}.html"))
    assert "[grader] partA_works: failed: your code changed how cells run (" in text


def test_messages_are_made_of_the_instructors_texts():
    """Without a kernel: a message passes when it is made of the notebook's string literals and
    f-string parts, with at most a few short numbers (rounded) in the placeholders."""
    S = _sandbox_module()
    f = S.MessageFilter(['assert ok, f"for n = {n} got {np.round(got[:3], 5)}..., expected {ref}: check W K"',
                         'assert ok, "add misses a hidden case"',
                         '_PARTS = {"add": "A"}\nmsg = f"your {name} (Part {part}) is not finished"'])
    assert f.compose("add misses a hidden case") == "add misses a hidden case"
    assert f.compose("for n = 8 got [0.123456 -1.5 3.]..., expected 2.5: check W K") == \
        "for n = 8 got [0.1235 -1.5 3]..., expected 2.5: check W K"
    assert f.compose("your add (Part A) is not finished") == "your add (Part A) is not finished"
    assert f.compose("your 'add' (Part A) is not finished") == "your 'add' (Part A) is not finished"
    assert f.compose("your add (Part A) is not finishedSingular matrix") == "your add (Part A) is not finishedSingular matrix"
    # a placeholder that carries text, too many numbers, or code
    assert f.compose("your assert type(add(40 (Part A) is not finished") is None
    assert f.compose("assert type(add(40, 2)) in (int, float)") is None
    many = f.compose("for n = 1 got [1 2 3 4 5 6 7 8]..., expected 9: check W K")
    assert many == "for n = 1 got [1 2 3 4 5 … … …]..., expected …: check W K"


def test_marker_is_the_last_statement_and_keeps_the_cells_result():
    """Without a kernel: the marker runs after everything else, a last expression stays the cell's
    result (partial credit), and a marker printed in two writes (split across outputs) is found."""
    import ast

    from nbformat.v4 import new_code_cell, new_output

    S = _sandbox_module()
    source = '"Part A"\nassert 1 + 1 == 2\nscore = 0.5\nscore'
    marked = S.with_marker(source, "M123")
    tree = ast.parse(marked)
    assert isinstance(tree.body[-1], ast.Expr) and marked.startswith(source[:-len("score")])
    printed = []
    value = eval(compile(ast.Expression(tree.body[-1].value), "<cell>", "eval"),
                 {"score": 0.5, "print": printed.append})
    assert value == 0.5 and printed == ["M123"]
    assert S.with_marker("for i in range(2):\n    assert i < 2", "M1").rstrip().endswith("print('M1')")
    cell = new_code_cell("x", outputs=[new_output("stream", name="stdout", text="ok\nM9"),
                                       new_output("stream", name="stdout", text="\n")])
    assert S.take_marker(cell, "M9") and [o.text for o in cell.outputs] == ["ok\n"]
    cell = new_code_cell("x", outputs=[new_output("stream", name="stdout", text="ok\n")])
    assert not S.take_marker(cell, "M9")


# ---- symbolic links handed in ---------------------------------------------------------------------
LINK_PROBE = '''import os
def show(folder, depth=0):
    for name in sorted(os.listdir(folder)):
        path = os.path.join(folder, name)
        print("ENTRY", path)
        if os.path.isdir(path) and depth < 3:
            show(path, depth + 1)
        elif not name.endswith(".ipynb"):
            try:
                with open(path, "rb") as fh:
                    print("CONTENT", path, fh.read(4000))
            except OSError as exc:
                print("UNREADABLE", path, exc)
show(".")
def add(a, b):
    return a + b'''


def test_symlinks_handed_in_reach_neither_autograded_nor_the_sandbox(tmp_path):
    """A submission holding symbolic links to the course's source notebook (hidden tests and
    solutions), to gradebook.db and to an instructor's folder, and a named pipe: autograde copies
    none of them (nbgrader's copy would copy the targets), the kernel, listing its folder and
    printing every file in a cell before the first hidden test, sees only the notebook, the
    feedback holds nothing of them, the correct parts keep full marks and grade.py names them."""
    course = str(tmp_path / "course")
    env = T.make_course(course)
    private = tmp_path / "instructor_private"
    private.mkdir()
    (private / "secret.txt").write_text("PRIVATE-MARKER-4711")
    T.submit(course, "mallory", {"partA_answer": LINK_PROBE})
    sub = os.path.join(course, "submitted", "mallory", T.A)
    T.nbgrader(course, env, "db", "student", "add", "mallory")
    os.symlink(os.path.join(course, "source", T.A, f"{T.A}.ipynb"), os.path.join(sub, "notes.txt"))
    os.symlink(os.path.join(course, "gradebook.db"), os.path.join(sub, "gb.txt"))
    os.symlink(str(private), os.path.join(sub, "data"))
    os.mkfifo(os.path.join(sub, "pipe"))
    out = _grade(course, env, "toy", "-j", "1", "--", *LIMITS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "symlinks refused: toy mallory" in out.stdout and "notes.txt" in out.stdout, out.stdout
    assert T.grades(course, "mallory") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}
    printed = T.outputs(course, "mallory", "partA_answer")
    entries = re.findall(r"ENTRY (\S+?)\\n", printed)
    assert entries == ["./toy.ipynb"], printed          # the kernel's folder: the notebook only
    autograded = os.path.join(course, "autograded", "mallory", T.A)
    assert sorted(os.listdir(autograded)) == [f"{T.A}.ipynb"]
    fb = T.nbgrader(course, env, "generate_feedback", "toy")
    html = _html_text(os.path.join(course, "feedback", "mallory", T.A, f"{T.A}.html"))
    assert "ENTRY ./toy.ipynb" in html, fb.stdout + fb.stderr        # the probe's output is there
    with open(os.path.join(autograded, f"{T.A}.ipynb")) as fh:
        nb = fh.read()
    for text in (printed, html, nb):
        for secret in ("PRIVATE-MARKER-4711", "SQLite format", "BEGIN SOLUTION"):
            assert secret not in text, secret
    for text in (printed, html):
        assert "BEGIN HIDDEN TESTS" not in text and "misses a hidden case" not in text


# an answer cell that rewrites the kernel's messages (jupyter_client's Session.send): a test's error
# becomes a line of stdout holding the grader's marker (read from the cell's code) and the reply's
# status "ok"; every answer is wrong
SESSION_SEND = ("import re\nimport jupyter_client.session as _js\n_send0 = _js.Session.send\n"
                "def _send(self, stream, msg_or_type, content=None, parent=None, *a, **k):\n"
                "    kind = msg_or_type if isinstance(msg_or_type, str) else msg_or_type.get('header', {}).get('msg_type')\n"
                "    code = (get_ipython().kernel.get_parent() or {}).get('content', {}).get('code', '')\n"
                "    marks = re.findall(r\"grader-[0-9a-f]+\", code or '')\n"
                "    if kind == 'error' and marks:\n"
                "        return _send0(self, stream, 'stream', {'name': 'stdout', 'text': marks[-1] + '\\n'}, parent, *a, **k)\n"
                "    if kind == 'execute_reply' and isinstance(content, dict) and content.get('status') == 'error':\n"
                "        content = {'status': 'ok', 'execution_count': content.get('execution_count'),\n"
                "                   'user_expressions': {}, 'payload': []}\n"
                "    return _send0(self, stream, msg_or_type, content, parent, *a, **k)\n"
                "_js.Session.send = _send\n"
                "def add(a, b):\n    return 0")


def test_rewritten_kernel_messages_do_not_pass(tmp_path):
    """Session.send replaced in an answer cell (every answer wrong): without the guard of the
    kernel's session, its display publisher and output streams this scored 3 of 3; now 0 on every
    part. A correct submission with magics beside it keeps full marks."""
    course = str(tmp_path / "course")
    env = T.make_course(course)
    T.submit(course, "mallory", {"partA_answer": SESSION_SEND, "partB_answer": WRONG_B, "partC_answer": WRONG_C})
    T.submit(course, "legit", HOSTILE["legit_magics"])
    out = _grade(course, env, "toy", "-j", "1", "--", *LIMITS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert T.grades(course, "mallory") == {"partA_works": 0, "partB_works": 0, "partC_works": 0}, out.stdout
    assert T.grades(course, "legit") == {"partA_works": 1, "partB_works": 1, "partC_works": 1}, out.stdout
