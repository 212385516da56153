"""Process pools and numba's threads: a fork after a parallel call, and what is not an executor.

numba's default threading layer on Linux is GNU OpenMP, which ends a forked child that enters a
parallel loop once the parent has started its threads (any ais call): a user's
multiprocessing.Pool then waits for ever for the lost task, and a ProcessPoolExecutor breaks. A
child forked after the threads started runs ais serially instead (the same numbers: each run is
seeded by its index). The checks run in a fresh process, whose threading layer the test does not
choose (the default, and NUMBA_THREADING_LAYER=workqueue), and are killed after a timeout whatever
happens: a hang fails, it never blocks the suite.
"""
import os
import subprocess
import sys
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import gpclab

SCRIPT = r"""
import multiprocessing as mp
from concurrent.futures import ProcessPoolExecutor
import numpy as np, numba, gpclab

r = np.random.default_rng(0)
X = r.standard_normal((20, 2))
y = np.where(X[:, 0] > 0, 1.0, -1.0)
K = gpclab.kernel_matrix("se", X, X, [0.0, 0.0])


def task(seed):
    return float(gpclab.ais(K, y, "probit", 50, 4, 0.2, seed=seed)[0])


serial = [task(s) for s in (1, 2, 3)]                 # numba's threads start here
print("LAYER", numba.threading_layer(), flush=True)
print("SERIAL", serial, flush=True)
ctx = mp.get_context("fork")
with ctx.Pool(2) as pool:
    print("POOL", pool.map_async(task, (1, 2, 3)).get(timeout=TIMEOUT), flush=True)
with ProcessPoolExecutor(2, mp_context=ctx) as pool:
    print("EXECUTOR", list(pool.map(task, (1, 2, 3), timeout=TIMEOUT)), flush=True)
grid = gpclab.ais_grid(X, y, [0.0], [0.0, 0.5], T=50, R=2, progress=False)["log_Z"]
with ProcessPoolExecutor(2, mp_context=ctx) as pool:
    forked = gpclab.ais_grid(X, y, [0.0], [0.0, 0.5], T=50, R=2, progress=False, executor=pool)["log_Z"]
print("GRID", grid.ravel().tolist(), forked.ravel().tolist(), flush=True)
print("PARENT", task(1) == serial[0], numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork: Linux")
@pytest.mark.parametrize("layer", [None, "workqueue"])
def test_a_fork_pool_after_ais_runs_it_serially_with_the_same_numbers(layer):
    env = dict(os.environ)
    env.pop("NUMBA_THREADING_LAYER", None)
    if layer:
        env["NUMBA_THREADING_LAYER"] = layer
    # a generous bound on a loaded machine (a cold compile of ais takes up to a minute); a hang
    # of the pool shows as the subprocess's own timeout, well inside the outer one
    script = SCRIPT.replace("TIMEOUT", "900")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=1200, env=env)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-3000:]
    assert "fork() called" not in out.stderr
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    if layer:
        assert lines["LAYER"] == layer
    assert lines["POOL"] == lines["SERIAL"], out.stdout
    assert lines["EXECUTOR"] == lines["SERIAL"], out.stdout
    grid, forked = lines["GRID"].split("] [")
    assert grid + "]" == "[" + forked, out.stdout
    assert lines["PARENT"] == "True True"                  # the parent keeps its threads


@pytest.mark.parametrize("executor,match", [
    (ProcessPoolExecutor, "got the class ProcessPoolExecutor itself"),
    (4, "have a submit"),
    ("pool", "have a submit"),
])
@pytest.mark.parametrize("where", ["evidence_grid", "ais_grid", "cross_validate"])
def test_what_is_not_an_executor_is_refused(executor, match, where):
    r = np.random.default_rng(0)
    X = r.standard_normal((10, 2))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    call = {"evidence_grid": lambda: gpclab.evidence_grid(X, y, [0.0], [0.0], progress=False, executor=executor),
            "ais_grid": lambda: gpclab.ais_grid(X, y, [0.0], [0.0], T=10, progress=False, executor=executor),
            "cross_validate": lambda: gpclab.cross_validate(X, y, n_folds=2, executor=executor)}[where]
    with pytest.raises(ValueError, match=f"{where}: executor must .*{match}"):
        call()
