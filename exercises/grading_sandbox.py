"""Autograding in a sandbox: each submission's kernel runs under bubblewrap (`bwrap`).

`nbgrader autograde` executes student code. Under `SandboxedExecute` (set in nbgrader_config.py)
each kernel starts inside a bubblewrap sandbox where it
- sees the operating system read-only (/usr, /etc, /lib..., /opt, /sys), the Python it runs on
  (its virtual environment and base installation), gpclab.py with its `__pycache__` and numba's
  cache folder (`$NUMBA_CACHE_DIR`), all read-only, and nothing else of the machine: no home
  folders, no /work or /srv, no course folder (source/, submitted/, gradebook.db), no exchange;
- writes only to its own working folder (`autograded/<student>/<assignment>/`, which holds a copy
  of the submission's files; the kernel sees it as /home/student/<assignment>) and to a private,
  empty HOME and /tmp that vanish with it;
- has no network (it talks to nbgrader over Unix sockets in a private folder instead of TCP), no
  view of other processes, and no capabilities, even when autograde runs as root.

Each sandbox is also bounded (SandboxedExecute, SandboxedKernelManager):
- time: `SandboxedExecute.timeout` seconds per cell (default 60) and `submission_timeout` seconds
  for all cells of a notebook (default 300). A cell that runs longer is interrupted; if it ignores
  the interrupt (SIGINT), its kernel is killed, a new one is started and the cells that finished
  before are run again (their outputs kept from the first run), and grading goes on with the next
  cell. The cell that was stopped, and every cell left when the budget is used up, shows an error
  ("stopped after 60 s", "not run: ...") and so scores 0; finished cells keep their grades.
- memory: `SandboxedKernelManager.memory_limit_gib` (default 2 GiB) per kernel
  (RLIMIT_DATA: heap and anonymous memory, about what it holds in RAM; the libraries it maps
  do not count): an allocation beyond it raises MemoryError in the student's code, which the cell
  reports as "exceeded 2 GiB".
- environment: the kernel gets only the variables named in `SandboxedKernelManager.env_keep`
  (PATH, PYTHONPATH, locale, numba's and the BLAS libraries' settings, NBGRADER_EXECUTION), with one
  BLAS/numba thread unless configured otherwise.
- sealed output: graded test cells run without entering IPython's history (`In`, `_ih`, the
  history manager), and every output of the graded notebook (and every text file the kernel leaves
  in its working folder) that repeats a line of a hidden test is replaced by a notice, so neither
  the autograded notebook nor the feedback carries hidden test code, whichever way student code
  found it (history, the calling frame, `inspect`).

- inert output: outputs of the graded notebook are shown in the instructor's browser (formgrader)
  and in the student's feedback, so after execution every display output keeps only plain text
  and raster images (PNG, JPEG, GIF); HTML, JavaScript, SVG, Markdown, widget views and any other
  rich type are dropped, and an output left with none of its types shows its text/plain form or
  a notice. Student code's `display(HTML('<script>...'))`, `Javascript(...)` or an `<img
  onerror=...>` thus reaches nobody's browser as active content.

- inert cells (`InertCells`, before execution): a student's Markdown cells keep no raw HTML (it
  shows as typed text) and no link or image to a `javascript:` (or other script) URL, raw cells
  are not passed to the page as HTML, and a grade id that is not a plain name is removed, since
  nbconvert and nbgrader's templates put all of these into the formgrader's and the feedback's
  pages as they are.

Without `bwrap` on the PATH autograde refuses to run a kernel. An instructor who grades elsewhere
in isolation (e.g. a container per submission) opts out in nbgrader_config.py with
`c.SandboxedKernelManager.allow_unsandboxed = True`.
"""
import asyncio
import base64
import copy
import importlib.util
import io
import math
import os
import re
import shutil
import sys
import tempfile
import time
import tokenize

from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import Execute, NbGraderPreprocessor
from traitlets import Bool, Float, Integer, List, Unicode


class SandboxUnavailable(RuntimeError):
    pass


