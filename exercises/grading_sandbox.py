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

Without `bwrap` on the PATH autograde refuses to run a kernel. An instructor who grades elsewhere
in isolation (e.g. a container per submission) opts out in nbgrader_config.py with
`c.SandboxedKernelManager.allow_unsandboxed = True`.
"""
import importlib.util
import os
import shutil
import sys
import tempfile

from jupyter_client.manager import AsyncKernelManager
from nbgrader.preprocessors import Execute
from traitlets import Bool, List, Unicode


class SandboxUnavailable(RuntimeError):
    pass


# system folders the kernel sees read-only (those that exist; symbolic links stay links)
SYSTEM_PATHS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32", "etc", "opt", "sys")
# the kernel's home folder (an empty tmpfs); the working folder appears in it
HOME = "/home/student"


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
        if bwrap is not None:
            cwd = os.path.abspath(kw.get("cwd") or os.getcwd())
            env = dict(kw.get("env") or os.environ)
            cmd, kw["env"] = self._wrap(bwrap, cmd, cwd, env)
            kw["cwd"] = cwd
        return cmd, kw

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
        env = {k: v for k, v in env.items()
               if not k.startswith(("JUPYTER_", "IPYTHONDIR", "XDG_", "MPLCONFIGDIR"))}
        env.update(HOME=HOME, TMPDIR="/tmp", PWD=work)
        return args + ["--"] + list(cmd), env


class SandboxedExecute(Execute):
    """nbgrader's Execute preprocessor with kernels from SandboxedKernelManager."""

    def __init__(self, *args, **kwargs):
        kwargs.setdefault("kernel_manager_class", SandboxedKernelManager)
        super().__init__(*args, **kwargs)
