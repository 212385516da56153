"""Autograde a whole course in parallel: nbgrader's own autograde, N submissions at a time.

    cd exercises
    python grade.py ex3_10_1 -j 2              # every submitted student of ex3_10_1, 2 at once
    python grade.py --all -j 4                  # every assignment
    python grade.py ex3_10_1 --student alice    # some students only (repeatable)
    python grade.py ex3_10_1 --force            # grade again what was graded already
    python grade.py --all --dask tcp://scheduler:8786   # workers of a dask.distributed cluster
    python grade.py ex3_10_1 -j 2 -- --Execute.timeout=120   # options after -- go to nbgrader

Each worker process runs nbgrader's `autograde` for one student at a time, in-process (nbgrader's
start is paid once per worker, not per submission), with the course's nbgrader_config.py: every
submission runs in the sandbox of grading_sandbox.py, bounded in time, memory, processes, disk
and output (the summary and each submission's log say how: a control group per sandbox, or
per-process limits where none can be made). All workers
write the one gradebook (gradebook.db), each access under a file lock (gradebook.db.lock), so
the gradebook, autograded/ and everything after (formgrader, generate_feedback, export) are as
`nbgrader autograde` leaves them.

Resumable: each submission graded is recorded in grading_logs/<assignment>/<student>.graded.json
(its timestamp.txt, as nbgrader collect wrote it, and a hash of every file submitted). A submission
counts as graded when that record matches what submitted/<student>/<assignment>/ holds now and
autograded/ has each of its notebooks; a resubmission (a new timestamp.txt or changed notebooks)
is graded again whatever the files' modification times (collect keeps the student's save times).
A run that is stopped (Ctrl-C, killed) and started again grades only the rest. --force grades
everything again.

A progress bar shows the count, the rate and the time left; the summary at the end lists what
was graded, what failed (with its log, grading_logs/<assignment>/<student>.log), which cells
were stopped (time or memory), which tests scored 0 because student code changed how cells run
while they ran (grading_sandbox.py's guard), and the time per submission.

With --dask the course folder must be at the same path on every worker machine (a shared file
system whose locks work, e.g. NFSv4), and nbgrader, bubblewrap and gpclab installed there.
"""
import argparse
import contextlib
import fcntl
import glob
import hashlib
import json
import logging
import os
import stat
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
STOP_NAMES = ("TimeLimitExceeded", "NotRun", "MemoryLimitExceeded", "KernelDied")
# the error of a test during which student code changed how cells run (grading_sandbox.TAMPERED)
TAMPERED = "ChangedHowCellsRun"


# ---- in the worker ------------------------------------------------------------------------------
_worker = {}
# nbgrader's apps are not thread-safe: a worker process (a dask worker may run several threads)
# grades one submission at a time
_JOB = threading.Lock()


def _setup_worker(course):
    """Once per worker process: the course as working folder, nbgrader's tools on the PATH, and
    every Gradebook opened under the course's file lock (held until it is closed)."""
    if _worker.get("course") == course:
        return _worker["started"]
    t0 = time.perf_counter()
    os.chdir(course)
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    import warnings

    warnings.filterwarnings("ignore", module=r"nbgrader\.")
    warnings.filterwarnings("ignore", message=r".*SAWarning.*")
    from nbgrader import api
    from nbgrader.apps import AutogradeApp  # noqa: F401  (imported once here)

    lock_path = os.path.join(course, "gradebook.db.lock")
    state = {"depth": 0, "fh": None}
    guard = threading.Lock()       # this process grades one submission at a time (_JOB), so a
                                   # count of the open Gradebooks is enough here

    def acquire():
        with guard:
            if state["depth"] == 0:
                state["fh"] = open(lock_path, "a")
                fcntl.flock(state["fh"], fcntl.LOCK_EX)
            state["depth"] += 1

    def release():
        with guard:
            state["depth"] -= 1
            if state["depth"] == 0:
                fcntl.flock(state["fh"], fcntl.LOCK_UN)
                state["fh"].close()
                state["fh"] = None

    init, close = api.Gradebook.__init__, api.Gradebook.close

    def locked_init(self, *args, **kwargs):
        acquire()
        self._grade_lock = True
        try:
            init(self, *args, **kwargs)
        except BaseException:
            self._grade_lock = False
            release()
            raise

    def locked_close(self):
        try:
            close(self)
        finally:
            if getattr(self, "_grade_lock", False):
                self._grade_lock = False
                release()

    api.Gradebook.__init__, api.Gradebook.close = locked_init, locked_close
    _worker.update(course=course, started=time.perf_counter() - t0)
    return _worker["started"]