# system folders the kernel sees read-only (those that exist; symbolic links stay links)
SYSTEM_PATHS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "sys")
# the kernel's home folder (an empty tmpfs); the working folder appears in it
HOME = "/home/student"
# the variables a kernel keeps from the grader's environment (and those starting with NUMBA_)
ENV_KEEP = ("PATH", "PYTHONPATH", "JPY_PARENT_PID", "LANG", "LANGUAGE", "LC_ALL", "LC_CTYPE", "LC_NUMERIC", "TZ",
            "NBGRADER_EXECUTION", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS",
            "MPLBACKEND", "PYTHONHASHSEED", "NUMBA_*")
# one thread each unless the grader's environment says otherwise: graded kernels run side by side
THREADS = ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS")
# sets the memory limit, then becomes the sandbox (the limit holds for everything in it)
_LIMIT = "import os, resource, sys; n = int(sys.argv[1]); resource.setrlimit(resource.RLIMIT_DATA, (n, n)); os.execv(sys.argv[2], sys.argv[2:])"


def _gib(x):
    return f"{x:g} GiB"


def _launcher_by_path(cmd, env):
    """cmd with `-m ipykernel_launcher` replaced by the installed launcher's file, when the kernel's
    Python is this installation's (the grader's own folder of executables)."""
    cmd = list(cmd)
    for i in range(len(cmd) - 1):
        if cmd[i] == "-m" and cmd[i + 1] == "ipykernel_launcher":
            exe = shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]
            spec = importlib.util.find_spec("ipykernel_launcher")
            same = os.path.dirname(os.path.abspath(exe)) == os.path.dirname(os.path.abspath(sys.executable))
            if same and spec is not None and spec.origin and os.path.isfile(spec.origin):
                return cmd[:i] + [spec.origin] + cmd[i + 2:]
            break
    return cmd


