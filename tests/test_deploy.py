"""A course installation: warmed once by `python -m gpclab compile`, then used read-only.

A copy of gpclab.py in a temporary folder stands for a non-editable installation. The
administrator warms its cache with the compile command (the binary Laplace path, to keep the
test short); the folder is then made read-only (chmod, or a read-only bind mount when the
tests run as root, whom chmod does not stop) and used by fresh processes whose home folder is
read-only too. numba's dispatcher statistics tell cache hits from compilations.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pytest
from scipy.stats import norm

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Runs in the user's process: the Laplace path the administrator warmed, then a function
# it did not warm. Prints the cache statistics and the warnings as JSON, leaving out ML-II's
# warning that its 3 steps (max_iter=3, to keep the fit short) did not converge.
USER_CODE = r"""
import json, warnings
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    import numba
    import gpclab

    def stats():
        hits = misses = 0
        for name in dir(gpclab):
            f = getattr(gpclab, name)
            f = getattr(f, "dispatcher", f)  # a public function's njit body
            if isinstance(f, numba.core.dispatcher.Dispatcher):
                hits += sum(f.stats.cache_hits.values())
                misses += sum(f.stats.cache_misses.values())
        return hits, misses

    X, y = gpclab.make_three_gaussians(seed=0)
    m = gpclab.GPClassifier(max_iter=3).fit(X, y)     # 3 ML-II steps: the Laplace path, quickly
    p = m.predict_proba([[-6.0], [0.0]])
    warmed = stats()
    moments = gpclab.probit_moments(1.0, 0.5, 2.0)
    after = stats()
print(json.dumps({"warmed": warmed, "after": after, "p": p.tolist(), "moments": list(moments),
                  "file": gpclab.__file__,
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught
                               if "ML-II L-BFGS-B stopped without converging" not in str(w.message)]}))
"""


def _env(home, **extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_", "XDG_")) and k != "PYTHONPATH"}
    env.update(HOME=home, **extra)
    return env


def _run_user(ro_root, env):
    """USER_CODE in a fresh process that cannot write below ro_root."""
    if os.geteuid() == 0:
        cmd = ["unshare", "-m", "sh", "-c",
               'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$1" -c "$2"',
               ro_root, sys.executable, USER_CODE]
    else:
        cmd = [sys.executable, "-c", USER_CODE]
    r = subprocess.run(cmd, env=env, cwd=os.path.dirname(ro_root), capture_output=True, text=True,
                       timeout=600)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


def _check_results(out):
    """The answers are right: probit moments (GPML 3.58) against scipy; sensible predictions."""
    y, mu, s2 = 1.0, 0.5, 2.0
    z = y * mu / (1 + s2) ** 0.5
    r = norm.pdf(z) / norm.cdf(z)
    assert out["moments"] == pytest.approx(
        [norm.logcdf(z), mu + y * s2 * r / (1 + s2) ** 0.5,
         s2 - s2 ** 2 * r * (z + r) / (1 + s2)], rel=1e-12)
    assert out["p"][0][1] > 0.5 > out["p"][1][1]           # P(class +1) at x = -6 and 0


@pytest.fixture(scope="module")
def installation():
    if os.geteuid() == 0:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind / /mnt"],
                               capture_output=True) if shutil.which("unshare") else None
        if probe is None or probe.returncode != 0:
            pytest.skip("running as root without mount namespaces: cannot make a folder read-only")
    tmp = tempfile.mkdtemp(prefix="gpclab-deploy-")
    ro = os.path.join(tmp, "ro")
    site, home = os.path.join(ro, "site"), os.path.join(ro, "home")
    os.makedirs(site)
    os.makedirs(home)
    shutil.copy(os.path.join(ROOT, "gpclab.py"), site)
    admin = subprocess.run([sys.executable, "-m", "gpclab", "compile", "laplace"], cwd=tmp,
                           env=_env(os.path.join(tmp, "admin"), PYTHONPATH=site),
                           capture_output=True, text=True, timeout=1200)
    assert admin.returncode == 0, admin.stderr
    assert os.path.join(site, "__pycache__") in admin.stdout
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", ro], check=True)
    yield tmp, ro, site, home
    subprocess.run(["chmod", "-R", "u+w", tmp], check=True)
    shutil.rmtree(tmp)


def test_read_only_installation_and_home_loads_the_warmed_cache(installation):
    """No writable folder at all: imports, loads the warmed path without compiling, one warning."""
    tmp, ro, site, home = installation
    out = _run_user(ro, _env(home, PYTHONPATH=site))
    assert out["file"] == os.path.join(site, "gpclab.py")
    hits, misses = out["warmed"]
    assert misses == 0 and hits > 0                       # everything loaded, nothing compiled
    assert out["after"][1] > 0                            # probit_moments was not warmed: compiled
    assert len(out["warnings"]) == 1, out["warnings"]     # ... in memory, with one warning
    assert out["warnings"][0].startswith("RuntimeWarning: gpclab: cannot save compiled functions")
    _check_results(out)


@pytest.mark.parametrize("where", ["home", "NUMBA_CACHE_DIR"])
def test_new_compilations_go_to_a_private_cache_and_the_shared_one_is_still_read(installation, where):
    """A writable home (or NUMBA_CACHE_DIR) keeps what the shared cache lacks, for the next process."""
    tmp, ro, site, home = installation
    private = tempfile.mkdtemp(dir=tmp)
    if where == "home":
        env = _env(private, PYTHONPATH=site)
    else:
        env = _env(home, PYTHONPATH=site, NUMBA_CACHE_DIR=private)
    first = _run_user(ro, env)
    assert first["warmed"][1] == 0 and first["warmed"][0] > 0
    assert first["after"][1] > 0 and first["warnings"] == []
    saved = [f for _, _, files in os.walk(private) for f in files]
    assert any(f.startswith("gpclab.probit_moments") and f.endswith(".nbc") for f in saved), saved
    assert not any(f.startswith("gpclab.laplace_mode") for f in saved), saved
    second = _run_user(ro, env)
    assert second["after"][1] == 0 and second["after"][0] > second["warmed"][0]
    assert second["warnings"] == []
    _check_results(second)


# Runs in a fresh process: every warmed path again; prints cache misses, the argument types
# each public function was loaded for, and how often numba refreshed its whole target context
# (gpclab's cache loads refresh only what cached code links to: a missing symbol would end the
# process in LLVM, so running every path proves the rest is not needed).
PATHS_AGAIN = r"""
import json, sys
import numba
from numba.core import base
refreshes = []
refresh = base.BaseContext.refresh
def counted(self):
    refreshes.append(1)
    return refresh(self)