def _no_message_contents(record):
    """Leave out nbclient's debug echo of every kernel message's content ("content: {...}"): it
    repeats all the output a submission prints (200 MiB printed made a 200 MB log)."""
    return not (record.levelno == logging.DEBUG and record.msg == "content: %s")


def grade_one(course, assignment, student, nbgrader_args=()):
    """nbgrader autograde ASSIGNMENT --student=STUDENT --force, in this process; returns what the
    summary needs."""
    with _JOB:
        return _grade_one(course, assignment, student, nbgrader_args)


def _grade_one(course, assignment, student, nbgrader_args):
    setup = _setup_worker(course)
    from nbgrader.apps import AutogradeApp

    t0 = time.perf_counter()
    # what is graded: taken before grading, so a resubmission during the run is graded next time
    fingerprint = _fingerprint(course, assignment, student)
    log_dir = os.path.join(course, "grading_logs", assignment)
    os.makedirs(log_dir, exist_ok=True)
    log_path = os.path.join(log_dir, f"{student}.log")
    open(log_path, "w").close()
    # appends: traitlets closes the app's handlers when it configures logging, and a closed
    # handler reopens its file only in append mode
    handler = logging.FileHandler(log_path, mode="a")
    handler.setFormatter(logging.Formatter("[%(name)s | %(levelname)s] %(message)s"))
    handler.addFilter(_no_message_contents)
    app = AutogradeApp()
    code = 0
    with open(os.devnull, "w") as null, contextlib.redirect_stderr(null), contextlib.redirect_stdout(null):
        try:
            app.initialize([assignment, f"--student={student}", "--force", *nbgrader_args])
            app.log.handlers[:] = [handler]
            app.log.propagate = False
            app.start()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 1
        except Exception as exc:       # noqa: BLE001  (reported as a failed submission)
            app.log.exception("grading failed: %s", exc)
            code = 1
        finally:
            handler.close()
            app.log.handlers[:] = []
            app.clear_instance()
    # how the sandbox was bounded (grading_sandbox's record of the last kernel started here)
    bounds = getattr(sys.modules.get("grading_sandbox"), "LAST_BOUNDS", None)
    if bounds:
        with open(log_path, "a") as fh:
            fh.write(f"[grade.py | INFO] sandbox bounds: {bounds}\n")
    stopped, tampered = [], []
    for path in glob.glob(os.path.join(course, "autograded", student, assignment, "*.ipynb")):
        with open(path) as fh:
            nb = json.load(fh)
        for cell in nb.get("cells", []):
            for out in cell.get("outputs", []):
                if out.get("output_type") == "error" and out.get("ename") in STOP_NAMES:
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or "(cell)"
                    stopped.append(f"{gid}: {out['ename']}: {out.get('evalue', '')}")
                elif out.get("output_type") == "error" and out.get("ename") == TAMPERED:
                    gid = cell.get("metadata", {}).get("nbgrader", {}).get("grade_id") or "(cell)"
                    tampered.append(f"{gid}: {out.get('evalue', '')}")
    # symbolic links and special files handed in, which autograde did not copy (grading_sandbox)
    sandbox = sys.modules.get("grading_sandbox")
    links = sandbox.unsafe_entries(os.path.join(course, "submitted", student, assignment)) if sandbox else []
    graded = code == 0 and _has_notebooks(course, assignment, student)
    record = _record_path(course, assignment, student)
    if graded:
        with open(record + ".part", "w") as fh:
            json.dump(fingerprint, fh)
        os.replace(record + ".part", record)
    elif os.path.exists(record):
        os.remove(record)
    return dict(assignment=assignment, student=student, ok=graded, seconds=time.perf_counter() - t0,
                stopped=stopped, tampered=tampered, links=links, log=log_path, worker_start=setup, pid=os.getpid(), bounds=bounds)


# ---- in the parent ------------------------------------------------------------------------------
def _notebooks(folder):
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(folder, "*.ipynb")))


def _record_path(course, assignment, student):
    return os.path.join(course, "grading_logs", assignment, f"{student}.graded.json")


