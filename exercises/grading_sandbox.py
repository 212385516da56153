"""Autograding in a sandbox: each submission's kernel runs under bubblewrap (`bwrap`).

`nbgrader autograde` executes student code. Under `SandboxedExecute` (set in nbgrader_config.py)
each kernel starts inside a bubblewrap sandbox where it
- sees the operating system read-only (/usr, /etc, /lib..., /opt, /sys), the Python it runs on
  (its virtual environment and base installation), gpclab.py with its `__pycache__` and numba's
  cache folder (`$NUMBA_CACHE_DIR`), all read-only, and nothing else of the machine: no home
  folders, no /work or /srv, no course folder (source/, submitted/, gradebook.db), no exchange;
- writes only to its own working folder and to a private, empty HOME, /tmp, /var/tmp and /dev/shm,
  all tmpfs that vanish with it; the working folder (the kernel sees it as
  /home/student/<assignment>) holds a copy of the files handed in (nbgrader's
  `autograded/<student>/<assignment>/`, bound read-only at /run/submission), so nothing the kernel
  writes reaches autograded/, the formgrader or the feedback: nbgrader writes the graded notebook
  from what it received, and autograded/ holds only what was handed in and the graded notebooks;
- has no network (it talks to nbgrader over Unix sockets in a private folder instead of TCP), no
  view of other processes, and no capabilities on the machine, even when autograde runs as root.

Each sandbox is also bounded (SandboxedExecute, SandboxedKernelManager):
- time: `SandboxedExecute.timeout` seconds per cell (default 60) and `submission_timeout` seconds
  for all cells of a notebook (default 300). A cell that runs longer is interrupted; if it ignores
  the interrupt (SIGINT), its kernel is killed, a new one is started and the cells that finished
  before are run again (their outputs kept from the first run), and grading goes on with the next
  cell. The cell that was stopped, and every cell left when the budget is used up, shows an error
  ("stopped after 60 s", "not run: ...") and so scores 0; finished cells keep their grades.
- memory and processes, for the whole sandbox (the kernel and every process it starts): where the
  grader can make control groups (cgroup v1 as root; a v2 group delegated to the grader; else a
  transient systemd scope, `systemd-run --scope`, where systemd runs the machine), each
  sandbox gets one of its own with `SandboxedKernelManager.memory_limit_gib` (default 2 GiB; swap
  included where the kernel accounts it) and `tasks_limit` (default 64 processes and threads), and
  the group is removed with the kernel (also when the kernel was killed). Beyond the memory the
  kernel's OOM killer stops a process of the sandbox (a child, or the kernel: "exceeded 2 GiB");
  beyond the tasks fork() fails. Each process is also held to `memory_limit_gib` of allocations
  (RLIMIT_DATA: heap and anonymous memory; beyond it MemoryError, which the cell reports as
  "exceeded 2 GiB"). Without control groups (`use_cgroup = False`, or none can be made) only the
  per-process limits hold: RLIMIT_DATA for each process, and `tasks_limit` as RLIMIT_NPROC counted
  in the sandbox's own user namespace; a root grader's kernel then runs as `sandbox_uid` (65534),
  since root is exempt from RLIMIT_NPROC. Which one is in force is logged for every kernel.
- disk: /tmp, /var/tmp, /dev/shm and HOME are tmpfs of `tmp_size_mib` (256 MiB) each, the working
  folder one of `work_size_mib` (256 MiB), /dev is read-only, and a process may write no file
  larger than `file_size_mib` (64 MiB, RLIMIT_FSIZE; the write fails with "File too large").
- output: `SandboxedExecute.cell_output_mib` (1 MiB) of a cell's output is kept and
  `notebook_output_mib` (10 MiB) of the notebook's; the rest is dropped as it arrives, with a
  notice at the end of the cell's outputs saying how much ("[grading: 199.0 MiB more output of
  this cell dropped: ...]"). Errors are kept (message and traceback cut to 64 KiB), so a test cell
  that fails still scores 0.
- environment: the kernel gets only the variables named in `SandboxedKernelManager.env_keep`
  (PATH, PYTHONPATH, locale, numba's and the BLAS libraries' settings, NBGRADER_EXECUTION), with one
  BLAS/numba thread unless configured otherwise.
- sealed output: graded test cells run without entering IPython's history (`In`, `_ih`, the
  history manager), and every output of the graded notebook (and every text file the kernel leaves
  in its working folder) that repeats a line of a hidden test is replaced by a notice. The
  student's feedback (SealedFeedback, with feedback_without_files) is composed by the grader: one
  line per test cell (passed / failed / stopped, the error's type, the instructor's own message
  texts with a few short numbers), no outputs of cells that ran after the first hidden test, no
  file the kernel wrote: nothing student code printed or wrote after it could have read a hidden
  test.
- guarded test cells (SandboxedExecute.guard): before each test cell the kernel's IPython hooks,
  trace functions, built-ins and library functions are put back as they were after the setup
  cells; a test passes only if its last statement (a random marker the grader appends) ran; a
  test during which student code installed such a hook scores 0 ("ChangedHowCellsRun").

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
import ast
import asyncio
import base64
import builtins
import contextlib
import copy
import importlib.util
import io
import json
import math
import os
import re
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import tokenize

from jupyter_client.manager import AsyncKernelManager
from nbclient.exceptions import CellTimeoutError, DeadKernelError
from jupyter_core.utils import ensure_async, run_sync
from nbformat.notebooknode import NotebookNode
from nbgrader import utils
from nbgrader.preprocessors import ClearHiddenTests, Execute, NbGraderPreprocessor
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
# Run before bubblewrap, as the grader (python -I -S -c _LIMIT SPEC CMD...): joins the sandbox's
# control group (everything started from here on is counted in it), sets the per-process limits,
# opens the working folder (bound into the sandbox by its descriptor); then becomes bubblewrap.
_LIMIT = """\
import json, os, resource, sys
spec, cmd = json.loads(sys.argv[1]), sys.argv[2:]
for path in spec.get("join", ()):
    with open(path, "w") as fh:
        fh.write(str(os.getpid()))
for name, n in spec.get("rlimits", {}).items():
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (n, n))
if spec.get("work"):
    fd = os.open(spec["work"], os.O_RDONLY | os.O_DIRECTORY)
    os.set_inheritable(fd, True)
    cmd = [str(fd) if a == "@WORKFD@" else a for a in cmd]
os.execv(cmd[0], cmd)
"""
# Run inside the sandbox before the kernel (python -I -S -c _INNER SPEC CMD...): copies the files
# handed in (regular files and folders only, following no symbolic link) (bound read-only at SUBMISSION) into the working folder, a size-capped tmpfs, sets the
# limits that must be counted inside the sandbox (RLIMIT_NPROC in the fallback, as an unprivileged
# user when the grader is root), becomes the kernel.
_INNER = """\
import json, os, resource, shutil, sys
spec, cmd = json.loads(sys.argv[1]), sys.argv[2:]
def copy_regular(src, dst):
    # regular files and folders only, no link followed: a symbolic link, FIFO or device is left out
    for entry in sorted(os.scandir(src), key=lambda e: e.name):
        target = os.path.join(dst, entry.name)
        try:
            if entry.is_dir(follow_symlinks=False):
                os.mkdir(target)
                copy_regular(entry.path, target)
            elif entry.is_file(follow_symlinks=False):
                shutil.copy2(entry.path, target, follow_symlinks=False)
            else:
                print(f"grading sandbox: {target} was not copied into the working folder: not a regular file",
                      file=sys.stderr)
        except OSError as exc:
            print(f"grading sandbox: {target} was not copied into the working folder: {exc}", file=sys.stderr)
copy_regular(spec["copy_from"], ".")
uid = spec.get("uid")
if uid is not None:
    # the fallback of a root grader: the kernel becomes an unprivileged user (root is exempt from
    # RLIMIT_NPROC) in a user namespace of its own (so that only this sandbox's processes count)
    for base, dirs, files in os.walk("."):
        for name in dirs + files:
            os.chown(os.path.join(base, name), uid, uid, follow_symlinks=False)
    for path in spec["own"]:
        os.chown(path, uid, uid)
    for path in spec["shared"]:
        os.chmod(path, 0o1777)
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)
    import ctypes
    if ctypes.CDLL(None, use_errno=True).unshare(0x10000000) != 0:
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWUSER) failed")
for name, n in spec.get("rlimits", {}).items():
    resource.setrlimit(getattr(resource, "RLIMIT_" + name), (n, n))
