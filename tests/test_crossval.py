"""cross_validate (K&R Table 1's protocol): folds, the executor path, E, I and ||m|| on one fold."""
from concurrent.futures import ProcessPoolExecutor

import numpy as np
import pytest
from scipy.stats import norm

import gpclab
import naive
from conftest import small_problem


def test_folds_partition_the_cases_and_follow_the_seed():
    X, y = small_problem(0, n=23)
    a = gpclab.cross_validate(X, y, n_folds=4, seed=5, max_iter=3)
    b = gpclab.cross_validate(X, y, n_folds=4, seed=5, max_iter=3)
    c = gpclab.cross_validate(X, y, n_folds=4, seed=6, max_iter=3)
    assert sorted(np.concatenate(a["folds"]).tolist()) == list(range(23))   # each case tested once
    assert sorted(len(f) for f in a["folds"]) == [5, 6, 6, 6]
    assert all(np.array_equal(f, g) for f, g in zip(a["folds"], b["folds"]))
    assert not all(np.array_equal(f, g) for f, g in zip(a["folds"], c["folds"]))
    assert a["error"].shape == a["information"].shape == a["norm_m"].shape == (4,)
    assert a["log_hyp"].shape == (4, 2)


def test_executor_gives_the_serial_results():
    X, y = small_problem(1, n=30)
    serial = gpclab.cross_validate(X, y, method="ep", n_folds=3, seed=2, max_iter=10)
    with ProcessPoolExecutor(2) as pool:
        pooled = gpclab.cross_validate(X, y, method="ep", n_folds=3, seed=2, max_iter=10, executor=pool)
    for key in ("error", "information", "norm_m", "log_evidence", "log_hyp"):
        np.testing.assert_array_equal(serial[key], pooled[key])


@pytest.mark.parametrize("method", ["laplace", "ep"])
def test_one_fold_against_a_direct_computation(method):
    """Check E, I (K&R 34, with log2 written out) and ||m|| of the first fold against naive dense
    formulas at the fold's fitted hyperparameters."""
    X, y = small_problem(3, n=40, d=3)
    out = gpclab.cross_validate(X, y, method=method, n_folds=4, seed=1, max_iter=30)
    test = out["folds"][0]
    train = np.setdiff1d(np.arange(40), test)
    mu, sd = X[train].mean(0), X[train].std(0)
    A, B = (X[train] - mu) / sd, (X[test] - mu) / sd
    log_l, log_sf = out["log_hyp"][0]
    K = naive.se_kernel(A, A, log_l, log_sf)
    Ks = naive.se_kernel(A, B, log_l, log_sf)
    kss = np.full(len(test), np.exp(2 * log_sf))
    if method == "laplace":
        m = naive.laplace_mode(K, y[train], "probit")
        mean, var = naive.laplace_predict(K, y[train], "probit", m, Ks, kss)
    else:
        nu, tau, _, m = naive.ep(K, y[train], 60)
        mean, var = naive.ep_predict(K, nu, tau, Ks, kss)
    p = norm.cdf(mean / np.sqrt(1 + var))                        # (3.82)
    yt = y[test]
    q = np.mean(y[train] > 0)
    f = np.mean(yt > 0)
    H = -f * np.log2(q) - (1 - f) * np.log2(1 - q)
    info = np.mean(np.where(yt > 0, np.log2(p), np.log2(1 - p))) + H
    assert out["error"][0] == pytest.approx(np.mean(np.sign(mean) != yt))
    assert out["information"][0] == pytest.approx(info, abs=1e-5)
    assert out["norm_m"][0] == pytest.approx(np.linalg.norm(m), rel=1e-5)


@pytest.mark.parametrize("kwargs, match", [
    ({"method": "emep"}, "method"),
    ({"method": "ep", "likelihood": "logistic"}, "likelihood"),
    ({"n_folds": 1}, "n_folds"),
    ({"n_folds": 2.5}, "n_folds"),
    ({"log_hyp0": [0.0]}, "log_hyp0"),
])
def test_bad_arguments_are_named(kwargs, match):
    X, y = small_problem(0, n=12)
    with pytest.raises(ValueError, match=match):
        gpclab.cross_validate(X, y, **kwargs)
