"""Process pools and numba's threads: a fork after a parallel call, and what is not an executor.

numba's default threading layer on Linux is GNU OpenMP, which kills a forked child that runs
parallel code once the parent has started its threads (any ais call): the pool breaks
(BrokenProcessPool) or, with multiprocessing.Pool, waits forever. ais_grid refuses such a pool
with the two ways out (a spawn context, or numba's fork-safe TBB layer from the tbb package);
with TBB the forked pool gives the serial answer. The check runs in a fresh process, whose
threading layer the test does not choose, and is killed after a timeout whatever happens.
"""
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
gpclab.ais(K, y, "probit", 50, 2, 0.2, 5)              # numba's threads start
print("LAYER", numba.threading_layer(), flush=True)
serial = gpclab.ais_grid(X, y, [0.0], [0.0, 0.5], T=50, R=2, progress=False)["log_Z"]
print("SERIAL", serial.ravel().tolist(), flush=True)
with ProcessPoolExecutor(2, mp_context=mp.get_context("fork")) as pool:
    try:
        out = gpclab.ais_grid(X, y, [0.0], [0.0, 0.5], T=50, R=2, progress=False, executor=pool)
        print("FORKED", out["log_Z"].ravel().tolist(), flush=True)
    except RuntimeError as e:
        print("REFUSED", e, flush=True)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork with GNU OpenMP: Linux")
def test_a_fork_pool_after_ais_is_refused_or_works():
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in out.stdout.splitlines() if " " in line)
    if lines["LAYER"] == "omp":
        assert "REFUSED" in lines, out.stdout
        msg = lines["REFUSED"]
        assert msg.startswith("ais_grid: executor starts its workers by fork")
        assert 'get_context("spawn")' in msg and "NUMBA_THREADING_LAYER=tbb" in msg
    else:                                                   # tbb (or workqueue): fork-safe
        assert lines["FORKED"] == lines["SERIAL"], out.stdout


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
