"""Start-up cost of gpclab for a course: first cell, compile time, autograding.

Measures, in fresh processes on copies of gpclab.py in temporary folders (a stand-in for a
non-editable installation):

1. the first cell of a new user (import; Laplace, EP and EM-EP fits with predictions on
   GPML's three-Gaussians data; a short AIS run), written with the book's functions and
   with GPClassifier (CELLS), with
   - a cold cache (nothing compiled yet),
   - a warmed shared cache: `python -m gpclab compile` run by the owner, then the folder
     made read-only and the user's home read-only too,
   - a warm private cache (the same user's second process);
   - four users at once on the warmed installation (three times), with a hub's default
     environment (no OPENBLAS_NUM_THREADS), beside the same with gpclab's one-BLAS-thread
     rule switched off;
2. the compile time of every public code path from an empty cache (`python -m gpclab
   compile`), per path, optionally beside another gpclab.py (`--reference`, e.g. an older
   version) in the same run;
3. nbgrader autograding seconds per submission, cold and warm (`--assignment`, default
   ex3_10_4, two solved submissions);
4. the ratios measured by other benchmark scripts, side by side (extra_ratios below).

Times are wall-clock and CPU seconds of the measured process (CPU time is much less
disturbed by other load on the machine than wall time); the load average is printed
with them. Run from the repository root: `python benchmarks/bench_startup.py` (add
`--skip-autograde`, `--skip-compile`, `--skip-ratios` or `--quick` to shorten).
"""
import argparse
import glob
import json
import os
import py_compile
import resource
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# A student's first cell, two ways: with the book's functions (as the exercises and lectures
# call them: ML-II, then the approximation and its predictions; EM-EP; a short AIS run), and
# with the scikit-learn estimator, GPClassifier (which imports scikit-learn, 0.6 s of CPU).
_CELL_START = r"""
import os, time, json, warnings
t0, c0 = time.perf_counter(), time.process_time()
import numpy as np
import gpclab
t_import = time.perf_counter() - t0
if "BENCH_BLAS_BELOW" in os.environ:            # 0: gpclab leaves BLAS's threads alone (the comparison)
    gpclab._BLAS_ONE_THREAD_BELOW = int(os.environ["BENCH_BLAS_BELOW"])
X, y = gpclab.make_three_gaussians(seed=0)
Xs = X[:5]
"""
_CELL_END = r"""
    K = gpclab.kernel_matrix("se", X, X, np.log([2.0, 2.0])) + 1e-8 * np.eye(X.shape[0])
    log_Z = gpclab.ais(K, y, "probit", T=200, R=2)
print(json.dumps({"wall": time.perf_counter() - t0, "cpu": time.process_time() - c0,
                  "import": t_import, "file": gpclab.__file__}))
"""
BOOK_CELL = _CELL_START + r"""
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for method, lik in (("laplace", "logistic"), ("ep", "probit")):
        h, _, _ = gpclab.ml2(X, y, gpclab.data_log_hyp("se", X, y), "se", lik, method=method)
        K = gpclab.kernel_matrix("se", X, X, h)
        K_s, k_ss = gpclab.kernel_matrix("se", X, Xs, h), gpclab.kernel_diag("se", Xs, h)
        if method == "laplace":      # without L, as the lectures call them: the same compiled code
            r = gpclab.laplace_mode(K, y, lik)
            p = gpclab.laplace_predict(r.f_hat, K, y, lik, K_s, k_ss)
        else:
            r = gpclab.ep(K, y)
            p = gpclab.ep_predict(r.nu_tilde, r.tau_tilde, K, K_s, k_ss)
    out = gpclab.em_ep(X, y)
""" + _CELL_END
FIRST_CELL = _CELL_START + r"""
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    for method in ("laplace", "ep", "emep"):
        model = gpclab.GPClassifier(method=method).fit(X, y)
        p = model.predict_proba(Xs)
""" + _CELL_END
CELLS = {"book's functions": BOOK_CELL, "GPClassifier": FIRST_CELL}


def load():
    return os.getloadavg()[0]