class SandboxedKernelManager(AsyncKernelManager):
    """A kernel manager whose kernels run under bubblewrap (see the module's docstring)."""

    bwrap = Unicode("bwrap", help="The bubblewrap executable (a name on the PATH or a path).").tag(config=True)
    allow_unsandboxed = Bool(False, help=(
        "Run kernels without a sandbox when bubblewrap is missing (with a warning) instead of "
        "refusing. Only for grading that is isolated otherwise.")).tag(config=True)
    visible = List(Unicode(), help=(
        "More paths the kernel may read (read-only), e.g. a data folder outside the "
        "course.")).tag(config=True)
    hidden = List(Unicode(), help=(
        "More paths hidden from the kernel even if they lie inside a visible one "
        "(the course root and the exchange root are always hidden).")).tag(config=True)
    memory_limit_gib = Float(2.0, help=(
        "The memory a kernel may allocate, in GiB (RLIMIT_DATA: heap and anonymous mappings); beyond "
        "it allocations raise MemoryError. 0: no limit.")).tag(config=True)
    env_keep = List(Unicode(), list(ENV_KEEP), help=(
        "The environment variables a kernel keeps from the grader's (a trailing * matches a "
        "prefix); all others are dropped.")).tag(config=True)

    _sandbox_dir = None

    def _bwrap_path(self):
        found = shutil.which(self.bwrap)
        if found is None and not self.allow_unsandboxed:
            raise SandboxUnavailable(
                f"autograde refuses to run student code without a sandbox: bubblewrap ('{self.bwrap}') "
                "is not installed (Debian/Ubuntu: apt-get install bubblewrap). To grade without it "
                "(only where grading is isolated otherwise), set "
                "c.SandboxedKernelManager.allow_unsandboxed = True in nbgrader_config.py.")
        if found is None:
            self.log.warning("bubblewrap not found: running the kernel WITHOUT a sandbox "
                             "(SandboxedKernelManager.allow_unsandboxed is set)")
        return found

    async def _async_pre_start_kernel(self, **kw):
        bwrap = self._bwrap_path()
        if bwrap is not None:
            # a private folder for the connection file and the kernel's Unix sockets: the
            # sandbox has no network, and sees no other kernel's connection file
            self._remove_sandbox_dir()
            self._sandbox_dir = tempfile.mkdtemp(prefix="nbgrader-kernel-")
            self.transport = "ipc"
            self.connection_file = os.path.join(self._sandbox_dir, "kernel.json")
            self.ip = os.path.join(self._sandbox_dir, "kernel-ipc")
            # signals from outside do not reach into the sandbox's own session: interrupt (a
            # cell's timeout) by a message on the control channel, which ipykernel supports
            self.kernel_spec.interrupt_mode = "message"
        cmd, kw = await super()._async_pre_start_kernel(**kw)
        env = self._environment(dict(kw.get("env") or os.environ))
        # `python -m ipykernel_launcher` looks in the working folder first, where a student's own
        # ipykernel_launcher.py (handed in beside the notebook, or written by a cell before the
        # kernel is restarted) would become the kernel: start the installed launcher by its path,
        # and with PYTHONSAFEPATH (Python 3.11+) no module is looked up in the working folder at
        # start-up (IPython adds it back afterwards, as in every Jupyter kernel)
        cmd = _launcher_by_path(cmd, env)
        env["PYTHONSAFEPATH"] = "1"
        if bwrap is not None:
            cwd = os.path.abspath(kw.get("cwd") or os.getcwd())
            cmd, env = self._wrap(bwrap, cmd, cwd, env)
            kw["cwd"] = cwd
        kw["env"] = env
        if self.memory_limit_gib and self.memory_limit_gib > 0:
            exe = shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]
            cmd = [sys.executable, "-c", _LIMIT, str(int(self.memory_limit_gib * 2 ** 30)), exe] + list(cmd[1:])
        return cmd, kw

    def _environment(self, env):
        """The grader's environment cut down to `env_keep`, one BLAS/numba thread by default."""
        exact = {k for k in self.env_keep if not k.endswith("*")}
        prefixes = tuple(k[:-1] for k in self.env_keep if k.endswith("*"))
        kept = {k: v for k, v in env.items() if k in exact or (prefixes and k.startswith(prefixes))}
        for name in THREADS:
            kept.setdefault(name, "1")
        return kept

    async def _async_cleanup_resources(self, restart=False):
        await super()._async_cleanup_resources(restart=restart)
        if not restart:
            self._remove_sandbox_dir()

    def _remove_sandbox_dir(self):
        if self._sandbox_dir is not None:
            shutil.rmtree(self._sandbox_dir, ignore_errors=True)
            self._sandbox_dir = None

    # ---- what the kernel sees --------------------------------------------------------------
    def _readable_paths(self, cmd, env):
        """Paths outside the system folders the kernel needs: its Python, gpclab, numba's cache."""
        paths = {sys.prefix, sys.base_prefix, sys.exec_prefix}
        exe = shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]
        if os.path.isabs(exe):
            paths.add(os.path.dirname(os.path.dirname(os.path.realpath(exe))))  # its installation
            paths.add(os.path.dirname(os.path.abspath(exe)))
        spec = importlib.util.find_spec("gpclab")
        if spec is not None and spec.origin:
            # gpclab.py and its __pycache__ (the warmed numba cache), not the folder around it:
            # for an editable install that folder is the course's repository
            paths.add(spec.origin)
            paths.add(os.path.join(os.path.dirname(spec.origin), "__pycache__"))
        if env.get("NUMBA_CACHE_DIR"):
            paths.add(env["NUMBA_CACHE_DIR"])
        paths.update(self.visible)
        return sorted(os.path.abspath(p) for p in paths if p and os.path.exists(p))

    def _hidden_paths(self):
        hidden = set(self.hidden)
        hidden.add(os.getcwd())      # where nbgrader runs: the course root, unless configured
        course = self.config.get("CourseDirectory", {}).get("root")
        if course:
            hidden.add(course)
        exchange = self.config.get("Exchange", {}).get("root") or "/usr/local/share/nbgrader/exchange"
        hidden.add(exchange)
        db = self.config.get("CourseDirectory", {}).get("db_url", "")
        if isinstance(db, str) and db.startswith("sqlite:///"):
            hidden.add(os.path.dirname(db[len("sqlite:///"):]))
        return sorted(os.path.abspath(p) for p in hidden if p and os.path.isdir(p))

    def _wrap(self, bwrap, cmd, cwd, env):
        """The bubblewrap command around `cmd`, and the kernel's environment."""
        args = [bwrap, "--die-with-parent", "--new-session", "--unshare-all", "--cap-drop", "ALL",
                "--proc", "/proc", "--dev", "/dev", "--tmpfs", "/tmp", "--tmpfs", "/var/tmp",
                "--tmpfs", "/home", "--dir", HOME]
        visible = []
        for name in SYSTEM_PATHS:
            path = "/" + name
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
                visible.append(path)
        for path in self._readable_paths(cmd, env):
            args += ["--ro-bind", path, path]
            visible.append(path)
        # hide the course, the exchange and the gradebook where they lie inside a visible
        # folder (e.g. an exchange under /usr/local/share); elsewhere they do not exist here
        hidden = [h for h in self._hidden_paths()
                  if any(h == v or h.startswith(v.rstrip(os.sep) + os.sep) for v in visible)]
        for path in hidden:
            args += ["--tmpfs", path]
        # the working folder appears as ~/<its name>: the kernel learns nothing of where it lies
        work = os.path.join(HOME, os.path.basename(cwd.rstrip(os.sep)) or "work")
        args += ["--bind", cwd, work, "--bind", self._sandbox_dir, self._sandbox_dir, "--chdir", work]
        # the sandbox's root and the hidden folders read-only (HOME, the working folder and /tmp
        # are mounts of their own and stay writable)
        args += ["--remount-ro", "/"]
        for path in hidden:
            args += ["--remount-ro", path]
        # JPY_PARENT_PID=1 (jupyter_client sets the launcher's pid): in its own process
        # namespace the kernel's parent is bubblewrap's pid 1, and ipykernel would otherwise take
        # the changed parent for "parent exited"; --die-with-parent does that job
        args += ["--setenv", "JPY_PARENT_PID", "1"]
        env = dict(env, HOME=HOME, TMPDIR="/tmp", PWD=work)
        return args + ["--"] + list(cmd), env


