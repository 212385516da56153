"""Autograding a class: serial `nbgrader autograde` against exercises/grade.py with 1 and 2 workers.

N submissions of one assignment (default ex3_10_4) are generated from the corpus
(tests/exercise_corpus: the instructor's solution, the correct solutions written differently and the
typical mistakes, in turn), released and graded three times, each in its own copy of the course
with the shipped configuration (sandbox, bounds), in one run:

1. serial: `nbgrader autograde ASSIGNMENT` (one process, one submission after the other);
2. `python grade.py ASSIGNMENT -j 1`;
3. `python grade.py ASSIGNMENT -j 2`.

The three gradebooks must agree (checked). Printed: wall seconds, seconds per submission and the
speed-up over serial for each, the load average, and the per-submission floor: a sandboxed kernel's
start, the assignment's imports (its setup cell) and nbgrader's own start (what a worker pays
once, reported by grade.py).

    python benchmarks/bench_grading.py --n 24        # from the repository root
"""
import argparse
import glob
import os
import re
import runpy
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

import nbformat

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COURSE = os.path.join(ROOT, "exercises")
CORPUS = os.path.join(ROOT, "tests", "exercise_corpus")


def _strip(src):
    return "\n".join(line for line in src.split("\n") if "### BEGIN SOLUTION" not in line and "### END SOLUTION" not in line)


def _submission(release, source, answers):
    nb = nbformat.read(release, as_version=4)
    solutions = {c.metadata["nbgrader"]["grade_id"]: _strip(c.source)
                 for c in nbformat.read(source, as_version=4).cells if c.metadata.get("nbgrader", {}).get("solution")}
    for cell in nb.cells:
        meta = cell.metadata.get("nbgrader", {})
        if meta.get("solution"):
            gid = meta["grade_id"]
            cell.source = "An answer." if cell.cell_type == "markdown" else answers.get(gid, solutions[gid]).strip("\n")
    return nb


def _env(course):
    env = dict(os.environ, PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ["PATH"],
               PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        env[var] = os.path.join(course, ".jupyter", var.lower())
    return env


def make_course(path, assignment, n):
    shutil.copytree(COURSE, path, ignore=shutil.ignore_patterns(
        "release", "submitted", "autograded", "feedback", "gradebook.db*", "grading_logs", "__pycache__"))
    env = _env(path)
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "generate_assignment", assignment,
                    "--force"], cwd=path, env=env, check=True, capture_output=True)
    src = glob.glob(os.path.join(path, "source", assignment, "*.ipynb"))[0]
    release = glob.glob(os.path.join(path, "release", assignment, "*.ipynb"))[0]
    corpus = runpy.run_path(os.path.join(CORPUS, f"{assignment}.py"))
    kinds = [("solved", {})] + [(f"correct_{k}", v) for k, v in corpus["CORRECT"].items()] + \
            [(f"mistake_{k}", v[1]) for k, v in corpus["MISTAKES"].items()]
    for i in range(n):
        name, answers = kinds[i % len(kinds)]
        dest = os.path.join(path, "submitted", f"s{i:03d}_{name}", assignment)
        os.makedirs(dest)
        nbformat.write(_submission(release, src, answers), os.path.join(dest, os.path.basename(src)))
    return env


def gradebook(course):
    from nbgrader.api import Gradebook

    rows = set()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{course}/gradebook.db") as gb:
            for a in gb.assignments:
                for sub in a.submissions:
                    for nb in sub.notebooks:
                        rows.update((sub.student.id, g.name, g.auto_score) for g in nb.grades)
    return rows