os.execv(cmd[0], cmd)
"""
# where the kernel sees the files handed in (read-only); its working folder holds a copy of them
SUBMISSION = "/run/submission"
# the prefix of the control groups made for sandboxes (then the grader's pid and a counter)
CGROUP_PREFIX = "gpclab-sandbox"


def _gib(x):
    return f"{x:g} GiB"


def _mib(n):
    return f"{n / 2 ** 20:g} MiB"


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


# ---- control groups: memory and processes counted for a whole sandbox ------------------------------
class CgroupUnavailable(RuntimeError):
    pass


def _cgroup_mounts():
    """[(mount point, file system type, super options, root within the hierarchy)] of the cgroup
    file systems this process sees."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            left, _, right = line.partition(" - ")
            fields, tail = left.split(), right.split()
            if tail and tail[0] in ("cgroup", "cgroup2"):
                found.append((fields[4].replace("\\040", " "), tail[0],
                              tail[2].split(",") if len(tail) > 2 else [], fields[3]))
    return found


def _own_cgroups():
    """{controller: this process's group} ('' for the unified, version 2, hierarchy)."""
    own = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for c in controllers.split(",") if controllers else [""]:
                own[c] = path
    return own


def _under(mount, root, path):
    rel = path[len(root):] if root != "/" and path.startswith(root) else path
    return os.path.join(mount, rel.lstrip("/"))


def _cgroup_parents():
    """('v1', {'memory': folder, 'pids': folder}) or ('v2', {'': folder}): where this process may
    make its sandboxes' groups (below its own group); CgroupUnavailable says why not."""
    try:
        mounts, own = _cgroup_mounts(), _own_cgroups()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read this process's control groups: {exc}") from None
    v1 = {}
    for point, fstype, options, root in mounts:
        for ctrl in ("memory", "pids"):
            if fstype == "cgroup" and ctrl in options and ctrl in own:
                v1[ctrl] = _under(point, root, own[ctrl])
    if len(v1) == 2 and all(os.path.isdir(d) for d in v1.values()):
        if all(os.access(d, os.W_OK) for d in v1.values()):
            return "v1", v1
        raise CgroupUnavailable(f"no permission to make control groups in {', '.join(sorted(v1.values()))}")
    for point, fstype, options, root in mounts:
        if fstype == "cgroup2" and "" in own:
            parent = _under(point, root, own[""])
            try:
                with open(os.path.join(parent, "cgroup.controllers")) as fh:
                    available = fh.read().split()
            except OSError:
                continue
            if not {"memory", "pids"} <= set(available):
                continue
            if not os.access(parent, os.W_OK):
                raise CgroupUnavailable(f"no permission to make control groups in {parent} (not delegated)")
            return "v2", {"": parent}
    raise CgroupUnavailable("no memory and pids controllers (cgroup v1 or v2) this process may use")


class Cgroup:
    """One sandbox's control group: its memory (with swap, where the kernel accounts it) and its
    number of tasks (processes and threads) are limited for everything started in it."""

    _count = 0

    def __init__(self, version, dirs):
        self.version, self.dirs = version, dict(dirs)

    @classmethod
    def create(cls, memory_bytes, tasks):
        version, parents = _cgroup_parents()
        cls._count += 1
        name = f"{CGROUP_PREFIX}-{os.getpid()}-{cls._count}-{os.urandom(3).hex()}"
        group = cls(version, {})
        try:
            for ctrl, parent in parents.items():
                _prune_cgroups(parent)
                path = os.path.join(parent, name)
                os.mkdir(path)
                group.dirs[ctrl] = path
            group._limit(memory_bytes, tasks)
        except OSError as exc:
            group.remove()
            raise CgroupUnavailable(f"cannot make a control group ({version}): {exc}") from None
        return group

    def _write(self, ctrl, name, value):
        with open(os.path.join(self.dirs[ctrl], name), "w") as fh:
            fh.write(str(value))

    def _limit(self, memory_bytes, tasks):
        if self.version == "v1":
            if memory_bytes:
                self._write("memory", "memory.limit_in_bytes", memory_bytes)
                if os.path.exists(os.path.join(self.dirs["memory"], "memory.memsw.limit_in_bytes")):
                    self._write("memory", "memory.memsw.limit_in_bytes", memory_bytes)
            if tasks:
                self._write("pids", "pids.max", tasks)
        else:
            parent = os.path.dirname(self.dirs[""])
            with open(os.path.join(parent, "cgroup.subtree_control")) as fh:
                enabled = set(fh.read().split())
            missing = {"memory", "pids"} - enabled
            if missing:        # fails (EBUSY) where the parent holds processes itself
                with open(os.path.join(parent, "cgroup.subtree_control"), "w") as fh:
                    fh.write(" ".join("+" + c for c in sorted(missing)))
            if memory_bytes:
                self._write("", "memory.max", memory_bytes)
                if os.path.exists(os.path.join(self.dirs[""], "memory.swap.max")):
                    self._write("", "memory.swap.max", 0)
            if tasks:
                self._write("", "pids.max", tasks)

    def join_files(self):
        """The files a process writes its pid into to enter the group."""
        return [os.path.join(d, "cgroup.procs") for d in self.dirs.values()]

    def pids(self):
        found = set()
        for path in self.join_files():
            with contextlib.suppress(OSError, ValueError), open(path) as fh:
                found.update(int(x) for x in fh.read().split())
        return found

    def oom_kills(self):
        """How many processes of the group the kernel's OOM killer stopped (None: not known)."""
        ctrl = "memory" if self.version == "v1" else ""
        name = "memory.oom_control" if self.version == "v1" else "memory.events"
        with contextlib.suppress(OSError, KeyError, ValueError), open(os.path.join(self.dirs[ctrl], name)) as fh:
            for line in fh:
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
        return None

    def remove(self, timeout=10.0):
        """Stop every process left in the group and remove it; False if it could not be removed."""
        deadline = time.monotonic() + timeout
        while self.dirs:
            kill = os.path.join(self.dirs.get("", ""), "cgroup.kill")
            if self.version == "v2" and os.path.exists(kill):
                with contextlib.suppress(OSError), open(kill, "w") as fh:
                    fh.write("1")
            for pid in self.pids():
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
            for ctrl, path in list(self.dirs.items()):
                try:
                    os.rmdir(path)
                except FileNotFoundError:
                    pass
                except OSError:
                    continue
                del self.dirs[ctrl]
            if not self.dirs or time.monotonic() > deadline:
                break
            time.sleep(0.05)
        return not self.dirs


def _prune_cgroups(parent, age=60.0):
    """Remove empty sandbox groups in `parent` left by graders that were killed (a group of a
    process that still runs, or younger than `age` seconds, is left alone)."""
    with contextlib.suppress(OSError):
        for name in os.listdir(parent):
            if not name.startswith(CGROUP_PREFIX + "-"):
                continue
            try:
                pid = int(name.split("-")[2])
                os.kill(pid, 0)
                continue                                    # its grader runs
            except (ValueError, IndexError):
                continue
            except ProcessLookupError:
                pass
            except PermissionError:
                continue
            path = os.path.join(parent, name)
            with contextlib.suppress(OSError):
                if time.time() - os.stat(path).st_mtime > age:
                    os.rmdir(path)                          # fails unless empty


_SYSTEMD = {}


def _systemd_scope(memory_bytes, tasks):
    """The systemd-run command that runs a command in a transient scope of its own with these
    limits (cgroup v2 under systemd, where the grader cannot make groups itself), and the scope's
    name; None where systemd does not run or refuses (tried once per process)."""
    exe = shutil.which("systemd-run")
    if exe is None or not os.path.isdir("/run/systemd/system"):
        return None
    user = ["--user"] if os.geteuid() != 0 else []
    props = []
    if memory_bytes:
        props += ["-p", f"MemoryMax={memory_bytes}", "-p", "MemorySwapMax=0"]
    if tasks:
        props += ["-p", f"TasksMax={tasks}"]
    base = [exe, *user, "--scope", "--quiet", "--collect", *props]
    if "ok" not in _SYSTEMD:
        try:
            probe = subprocess.run(base + ["--", "/bin/true"], capture_output=True, timeout=30)
            _SYSTEMD["ok"] = probe.returncode == 0
        except (OSError, subprocess.SubprocessError):
            _SYSTEMD["ok"] = False
    if not _SYSTEMD["ok"]:
        return None
    Cgroup._count += 1
    unit = f"{CGROUP_PREFIX}-{os.getpid()}-{Cgroup._count}-{os.urandom(3).hex()}"
    return base + ["--unit", unit, "--"], unit


def _stop_scope(unit):
    user = ["--user"] if os.geteuid() != 0 else []
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run(["systemctl", *user, "stop", f"{unit}.scope"], capture_output=True, timeout=30)