# error names of the outputs that bounded execution writes (the summary of a grading run reads them)
STOPPED, NOT_RUN, MEMORY = "TimeLimitExceeded", "NotRun", "MemoryLimitExceeded"
HIDDEN_NOTICE = "[removed from the feedback: this output repeated code of a hidden test]"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _normal(text):
    """Only letters and digits, lower case: a line printed, repr()'d, quoted or re-indented still
    matches."""
    return re.sub(r"[^0-9a-z]", "", _ANSI.sub("", text).lower())


def _code_segments(line):
    """The parts of a line of code between its string literals (a message printed as it is meant
    to be is no leak; the code around it is)."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return [] if ('"' in line or "'" in line) else [line]
    segments, current = [], []
    for tok in tokens:
        if tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_START", -1):
            segments.append(" ".join(current))
            current = []
        elif tok.type not in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER, tokenize.COMMENT):
            current.append(tok.string)
    segments.append(" ".join(current))
    return segments


def hidden_fragments(nb, min_chars=16):
    """The pieces of code of the notebook's hidden tests that could identify them: each line's
    code between its string literals, normalised, of at least `min_chars` letters and digits,
    less those that also appear outside the hidden tests (the released text is no secret)."""
    hidden, visible = [], []
    begin, end = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
    for cell in nb.cells:
        inside = False
        for line in cell.source.splitlines():
            if begin in line:
                inside = True
            elif end in line:
                inside = False
            elif inside:
                hidden.append(line)
            else:
                visible.append(line)
    seen = "\n".join(_normal(v) for v in visible)
    out, encoded = set(), set()
    for line in hidden:
        if not line.strip() or line.strip().startswith("#"):
            continue
        secret = False
        for segment in _code_segments(line):
            frag = _normal(segment)
            if len(frag) >= min_chars and frag not in seen:
                out.add(frag)
                secret = True
        if secret:
            # the line in base64, at each of the three alignments it can have inside a longer
            # text (the last, partial block left out); and with its indentation stripped
            for text in {line + "\n", line.strip() + "\n"}:
                for k in range(3):
                    b64 = base64.b64encode(text[k:].encode())[:-4].decode()
                    if len(b64) >= min_chars:
                        encoded.add(b64)
    return Fragments(sorted(out), sorted(encoded))


class Fragments(list):
    """hidden_fragments' normalised fragments, and `encoded`: the base64 forms of their lines."""

    def __init__(self, fragments=(), encoded=()):
        super().__init__(fragments)
        self.encoded = list(encoded)


def _output_text(out):
    parts = [out.get("text", ""), out.get("evalue", ""), "\n".join(out.get("traceback", []))]
    for value in (out.get("data") or {}).values():
        parts.append(value if isinstance(value, str) else "".join(value) if isinstance(value, list) else str(value))
    return "\n".join(p if isinstance(p, str) else "".join(p) for p in parts)


