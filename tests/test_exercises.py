"""The nbgrader course grades fairly: a test of the tests.

Every assignment is released (one `nbgrader generate_assignment` for all) and autograded (one
`nbgrader autograde` for all) with these students:
- "solved": the instructor's source notebook;
- "unsolved": the untouched release;
- "correct_<name>": the release completed with a correct solution written differently
  (tests/exercise_corpus/<assignment>.py, CORRECT);
- "mistake_<name>": the instructor's solution with one typical mistake in one answer cell, and
  sometimes a correct later part that calls the mistaken function (MISTAKES, which also names the
  test cells that must lose points).
Correct submissions must get full marks, and a mistake must cost points in exactly the test
cells named for it and nowhere else (so no cascades from one part into another).
"""
import ast
import glob
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
import warnings

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COURSE = os.path.join(ROOT, "exercises")
CORPUS = os.path.join(ROOT, "tests", "exercise_corpus")
ASSIGNMENTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(COURSE, "source", "*")))
MANUAL_ANSWER = "An answer typed by the student, to be graded by hand."


def _corpus(assignment):
    return runpy.run_path(os.path.join(CORPUS, f"{assignment}.py"))


def _nbgrader(course, *args):
    exe = os.path.join(os.path.dirname(sys.executable), "nbgrader")
    out = subprocess.run([exe, *args, "--force"], cwd=course, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout + out.stderr


def _strip_solution_markers(src):
    return "\n".join(line for line in src.split("\n")
                     if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def _submission(release_nb, source_nb, answers):
    """The release with every answer cell filled: from `answers` (by grade id) where given,
    else the instructor's solution; manual (Markdown) answers get a typed text."""
    nb = nbformat.read(release_nb, as_version=4)
    solutions = {c.metadata["nbgrader"]["grade_id"]: _strip_solution_markers(c.source)
                 for c in nbformat.read(source_nb, as_version=4).cells
                 if c.metadata.get("nbgrader", {}).get("solution")}
    unknown = set(answers) - set(solutions)
    assert not unknown, f"corpus names answer cells that {release_nb} does not have: {unknown}"
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if not meta.get("solution"):
            continue
        gid = meta["grade_id"]
        if cell.cell_type == "markdown":
            cell.source = MANUAL_ANSWER
        else:
            cell.source = answers.get(gid, solutions[gid]).strip("\n")
    return nb


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Release all assignments, hand in every corpus submission, autograde, and make the
    feedback of the unsolved and of one mistaken submission per assignment."""
    tmp = tmp_path_factory.mktemp("course")
    course = tmp / "exercises"
    shutil.copytree(COURSE, course, ignore=shutil.ignore_patterns(
        "release", "submitted", "autograded", "feedback", "gradebook.db", ".ipynb_checkpoints"))
    env_backup = dict(os.environ)
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        os.environ[var] = str(tmp / var.lower())
    logs = {}
    try:
        t0 = time.perf_counter()
        # autograde runs each kernel in a sandbox that reads numba's cache but cannot write it:
        # warm it first (as the README asks), or every submission compiles gpclab's functions anew
        warm = subprocess.run([sys.executable, "-c", "import gpclab; gpclab.compile_paths(['laplace', 'multiclass', 'ep'])"],
                              cwd=ROOT, capture_output=True, text=True)
        assert warm.returncode == 0, warm.stdout + warm.stderr
        logs["generate"] = _nbgrader(course, "generate_assignment", "*")
        for a in ASSIGNMENTS:
            corpus = _corpus(a)
            src = glob.glob(str(course / "source" / a / "*.ipynb"))
            assert len(src) == 1, src
            release = str(course / "release" / a / os.path.basename(src[0]))
            students = {"solved": None, "unsolved": None}
            students.update({f"correct_{k}": v for k, v in corpus["CORRECT"].items()})
            students.update({f"mistake_{k}": v[1] for k, v in corpus["MISTAKES"].items()})
            for student, answers in students.items():
                dest = course / "submitted" / student / a
                dest.mkdir(parents=True)
                target = str(dest / os.path.basename(src[0]))
                if student == "solved":
                    shutil.copy(src[0], target)
                elif student == "unsolved":
                    shutil.copy(release, target)
                else:
                    nbformat.write(_submission(release, src[0], answers), target)
        logs["autograde"] = _nbgrader(course, "autograde", "*")
        logs["feedback"] = _nbgrader(course, "generate_feedback", "*", "--student=unsolved")
        print(f"\nexercise course: release, {len(glob.glob(str(course / 'submitted' / '*' / '*')))} "
              f"submissions autograded, feedback in {time.perf_counter() - t0:.0f} s")
        yield course, logs
    finally:
        os.environ.clear()
        os.environ.update(env_backup)


def _grades(course, assignment, student):
    """{grade_id: (auto_score, max_score, needs_manual_grade)} from the gradebook."""
    from nbgrader.api import Gradebook

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
            for nb in glob.glob(str(course / "source" / assignment / "*.ipynb")):
                name = os.path.splitext(os.path.basename(nb))[0]
                for g in gb.find_submission_notebook(name, assignment, student).grades:
                    out[g.name] = (g.auto_score, g.max_score, g.needs_manual_grade)
    return out


def _graded_cells(assignment):
    """{grade_id: (points, autograded?)} of the source notebook, and the points each part
    heading announces ({part letter: points})."""
    cells, announced, sums, part = {}, {}, {}, None
    for path in glob.glob(os.path.join(COURSE, "source", assignment, "*.ipynb")):
        for c in nbformat.read(path, as_version=4).cells:
            meta = c.metadata.get("nbgrader", {})
            if c.cell_type == "markdown" and meta.get("locked"):
                m = re.search(r"^## Part ([A-Z])\b.*\((\d+) points", c.source, re.M)
                if m:
                    part = m.group(1)
                    announced[part] = int(m.group(2))
            if meta.get("grade"):
                cells[meta["grade_id"]] = (meta["points"], c.cell_type == "code")
                sums[part] = sums.get(part, 0) + meta["points"]
    return cells, announced, sums


def _students(assignment):
    corpus = _corpus(assignment)
    return ([("solved", set())]
            + [(f"correct_{k}", set()) for k in corpus["CORRECT"]]
            + [(f"mistake_{k}", set(v[0])) for k, v in corpus["MISTAKES"].items()])


def test_course_has_six_assignments():
    assert ASSIGNMENTS == [f"ex3_10_{i}" for i in range(1, 7)]


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_corpus_is_complete(assignment):
    """At least two correct solutions and three mistakes, each mistake naming existing test cells."""
    corpus = _corpus(assignment)
    cells, _, _ = _graded_cells(assignment)
    assert len(corpus["CORRECT"]) >= 2 and len(corpus["MISTAKES"]) >= 3
    for name, (loses, answers) in corpus["MISTAKES"].items():
        assert loses and set(loses) <= {g for g, (_, auto) in cells.items() if auto}, name
        parts = {g.split("_")[0] for g in loses}
        assert len(parts) == 1, f"mistake {name} loses points in parts {parts}"
        # the mistake sits in the part that loses points; other answers given are correct ones
        # (e.g. a later part that calls the mistaken function)
        assert parts <= {g.split("_")[0] for g in answers}, name


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_points_add_up(assignment, graded):
    """Each part's test cells carry the points its heading announces, and the gradebook's
    total is the sum of autograded and manually graded points."""
    course, _ = graded
    cells, announced, sums = _graded_cells(assignment)
    assert announced == sums
    manual = [g for g, (_, auto) in cells.items() if not auto]
    if assignment != "ex3_10_3":
        assert manual, "a manually graded derivation cell"
    from nbgrader.api import Gradebook

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
            a = gb.find_assignment(assignment)
            assert a.max_score == sum(p for p, _ in cells.values())
            assert a.max_code_score == sum(p for p, auto in cells.values() if auto)
            assert a.max_written_score == sum(p for p, auto in cells.values() if not auto)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_each_submission_loses_points_exactly_where_its_mistake_is(assignment, graded):
    course, _ = graded
    cells, _, _ = _graded_cells(assignment)
    report = []
    for student, loses in _students(assignment):
        grades = _grades(course, assignment, student)
        assert set(grades) == set(cells), (student, set(grades) ^ set(cells))
        lost = set()
        for gid, (score, max_score, manual) in grades.items():
            points, auto = cells[gid]
            assert max_score == points
            if not auto:
                assert manual and score is None, (student, gid, score, manual)  # waits for the grader
                continue
            assert score is not None and not manual, (student, gid, score)
            if score < max_score:
                lost.add(gid)
        report.append((student, sorted(lost)))
        assert lost == loses, (
            f"{assignment}, {student}: lost points in {sorted(lost)}, expected exactly {sorted(loses)}")


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_unsolved_release_scores_zero(assignment, graded):
    course, _ = graded
    cells, _, _ = _graded_cells(assignment)
    grades = _grades(course, assignment, "unsolved")
    for gid, (points, auto) in cells.items():
        score, max_score, _ = grades[gid]
        if auto:
            assert score == 0 and max_score == points, (gid, score)
        else:
            assert not score, (gid, score)      # the unchanged "YOUR ANSWER HERE" gets nothing


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_release_has_no_solutions_or_hidden_tests(graded, assignment):
    course, _ = graded
    for path in glob.glob(str(course / "release" / assignment / "*.ipynb")):
        text = open(path).read()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS",
                       "Rubric", "_grade_with", "_ref_"):
            assert marker not in text, (path, marker)
        assert "raise NotImplementedError()" in text


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solved_notebook_runs_clean(graded, assignment):
    """Every cell of the instructor's version runs without error when graded (demo cells and
    the 3.10.6 widget cell included)."""
    course, _ = graded
    for path in glob.glob(str(course / "autograded" / "solved" / assignment / "*.ipynb")):
        for c in nbformat.read(path, as_version=4).cells:
            errors = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
            assert not errors, (path, c.source[:80], errors[0].get("evalue"))


def test_failed_tests_explain_themselves(graded):
    """A failed test's message says what was expected and what came back."""
    course, _ = graded
    path = glob.glob(str(course / "autograded" / "mistake_set_1_first" / "ex3_10_4" / "*.ipynb"))[0]
    cell = [c for c in nbformat.read(path, as_version=4).cells
            if c.metadata.get("nbgrader", {}).get("grade_id") == "partB_equals_full"][0]
    err = [o for o in cell.outputs if o.output_type == "error"][0]
    assert err.ename == "AssertionError" and "differs from the full update" in err.evalue
    assert "order" in err.evalue


def test_feedback_hides_hidden_tests(graded):
    course, _ = graded
    pages = glob.glob(str(course / "feedback" / "unsolved" / "*" / "*.html"))
    assert len(pages) == len(ASSIGNMENTS)
    for page in pages:
        html = open(page).read()
        for hidden in ("HIDDEN TESTS", "_grade_with", "_ref_", "BEGIN SOLUTION"):
            assert hidden not in html, (page, hidden)
        assert "NotImplementedError" in html        # the failure itself is reported


def test_nbgrader_runs_without_warnings(graded):
    """No "root is not absolute" warnings; hidden tests restored without checksum warnings."""
    _, logs = graded
    for step, log in logs.items():
        assert "is not absolute" not in log, step
        assert "Attribute 'checksum'" not in log, step


def test_installed_package_ships_no_solutions(tmp_path):
    """What `pip install` builds holds gpclab.py and no exercise sources or corpus: the wheel is
    the one module (py-modules), and the sdist is built here and listed."""
    import tarfile
    tomllib = pytest.importorskip("tomllib")     # Python 3.11+

    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        tool = tomllib.load(fh)["tool"]["setuptools"]
    assert tool.get("py-modules") == ["gpclab"] and "packages" not in tool
    for name in ("gpclab.py", "README.md", "pyproject.toml", "MANIFEST.in"):
        shutil.copy(os.path.join(ROOT, name), tmp_path / name)
    for folder in ("exercises", "tests"):
        shutil.copytree(os.path.join(ROOT, folder), tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__", "release", "submitted", "autograded",
                                                      "feedback", "gradebook.db"))
    out = subprocess.run([sys.executable, "-c", "from setuptools import build_meta as b; print(b.build_sdist('dist'))"],
                         cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    with tarfile.open(tmp_path / "dist" / out.stdout.strip().splitlines()[-1]) as tar:
        names = tar.getnames()
    assert any(n.endswith("/gpclab.py") for n in names)
    assert not [n for n in names if "exercises/source" in n or "exercise_corpus" in n], names


def _error(course, assignment, student, grade_id):
    path = glob.glob(str(course / "autograded" / student / assignment / "*.ipynb"))[0]
    cell = [c for c in nbformat.read(path, as_version=4).cells
            if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id][0]
    errors = [o for o in cell.outputs if o.output_type == "error"]
    assert errors, (student, grade_id, "passed")
    return errors[0].ename + ": " + errors[0].evalue


@pytest.mark.parametrize("assignment, student, grade_id, says, not_says", [
    ("ex3_10_1", "mistake_library_evidence", "partC_two_cases", "exact_log_evidence_probit", "np.float64"),
    ("ex3_10_1", "mistake_library_evidence_imported", "partC_more_cases", "exact_log_evidence_probit", "np.float64"),
    ("ex3_10_2", "mistake_case_major_order", "partB_class_major", "class-major", "returned shape"),
    ("ex3_10_3", "mistake_no_cross_terms", "partC_z_covariance", "cross term", "order of T"),
    ("ex3_10_4", "mistake_signed_gap", "partC_gap", "signed difference", "np.float64"),
    ("ex3_10_6", "mistake_map_predictions", "partB_predictions", "MAP predictions", "accurately"),
    ("ex3_10_6", "mistake_coarse_quadrature", "partB_predictions", "1e-4", "MAP"),
    ("ex3_10_2", "mistake_signed_residual", "partC_null_residual", "ABSOLUTE", "class-major"),
    ("ex3_10_3", "mistake_cholesky_sampling", "partA_average", "your averaged_softmax (Part A) raised LinAlgError",
     "np.float64"),
    ("ex3_10_3", "mistake_cholesky_sampling", "partA_average", "method='eigh'", "Part B"),
    ("ex3_10_5", "mistake_tau_and_nu_swapped", "partA_posterior", "Part A, posterior: Sigma", "np.float64"),
    ("ex3_10_5", "mistake_tau_and_nu_swapped", "partA_posterior", "expected [", "although Sigma agrees"),
])
def test_messages_name_the_mistake(graded, assignment, student, grade_id, says, not_says):
    """A failed test's message names what went wrong, and not a mistake the student did not make."""
    course, _ = graded
    msg = _error(course, assignment, student, grade_id)
    assert says in msg and not_says not in msg, msg


def test_messages_print_plain_numbers(graded):
    """No failed test anywhere shows a number as np.float64(...)."""
    course, _ = graded
    for path in glob.glob(str(course / "autograded" / "*" / "*" / "*.ipynb")):
        for c in nbformat.read(path, as_version=4).cells:
            for o in c.get("outputs", []):
                if o.get("output_type") == "error":
                    assert "np.float64(" not in o.get("evalue", ""), (path, o["evalue"])


def _functions(tree):
    return {n.name: [a.arg for a in n.args.args] for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_swapped_in_references_have_the_documented_signature(assignment):
    """Every reference that grading swaps in for a student's function (_grade_with) takes the same
    parameters as the function the notebook asks for, so a call with keyword arguments works."""
    path = glob.glob(os.path.join(COURSE, "source", assignment, "*.ipynb"))[0]
    cells = nbformat.read(path, as_version=4).cells
    asked = {}
    for c in cells:
        if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("solution"):
            asked.update(_functions(ast.parse(c.source)))
    swaps = 0
    for c in cells:
        if c.cell_type != "code" or "_grade_with(" not in c.source:
            continue
        tree = ast.parse(c.source)
        defined = _functions(tree)
        for call in ast.walk(tree):
            if isinstance(call, ast.Call) and getattr(call.func, "id", None) == "_grade_with":
                for kw in call.keywords:
                    assert isinstance(kw.value, ast.Name), (
                        f"{kw.arg} is swapped for an expression (a lambda?), not a function with its parameters")
                    assert defined.get(kw.value.id) == asked[kw.arg], (kw.arg, defined.get(kw.value.id), asked[kw.arg])
                    swaps += 1
    if assignment != "ex3_10_1":
        assert swaps, "later parts are graded with reference versions of earlier parts"


@pytest.mark.parametrize("assignment, mistake, part", [
    ("ex3_10_2", "case_major_order", "B"),
    ("ex3_10_4", "K_W_instead_of_W_K", "A"),
    ("ex3_10_5", "tau_and_nu_swapped", "A"),
    ("ex3_10_4", "part_a_unfinished", "A"),
    ("ex3_10_5", "posterior_unfinished", "A"),
])
def test_students_own_run_points_at_the_earlier_part(graded, assignment, mistake, part):
    """Run as a student runs it (visible tests only, no reference swapped in), a mistake in an
    earlier part also fails later parts whose tests call the mistaken function: each such failure
    says to fix that earlier part first."""
    from nbclient import NotebookClient

    course, _ = graded
    release = glob.glob(str(course / "release" / assignment / "*.ipynb"))[0]
    source = glob.glob(os.path.join(COURSE, "source", assignment, "*.ipynb"))[0]
    nb = _submission(release, source, _corpus(assignment)["MISTAKES"][mistake][1])
    NotebookClient(nb, timeout=600, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(course / "release" / assignment)}}).execute()
    failed = {}
    for c in nb.cells:
        gid = c.metadata.get("nbgrader", {}).get("grade_id", "")
        errors = [o for o in c.get("outputs", []) if o.get("output_type") == "error"]
        if c.metadata.get("nbgrader", {}).get("grade") and errors:
            failed[gid] = errors[0].get("evalue", "")
    own = {g for g in failed if g.startswith(f"part{part}_")}
    later = {g: m for g, m in failed.items() if g not in own}
    assert own, f"{mistake} passes its own part's visible tests"
    if "unfinished" in mistake:
        assert later, f"{mistake}: no later part calls the unfinished function in a student's own run"
    for gid, msg in later.items():
        assert f"Part {part}" in msg and "first" in msg, (gid, msg)
        if "unfinished" in mistake:
            assert "not finished (NotImplementedError)" in msg, (gid, msg)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_released_test_cells_print_nothing(graded, assignment):
    """A released test cell ends in a statement, not an expression: a cell whose hidden tests were
    removed and that ends in its title string would print it, and `nbgrader validate` warns "cannot
    be converted to a float" for every such cell."""
    course, _ = graded
    for path in glob.glob(str(course / "release" / assignment / "*.ipynb")):
        for c in nbformat.read(path, as_version=4).cells:
            if c.cell_type == "code" and c.metadata.get("nbgrader", {}).get("grade"):
                body = ast.parse(c.source).body
                assert not body or not isinstance(body[-1], ast.Expr), (
                    c.metadata["nbgrader"]["grade_id"], c.source[:120])