def floor(course, assignment, env, repeats=3):
    """Seconds for a sandboxed kernel to start and for the assignment's setup cell (its imports)."""
    code = r'''
import sys, time, glob, nbformat
sys.path.insert(0, ".")
from traitlets.config import Config
from grading_sandbox import SandboxedKernelManager
nb = nbformat.read(glob.glob("release/%s/*.ipynb")[0], as_version=4)
setup = [c for c in nb.cells if c.metadata.get("nbgrader", {}).get("grade_id") == "setup"][0].source
import asyncio


async def main():
    t0 = time.perf_counter()
    km = SandboxedKernelManager(kernel_name="python3")
    await km.start_kernel(cwd=".")
    kc = km.client()
    kc.start_channels()
    await kc.wait_for_ready(timeout=120)
    t1 = time.perf_counter()
    reply = await kc.execute_interactive(setup, timeout=300, output_hook=lambda m: None)
    t2 = time.perf_counter()
    kc.stop_channels()
    await km.shutdown_kernel(now=True)
    return t0, t1, t2, reply


t0, t1, t2, reply = asyncio.run(main())
print(f"{t1 - t0:.3f} {t2 - t1:.3f} {reply['content']['status']}")
''' % assignment
    starts, setups = [], []
    for _ in range(repeats):
        out = subprocess.run([sys.executable, "-c", code], cwd=course, env=env, capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.split()[-1:] == ["ok"], out.stdout[-2000:] + out.stderr[-2000:]
        a, b, status = out.stdout.split()[-3:]
        starts.append(float(a))
        setups.append(float(b))
    t0 = time.perf_counter()
    subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "--version"], env=env,
                   capture_output=True)
    return statistics.median(starts), statistics.median(setups), time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=24, help="submissions (default 24)")
    p.add_argument("--assignment", default="ex3_10_4")
    args = p.parse_args()
    if args.n < 1:
        p.error(f"--n must be at least 1, got {args.n}")
    warm = subprocess.run([sys.executable, "-c", "import gpclab; gpclab.compile_paths(['laplace', 'multiclass', 'ep'])"],
                          cwd=ROOT, capture_output=True, text=True)
    assert warm.returncode == 0, warm.stderr
    tmp = tempfile.mkdtemp(prefix="bench_grading_")
    rows, books = [], {}
    try:
        for mode in ("serial", "-j 1", "-j 2"):
            course = os.path.join(tmp, re.sub(r"\W", "", mode) or "serial")
            env = make_course(course, args.assignment, args.n)
            load = os.getloadavg()[0]
            t0 = time.perf_counter()
            if mode == "serial":
                out = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nbgrader"), "autograde",
                                      args.assignment], cwd=course, env=env, capture_output=True, text=True)
                worker = None
            else:
                out = subprocess.run([sys.executable, "grade.py", args.assignment, *mode.split(), "--no-progress"],
                                     cwd=course, env=env, capture_output=True, text=True)
                m = re.search(r"once per worker: ([\d.]+) s", out.stdout)
                worker = float(m.group(1)) if m else None
            wall = time.perf_counter() - t0
            assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
            books[mode] = gradebook(course)
            rows.append((mode, wall, wall / args.n, load, worker))
            print(f"{mode}: {wall:.1f} s", file=sys.stderr)
        assert books["serial"] == books["-j 1"] == books["-j 2"], "the gradebooks differ"
        kernel, setup, nbgrader_start = floor(os.path.join(tmp, "j2"), args.assignment, _env(os.path.join(tmp, "j2")))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report(args, rows, kernel, setup, nbgrader_start)


def report(args, rows, kernel, setup, nbgrader_start):
    serial = rows[0][1]
    print(f"\n{args.n} submissions of {args.assignment}, {os.cpu_count()} cores\n")
    print("| grading | wall s | s per submission | speed-up | load at start | worker start s (once per worker) |")
    print("|---|---|---|---|---|---|")
    for mode, wall, per, load, worker in rows:
        name = "nbgrader autograde (serial)" if mode == "serial" else f"grade.py {mode}"
        print(f"| {name} | {wall:.1f} | {per:.2f} | {serial / wall:.2f}x | {load:.1f} | "
              f"{'-' if worker is None else f'{worker:.1f}'} |")
    print(f"\nper-submission floor: sandboxed kernel start {kernel:.2f} s, setup cell (imports) {setup:.2f} s; "
          f"nbgrader's start ({nbgrader_start:.1f} s for `nbgrader --version`) is paid once per run (serial) "
          "or once per worker (grade.py)")


if __name__ == "__main__":
    main()
