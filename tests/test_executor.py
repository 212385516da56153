"""Grids on a concurrent.futures-style executor give exactly the serial results."""
import multiprocessing
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest

import gpclab
from conftest import small_problem


def _grids(executor):
    """A Laplace grid with test scores, an EP grid, a multi-class grid and an AIS grid, all small."""
    X, y = small_problem(3, n=16)
    Xt, yt = small_problem(4, n=10)
    le, ls = np.array([-0.5, 0.5, 1.5]), np.array([0.0, 1.0])
    r = np.random.default_rng(5)
    Xm = np.vstack([r.normal(c, 0.8, (6, 2)) for c in ([0, 0], [3, 0], [0, 3])])
    lm = np.repeat([0, 1, 2], 6)
    return {
        "laplace": gpclab.evidence_grid(X, y, le, ls, X_test=Xt, y_test=yt, progress=False, executor=executor),
        "ep": gpclab.evidence_grid(X, y, le, ls, likelihood="probit", method="ep", progress=False,
                                   executor=executor),
        "multi": gpclab.evidence_grid(Xm, lm, le[:2], ls[:1], X_test=Xm[::2], y_test=lm[::2], n_samples=50,
                                      progress=False, executor=executor),
        "ais": gpclab.ais_grid(X, y, le[:2], ls, T=60, R=3, progress=False, executor=executor),
    }


def _assert_identical(a, b):
    for name in a:
        assert a[name].keys() == b[name].keys()
        for key in a[name]:
            np.testing.assert_array_equal(a[name][key], b[name][key], err_msg=f"{name} {key}")


@pytest.fixture(scope="module")
def serial():
    return _grids(None)


def test_process_pool_gives_the_serial_grids(serial):
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(2, mp_context=ctx) as pool:
        _assert_identical(serial, _grids(pool))
    # the grids are not trivially equal: they vary over the grid points
    assert np.ptp(serial["laplace"]["log_q"]) > 0.1 and np.ptp(serial["ais"]["log_Z"]) > 0.1


def test_dask_local_cluster_gives_the_serial_grids(serial):
    distributed = pytest.importorskip("distributed")
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True,
                                  dashboard_address=None) as cluster, distributed.Client(cluster) as client:
        _assert_identical(serial, _grids(client.get_executor()))


def test_executor_without_submit_is_refused():
    X, y = small_problem(3)
    with pytest.raises(ValueError, match="executor must have a submit"):
        gpclab.evidence_grid(X, y, [0.0], [0.0], progress=False, executor=4)
    with pytest.raises(ValueError, match="executor must have a submit"):
        gpclab.ais_grid(X, y, [0.0], [0.0], T=10, progress=False, executor="pool")