def _has(text, fragments):
    """Whether the text repeats a fragment: as it is, reversed, or (whitespace and escaped line
    breaks aside) in base64."""
    norm = _normal(text)
    if any(f in norm or f[::-1] in norm for f in fragments):
        return True
    encoded = getattr(fragments, "encoded", ())
    if encoded:
        compact = re.sub(r"\s|\\n", "", text)
        return any(e in compact for e in encoded)
    return False


def scrub_outputs(nb, fragments):
    """Replace every output that contains a hidden-test fragment; returns how many.

    The traceback of a failed test cell shows the test's own code; it stays for the instructor
    (feedback shows only the error's name and message for test cells), and only a message that
    repeats hidden code is replaced. Elsewhere a traceback that repeats hidden code goes too."""
    count = 0
    if not fragments:
        return 0
    for cell in nb.cells:
        test_cell = utils.is_grade(cell) and not utils.is_solution(cell)
        for k, out in enumerate(cell.get("outputs", [])):
            if out.get("output_type") == "error":
                evalue = _has(out.get("evalue", ""), fragments)
                trace = not test_cell and _has("\n".join(out.get("traceback", [])), fragments)
                if evalue:
                    out["evalue"] = HIDDEN_NOTICE
                if evalue or trace:
                    count += 1
                    out["traceback"] = [f"{out.get('ename', 'Error')}: {out['evalue']}"]
            elif _has(_output_text(out), fragments):
                count += 1
                cell.outputs[k] = NotebookNode(output_type="stream", name="stdout", text=HIDDEN_NOTICE + "\n")
    return count


def scrub_files(folder, fragments, since, max_bytes=50 * 2 ** 20):
    """Blank every file in `folder` written since `since` (the kernel's run) that contains a
    hidden-test fragment; returns their paths."""
    found = []
    if not fragments:
        return found
    for base, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(base, name)
            try:
                st = os.lstat(path)
                if not os.path.isfile(path) or os.path.islink(path) or st.st_mtime < since or st.st_size > max_bytes:
                    continue
                with open(path, "rb") as fh:
                    text = fh.read().decode("utf-8", "replace")
            except OSError:
                continue
            if _has(text, fragments):
                with open(path, "w") as fh:
                    fh.write(HIDDEN_NOTICE + "\n")
                found.append(path)
    return found


# the output types that stay in a graded notebook: no markup, no script (SVG can hold script)
INERT_TYPES = ("text/plain", "image/png", "image/jpeg", "image/gif")
INERT_NOTICE = "[removed from the graded notebook: an output of type {types}, which a browser would run or render]"


def neutralise_outputs(nb):
    """Keep only inert types (INERT_TYPES) in every display output of the notebook; returns how
    many outputs lost something."""
    count = 0
    # the state of widgets (rendered by a widget manager in the feedback's HTML)
    if nb.get("metadata", {}).pop("widgets", None) is not None:
        count += 1
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data")
            if out.get("output_type") not in ("display_data", "execute_result", "update_display_data") or data is None:
                continue
            dropped = sorted(k for k in data if k not in INERT_TYPES)
            if not dropped:
                continue
            count += 1
            for k in dropped:
                del data[k]
            for k in dropped:
                out.get("metadata", {}).pop(k, None)
            if not data:
                data["text/plain"] = INERT_NOTICE.format(types=", ".join(dropped))
    return count


def _error(ename, evalue):
    return NotebookNode(output_type="error", ename=ename, evalue=evalue, traceback=[f"{ename}: {evalue}"])


