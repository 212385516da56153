"""A small nbgrader course for tests of grading itself (tests/test_grading.py): the shipped
configuration (exercises/nbgrader_config.py, grading_sandbox.py) with one quick assignment, "toy",
whose three parts each have a hidden test, and submissions that misbehave."""
import json
import os
import shutil
import subprocess
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COURSE = os.path.join(ROOT, "exercises")
A = "toy"

# the hidden tests: the lines that must never reach a student
HIDDEN = {
    "partA_works": 'assert type(add(40, 2)) in (int, float) and add(40, 2) == 42 and add(-7, 7) == 0, "add misses a hidden case"',
    "partB_works": ('assert type(mul(6, 7)) in (int, float) and abs(mul(6, 7) - 42) < 1e-9 and mul(-3, 5) == -15, '
                    '"mul misses a hidden case"'),
    # (a loop whose assert is followed by another line: a trace function could jump over it)
    "partC_works": ('for x, want in [(5, -5), (-2.5, 2.5)]:\n'
                    '    assert type(neg(x)) in (int, float) and neg(x) == want, "neg misses a hidden case"\n'
                    '    print(f"neg({x}) ok")'),
}
# (the exact type first: an object whose == always says True, or a float subclass that lies,
# passes an equality test)
SOLUTIONS = {
    "partA_answer": "def add(a, b):\n    return a + b",
    "partB_answer": "def mul(a, b):\n    return a * b",
    "partC_answer": "def neg(a):\n    return -a",
}
VISIBLE = {"partA_works": "assert add(1, 2) == 3", "partB_works": "assert mul(2, 3) == 6",
           "partC_works": "assert neg(1) == -1"}


def _meta(gid, grade=False, solution=False, points=None):
    m = {"grade": grade, "grade_id": gid, "locked": not solution, "schema_version": 3, "solution": solution}
    if points is not None:
        m["points"] = points
    return {"nbgrader": m}


def source_notebook():
    cells = [new_markdown_cell("# A toy assignment", metadata=_meta("intro")),
             new_code_cell("import os, sys", metadata=_meta("setup"))]
    for part in "ABC":
        answer, test = f"part{part}_answer", f"part{part}_works"
        body = SOLUTIONS[answer].split("\n")
        cells.append(new_code_cell("\n".join([body[0], "    ### BEGIN SOLUTION", *body[1:], "    ### END SOLUTION"]),
                                   metadata=_meta(answer, solution=True)))
        cells.append(new_code_cell(f'"Part {part}"\n{VISIBLE[test]}\n### BEGIN HIDDEN TESTS\n{HIDDEN[test]}\n'
                                   "### END HIDDEN TESTS", metadata=_meta(test, grade=True, points=1)))
    nb = new_notebook(cells=cells)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)", "language": "python"}
    return nb


def make_course(path, env_extra=None):
    """The course folder at `path` (exercises' configuration, the toy source), released; returns
    the environment to run nbgrader in."""
    os.makedirs(path, exist_ok=True)
    for name in ("nbgrader_config.py", "grading_sandbox.py", "grade.py"):
        if os.path.exists(os.path.join(COURSE, name)):
            shutil.copy(os.path.join(COURSE, name), os.path.join(path, name))
    os.makedirs(os.path.join(path, "source", A), exist_ok=True)
    nbformat.write(source_notebook(), os.path.join(path, "source", A, f"{A}.ipynb"))
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env["PATH"]
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[var] = os.path.join(str(path), ".jupyter", var.lower())
    env.update(env_extra or {})
    nbgrader(path, env, "generate_assignment", A, "--force")
    return env


def nbgrader(course, env, *args, check=True):
    exe = os.path.join(os.path.dirname(sys.executable), "nbgrader")
    out = subprocess.run([exe, *args], cwd=course, capture_output=True, text=True, env=env)
    if check:
        assert out.returncode == 0, (args, out.stdout + out.stderr)
    return out


def submit(course, student, answers=None):
    """submitted/<student>/toy/toy.ipynb: the release with the solutions, or `answers` by grade id."""
    release = nbformat.read(os.path.join(course, "release", A, f"{A}.ipynb"), as_version=4)
    for cell in release.cells:
        gid = cell.metadata.get("nbgrader", {}).get("grade_id")
        if cell.metadata.get("nbgrader", {}).get("solution"):
            cell.source = (answers or {}).get(gid, SOLUTIONS[gid])
    dest = os.path.join(course, "submitted", student, A)
    os.makedirs(dest, exist_ok=True)
    nbformat.write(release, os.path.join(dest, f"{A}.ipynb"))


def grades(course, student, assignment=A):
    import warnings

    from nbgrader.api import Gradebook

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
            return {g.name: g.auto_score for g in gb.find_submission_notebook(assignment, assignment, student).grades}


def outputs(course, student, grade_id):
    nb = nbformat.read(os.path.join(course, "autograded", student, A, f"{A}.ipynb"), as_version=4)
    cell = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == grade_id][0]
    return json.dumps(cell.outputs)