def env_for(home, site, hub_default=False, **extra):
    """The environment of a user's process; hub_default: no thread settings at all (as a
    JupyterHub starts kernels), else OPENBLAS_NUM_THREADS=1 for steadier single timings."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("NUMBA_", "XDG_", "OPENBLAS_", "OMP_", "MKL_"))
           and k not in ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE")}
    env.update(HOME=home, PYTHONPATH=site, **extra)
    if not hub_default:
        env["OPENBLAS_NUM_THREADS"] = "1"
    return env


def install_copy(tmp, name, source=os.path.join(ROOT, "gpclab.py")):
    """A fresh 'installation': a folder holding only gpclab.py and its bytecode, as pip
    installs it (a read-only installation without the bytecode would compile gpclab.py's
    source at every import), with no numba cache yet."""
    site = os.path.join(tmp, name, "site")
    os.makedirs(site)
    shutil.copy(source, os.path.join(site, "gpclab.py"))
    py_compile.compile(os.path.join(site, "gpclab.py"), doraise=True)
    return site


def run_json(code, env, read_only=None):
    """Run code in a fresh Python; read_only: a folder the process cannot write."""
    cmd = [sys.executable, "-c", code]
    if read_only and os.geteuid() == 0:   # chmod does not stop root: a read-only bind mount
        cmd = ["unshare", "-m", "sh", "-c",
               'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$1" -c "$2"',
               read_only, sys.executable, code]
    out = subprocess.run(cmd, env=env, cwd=env["HOME"] if os.path.isdir(env["HOME"]) else "/",
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    return json.loads(out.stdout.strip().splitlines()[-1])


def run_at_once(code, env, read_only, k):
    """Start k users' processes together (a busy hub); the wall seconds of each first cell."""
    cmd = [sys.executable, "-c", code]
    if read_only and os.geteuid() == 0:
        cmd = ["unshare", "-m", "sh", "-c",
               'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$1" -c "$2"',
               read_only, sys.executable, code]
    procs = [subprocess.Popen(cmd, env=env, cwd=env["HOME"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(k)]
    out = []
    for p in procs:
        stdout, stderr = p.communicate()
        if p.returncode != 0:
            raise RuntimeError(stderr)
        out.append(json.loads(stdout.strip().splitlines()[-1])["wall"])
    return out


def compile_command(site, home, paths=()):
    """Run `python -m gpclab compile`: (wall seconds, CPU seconds, its output)."""
    t0, c0 = time.perf_counter(), resource.getrusage(resource.RUSAGE_CHILDREN)
    out = subprocess.run([sys.executable, "-m", "gpclab", "compile", *paths],
                         env=env_for(home, site), cwd=os.path.dirname(site),
                         capture_output=True, text=True)
    if out.returncode != 0:
        raise RuntimeError(out.stderr)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime
    return time.perf_counter() - t0, cpu, out.stdout


COMPILE_CPU = r"""
import json, sys, time, inspect, importlib.util
c0, t0 = time.process_time(), time.perf_counter()
spec = importlib.util.spec_from_file_location("gpclab", sys.argv[1])
gp = importlib.util.module_from_spec(spec); sys.modules["gpclab"] = gp; spec.loader.exec_module(gp)
if not hasattr(gp, "_compile_all"):  # an older gpclab: run this version's workload on it
    if not hasattr(gp, "_estimator"):    # ... whose GPClassifier is made at import
        gp._estimator = lambda: gp.GPClassifier
    exec(sys.argv[2], gp.__dict__)
times = {}
for path in gp._COMPILE_PATHS:
    c1 = time.process_time()
    gp._compile_all([path], log=lambda s: None)
    times[path] = time.process_time() - c1
print(json.dumps({"paths": times, "cpu": time.process_time() - c0,
                  "wall": time.perf_counter() - t0}))
"""


def first_cell(tmp, repeats=3):
    print(f"\n1. First cell of a new user (load average {load():.1f})")
    res = {}
    # cold: an installation nobody has compiled, a writable home
    site = install_copy(tmp, "cold")
    home = os.path.join(tmp, "cold", "home")
    os.makedirs(home)
    res["cold"] = run_json(FIRST_CELL, env_for(home, site))
    # warm private: the same user's next process
    res["warm private"] = run_json(FIRST_CELL, env_for(home, site))
    # warmed shared: the owner compiles, then installation and home are read-only
    ro = os.path.join(tmp, "shared", "ro")
    site = install_copy(os.path.join(tmp, "shared"), "ro")
    home = os.path.join(ro, "home")
    os.makedirs(home)
    wall, cpu, log = compile_command(site, os.path.join(tmp, "shared", "admin"))
    print(f"  python -m gpclab compile: wall {wall:.1f} s, cpu {cpu:.1f} s; wall per path:")
    print("\n".join("   " + line for line in log.splitlines()[1:-1]))
    if os.geteuid() != 0:
        subprocess.run(["chmod", "-R", "a-w", ro], check=True)
    res["warmed shared, read-only"] = run_json(FIRST_CELL, env_for(home, site), read_only=ro)
    for cell_name, cell in CELLS.items():
        if cell is not FIRST_CELL:
            res[f"warmed shared, read-only ({cell_name})"] = run_json(cell, env_for(home, site), read_only=ro)
        for label, extra in (("hub default", {}), ("BLAS threads left alone", {"BENCH_BLAS_BELOW": "0"})):
            label = f"4 at once, {cell_name}, {label}"
            times = [run_at_once(cell, env_for(home, site, hub_default=True, **extra), ro, 4)
                     for _ in range(repeats)]
            print(f"  {label:56s} wall " + "; ".join(", ".join(f"{t:.2f}" for t in run) for run in times)
                  + " s")
            res[label] = {"wall": max(max(run) for run in times), "cpu": float("nan"), "import": float("nan")}
    subprocess.run(["chmod", "-R", "u+w", ro], check=True)
    for k, v in res.items():
        print(f"  {k:56s} wall {v['wall']:6.2f} s   cpu {v['cpu']:6.2f} s   "
              f"(import {v['import']:.2f} s)")
    print(f"  load average after: {load():.1f}")
    return res


def compile_times(tmp, reference=None):
    print(f"\n2. Compile time of every public path from an empty cache (load average {load():.1f})")
    import inspect
    sys.path.insert(0, ROOT)
    import gpclab
    workload = inspect.getsource(gpclab._compile_all) + "\n_COMPILE_PATHS = " + repr(
        gpclab._COMPILE_PATHS)
    res = {}
    for name, source in [("this gpclab.py", os.path.join(ROOT, "gpclab.py")),
                         ("reference", reference)]:
        if source is None:
            continue
        site = install_copy(tmp, "compile-" + name.replace(" ", "_"), source)
        home = os.path.join(os.path.dirname(site), "home")
        os.makedirs(home)
        out = subprocess.run([sys.executable, "-c", COMPILE_CPU, os.path.join(site, "gpclab.py"),
                              workload], env=env_for(home, site), cwd=home,
                             capture_output=True, text=True)
        if out.returncode != 0:
            raise RuntimeError(out.stderr)
        res[name] = r = json.loads(out.stdout.strip().splitlines()[-1])
        per_path = ", ".join(f"{k} {v:.1f}" for k, v in r["paths"].items())
        print(f"  {name:16s} cpu {r['cpu']:6.1f} s  wall {r['wall']:6.1f} s  ({per_path}; cpu s)")
    if len(res) == 2:
        print(f"  ratio of CPU times, this / reference: "
              f"{res['this gpclab.py']['cpu'] / res['reference']['cpu']:.2f}")
    print(f"  load average after: {load():.1f}")
    return res


def autograde(tmp, assignment, n_submissions=2):
    print(f"\n3. nbgrader autograde, {assignment}, {n_submissions} submissions "
          f"(load average {load():.1f})")
    res = {}
    for state in ("cold", "warm"):
        base = os.path.join(tmp, "grade-" + state)
        site = install_copy(tmp, "grade-" + state)
        home = os.path.join(base, "home")
        os.makedirs(home)
        if state == "warm":
            compile_command(site, home)
        course = os.path.join(base, "course")
        shutil.copytree(os.path.join(ROOT, "exercises"), course, ignore=shutil.ignore_patterns(
            "release", "submitted", "autograded", "feedback", "gradebook.db", ".ipynb_checkpoints"))
        env = env_for(home, site)
        env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
        for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
            env[var] = os.path.join(base, var.lower())
        nbgrader = os.path.join(os.path.dirname(sys.executable), "nbgrader")
        subprocess.run([nbgrader, "generate_assignment", assignment, "--force"], cwd=course,
                       env=env, capture_output=True, check=True)
        for s in range(n_submissions):
            dest = os.path.join(course, "submitted", f"student{s}", assignment)
            os.makedirs(dest)
            for nb in glob.glob(os.path.join(course, "source", assignment, "*.ipynb")):
                shutil.copy(nb, dest)
        t0 = time.perf_counter()
        subprocess.run([nbgrader, "autograde", assignment, "--force"], cwd=course, env=env,
                       capture_output=True, check=True)
        res[state] = (time.perf_counter() - t0) / n_submissions
        print(f"  {state:5s} cache: {res[state]:6.1f} s per submission (wall)")
    print(f"  load average after: {load():.1f}")
    return res


def extra_ratios(quick=False):
    """Speed ratios of the other benchmark scripts, run here side by side with the above.

    Each is a ratio of two timings taken one after the other in this process (peer or
    serial time / gpclab or parallel time; above 1 means gpclab or the pool is faster):
    the AIS grid on two worker processes against the serial run (bench_ais.grid_ratio,
    GPML Figure 3.12's 21 x 21 grid at n = 180; quick: 7 x 7), multi-class predictions
    against scikit-learn's one-vs-rest (bench_multiclass.predict_ratio, n = 500 and
    1000) and ML-II on EP's evidence against GPy (bench_ml2_ep.ml2_ratio, Boston
    n = 500; skipped if GPy is not installed). Returns {label: value}.
    """
    sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
    import bench_ais
    import bench_multiclass

    results = {}
    T, size = (50, 7) if quick else (100, 21)
    r = bench_ais.grid_ratio(T, size)
    results[f"AIS grid {size}x{size}: serial (numba threads) / 2 workers"] = r["speedup"]
    results[f"AIS grid {size}x{size}: serial (1 thread) / 2 workers"] = r["speedup_1_thread"]
    for n in (500, 1000):
        r = bench_multiclass.predict_ratio(n)
        results[f"multi-class predict n={n}: sklearn / gpclab"] = r["ratio"]
        results[f"multi-class predict n={n}: MC standard error (max)"] = r["se_max"]
    try:
        import GPy  # noqa: F401
    except ImportError:
        print("  (GPy not installed: ML-II against GPy skipped)")
        return results
    import bench_ml2_ep

    for name, row in bench_ml2_ep.ml2_ratio(500).items():
        results[f"ML-II EP {name}: GPy / gpclab"] = row["ratio"]
        results[f"ML-II EP {name}: log Z gpclab - GPy"] = row["log_Z_gpclab"] - row["log_Z_gpy"]
    return results


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reference", help="another gpclab.py to compile beside this one")
    parser.add_argument("--assignment", default="ex3_10_4")
    parser.add_argument("--skip-compile", action="store_true")
    parser.add_argument("--skip-autograde", action="store_true")
    parser.add_argument("--skip-ratios", action="store_true")
    parser.add_argument("--quick", action="store_true", help="a 7 x 7 AIS grid instead of 21 x 21")
    args = parser.parse_args()
    print(f"bench_startup: load average {os.getloadavg()}, {os.cpu_count()} CPUs")
    tmp = tempfile.mkdtemp(prefix="gpclab-startup-")
    os.chmod(tmp, 0o755)
    try:
        first_cell(tmp)
        if not args.skip_compile:
            compile_times(tmp, args.reference)
        if not args.skip_autograde:
            autograde(tmp, args.assignment)
        ratios = {} if args.skip_ratios else extra_ratios(args.quick)
        if ratios:
            print(f"\n4. Other measurements (load average {load():.1f})")
            for k, v in ratios.items():
                print(f"  {k:50s} {v:8.2f}")
    finally:
        subprocess.run(["chmod", "-R", "u+w", tmp])
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