class SandboxedExecute(Execute):
    """nbgrader's Execute preprocessor with kernels from SandboxedKernelManager, a time budget per
    cell and per notebook, recovery from a kernel that must be killed, and sealed outputs (see the
    module's docstring)."""

    timeout = Integer(60, allow_none=True, help=(
        "Seconds a cell may run before it is stopped (its test scores 0).")).tag(config=True)
    submission_timeout = Integer(300, allow_none=True, help=(
        "Seconds all cells of a notebook may run together; cells left when it is used up are not "
        "run and score 0. None or 0: no budget.")).tag(config=True)
    interrupt_grace = Float(5.0, help=(
        "Seconds a stopped cell has to react to the interrupt before its kernel is killed.")).tag(config=True)
    reply_grace = Float(10.0, help=(
        "Seconds to wait for the kernel's reply once the kernel has reported the cell finished "
        "(status idle); after that the cell counts as finished (a lost reply, as with widget "
        "cells, jupyter/nbclient#312, would otherwise hold the cell until its timeout).")).tag(config=True)
    seal = Bool(True, help=(
        "Run test cells outside IPython's history and replace outputs (and files left in the "
        "working folder) that repeat hidden test code.")).tag(config=True)

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)

    # ---- one notebook --------------------------------------------------------------------------
    def preprocess(self, nb, resources=None, km=None):
        self._deadline = None
        self._ran = []            # indices of the cells that finished in the current kernel's run
        self._kernel_lost = False
        self._stops = []
        self.iopub_timeout = max(self.iopub_timeout, int(math.ceil(self.interrupt_grace)))
        self.timeout_func = self._cell_timeout
        started = time.time()
        nb, resources = super().preprocess(nb, resources, km)
        n = neutralise_outputs(nb)
        if n:
            self.log.warning("%d output(s) held HTML, script or other active types: kept as plain text", n)
        if self.seal:
            fragments = hidden_fragments(nb)
            n = scrub_outputs(nb, fragments)
            path = (resources or {}).get("metadata", {}).get("path")
            files = scrub_files(path, fragments, started) if path else []
            if n or files:
                self.log.warning("%d output(s) and %d file(s) repeated hidden test code: replaced", n, len(files))
        return nb, resources

    def _budget_left(self):
        if self._deadline is None:
            return math.inf
        return self._deadline - time.monotonic()

    def _cell_timeout(self, cell):
        left = self._budget_left()
        cap = self.timeout if self.timeout and self.timeout > 0 else math.inf
        t = min(cap, left)
        return None if t == math.inf else max(1, int(math.ceil(t)))

    def _memory_gib(self):
        if self.km is not None:              # None once a kernel is killed: keep what it had
            self._gib = getattr(self.km, "memory_limit_gib", 0) or 0
        return getattr(self, "_gib", 0)

    def preprocess_cell(self, cell, resources, index):
        self._check_assign_resources(resources)
        if cell.cell_type != "code" or not cell.source.strip():
            return cell, self.resources
        if self._deadline is None and self.submission_timeout and self.submission_timeout > 0:
            self._deadline = time.monotonic() + self.submission_timeout
        if self._budget_left() <= 0:
            cell.outputs = [_error(NOT_RUN, (
                f"not run: the notebook used up its time budget of {self.submission_timeout} s "
                "(an earlier cell ran too long)"))]
            return cell, self.resources
        if self._kernel_lost and not self._restart_and_replay():
            cell.outputs = [_error(NOT_RUN, (
                "not run: the kernel was stopped and the cells before this one could not be run "
                f"again within the notebook's time budget of {self.submission_timeout} s"))]
            return cell, self.resources
        status = self._run(cell, index, store_history=not self._is_test(cell))
        if status == "ok":
            self._ran.append(index)
        return cell, self.resources

    def _is_test(self, cell):
        return self.seal and utils.is_grade(cell) and not utils.is_solution(cell)

    def _run(self, cell, index, store_history=True):
        """Execute one cell within its time budget: 'ok' (finished, with or without an error),
        'stopped' (ran too long) or 'lost' (the kernel died or had to be killed)."""
        timeout = self._cell_timeout(cell)
        t0 = time.monotonic()
        try:
            self.execute_cell(cell, index, store_history=store_history)
        except CellTimeoutError:
            # the interrupt did not stop it (SIGINT ignored or caught): kill the kernel
            self._kill_kernel()
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "error"]
            cell.outputs.append(self._stopped(timeout, killed=True))
            return "lost"
        except DeadKernelError:
            gib = self._memory_gib()
            self._kill_kernel()
            limit = f" (or exceeded its memory limit of {_gib(gib)})" if gib else ""
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "error"]
            cell.outputs.append(_error(MEMORY if gib else "KernelDied", f"the kernel died while this cell ran{limit}"))
            return "lost"
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if any(o.get("ename") == "CellTimeoutError" for o in errors):
            # stopped by the interrupt: the kernel lives on
            cell.outputs = [o for o in cell.outputs if o.get("output_type") != "error"]
            cell.outputs.append(self._stopped(timeout, killed=False))
            self.log.warning("cell %d stopped after %.0f s", index, time.monotonic() - t0)
            return "stopped"
        gib = self._memory_gib()
        for o in errors:
            if o.get("ename") == "MemoryError" and gib:
                o["ename"] = MEMORY
                o["evalue"] = f"exceeded {_gib(gib)}: the cell asked for more memory than a submission may use ({_gib(gib)})"
                o["traceback"] = [f"{MEMORY}: {o['evalue']}"]
        return "ok"

    def _stopped(self, timeout, killed):
        why = "the cell's limit" if timeout is not None and (self.timeout or 0) <= timeout + 1 else "the notebook's time budget"
        how = " (it ignored the interrupt, so its kernel was stopped)" if killed else ""
        self._stops.append(timeout)
        return _error(STOPPED, f"stopped after {timeout} s ({why}){how}")

    def _cleanup_kernel(self):
        if self.km is not None:          # None: already stopped (a cell was stopped last)
            Execute._cleanup_kernel(self)

    def _kill_kernel(self):
        self.log.warning("stopping the kernel of a cell that ran too long or died")
        mode, self.shutdown_kernel = self.shutdown_kernel, "immediate"
        try:
            self._cleanup_kernel()
        except Exception as exc:          # a kernel that is already gone
            self.log.debug("cleanup: %s", exc)
        finally:
            self.shutdown_kernel = mode
        self.km = self.kc = None
        self._kernel_lost = True

    def _restart_and_replay(self):
        """A new kernel, then the cells that had finished, run again without keeping their
        outputs; False if that does not finish within the budget."""
        self.log.warning("starting a new kernel and running %d earlier cells again", len(self._ran))
        self.km = self.create_kernel_manager()
        self.start_new_kernel()
        self.start_new_kernel_client()
        self._kernel_lost = False
        ran, self._ran = self._ran, []
        for i in ran:
            original = self.nb.cells[i]
            again = copy.deepcopy(original)
            status = self._run(again, i, store_history=not self._is_test(original))
            self.nb.cells[i] = original
            if status != "ok":
                if self._kernel_lost:
                    self._kill_kernel()
                return False
            self._ran.append(i)
        return True

    # ---- a lost reply ----------------------------------------------------------------------------
    async def _async_poll_for_reply(self, msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive):
        reply = asyncio.ensure_future(super()._async_poll_for_reply(
            msg_id, cell, timeout, task_poll_output_msg, task_poll_kernel_alive))
        try:
            await asyncio.wait({reply, task_poll_output_msg}, return_when=asyncio.FIRST_COMPLETED)
            if reply.done() or task_poll_output_msg.cancelled() or task_poll_output_msg.exception() is not None:
                return await reply
            try:
                return await asyncio.wait_for(asyncio.shield(reply), self.reply_grace)
            except asyncio.TimeoutError:
                pass
            # the kernel said idle but its reply did not come
            self.log.warning("no execute reply %.0f s after the kernel went idle: counting the cell as finished",
                             self.reply_grace)
            reply.cancel()
            task_poll_kernel_alive.cancel()
            errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
            content = {"status": "error", "ename": errors[-1].ename, "evalue": errors[-1].evalue,
                       "traceback": errors[-1].traceback} if errors else {"status": "ok"}
            return {"content": content, "parent_header": {"msg_id": msg_id}, "header": {}, "metadata": {}}
        finally:
            if not reply.done():
                reply.cancel()