# the bounds the last kernel of this process started with (grade.py's log and summary)
LAST_BOUNDS = None


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
        "The memory a sandbox may use, in GiB: for all its processes together (a control group, "
        "where the grader can make one), and for each process's allocations (RLIMIT_DATA: heap and "
        "anonymous mappings), beyond which they raise MemoryError. 0: no limit.")).tag(config=True)
    tasks_limit = Integer(64, help=(
        "Processes and threads a sandbox may run at once (a control group's pids.max; without "
        "one, RLIMIT_NPROC counted in the sandbox). 0: no limit.")).tag(config=True)
    use_cgroup = Bool(True, help=(
        "Bound each sandbox by a control group of its own when the grader can make one (cgroup v1 "
        "or a delegated v2); False: per-process limits only.")).tag(config=True)
    sandbox_uid = Integer(65534, help=(
        "Without a control group, a grader running as root runs the sandbox as this unprivileged "
        "user, so that RLIMIT_NPROC applies (root is exempt from it).")).tag(config=True)
    tmp_size_mib = Integer(256, help=(
        "Size of the sandbox's /tmp, /var/tmp, /dev/shm and home (each a tmpfs), MiB.")).tag(config=True)
    work_size_mib = Integer(256, help=(
        "Size of the working folder (a tmpfs holding a copy of the files handed in; what the "
        "kernel writes there vanishes with it), MiB.")).tag(config=True)
    file_size_mib = Integer(64, help=(
        "The largest file a sandbox's process may write (RLIMIT_FSIZE), MiB. 0: no limit.")).tag(config=True)
    env_keep = List(Unicode(), list(ENV_KEEP), help=(
        "The environment variables a kernel keeps from the grader's (a trailing * matches a "
        "prefix); all others are dropped.")).tag(config=True)

    _sandbox_dir = None
    _cgroup = None
    _scope = None
    bounds = None

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
        global LAST_BOUNDS
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
        cmd = [shutil.which(cmd[0], path=env.get("PATH")) or cmd[0]] + list(cmd[1:])
        memory = int(self.memory_limit_gib * 2 ** 30) if self.memory_limit_gib and self.memory_limit_gib > 0 else 0
        tasks = max(0, self.tasks_limit or 0)
        outer = {"rlimits": {}}
        if memory:
            outer["rlimits"]["DATA"] = memory
        # the largest file: set in the sandbox once the files handed in are copied (a data file
        # handed in may be larger), or here without a sandbox
        fsize = {"FSIZE": self.file_size_mib * 2 ** 20} if self.file_size_mib and self.file_size_mib > 0 else {}
        if bwrap is None:
            outer["rlimits"].update(fsize)
        # memory and tasks for the whole sandbox: a control group of its own
        self._remove_cgroup()
        reason = "cgroups turned off (SandboxedKernelManager.use_cgroup = False)"
        if self.use_cgroup and (memory or tasks):
            try:
                self._cgroup = Cgroup.create(memory, tasks)
                outer["join"] = self._cgroup.join_files()
            except CgroupUnavailable as exc:
                reason = str(exc)
                scope = _systemd_scope(memory, tasks)
                if scope is not None:
                    scope_cmd, self._scope = scope
        limits = f"{_gib(self.memory_limit_gib) if memory else 'no memory limit'}, {tasks or 'any number of'} tasks"
        if self._cgroup is not None:
            self.bounds = f"cgroup {self._cgroup.version} for the whole sandbox ({limits})"
        elif self._scope is not None:
            self.bounds = f"systemd scope {self._scope} for the whole sandbox ({limits})"
        if bwrap is not None:
            cwd = os.path.abspath(kw.get("cwd") or os.getcwd())
            inner = {"copy_from": SUBMISSION, "rlimits": dict(fsize)}
            uid = None
            if self._cgroup is None and self._scope is None:
                # no group: processes counted by RLIMIT_NPROC in the sandbox's own user
                # namespace; root is exempt from it, so a root grader's kernel runs as a user
                if tasks:
                    inner["rlimits"]["NPROC"] = tasks
                    if os.geteuid() == 0:
                        uid = self.sandbox_uid
                        inner.update(uid=uid, own=[".", HOME], shared=["/tmp", "/var/tmp", "/dev/shm"])
                self.bounds = (f"per process (RLIMIT_DATA {_gib(self.memory_limit_gib) if memory else 'none'}), "
                               + (f"RLIMIT_NPROC {tasks} in the sandbox" + (f" as uid {uid}" if uid is not None else "")
                                  if tasks else "processes unbounded")
                               + f"; no cgroup: {reason}")
            outer["work"] = cwd
            cmd, env = self._wrap(bwrap, cmd, cwd, env, inner, uid)
            kw["cwd"] = cwd
            if uid is not None:
                for path in (self._sandbox_dir, self.connection_file):
                    os.chown(path, uid, uid)
        elif self._cgroup is None and self._scope is None:
            self.bounds = f"per process (RLIMIT_DATA {_gib(self.memory_limit_gib) if memory else 'none'}); no cgroup: {reason}"
        kw["env"] = env
        self.log.info("sandbox bounds: %s", self.bounds)
        LAST_BOUNDS = self.bounds
        if outer.get("rlimits") or outer.get("join") or outer.get("work"):
            cmd = [sys.executable, "-I", "-S", "-c", _LIMIT, json.dumps(outer)] + list(cmd)
        if self._scope is not None:
            cmd = scope_cmd + list(cmd)
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
        self._remove_cgroup()
        if not restart:
            self._remove_sandbox_dir()

    def oom_kills(self):
        """How many of the sandbox's processes were stopped at its memory limit (None: no group)."""
        return self._cgroup.oom_kills() if self._cgroup is not None else None

    def _remove_cgroup(self):
        if self._scope is not None:
            _stop_scope(self._scope)
            self._scope = None
        if self._cgroup is not None:
            if not self._cgroup.remove():
                self.log.warning("could not remove the sandbox's control group %s", self._cgroup.dirs)
            self._cgroup = None

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

    def _wrap(self, bwrap, cmd, cwd, env, inner=None, uid=None):
        """The bubblewrap command around `cmd`, and the kernel's environment. The files handed in
        (`cwd`) are bound read-only at SUBMISSION, by the descriptor _LIMIT opens (@WORKFD@), and
        copied by _INNER into the working folder, a tmpfs of `work_size_mib`."""
        tmp = ["--size", str(max(1, self.tmp_size_mib) * 2 ** 20)] if self.tmp_size_mib > 0 else []
        if uid is None:
            isolate = ["--unshare-all", "--cap-drop", "ALL"]
        else:
            # as root without a user namespace of bubblewrap's (it would map uid 0 only): _INNER
            # needs to hand the folders to `uid` and become it, then makes its own user namespace
            isolate = ["--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts", "--unshare-cgroup-try",
                       "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                       "--cap-add", "CAP_CHOWN"]
        args = [bwrap, "--die-with-parent", "--new-session", *isolate, "--proc", "/proc", "--dev", "/dev", *tmp, "--tmpfs", "/dev/shm", *tmp, "--tmpfs", "/tmp",
                *tmp, "--tmpfs", "/var/tmp", *tmp, "--tmpfs", "/home", "--dir", HOME]
        visible = []
        for name in SYSTEM_PATHS:
            path = "/" + name
            if os.path.islink(path):
                args += ["--symlink", os.readlink(path), path]
            elif os.path.isdir(path):
                args += ["--ro-bind", path, path]
                visible.append(path)
        readable = self._readable_paths(cmd, env)
        if uid is not None:
            # the folders above them, which bubblewrap would make private (mode 700), open to `uid`
            above = set()
            for path in readable:
                folder = os.path.dirname(path)
                while folder not in ("/", "") and folder.split("/")[1] not in SYSTEM_PATHS:
                    above.add(folder)
                    folder = os.path.dirname(folder)
            for folder in sorted(above, key=len):
                args += ["--perms", "0755", "--dir", folder]
        for path in readable:
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
        size = ["--size", str(self.work_size_mib * 2 ** 20)] if self.work_size_mib > 0 else []
        args += ["--ro-bind-fd", "@WORKFD@", SUBMISSION, *size, "--tmpfs", work,
                 "--bind", self._sandbox_dir, self._sandbox_dir, "--chdir", work]
        # the sandbox's root, /dev and the hidden folders read-only (HOME, the working folder, /tmp
        # and /dev/shm are mounts of their own and stay writable)
        args += ["--remount-ro", "/", "--remount-ro", "/dev"]
        for path in hidden:
            args += ["--remount-ro", path]
        # JPY_PARENT_PID=1 (jupyter_client sets the launcher's pid): in its own process
        # namespace the kernel's parent is bubblewrap's pid 1, and ipykernel would otherwise take
        # the changed parent for "parent exited"; --die-with-parent does that job
        args += ["--setenv", "JPY_PARENT_PID", "1"]
        env = dict(env, HOME=HOME, TMPDIR="/tmp", PWD=work)
        inner = dict(inner or {"copy_from": SUBMISSION, "rlimits": {}})
        return args + ["--", sys.executable, "-I", "-S", "-c", _INNER, json.dumps(inner)] + list(cmd), env


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


def _inert_metadata(meta, data):
    """An output's metadata reduced to what is inert: an image's width and height as numbers.
    nbconvert writes them into the page unquoted (`width={{ width | escape_html }}`), so a width of
    `1 onerror=...` would be an event handler; `filenames` would point the image anywhere."""
    out = {}
    for mime in INERT_TYPES:
        if mime == "text/plain" or mime not in data:
            continue
        sizes = {}
        for key in ("width", "height"):
            value = (meta.get(mime) or {}).get(key) if isinstance(meta.get(mime), dict) else None
            if value is None:
                value = meta.get(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0:
                sizes[key] = int(value)
            elif isinstance(value, str) and value.strip().isdigit():
                sizes[key] = int(value.strip())
        if sizes:
            out[mime] = sizes
    return out


def neutralise_outputs(nb):
    """Keep only inert types (INERT_TYPES) in every display output of the notebook, and of their
    metadata only an image's numeric width and height (_inert_metadata); returns how many outputs
    lost something."""
    count = 0
    # the state of widgets (rendered by a widget manager in the feedback's HTML)
    if nb.get("metadata", {}).pop("widgets", None) is not None:
        count += 1
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            data = out.get("data")
            if out.get("output_type") not in ("display_data", "execute_result", "update_display_data") or data is None:
                continue
            meta = out.get("metadata") or {}
            clean = _inert_metadata(meta, data)
            if clean != meta:
                count += 1
            out["metadata"] = clean
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


# the notice that ends a cell's outputs when some were dropped
OUTPUT_NOTICE = ("[grading: {dropped} more output of this cell dropped: a cell keeps at most {cell} of "
                 "output, the notebook {notebook}]")


def _output_size(out):
    """Characters of an output: its text, or its data (encoded images included)."""
    if out.get("output_type") == "stream":
        return len(out.get("text", ""))
    if out.get("output_type") == "error":
        return len(out.get("evalue", "")) + sum(len(t) for t in out.get("traceback", []))
    size = 0
    for value in (out.get("data") or {}).values():
        size += len(value) if isinstance(value, str) else len(json.dumps(value))
    return size


def _shorten_error(out, limit):
    """An error output cut to about `limit` characters (its message and traceback)."""
    evalue = out.get("evalue", "")
    if len(evalue) > limit:
        out["evalue"] = evalue[:limit] + f"... [{len(evalue) - limit:,} characters dropped]"
    lines, total = [], 0
    for line in out.get("traceback", []):
        if total + len(line) > limit:
            lines.append(f"... [{len(out['traceback']) - len(lines)} traceback line(s) dropped]")
            break
        lines.append(line)
        total += len(line)
    out["traceback"] = lines


# ---- the kernel-side guard (runs in the student's kernel; see SandboxedExecute) -----------------
# A module of its own (in sys.modules under a random name) that takes a baseline of how cells run
# once the instructor's setup cells have run, resets the shell to it before each test cell, and
# after the test reports what was changed while it ran. Every name it uses is bound here, at the
# baseline, before any student code runs.
GUARD_SOURCE = r'''
import builtins as _builtins, json as _json, sys as _sys, threading as _threading, types as _types

# the built-ins and functions the guard calls, bound now: student code may replace them later
(all, any, callable, delattr, dict, getattr, isinstance, len, list, set, setattr, sorted, str, tuple, type, vars,
 zip) = (all, any, callable, delattr, dict, getattr, isinstance, len, list, set, setattr, sorted, str, tuple, type,
         vars, zip)
_dumps, _gettrace, _settrace = _json.dumps, _sys.gettrace, _sys.settrace

_MISSING = object()
_ip = get_ipython()
_ENTRY = {"trace": _gettrace()}
# callbacks that IPython's own extensions register when a cell first needs them (matplotlib's
# inline backend when pyplot is first imported, autoreload): not a change of how cells run
_ALLOWED = (("matplotlib_inline.backend_inline", "flush_figures"), ("ipykernel.pylab.backend_inline", "flush_figures"))


def _allowed(cb):
    for mod, name in _ALLOWED:
        m = _sys.modules.get(mod)
        if m is not None and getattr(m, name, None) is cb:
            return True
    owner = getattr(cb, "__self__", None)
    auto = _sys.modules.get("IPython.extensions.autoreload")
    return auto is not None and owner is not None and type(owner) in (
        getattr(auto, "ModuleReloader", None), getattr(auto, "AutoreloadMagics", None))
_DUNDER_OK = {"__import__", "__build_class__"}
_IGNORE = {"_", "__", "___"}


def _own(d, k):
    return d.get(k, _MISSING)


class _Slots:
    """Named values of the kernel's state: (key, description, get, set)."""

    def __init__(self):
        self.items = []

    def add(self, key, what, get, put):
        self.items.append((key, what, get, put))


def _same(a, b):
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(x is y for x, y in zip(a, b))
    return a is b


def _list_slot(slots, key, what, owner, attr):
    slots.add(key, what, lambda: tuple(getattr(owner, attr)), lambda v: setattr(owner, attr, list(v)))


def _attr_slot(slots, key, what, owner, attr):
    def put(v):
        if v is _MISSING:
            try:
                delattr(owner, attr)
            except AttributeError:
                pass
        else:
            setattr(owner, attr, v)
    slots.add(key, what, lambda: getattr(owner, attr, _MISSING), put)


def _dict_slots(slots, prefix, what, d, put_owner=None, names=None):
    for k in list(names if names is not None else d):
        if k in _IGNORE or (k.startswith("__") and k.endswith("__") and k not in _DUNDER_OK):
            continue
        if put_owner is None:
            def put(v, d=d, k=k):
                if v is _MISSING:
                    d.pop(k, None)
                else:
                    d[k] = v
        else:
            def put(v, o=put_owner, k=k):
                if v is _MISSING:
                    try:
                        delattr(o, k)
                    except AttributeError:
                        pass
                else:
                    setattr(o, k, v)
        slots.add(prefix + k, what.format(name=k), lambda d=d, k=k: d.get(k, _MISSING), put)


def _object_slots(slots, label, obj, prefix="", done=None):
    """The methods of obj's classes and obj's own attributes that would shadow them (a class in
    `done`, a set, is not taken again)."""
    for cls in type(obj).__mro__:
        if cls is object or cls.__module__ == "builtins" or (done is not None and cls in done):
            continue
        if done is not None:
            done.add(cls)
        names = [k for k, v in vars(cls).items() if callable(v) or isinstance(v, (staticmethod, classmethod, property))]
        _dict_slots(slots, f"{prefix}cls:{cls.__module__}.{cls.__qualname__}.", f"IPython's {label}.{{name}}", vars(cls),
                    put_owner=cls, names=names)
    own = getattr(obj, "__dict__", {})
    methods = {k for cls in type(obj).__mro__ for k, v in vars(cls).items() if callable(v)}
    for k in methods:
        if k in _IGNORE:
            continue
        def put(v, o=obj, k=k):
            if v is _MISSING:
                vars(o).pop(k, None)
            else:
                vars(o)[k] = v
        slots.add(f"{prefix}own:{label}.{k}", f"IPython's {label}.{k}", lambda o=own, k=k: o.get(k, _MISSING), put)


def _baseline(prefixes):
    ip = _ip
    slots = _Slots()
    itm = ip.input_transformer_manager
    _list_slot(slots, "ast", "an AST transformer (get_ipython().ast_transformers)", ip, "ast_transformers")
    _list_slot(slots, "input_post", "an input transformer (input_transformers_post)", ip, "input_transformers_post")
    for attr in ("cleanup_transforms", "line_transforms", "token_transformers"):
        _list_slot(slots, "input_" + attr, f"an input transformer ({attr})", itm, attr)
    for attr in ("input_transformer_manager", "events", "compile", "CustomTB", "displayhook", "display_pub",
                 "InteractiveTB", "SyntaxTB"):
        _attr_slot(slots, "shell:" + attr, f"IPython's {attr}", ip, attr)
    slots.add("custom_exc", "a custom exception handler (set_custom_exc)",
              lambda: tuple(ip.custom_exceptions), lambda v: setattr(ip, "custom_exceptions", tuple(v)))
    events = ip.events
    for name in list(events.callbacks):
        def put_event(v, n=name):
            kept = [cb for cb in events.callbacks.get(n, ()) if _allowed(cb) and cb not in v]
            events.callbacks[n] = list(v) + kept
        slots.add("event:" + name, f"a {name} callback (events.register)",
                  lambda n=name: tuple(cb for cb in events.callbacks.get(n, ()) if not _allowed(cb)), put_event)
    def put_trace(v):
        _ENTRY["trace"] = v
        _settrace(v)
    slots.add("trace", "a trace function (sys.settrace)", lambda: _ENTRY["trace"], put_trace)
    slots.add("thread_trace", "a trace function for threads (threading.settrace)",
              lambda: getattr(_threading, "_trace_hook", None), _threading.settrace)
    for name in ("stdout", "stderr", "displayhook", "excepthook"):
        _attr_slot(slots, "sys:" + name, f"sys.{name}", _sys, name)
    _dict_slots(slots, "builtin:", "the built-in {name}", vars(_builtins))
    ns = ip.user_global_ns
    slots.add("ns:__builtins__", "the notebook's __builtins__", lambda: ns.get("__builtins__", _MISSING),
              lambda v: ns.__setitem__("__builtins__", v))
    for obj, label in ((ip, "shell"), (ip.compile, "compile"), (events, "events"), (itm, "input_transformer_manager"),
                       (getattr(ip, "kernel", None), "kernel")):
        if obj is not None:
            _object_slots(slots, label, obj)
    kernel = getattr(ip, "kernel", None)
    if kernel is not None and isinstance(getattr(kernel, "shell_handlers", None), dict):
        _dict_slots(slots, "handler:", "the kernel's {name} handler", kernel.shell_handlers)
    # how the kernel sends its messages (a test's error, its output, the reply's status): the
    # kernel's session (jupyter_client's Session), its iopub socket and thread, the display
    # publisher, the display hook and the output streams (ipykernel's OutStream): their classes'
    # methods, their own attributes that would shadow them, and which objects they use
    done = set()
    io = [(getattr(kernel, n, None), n) for n in ("session", "iopub_socket", "iopub_thread")] if kernel is not None else []
    io += [(getattr(ip, "display_pub", None), "display_pub"), (getattr(ip, "displayhook", None), "displayhook"),
           (_sys.stdout, "stdout"), (_sys.stderr, "stderr")]
    if kernel is not None:    # the zmq sockets below them (pyzmq's Python classes; its C types cannot be changed)
        io += [(getattr(kernel, n, None), n) for n in ("shell_stream", "shell_socket", "control_stream")]
        io.append((getattr(getattr(kernel, "iopub_thread", None), "socket", None), "iopub_thread.socket"))
    for obj, label in io:
        if obj is None:
            continue
        _object_slots(slots, label, obj, prefix="io:", done=done)
        for attr in ("session", "pub_socket", "pub_thread", "iopub_socket", "iopub_thread", "socket", "pack",
                     "unpack", "topic"):
            if attr in getattr(obj, "__dict__", {}) or hasattr(type(obj), attr):
                _attr_slot(slots, f"io:attr:{label}.{attr}", f"the kernel's {label}.{attr}", obj, attr)
    guarded = sorted(n for n, m in list(_sys.modules.items())
                     if isinstance(m, _types.ModuleType) and any(n == p or n.startswith(p + ".") for p in prefixes))
    for n in guarded:
        mod = _sys.modules[n]
        slots.add("module:" + n, f"the module {n}", lambda n=n: _sys.modules.get(n, _MISSING),
                  lambda v, n=n: _sys.modules.__setitem__(n, v))
        d = vars(mod)
        _dict_slots(slots, f"attr:{n}.", n + ".{name}", d)
        for k, f in list(d.items()):
            if isinstance(f, _types.FunctionType):
                for a in ("__code__", "__defaults__", "__kwdefaults__"):
                    _attr_slot(slots, f"code:{n}.{k}.{a}", f"{n}.{k}", f, a)
    # what the setup cells defined: modules, functions and classes by name (data may change)
    setup_names = [k for k, v in ns.items()
                   if not k.startswith("_") and isinstance(v, (_types.ModuleType, _types.FunctionType, type))]
    _dict_slots(slots, "ns:", "{name} (defined by the notebook's setup)", ns, names=setup_names)
    return slots


class _Guard:
    def __init__(self, prefixes):
        self.slots = _baseline(prefixes)
        self.base = [(item, item[2]()) for item in self.slots.items]
        self.saved = []

    def _changed(self, skip=()):
        out = []
        for item, value in self.base:
            if skip and skip(item[0]):
                continue
            try:
                now = item[2]()
            except Exception:
                now = _MISSING
            if not _same(now, value):
                out.append((item, value, now))
        return out

    def reset(self):
        """Put the baseline back for a test cell; keep what it replaced for after the test."""
        _ENTRY["trace"] = _gettrace()
        _settrace(None)
        changed = self._changed()
        self.saved = [(item, now) for item, value, now in changed]
        failed = []
        for item, value, now in changed:
            try:
                item[3](value)
            except Exception:
                failed.append(item[0])
        return _dumps({"removed": sorted({item[0] for item, value, now in changed}), "failed": failed})

    def check(self):
        """What changed while the test ran, set back to the baseline; then the student's own state
        as it was before the test. Names bound in the notebook and private attributes of modules
        (a library's own caches) are not counted."""
        _ENTRY["trace"] = _gettrace()
        _settrace(None)

        def skip(key):
            return key.startswith("ns:") or (key.startswith("attr:") and key.rsplit(".", 1)[-1].startswith("_"))
        changed = self._changed(skip)
        for item, value, now in changed:
            try:
                item[3](value)
            except Exception:
                pass
        # the answer first: what is put back next may be the student's own built-ins
        answer = _dumps({"changed": sorted({item[0] for item, value, now in changed})})
        saved, self.saved = self.saved, []
        for item, now in saved:
            try:
                item[3](now)
            except Exception:
                pass
        return answer
'''


# ---- the student's feedback, composed by the grader ---------------------------------------------------
# What a student sees of a test cell is built here from a finite set of pieces: the part's name, its
# points, passed / failed / stopped, the exception's type (a built-in one, else "an error") and its
# message only when the message is made of the instructor's own strings (the literals and f-string
# parts of the notebook's locked cells) with a few short numbers in the placeholders. Outputs of
# every other cell that ran after the first hidden test are left out: student code could have kept
# a hidden test and print it there.
VERDICT_KEY = "grading_sandbox"
TAMPERED = "ChangedHowCellsRun"
FEEDBACK_PREFIX = "[grader]"
AFTER_HIDDEN_NOTICE = ("[grader] output not shown in the feedback: this cell ran after a hidden test "
                       "(run the notebook yourself to see it)\n")
MAX_NUMBERS = 6          # numbers a message may show, each to NUMBER_DIGITS significant digits
NUMBER_DIGITS = 4
MAX_PIECES = 12          # instructor's strings a message may be made of
MAX_WORDS = 12           # placeholders a message may fill with one of the instructor's short strings
MAX_WORD = 40            # the longest instructor's string that may fill a placeholder
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?|[-+]?inf|nan"
_NUMRUN = (rf"[\[\(\s]*(?:{_NUM})(?:[\s,\[\]\(\)]+(?:{_NUM}))*[\s\]\)]*(?:\.\.\.)?")
_FORMAT_HOLE = re.compile(r"\{[^{}]*\}|%[-+ #0]*\d*(?:\.\d+)?[sdifgeEr]")
# exception names a student may see (others: "an error"): Python's own, numpy's LinAlgError, the grader's
SAFE_ENAMES = frozenset(
    [n for n, v in vars(builtins).items()
     if isinstance(v, type) and issubclass(v, BaseException)]
    + ["LinAlgError", STOPPED, NOT_RUN, MEMORY, "KernelDied", TAMPERED])


# fixed messages of the libraries a test may quote (numpy's linear algebra errors): no text of a student's
LIBRARY_MESSAGES = ("Matrix is not positive definite", "Singular matrix", "SVD did not converge",
                    "Eigenvalues did not converge", "Last 2 dimensions of the array must be square")


def _without_magics(source):
    return "\n".join("pass" if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines())


def message_templates(sources):
    """The instructor's message templates in `sources` (code): each string literal, and each
    f-string as its literal parts with placeholders (None) between them; `{...}` and `%s`-style
    fields inside a literal are placeholders too; and LIBRARY_MESSAGES. Returns (templates, words):
    words are the short literals (and their repr) a placeholder may show."""
    templates, words = set(), set()
    for source in sources:
        try:
            tree = ast.parse(_without_magics(source))
        except SyntaxError:
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                parts = []
                last = 0
                for m in _FORMAT_HOLE.finditer(node.value):
                    parts += [node.value[last:m.start()], None]
                    last = m.end()
                parts.append(node.value[last:])
                templates.add(tuple(p for p in parts if p != ""))
                if 0 < len(node.value) <= MAX_WORD:
                    words.add(node.value)
            elif isinstance(node, ast.JoinedStr):
                parts = []
                for v in node.values:
                    if isinstance(v, ast.Constant) and isinstance(v.value, str):
                        parts.append(v.value)
                    elif not parts or parts[-1] is not None:
                        parts.append(None)
                templates.add(tuple(parts))
    templates.discard(())
    templates |= {(m,) for m in LIBRARY_MESSAGES}
    words |= {"True", "False", "None"} | {repr(w) for w in words}
    return sorted(templates, key=lambda t: [(p is None, p or "") for p in t]), sorted(words)


class MessageFilter:
    """Whether an error message is made of the instructor's templates (see message_templates), and
    the message as the student may see it (numbers rounded, at most MAX_NUMBERS of them)."""

    def __init__(self, sources):
        templates, words = message_templates(sources)
        word = "|".join(re.escape(w) for w in sorted(words, key=len, reverse=True))
        hole = f"((?:{_NUMRUN})|(?:{word})|)" if word else f"((?:{_NUMRUN})|)"
        self.patterns = []
        for t in templates:
            rx = "".join(hole if p is None else re.escape(p) for p in t)
            self.patterns.append((t, re.compile(rx, re.S)))

    def compose(self, message):
        """The message rebuilt from the instructor's pieces, or None when it is not made of them."""
        n = len(message)
        found = {0: []}
        frontier = [0]
        for _ in range(MAX_PIECES):
            if n in found:
                break
            new = []
            for pos in frontier:
                for t, rx in self.patterns:
                    m = rx.match(message, pos)
                    if m and m.end() > pos and m.end() not in found:
                        found[m.end()] = found[pos] + [(t, m)]
                        new.append(m.end())
            if not new:
                break
            frontier = new
        if n not in found:
            return None
        out, count = [], [0]

        def number(m):
            count[0] += 1
            if count[0] > MAX_NUMBERS:
                return "…"
            text = m.group(0)
            try:
                value = float(text)
            except ValueError:
                return text
            return text if value != value or abs(value) == math.inf else f"{value:.{NUMBER_DIGITS}g}"

        words = 0
        for t, m in found[n]:
            k = 0
            for p in t:
                if p is None:
                    k += 1
                    filler = m.group(k)
                    if re.fullmatch(_NUMRUN, filler or "-"):
                        out.append(re.sub(_NUM, number, filler))
                    else:
                        words += 1
                        out.append(filler)
                else:
                    out.append(p)
        return "".join(out) if words <= MAX_WORDS else None


def _code_cells_of_instructor(nb):
    """The sources of the notebook's locked, non-answer code cells (setup and tests)."""
    return [c.source for c in nb.cells if c.cell_type == "code" and utils.is_locked(c) and not utils.is_solution(c)]


def _has_hidden_tests(cell):
    return "BEGIN HIDDEN TESTS" in cell.get("source", "")


def _points(cell):
    m = cell.metadata.get("nbgrader", {})
    score, points = m.get("score"), m.get("points")

    def fmt(x):
        return f"{float(x):g}"
    if points is None:
        return ""
    unit = "point" if float(points) == 1 else "points"
    return f" ({fmt(score) if score is not None else '?'} of {fmt(points)} {unit})"


def feedback_line(cell, filt):
    """The one line a student sees for a graded test cell, composed from the grader's verdict."""
    gid = cell.metadata.get("nbgrader", {}).get("grade_id", "test")
    verdict = cell.metadata.get(VERDICT_KEY, {})
    kind = verdict.get("verdict")
    errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
    stderr = any(o.get("output_type") == "stream" and o.get("name") == "stderr" for o in cell.get("outputs", []))
    head = f"{FEEDBACK_PREFIX} {gid}:"
    pts = _points(cell)
    if kind == "stopped":
        return f"{head} stopped after {int(verdict.get('seconds', 0))} s ({verdict.get('why', 'time limit')}){pts}"
    if kind == "not_run":
        return f"{head} not run: the notebook used up its time budget{pts}"
    if kind == "memory":
        return f"{head} stopped: exceeded {_gib(float(verdict.get('gib', 0)))} of memory{pts}"
    if kind == "died":
        return f"{head} stopped: the kernel died while this cell ran{pts}"
    if kind == "tampered":
        what = ", ".join(w for w in verdict.get("what", []) if w in TAMPER_PHRASES.values()) or "the kernel's state"
        return f"{head} failed: your code changed how cells run ({what}){pts}"
    if not errors and not stderr and kind in ("passed", None):
        return f"{head} passed{pts}"
    if not errors:
        return f"{head} failed: the test wrote to stderr (a warning or an error message){pts}"
    err = errors[-1]
    ename = err.get("ename", "")
    shown = ename if ename in SAFE_ENAMES else "an error"
    message = filt.compose(err.get("evalue", "")) if shown != "an error" else None
    if message is None:
        return (f"{head} failed: {shown} raised in your code; run the visible tests in your notebook to see "
                f"the message{pts}")
    return f"{head} failed: {shown}{': ' + message if message else ''}{pts}"


class SealedFeedback(ClearHiddenTests):
    """Feedback (generate_feedback): test cells as students saw them (hidden tests removed), each
    with one line composed by the grader (feedback_line) instead of its outputs; the outputs of
    every other cell that ran after the first hidden test replaced by a notice."""

    # nbconvert's HTML exporter configures display_data_priority for every NbConvertBase; accept it
    # (unused), or nbgrader warns "Config option `display_data_priority` not recognized"
    display_data_priority = List(["text/html", "application/pdf", "text/latex", "image/svg+xml", "image/png",
                                  "image/jpeg", "text/markdown", "text/plain"]).tag(config=True)

    def preprocess(self, nb, resources):
        sources = _code_cells_of_instructor(nb)
        setup = [c.source for c in nb.cells if c.cell_type == "code" and utils.is_locked(c)
                 and not utils.is_solution(c) and not utils.is_grade(c)]
        hidden = [i for i, c in enumerate(nb.cells) if c.cell_type == "code" and _has_hidden_tests(c)]
        self._first_hidden = hidden[0] if hidden else len(nb.cells)
        self._setup = setup
        del sources
        nb.metadata.pop("widgets", None)
        return super().preprocess(nb, resources)

    def preprocess_cell(self, cell, resources, cell_index):
        test = cell.cell_type == "code" and utils.is_grade(cell) and not utils.is_solution(cell)
        if test:
            filt = MessageFilter(self._setup + [cell.source])
        cell, resources = super().preprocess_cell(cell, resources, cell_index)
        if test:
            cell.outputs = [NotebookNode(output_type="stream", name="stdout", text=feedback_line(cell, filt) + "\n")]
        elif cell.cell_type == "code" and cell_index > self._first_hidden and cell.get("outputs"):
            cell.outputs = [NotebookNode(output_type="stream", name="stdout", text=AFTER_HIDDEN_NOTICE)]
        cell.metadata.pop(VERDICT_KEY, None)
        return cell, resources


# what the guard's keys mean, in the words the student and the instructor see
TAMPER_PHRASES = {
    "ast": "an AST transformer", "input_": "an input transformer", "event:": "an IPython event callback",
    "custom_exc": "a custom exception handler", "shell:CustomTB": "a custom exception handler",
    "trace": "a trace function", "thread_trace": "a trace function", "builtin:": "a built-in function",
    "ns:__builtins__": "a built-in function", "module:": "a library module", "attr:": "a library function",
    "code:": "a library function", "shell:": "IPython's shell", "cls:": "IPython's shell", "own:": "IPython's shell",
    "handler:": "IPython's shell", "sys:": "sys.stdout, sys.stderr or sys's hooks",
    "io:": "how the kernel sends its messages",
}
# modules whose functions are put back before each test cell (with their submodules, those imported
# by the setup cells)
GUARDED_MODULES = ("numpy", "scipy", "math", "cmath", "operator", "functools", "statistics", "gpclab", "sklearn",
                   "jupyter_client.session", "ipykernel.iostream", "ipykernel.zmqshell", "ipykernel.displayhook",
                   "ipykernel.jsonutil")


def _phrase(key):
    for prefix in sorted(TAMPER_PHRASES, key=len, reverse=True):
        if key == prefix or key.startswith(prefix):
            return TAMPER_PHRASES[prefix]
    return "the kernel's state"


def _plain_key(key):
    """A guard's key as the instructor's message shows it (names only, short)."""
    return re.sub(r"[^\w.:]", "", str(key))[:60]


def _char_offset(lines, lineno, col):
    line = lines[lineno - 1] if lineno - 1 < len(lines) else ""
    return sum(len(x) for x in lines[:lineno - 1]) + len(line.encode()[:col].decode("utf-8", "replace"))


def with_marker(source, marker):
    """The test cell's source with a last statement that prints `marker`; a last expression (its
    value is the cell's result, e.g. partial credit) stays the cell's result."""
    stmt = f"print({marker!r})"
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source.rstrip() + "\n" + stmt + "\n"
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = tree.body[-1]
        lines = source.splitlines(keepends=True)
        start = _char_offset(lines, last.lineno, last.col_offset)
        end = _char_offset(lines, last.end_lineno, last.end_col_offset)
        return source[:start] + f"({source[start:end]},\n{stmt})[0]" + source[end:] + "\n"
    return source.rstrip() + "\n" + stmt + "\n"


def take_marker(cell, marker):
    """Remove the marker's line from the cell's outputs; whether it was printed."""
    found = False
    kept = []
    merged = []
    for out in cell.get("outputs", []):      # consecutive writes to one stream as one output
        if (out.get("output_type") == "stream" and merged and merged[-1].get("output_type") == "stream"
                and merged[-1].get("name") == out.get("name")):
            merged[-1]["text"] = merged[-1].get("text", "") + out.get("text", "")
        else:
            merged.append(out)
    for out in merged:
        if out.get("output_type") == "stream":
            text = out.get("text", "")
            if out.get("name") == "stdout" and marker + "\n" in text:
                found = True
                text = text.replace(marker + "\n", "", 1)
            text = text.replace(marker, "")
            out["text"] = text
            if not text:
                continue
        elif out.get("output_type") == "error":
            out["evalue"] = out.get("evalue", "").replace(marker, "…")
            out["traceback"] = [t.replace(marker, "…") for t in out.get("traceback", [])]
        kept.append(out)
    cell.outputs = kept
    return found


# the files of a submission that `nbgrader release_feedback` reads from feedback/
RELEASE_FEEDBACK_FILES = ("timestamp.txt", "submission_secret.txt")


def feedback_without_files():
    """Make `nbgrader generate_feedback` write only the feedback's HTML and the submission's
    timestamp.txt and submission_secret.txt (which `release_feedback` needs), taken from
    submitted/ as `collect` left them: nbgrader copies every file of the autograded folder into
    feedback/, and student code writes in that folder (those two files included)."""
    from nbgrader.converters import GenerateFeedback

    def init_assignment(self, assignment_id, student_id):
        dest = self._format_dest(assignment_id, student_id)
        submitted = self.coursedir.format_path(self.coursedir.submitted_directory, student_id, assignment_id)
        os.makedirs(dest, exist_ok=True)
        for name in RELEASE_FEEDBACK_FILES:
            path = os.path.join(submitted, name)
            if os.path.isfile(path) and not os.path.islink(path):
                shutil.copyfile(path, os.path.join(dest, name))
        self.log.info("Feedback of %s for %s: the HTML and submitted/'s %s only", assignment_id, student_id,
                      " and ".join(RELEASE_FEEDBACK_FILES))

    GenerateFeedback.init_assignment = init_assignment


def unsafe_entries(folder):
    """The paths (relative to `folder`, sorted) of what in `folder` is neither a regular file nor a
    folder: symbolic links (a linked folder is not entered), named pipes, sockets, devices. A
    submission holding a link to the course's source notebook or gradebook would otherwise hand
    the link's target to autograde and to the student's kernel."""
    found = []
    for base, dirs, files in os.walk(folder):          # follows no link
        for name in dirs + files:
            path = os.path.join(base, name)
            try:
                mode = os.lstat(path).st_mode
            except OSError:
                continue
            if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
                found.append(os.path.relpath(path, folder))
    return sorted(found)


REFUSED_LINKS = "symlinks refused"


def autograde_without_links():
    """Make `nbgrader autograde` copy into autograded/ only the regular files of a submission: a
    symbolic link (or anything in a linked folder), a named pipe or a device in submitted/ is not
    copied (nbgrader's copy follows links and would copy their targets) and a notebook that is a
    link is not graded (it counts as missing); the warning names them ("symlinks refused: ...")."""
    from nbgrader.converters import Autograde
    from nbgrader.converters.base import BaseConverter
    if getattr(BaseConverter.init_assignment, "_without_links", False):
        return
    base_init = BaseConverter.init_assignment

    def init_assignment(self, assignment_id, student_id):
        if not isinstance(self, Autograde):
            return base_init(self, assignment_id, student_id)
        source = self._format_source(assignment_id, student_id)
        dest = self._format_dest(assignment_id, student_id)
        refused = unsafe_entries(source)
        if refused:
            self.log.warning("%s of %s: %s: %s (symbolic links and special files are not copied or graded)",
                             assignment_id, student_id, REFUSED_LINKS, ", ".join(refused))
        bad = {os.path.normpath(os.path.join(source, r)) for r in refused}
        self.notebooks = [nb for nb in self.notebooks if os.path.normpath(nb) not in bad]
        for filename in utils.find_all_files(source, self.coursedir.ignore + ["*.ipynb"]):
            if os.path.normpath(filename) in bad or not stat.S_ISREG(os.lstat(filename).st_mode):
                continue
            path = os.path.join(dest, os.path.relpath(filename, source))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            if os.path.lexists(path):
                os.remove(path)
            self.log.info("Copying %s -> %s", filename, path)
            shutil.copy(filename, path, follow_symlinks=False)

    init_assignment._without_links = True
    BaseConverter.init_assignment = init_assignment


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
    cell_output_mib = Float(1.0, help=(
        "Output a cell keeps, in MiB of text (characters) and encoded images; the rest is dropped "
        "with a notice saying how much. Errors are always kept (shortened). 0: no limit.")).tag(config=True)
    notebook_output_mib = Float(10.0, help=(
        "Output all cells of a notebook keep together, in MiB; beyond it every cell's output is "
        "dropped as beyond a cell's limit. 0: no limit.")).tag(config=True)
    guard = Bool(True, help=(
        "Before each test cell put back how cells run as it was after the setup cells (IPython's "
        "transformers, event callbacks and exception handlers, trace functions, built-ins, library "
        "functions); count a test only when it ran to its last statement; a test during which "
        "student code changed how cells run scores 0.")).tag(config=True)
    guarded_modules = List(Unicode(), list(GUARDED_MODULES), help=(
        "Modules (with their submodules) whose functions are put back before each test cell, as "
        "they were after the setup cells.")).tag(config=True)
    guard_timeout = Float(30.0, help=(
        "Seconds the kernel has to answer the guard before and after a test cell.")).tag(config=True)

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
        self._guard_name = None       # the guard's module in the current kernel (False: could not install)
        for cell in nb.cells:         # a verdict only the grader writes
            cell.metadata.pop(VERDICT_KEY, None)
        started = time.time()
        nb, resources = super().preprocess(nb, resources, km)
        for cell in nb.cells:
            if self._is_test(cell) and VERDICT_KEY not in cell.metadata:
                errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
                cell.metadata[VERDICT_KEY] = {"verdict": "failed" if errors else "passed"}
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
            cell.metadata[VERDICT_KEY] = {"verdict": "not_run"}
            return cell, self.resources
        if self._kernel_lost and not self._restart_and_replay():
            cell.outputs = [_error(NOT_RUN, (
                "not run: the kernel was stopped and the cells before this one could not be run "
                f"again within the notebook's time budget of {self.submission_timeout} s"))]
            cell.metadata[VERDICT_KEY] = {"verdict": "not_run"}
            return cell, self.resources
        status = self._run(cell, index, store_history=not self._is_test(cell))
        if status == "ok":
            self._ran.append(index)
        return cell, self.resources

    def _is_test(self, cell):
        return self.seal and utils.is_grade(cell) and not utils.is_solution(cell)

    def _is_setup(self, cell):
        """An instructor's read-only cell that is not a test (nbgrader restored its source)."""
        m = cell.metadata.get("nbgrader", {})
        return bool(m.get("grade_id") and m.get("locked") and not m.get("solution") and not m.get("grade"))

    def _run(self, cell, index, store_history=True):
        """Execute one cell within its time budget: 'ok' (finished, with or without an error),
        'stopped' (ran too long) or 'lost' (the kernel died or had to be killed). A test cell runs
        under the guard (see `guard`)."""
        if not (self.guard and self.seal):
            return self._run_cell(cell, index, store_history)
        if self._guard_name is None and not self._is_setup(cell):
            self._install_guard()
        if not self._is_test(cell) or not self._guard_name:
            return self._run_cell(cell, index, store_history)
        removed = self._guard_call("reset")
        marker = "grader-" + secrets.token_hex(16)
        source = cell.source
        cell.source = with_marker(source, marker)
        try:
            status = self._run_cell(cell, index, store_history)
        finally:
            cell.source = source
        printed = take_marker(cell, marker)
        if status == "lost":
            return status
        found = self._guard_call("check")
        if status != "ok":
            return status
        problems = []
        if removed is None or found is None:
            problems.append("the grader could not check the kernel's state")
            keys = []
        else:
            keys = list(found.get("changed", []))
            if removed.get("failed"):
                keys += list(removed["failed"])
            if removed.get("removed"):
                self.log.info("before %s: put back %s", cell.metadata.get("nbgrader", {}).get("grade_id"),
                              ", ".join(_plain_key(k) for k in removed["removed"][:20]))
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if not errors and not printed:
            problems.append("the test did not run to its last statement (an error was swallowed or cleared)")
        if keys:
            phrases = sorted({_phrase(k) for k in keys})
            problems.append("changed while the test ran: " + ", ".join(phrases) +
                            " (" + ", ".join(_plain_key(k) for k in keys[:6]) + ("..." if len(keys) > 6 else "") + ")")
        if problems:
            phrases = sorted({_phrase(k) for k in keys})
            evalue = "your code changed how cells run: " + "; ".join(problems)
            cell.outputs.append(_error(TAMPERED, evalue))
            cell.metadata[VERDICT_KEY] = {"verdict": "tampered", "what": phrases}
            self.log.warning("cell %d: %s", index, evalue)
        return status

    def _install_guard(self):
        """The guard's module in the kernel, with its baseline taken now (before any student cell)."""
        name = "_" + secrets.token_hex(8)
        src = (f"import sys, types\nfrom IPython import get_ipython\nm = types.ModuleType({name!r})\n"
               f"m.get_ipython = get_ipython\nexec({GUARD_SOURCE!r}, m.__dict__)\n"
               f"m.guard = m._Guard({tuple(self.guarded_modules)!r})\nsys.modules[{name!r}] = m\n")
        self._guard_name = name
        if self._guard_request(f"exec({src!r}, {{}}) or 'ok'") != "ok":
            self.log.warning("could not install the grading guard in the kernel: test cells run without it")
            self._guard_name = False

    def _guard_call(self, op):
        got = self._guard_request(f"__import__('sys').modules[{self._guard_name!r}].guard.{op}()")
        try:
            return json.loads(got)
        except (TypeError, ValueError):
            return None

    def _guard_request(self, expr):
        """Evaluate `expr` in the kernel (as a user expression of an empty, silent request: no
        input transformers, AST transformers or history); its str value, or None."""
        try:
            return run_sync(self._async_guard_request)(expr)
        except Exception as exc:           # noqa: BLE001  (a kernel that does not answer)
            self.log.warning("grading guard: %s", exc)
            return None

    async def _async_guard_request(self, expr):
        msg_id = self.kc.execute("", silent=True, store_history=False, user_expressions={"r": expr},
                                 allow_stdin=False)
        deadline = time.monotonic() + self.guard_timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError("no answer from the kernel")
            msg = await ensure_async(self.kc.shell_channel.get_msg(timeout=left))
            if msg.get("parent_header", {}).get("msg_id") == msg_id:
                break
        r = msg.get("content", {}).get("user_expressions", {}).get("r", {})
        if r.get("status") != "ok":
            raise RuntimeError(f"{r.get('ename')}: {r.get('evalue')}")
        text = r.get("data", {}).get("text/plain", "")
        value = ast.literal_eval(text)
        return value if isinstance(value, str) else None

    def _run_cell(self, cell, index, store_history=True):
        timeout = self._cell_timeout(cell)
        t0 = time.monotonic()
        try:
            self.execute_cell(cell, index, store_history=store_history)
        except CellTimeoutError:
            # the interrupt did not stop it (SIGINT ignored or caught): kill the kernel
            self._kill_kernel()
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "error"]
            cell.outputs.append(self._stopped(timeout, killed=True))
            cell.metadata[VERDICT_KEY] = self._stop_verdict(timeout)
            return "lost"
        except DeadKernelError:
            gib = self._memory_gib()
            self._kill_kernel()
            limit = f" (or exceeded its memory limit of {_gib(gib)})" if gib else ""
            cell.outputs = [o for o in cell.get("outputs", []) if o.get("output_type") != "error"]
            cell.outputs.append(_error(MEMORY if gib else "KernelDied", f"the kernel died while this cell ran{limit}"))
            cell.metadata[VERDICT_KEY] = {"verdict": "memory", "gib": gib} if gib else {"verdict": "died"}
            return "lost"
        errors = [o for o in cell.get("outputs", []) if o.get("output_type") == "error"]
        if any(o.get("ename") == "CellTimeoutError" for o in errors):
            # stopped by the interrupt: the kernel lives on
            cell.outputs = [o for o in cell.outputs if o.get("output_type") != "error"]
            cell.outputs.append(self._stopped(timeout, killed=False))
            cell.metadata[VERDICT_KEY] = self._stop_verdict(timeout)
            self.log.warning("cell %d stopped after %.0f s", index, time.monotonic() - t0)
            return "stopped"
        gib = self._memory_gib()
        for o in errors:
            if o.get("ename") == "MemoryError" and gib:
                o["ename"] = MEMORY
                o["evalue"] = f"exceeded {_gib(gib)}: the cell asked for more memory than a submission may use ({_gib(gib)})"
                o["traceback"] = [f"{MEMORY}: {o['evalue']}"]
                cell.metadata[VERDICT_KEY] = {"verdict": "memory", "gib": gib}
        return "ok"

    def _stop_verdict(self, timeout):
        why = "the cell's limit" if timeout is not None and (self.timeout or 0) <= timeout + 1 else "the notebook's time budget"
        return {"verdict": "stopped", "seconds": int(timeout or 0), "why": why}

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
        self._guard_name = None

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

    # ---- outputs change nothing but their own cell ----------------------------------------------------
    def _update_display_id(self, display_id, msg):
        """While grading, an output never rewrites another: `update_display` (and a display with a
        display id shown before) would otherwise replace earlier outputs in place, also in cells
        that ran before the first hidden test (which the feedback keeps) and past the output
        limits (which count outputs as they are added). A display with a display id still adds its
        own output where it is shown; an update is dropped."""
        self.log.debug("display id %r: updates of earlier outputs are not applied while grading", display_id)

    # ---- bounded output ---------------------------------------------------------------------------
    def output(self, outs, msg, display_id, cell_index):
        out = super().output(outs, msg, display_id, cell_index)
        if out is None or not outs or outs[-1] is not out:
            return out
        return self._cap_output(outs, out, display_id, cell_index)

    def _cap_output(self, outs, out, display_id, cell_index):
        """Keep `out` (just appended to `outs`) within the cell's and the notebook's output
        limits: cut, or dropped, with a notice at the end of the cell's outputs."""
        mib = 2 ** 20
        cell_cap = self.cell_output_mib * mib if self.cell_output_mib and self.cell_output_mib > 0 else math.inf
        nb_cap = self.notebook_output_mib * mib if self.notebook_output_mib and self.notebook_output_mib > 0 else math.inf
        if getattr(self, "_cap_nb", None) is not self.nb:
            self._cap_nb, self._cap_kept = self.nb, {}
        kept = self._cap_kept
        if len(outs) == 1:                    # the cell's first output (or the first after a clear)
            kept[cell_index] = [0, 0, None]   # characters kept, characters dropped, the notice
        state = kept.setdefault(cell_index, [0, 0, None])
        if out.get("output_type") == "error":
            _shorten_error(out, int(min(cell_cap, 64 * 2 ** 10)))
            state[0] += _output_size(out)
            return out
        others = sum(v[0] for k, v in kept.items() if k != cell_index)
        room = max(0, int(min(cell_cap - state[0], nb_cap - others - state[0])))
        size = _output_size(out)
        if size <= room:
            state[0] += size
            return out
        if out.get("output_type") == "stream" and room > 0:
            out["text"] = out["text"][:room]
            state[0] += room
            state[1] += size - room
        else:
            outs.pop()
            if display_id:
                with contextlib.suppress(KeyError, IndexError):
                    self._display_id_map[display_id][cell_index].pop()
            state[1] += size
            out = None
        notice = state[2]
        if notice is None or not outs or outs[-1] is not notice:
            # a display output, not a stream: nbgrader's LimitOutput (1000 lines) drops streams
            # beyond its limit, and the notice must stay
            notice = state[2] = NotebookNode(output_type="display_data", data={"text/plain": ""}, metadata={})
            outs.append(notice)
        notice["data"]["text/plain"] = OUTPUT_NOTICE.format(dropped=f"{state[1] / mib:.1f} MiB" if state[1] >= mib else f"{state[1]:,} characters",
                                              cell=_mib(cell_cap) if cell_cap < math.inf else "any",
                                              notebook=_mib(nb_cap) if nb_cap < math.inf else "any")
        return out

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