base.BaseContext.refresh = counted
import gpclab
gpclab._compile_all(sys.argv[1:], log=lambda s: None)
misses, types = 0, {}
for name in dir(gpclab):
    f = getattr(gpclab, name)
    if isinstance(f, gpclab.PublicFunction) and isinstance(f.dispatcher, numba.core.dispatcher.Dispatcher):
        misses += sum(f.dispatcher.stats.cache_misses.values())
        if f.dispatcher.signatures:
            types[name] = [str(s) for s in f.dispatcher.signatures]
print(json.dumps({"misses": misses, "types": types, "refreshes": len(refreshes)}))
"""


def test_compile_in_two_processes_warms_every_path_with_one_type_per_function(tmp_path):
    """`python -m gpclab compile laplace ep --jobs 2` shares the paths out over two worker
    processes, then checks that everything loads from the cache; a new process then compiles
    nothing. Each public function is compiled for one combination of argument types only,
    whether called through its checked entry with optional arguments left out, through
    .unchecked by the Python layer, or with warm starts (an absent warm start arrives as zeros)."""
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(os.path.join(ROOT, "gpclab.py"), site)
    env = _env(str(tmp_path / "home"), PYTHONPATH=str(site))
    admin = subprocess.run([sys.executable, "-m", "gpclab", "compile", "laplace", "ep", "--jobs", "2"],
                           cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1200)
    assert admin.returncode == 0, admin.stderr
    assert "binary Laplace" in admin.stdout and "binary EP" in admin.stdout, admin.stdout
    assert "checked: every path loads from the cache" in admin.stdout, admin.stdout   # nothing was lost
    r = subprocess.run([sys.executable, "-c", PATHS_AGAIN, "laplace", "ep"], cwd=tmp_path, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["misses"] == 0 and out["refreshes"] == 0
    for name in ("laplace_mode", "ep", "kernel_matrix", "laplace_log_q_grad",
                 "ep_log_Z_grad", "laplace_predict", "ep_predict"):
        assert name in out["types"], sorted(out["types"])
    several = {k: v for k, v in out["types"].items() if len(v) > 1}
    assert not several, several


def test_compile_command_refuses_bad_arguments(tmp_path):
    for args, message in ((["nonsense"], "unknown path"), (["--jobs", "0"], "--jobs must be")):
        r = subprocess.run([sys.executable, "-m", "gpclab", "compile", *args], cwd=ROOT,
                           capture_output=True, text=True, timeout=600)
        assert r.returncode == 2 and message in r.stderr, r.stderr


# Runs in a fresh process with an empty cache: compiles every path, listening to numba's compile events.
ONE_TYPE_EACH = r"""
import collections, json
from numba.core import event
import gpclab
seen = collections.defaultdict(set)

