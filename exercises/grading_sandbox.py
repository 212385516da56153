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
import contextlib
import copy
import importlib.util
import io
import json
import math
import os
import re
import shutil
import signal
import subprocess
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
# handed in (bound read-only at SUBMISSION) into the working folder, a size-capped tmpfs, sets the
# limits that must be counted inside the sandbox (RLIMIT_NPROC in the fallback, as an unprivileged
# user when the grader is root), becomes the kernel.
_INNER = """\
import json, os, resource, shutil, sys
spec, cmd = json.loads(sys.argv[1]), sys.argv[2:]
src = spec["copy_from"]
for name in sorted(os.listdir(src)):
    path = os.path.join(src, name)
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.copytree(path, name, symlinks=True)
        else:
            shutil.copy2(path, name, follow_symlinks=False)
    except OSError as exc:
        print(f"grading sandbox: {name} was not copied into the working folder: {exc}", file=sys.stderr)
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
