"""The nbgrader course runs end to end: release, then autograde a solved and an unsolved copy."""
import glob
import os
import shutil
import subprocess
import sys

import nbformat
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COURSE = os.path.join(ROOT, "exercises")
ASSIGNMENTS = sorted(os.path.basename(p) for p in glob.glob(os.path.join(COURSE, "source", "*")))


def _nbgrader(course, *args):
    exe = os.path.join(os.path.dirname(sys.executable), "nbgrader")
    out = subprocess.run([exe, *args, "--force"], cwd=course, capture_output=True, text=True)
    assert out.returncode == 0, out.stdout + out.stderr
    return out


@pytest.fixture(scope="module")
def graded(tmp_path_factory):
    """Release every assignment and autograde two students: 'solved' hands in the
    instructor's version, 'unsolved' the untouched release."""
    tmp = tmp_path_factory.mktemp("course")
    course = tmp / "exercises"
    shutil.copytree(COURSE, course, ignore=shutil.ignore_patterns(
        "release", "submitted", "autograded", "feedback", "gradebook.db", ".ipynb_checkpoints"))
    env_backup = dict(os.environ)
    os.environ["PATH"] = os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"]
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        os.environ[var] = str(tmp / var.lower())
    try:
        for a in ASSIGNMENTS:
            _nbgrader(course, "generate_assignment", a)
            for student, src in (("solved", "source"), ("unsolved", "release")):
                dest = course / "submitted" / student / a
                dest.mkdir(parents=True)
                for nb in glob.glob(str(course / src / a / "*.ipynb")):
                    shutil.copy(nb, dest)
            _nbgrader(course, "autograde", a)
        yield course
    finally:
        os.environ.clear()
        os.environ.update(env_backup)


def _grades(course, assignment, student):
    import warnings

    from nbgrader.api import Gradebook

    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
            for nb in glob.glob(str(course / "source" / assignment / "*.ipynb")):
                name = os.path.splitext(os.path.basename(nb))[0]
                for g in gb.find_submission_notebook(name, assignment, student).grades:
                    out[(name, g.name)] = (g.auto_score, g.max_score, g.needs_manual_grade)
    return out


def test_course_has_assignments():
    assert {"ex3_10_1", "ex3_10_2", "ex3_10_3", "ex3_10_4", "ex3_10_5"} <= set(ASSIGNMENTS)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_release_has_no_solutions_or_hidden_tests(graded, assignment):
    for path in glob.glob(str(graded / "release" / assignment / "*.ipynb")):
        text = open(path).read()
        for marker in ("BEGIN SOLUTION", "END SOLUTION", "BEGIN HIDDEN TESTS", "END HIDDEN TESTS"):
            assert marker not in text, (path, marker)
        assert "raise NotImplementedError()" in text


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solved_copy_gets_full_marks(graded, assignment):
    grades = _grades(graded, assignment, "solved")
    assert grades
    for cell, (score, max_score, manual) in grades.items():
        if not manual:
            assert score == max_score, (cell, score, max_score)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_unsolved_copy_gets_zero(graded, assignment):
    grades = _grades(graded, assignment, "unsolved")
    assert grades
    for cell, (score, max_score, manual) in grades.items():
        if not manual:
            assert max_score > 0 and score == 0, (cell, score, max_score)


@pytest.mark.parametrize("assignment", ASSIGNMENTS)
def test_solutions_run_clean_in_the_source(assignment):
    """The instructor's version executes without error (what students are graded against)."""
    from nbclient import NotebookClient

    for path in glob.glob(os.path.join(COURSE, "source", assignment, "*.ipynb")):
        nb = nbformat.read(path, as_version=4)
        NotebookClient(nb, timeout=900, kernel_name="python3",
                       resources={"metadata": {"path": os.path.dirname(path)}}).execute()