def _fingerprint(course, assignment, student):
    """The submission as it is now: its timestamp.txt and a hash of every file in it (names and
    contents, not modification times; a symbolic link by its target, never followed)."""
    sub = os.path.join(course, "submitted", student, assignment)
    digest = hashlib.sha256()
    for base, dirs, files in os.walk(sub):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(base, name)
            digest.update(os.path.relpath(path, sub).encode() + b"\0")
            mode = os.lstat(path).st_mode
            if stat.S_ISLNK(mode):       # a link by where it points (never followed, never graded)
                digest.update(b"link\0" + os.fsencode(os.readlink(path)))
            elif not stat.S_ISREG(mode):  # a named pipe or device: by its kind (reading one blocks)
                digest.update(b"special\0" + str(stat.S_IFMT(mode)).encode())
            else:
                with open(path, "rb") as fh:
                    digest.update(hashlib.sha256(fh.read()).digest())
    timestamp = None
    with contextlib.suppress(OSError), open(os.path.join(sub, "timestamp.txt")) as fh:
        timestamp = fh.read().strip()
    return {"student": student, "assignment": assignment, "timestamp": timestamp, "sha256": digest.hexdigest()}


def _has_notebooks(course, assignment, student):
    names = _notebooks(os.path.join(course, "submitted", student, assignment))
    out = os.path.join(course, "autograded", student, assignment)
    return bool(names) and all(os.path.exists(os.path.join(out, n)) for n in names)


def _is_graded(course, assignment, student):
    """Graded: the record of its last grading matches the submission as it is now, and autograded/
    holds each of its notebooks."""
    try:
        with open(_record_path(course, assignment, student)) as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return False
    return record == _fingerprint(course, assignment, student) and _has_notebooks(course, assignment, student)


def find_work(course, assignments, students=None, force=False):
    """[(assignment, student)] submitted and (unless force) not graded yet; and how many were
    graded already."""
    jobs, done = [], 0
    for a in assignments:
        for folder in sorted(glob.glob(os.path.join(course, "submitted", "*", a))):
            student = os.path.basename(os.path.dirname(folder))
            if students and student not in students:
                continue
            if not force and _is_graded(course, a, student):
                done += 1
            else:
                jobs.append((a, student))
    return jobs, done


def _ensure_gradebook(course):
    """Create gradebook.db before the workers start (its creation runs alembic; not twice at once)."""
    import warnings

    from nbgrader.api import Gradebook

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with Gradebook(f"sqlite:///{os.path.join(course, 'gradebook.db')}") as gb:
            return [a.name for a in gb.assignments]


def _executor(jobs_n, dask):
    if dask:
        from distributed import Client

        client = Client(dask)
        # workers import this module by name (functions pickled by reference, one state per worker)
        client.upload_file(os.path.join(HERE, "grade.py"))
        return client.get_executor(), client
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    return ProcessPoolExecutor(jobs_n, mp_context=multiprocessing.get_context("spawn")), None


def run(course, assignments, jobs_n=None, students=None, force=False, dask=None, nbgrader_args=(),
        progress=True, out=sys.stdout):
    """Grade; returns the list of results (one dict per submission) and prints the summary."""
    from concurrent.futures import as_completed

    from tqdm import tqdm

    course = os.path.abspath(course)
    bindir = os.path.dirname(sys.executable)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    known = _ensure_gradebook(course)
    missing = [a for a in assignments if a not in known]
    if missing:
        raise SystemExit(f"grade.py: no assignment {', '.join(missing)} in the gradebook: run "
                         "`nbgrader generate_assignment` first")
    jobs, done = find_work(course, assignments, students, force)
    jobs_n = jobs_n or os.cpu_count() or 1
    print(f"{len(jobs)} submission(s) to grade ({done} graded already{'' if force else ', skipped'}), "
          f"{'dask cluster ' + dask if dask else f'{jobs_n} worker(s)'}", file=out)
    results = []
    t0 = time.perf_counter()
    if jobs:
        pool, client = _executor(jobs_n, dask)
        bar = tqdm(total=len(jobs), unit="submission", disable=not progress, file=sys.stderr,
                   dynamic_ncols=True)
        try:
            # grade_one from the module `grade` (not __main__), which workers import by name
            if HERE not in sys.path:
                sys.path.insert(0, HERE)
            import grade as module

            futures = {}
            futures = {pool.submit(module.grade_one, course, a, s, tuple(nbgrader_args)): (a, s) for a, s in jobs}
            for fut in as_completed(futures):
                a, s = futures[fut]
                try:
                    res = fut.result()
                except Exception as exc:      # noqa: BLE001  (a worker that died)
                    res = dict(assignment=a, student=s, ok=False, seconds=float("nan"), stopped=[],
                               log=f"worker failed: {type(exc).__name__}: {exc}", worker_start=None, pid=None)
                results.append(res)
                bar.update(1)
                bar.set_postfix(failed=sum(not r["ok"] for r in results),
                                stopped=sum(bool(r["stopped"]) for r in results), refresh=False)
        except KeyboardInterrupt:
            bar.close()
            print("\ninterrupted: the submissions being graded finish, the others wait; run the same "
                  "command again to grade what is left", file=out)
            for fut in futures:
                fut.cancel()                 # those not started yet
            raise
        finally:
            bar.close()
            pool.shutdown(wait=True)
            if client is not None:
                client.close()
    summary(results, time.perf_counter() - t0, out)
    return results