class Listener(event.Listener):
    def on_start(self, ev):
        f = ev.data["dispatcher"].py_func
        if f.__module__ == "gpclab":
            seen[f.__qualname__].add(str(ev.data["args"]))

    def on_end(self, ev):
        pass

event.register("numba:compile", Listener())
gpclab._compile_all(log=lambda s: None)
print(json.dumps({k: sorted(v) for k, v in seen.items()}))
"""


def _run_on_a_copy(tmp_path, code):
    """Run code in a fresh process on a copy of gpclab.py with a cache of its own (empty the first
    time for this tmp_path); its stdout."""
    site = tmp_path / "site"
    if not site.exists():
        site.mkdir()
        shutil.copy(os.path.join(ROOT, "gpclab.py"), site)
    env = _env(str(tmp_path / "home"), PYTHONPATH=str(site), NUMBA_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True,
                       text=True, timeout=1200)
    assert r.returncode == 0, r.stderr
    return r.stdout


def test_every_path_compiles_each_function_for_one_type_only(tmp_path):
    """Every numba function of gpclab, internal helpers included, is compiled for one combination of
    argument types on all the paths of `python -m gpclab compile`. That keeps compilation short, and it
    keeps the cache consistent when worker processes compile at once: numba's cache index is not
    locked, and two processes saving different types of one function at the same moment could leave an
    entry pointing at the other's code; saving the same type twice is harmless."""
    seen = json.loads(_run_on_a_copy(tmp_path, ONE_TYPE_EACH).strip().splitlines()[-1])
    assert {"laplace_mode", "ep", "ais", "_ais_temperatures", "laplace_mode_multiclass", "em_ep_grad",
            "elliptical_slice_latent", "_current_column", "averaged_probability"} <= set(seen)
    several = {k: v for k, v in seen.items() if len(v) > 1}
    assert not several, several
    # a new process loads every path from that cache, without numba's full refresh
    again = json.loads(_run_on_a_copy(tmp_path, PATHS_AGAIN).strip().splitlines()[-1])
    assert again["misses"] == 0 and again["refreshes"] == 0, again
    assert {"laplace_mode", "ep", "ais", "laplace_mode_multiclass", "em_ep_grad"} <= set(again["types"])


def test_compile_paths_refuses_an_unknown_path():
    import gpclab
    with pytest.raises(ValueError, match="unknown path"):
        gpclab.compile_paths(["laplce"])



def test_compile_chains_share_out_every_path_once():
    """However many workers and whichever paths, each path is compiled by exactly one
    process, in at most `jobs` chains (or one per path when there are fewer paths)."""
    import gpclab
    everything = list(gpclab._COMPILE_PATHS)
    assert sorted(p for chain in gpclab._COMPILE_CHAINS for p in chain) == sorted(everything)
    for paths in (everything, ["laplace"], ["laplace", "multiclass"], ["ep", "mcmc", "ais"]):
        for jobs in range(1, 11):
            chains = gpclab._split_chains(paths, jobs)
            flat = [p for chain in chains for p in chain]
            assert sorted(flat) == sorted(paths), (paths, jobs, chains)
            assert all(chains)
            if jobs >= 2:                   # jobs = 1 compiles everything in one process
                assert len(chains) == min(jobs, len(paths)), (paths, jobs, chains)