# ---------------------------------------------------------------------------------------------
# Inert Markdown: a student's Markdown and raw cells are shown as HTML to the instructor (formgrader,
# logged in) and to the student (feedback). nbconvert renders Markdown with its raw HTML passed
# through, so a cell holding `<script>` or `<img onerror=...>` would run in those browsers.

def _raw_html(tokens):
    for token in tokens:
        if token.get("type") in ("inline_html", "block_html"):
            yield token["raw"]
        yield from _raw_html(token.get("children") or ())


# tags that only format, written without attributes (an attribute can hold an event handler), are kept:
# `<details><summary>` for a hint, `<sub>`, `<br>` ...
PLAIN_TAGS = ("b", "i", "em", "strong", "u", "s", "sub", "sup", "br", "hr", "p", "kbd", "code", "pre", "blockquote",
              "details", "summary", "ul", "ol", "li", "dl", "dt", "dd", "table", "thead", "tbody", "tr", "th", "td",
              "h1", "h2", "h3", "h4", "h5", "h6", "center", "small", "mark")
_PLAIN_TAG = re.compile(r"</?(?:%s)\s*/?>" % "|".join(PLAIN_TAGS), re.IGNORECASE)


def _plain_html(piece):
    """Raw HTML made only of PLAIN_TAGS without attributes (and text): it cannot run anything."""
    return "<" not in _PLAIN_TAG.sub("", piece)