def summary(results, wall, out=sys.stdout):
    ok = [r for r in results if r["ok"]]
    failed = [r for r in results if not r["ok"]]
    stopped = [r for r in ok if r["stopped"]]
    times = [r["seconds"] for r in results if r["seconds"] == r["seconds"]]
    tampered = [r for r in ok if r.get("tampered")]
    print(f"graded {len(ok)}, failed {len(failed)}, with stopped cells {len(stopped)}, "
          f"changed how cells run {len(tampered)}, in {wall:.1f} s", file=out)
    if times:
        print(f"per submission: median {statistics.median(times):.1f} s, max {max(times):.1f} s "
              f"({max(results, key=lambda r: r['seconds'] if r['seconds'] == r['seconds'] else -1)['student']})",
              file=out)
    starts = {r["pid"]: r["worker_start"] for r in results if r.get("worker_start") is not None}
    if starts:
        print(f"worker start (nbgrader import), once per worker: {statistics.mean(starts.values()):.1f} s "
              f"x {len(starts)}", file=out)
    for bounds in sorted({r["bounds"] for r in results if r.get("bounds")}):
        print(f"sandbox bounds: {bounds}", file=out)
    for r in stopped:
        print(f"  stopped  {r['assignment']} {r['student']} ({r['seconds']:.0f} s):", file=out)
        for line in r["stopped"]:
            print(f"           {line}", file=out)
    for r in tampered:
        print(f"  tampered {r['assignment']} {r['student']} (its tests score 0 where this was found):", file=out)
        for line in r["tampered"]:
            print(f"           {line}", file=out)
    for r in results:
        if r.get("links"):
            print(f"  symlinks refused: {r['assignment']} {r['student']} (not copied, not graded): "
                  f"{', '.join(r['links'])}", file=out)
    for r in failed:
        print(f"  FAILED   {r['assignment']} {r['student']}: see {r['log']}", file=out)


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    extra = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(prog="python grade.py", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog="Options after -- are passed to nbgrader autograde.")
    p.add_argument("assignments", nargs="*", help="assignment names (or --all)")
    p.add_argument("--all", action="store_true", help="every assignment (of source/) with a submission")
    p.add_argument("-j", "--jobs", type=int, default=None, help="worker processes (default: the number of cores)")
    p.add_argument("--dask", metavar="ADDRESS", help="grade on a dask.distributed cluster (scheduler address)")
    p.add_argument("--student", action="append", help="only this student (repeatable)")
    p.add_argument("--force", action="store_true", help="grade again what is graded already")
    p.add_argument("--course", default=HERE, help="the course folder (default: this file's folder)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    args = p.parse_args(argv)
    course = os.path.abspath(args.course)
    assignments = args.assignments
    if args.all:
        # every assignment of source/ that someone has submitted
        submitted = {os.path.basename(d) for d in glob.glob(os.path.join(course, "submitted", "*", "*"))}
        assignments = sorted(os.path.basename(d) for d in glob.glob(os.path.join(course, "source", "*"))
                             if os.path.isdir(d) and os.path.basename(d) in submitted)
    if not assignments:
        p.error("name an assignment, or --all" + (" (nothing is submitted yet)" if args.all else ""))
    if args.jobs is not None and args.jobs < 1:
        p.error(f"-j/--jobs must be at least 1, got {args.jobs}")
    results = run(course, assignments, args.jobs, args.student, args.force, args.dask, extra,
                  progress=not args.no_progress)
    return 0 if all(r["ok"] for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