def test_gpclab_functions_compile_at_their_llvm_level_unless_numba_opt_is_set(monkeypatch, tmp_path):
    """gpclab compiles its functions at LLVM level 1 (a quarter less compile time, the same run
    time) and leaves numba's level as it found it; NUMBA_OPT set by the user wins."""
    import numba
    from numba.core import codegen

    import gpclab
    monkeypatch.setattr(numba.config, "CACHE_DIR", str(tmp_path))
    gpclab._cache_dirs.cache_clear()              # (memoised per source file) read CACHE_DIR again
    levels = []                                   # the level LLVM's pass builders are given
    real = codegen.create_pass_builder

    def spy(tm, opt, **kwargs):
        levels.append(int(opt))
        return real(tm, opt=opt, **kwargs)

    monkeypatch.setattr(codegen, "create_pass_builder", spy)

    def one(x):
        return x + 1.0

    def two(x):
        return x + 2.0

    before = int(numba.config.OPT)
    monkeypatch.delenv("NUMBA_OPT", raising=False)
    assert gpclab.njit(cache=True)(one)(1.0) == 2.0
    assert levels and set(levels) <= {gpclab._COMPILE_OPT, 0}, levels     # 0: numba's "cheap" inlining pass
    assert gpclab._COMPILE_OPT in levels and int(numba.config.OPT) == before
    other = 3 if gpclab._COMPILE_OPT != 3 else 2
    levels.clear()
    monkeypatch.setenv("NUMBA_OPT", str(other))
    monkeypatch.setattr(numba.config, "OPT", numba.config._OptLevel(other))
    assert gpclab.njit(cache=True)(two)(1.0) == 3.0
    assert other in levels and gpclab._COMPILE_OPT not in levels, levels
    gpclab._cache_dirs.cache_clear()


SAVE_MISSING = r"""
import glob, os
import gpclab
gpclab._compile_all(["laplace"], log=lambda s: None)
index = glob.glob(os.path.join(os.environ["NUMBA_CACHE_DIR"], "**", "*.laplace_mode-*.nbi"), recursive=True)
os.remove(index[0])
print(gpclab._save_missing_overloads(), gpclab._save_missing_overloads(), len(glob.glob(os.path.dirname(index[0]) + "/*.laplace_mode-*.nbi")))
"""


def test_the_compile_check_saves_again_what_the_cache_index_lost(tmp_path):
    """The check of `python -m gpclab compile` for the functions its own process compiled: a cache
    index entry that is missing (here deleted) is written again from memory, once."""
    first, second, files = map(int, _run_on_a_copy(tmp_path, SAVE_MISSING).split()[-3:])
    assert first >= 1 and second == 0 and files == 1


def test_warm_up_refuses_a_checkout_that_is_not_the_installed_gpclab(tmp_path):
    """`python -m gpclab compile` in the source checkout imports the checkout's gpclab.py (python -m
    puts the current folder first), not the installation students import: it refuses and names
    both, instead of warming the wrong cache. The console script `gpclab compile` has no such trap."""
    site, checkout, home = tmp_path / "site", tmp_path / "checkout", tmp_path / "home"
    for d in (site, checkout, home):
        d.mkdir()
    shutil.copy(os.path.join(ROOT, "gpclab.py"), site / "gpclab.py")
    shutil.copy(os.path.join(ROOT, "gpclab.py"), checkout / "gpclab.py")
    info = site / "gpclab-0.1.0.dist-info"                   # what `pip install .` leaves beside it
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpclab\nVersion: 0.1.0\n")
    (info / "RECORD").write_text("gpclab.py,,\ngpclab-0.1.0.dist-info/METADATA,,\n")
    env = _env(str(home), PYTHONPATH=str(site))
    out = subprocess.run([sys.executable, "-m", "gpclab", "compile", "laplace"], cwd=checkout, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 2, out.stderr
    assert str(checkout / "gpclab.py") in out.stderr and str(site / "gpclab.py") in out.stderr
    assert "gpclab compile" in out.stderr
    assert not (checkout / "__pycache__").exists() or not any((checkout / "__pycache__").glob("*.nbi"))
    # from another folder the installed copy is the one imported, and it is not refused
    out = subprocess.run([sys.executable, "-c", "import gpclab, sys; sys.exit(gpclab._installed_file() "
                          "!= gpclab.os.path.realpath(gpclab.__file__))"], cwd=home, env=env,
                         capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr


def test_the_console_script_is_declared():
    import tomllib
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as fh:
        scripts = tomllib.load(fh)["project"]["scripts"]
    assert scripts == {"gpclab": "gpclab:main"}