def _urls(tokens):
    for token in tokens:
        url = (token.get("attrs") or {}).get("url")
        if token.get("type") in ("link", "image") and url is not None:
            yield url
        yield from _urls(token.get("children") or ())


def _unsafe_url(url):
    """A URL a browser would run (javascript:, vbscript:, data: other than raster images, ...):
    nbconvert renders Markdown links with whatever protocol they name."""
    from mistune.renderers.html import HTMLRenderer
    return not url.startswith("attachment:") and HTMLRenderer().sanitize_url(url) != url


def inert_markdown(source, attachments=None):
    """`source` (a Markdown cell's text) with every piece of raw HTML in it turned into text (its
    `<` written `&lt;`, so it shows as typed and never runs), unless it is made only of formatting
    tags without attributes (PLAIN_TAGS), and every link or image whose URL a
    browser would run (`javascript:` ...) pointed at nothing, parsed as nbconvert parses Markdown
    for HTML (math and code are not HTML); an image of a missing attachment, which would stop
    nbconvert's HTML export, links to nothing too. Text that stays live after that (written to
    hide from the parser) is shown whole as a code block. Unchanged when the cell has none of it."""
    from nbconvert.filters.markdown_mistune import MarkdownWithMath

    def parse(text):
        return MarkdownWithMath(renderer=None)(text)

    tokens = parse(source)
    for url in {u for u in _urls(tokens) if u.startswith("attachment:")}:
        if url[len("attachment:"):] not in (attachments or {}):
            source = source.replace(url, "#missing-attachment")
    for _ in range(4):
        tokens = parse(source)
        raw = sorted({h for h in _raw_html(tokens) if not _plain_html(h)}, key=len, reverse=True)
        urls = sorted({u for u in _urls(tokens) if _unsafe_url(u)}, key=len, reverse=True)
        if not raw and not urls:
            return source
        for piece in raw:
            source = source.replace(piece, piece.replace("<", "&lt;"))
        for url in urls:
            source = source.replace(url, "#unsafe-link")
    fence = "~" * (max(map(len, re.findall("~+", source)), default=0) + 3)
    return f"{fence}\n{source}\n{fence}"


class InertCells(NbGraderPreprocessor):
    """Autograde: the Markdown cells of a graded notebook carry no raw HTML (`inert_markdown`), its
    raw cells are not passed to the HTML page as HTML (their format is removed), and a cell's
    nbgrader grade id (written into the formgrader's and the feedback's pages as it is) is made
    of letters, digits, `_`, `-` and `.` or the cell loses its nbgrader metadata, so what a student
    wrote shows as text in the formgrader and the feedback and runs nowhere."""

    def preprocess_cell(self, cell, resources, index):
        meta = cell.metadata.get("nbgrader")
        if meta is not None and not (isinstance(meta, dict)
                                     and re.fullmatch(r"[A-Za-z0-9_.\-]+", str(meta.get("grade_id", "")))):
            self.log.warning("cell %d: nbgrader metadata with a grade id that is not a plain name; removed", index)
            del cell.metadata["nbgrader"]
        if cell.cell_type == "markdown":
            source = inert_markdown(cell.source, cell.get("attachments"))
            if source != cell.source:
                self.log.warning("a Markdown cell held raw HTML: it is kept as text (cell %d)", index)
                cell.source = source
        elif cell.cell_type == "raw":
            for key in ("format", "raw_mimetype"):
                cell.metadata.pop(key, None)
        return cell, resources
