"""Raw data fit like scaled data: each input in its own unit.

Scaling input m by c_m and the test inputs with it is the same problem in other units: a fit that
follows each input's own spread (the start and bounds of ML-II for 'ard' and 'kg', EM-EP's start
and bounds) gives the same predictions. scikit-learn's GaussianProcessClassifier with an ARD RBF
kernel is the reference behaviour (its predictions moved by 1.5e-5 under (100, 0.01, 1), where
gpclab's, with one median distance for all inputs, moved by up to 0.83). benchmarks/bench_units.py
prints the table of both.
"""
import os

import numpy as np
import pytest

import gpclab

SCALES = [(100.0, 0.01, 1.0), (1e6, 1e-6, 1.0), (1e-3, 1.0, 1e4)]
METHODS = {"laplace": dict(method="laplace", kernel="ard"),
           "ep": dict(method="ep", kernel="ard"),
           "emep": dict(method="emep")}                   # K&G's 'kg', an inverse length-scale per input


def problem(seed=0, n=60):
    """Three inputs: the class from the first two (a curved boundary), the third irrelevant."""
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, 3))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] ** 2 - 0.5 + 0.3 * r.standard_normal(n) > 0, 1, 0)
    Xt = r.standard_normal((40, 3))
    return X, y, Xt


_FITS = {}


def fit(method, scale):
    key = (method, scale)
    if key not in _FITS:
        X, y, Xt = problem()
        c = np.asarray(scale)
        m = gpclab.GPClassifier(**METHODS[method]).fit(X * c, y)
        _FITS[key] = (m.predict_proba(Xt * c)[:, 1], m.log_marginal_likelihood_, m.log_hyp_)
    return _FITS[key]


@pytest.mark.parametrize("scale", SCALES)
@pytest.mark.parametrize("method", list(METHODS))
def test_predictions_do_not_depend_on_the_unit_of_each_input(method, scale):
    p0, v0, h0 = fit(method, (1.0, 1.0, 1.0))
    p, v, h = fit(method, scale)
    assert np.max(np.abs(p - p0)) < 1e-3
    assert abs(v - v0) < 1e-3 * max(1.0, abs(v0))
    # the inverse squared length-scales move by exactly the units: log w_m + 2 log c_m is the same
    first = 2 if method != "emep" else 3
    np.testing.assert_allclose(h[first:] + 2 * np.log(scale), h0[first:], atol=0.05)


@pytest.mark.parametrize("scale", SCALES[:2])
def test_scikit_learn_reference_moves_as_little(scale):
    """The reference behaviour: scikit-learn's ARD GPC under the same rescaling (its length-scale
    bounds widened to cover the units: its default bounds (1e-5, 1e5) are in absolute units)."""
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, y, Xt = problem()

    def sk(c):
        c = np.asarray(c)
        kernel = ConstantKernel(1.0, (1e-5, 1e5)) * RBF(c.copy(), (1e-12, 1e12))
        return GaussianProcessClassifier(kernel, random_state=0).fit(X * c, y).predict_proba(Xt * c)[:, 1]

    moved_sk = np.max(np.abs(sk(scale) - sk((1.0, 1.0, 1.0))))
    moved = np.max(np.abs(fit("laplace", scale)[0] - fit("laplace", (1.0, 1.0, 1.0))[0]))
    assert moved_sk < 1e-3 and moved < 1e-3


def test_start_and_bounds_follow_each_input():
    X, y, _ = problem()
    c = np.array([100.0, 0.01, 1.0])
    for kernel, first in (("ard", 2), ("kg", 3)):
        h0, h = gpclab.data_log_hyp(kernel, X, y), gpclab.data_log_hyp(kernel, X * c, y)
        np.testing.assert_allclose(h[first:], h0[first:] - 2 * np.log(c), atol=1e-12)
        np.testing.assert_allclose(h[:first], h0[:first])
        b0 = np.array(gpclab.default_bounds(kernel, 3, X))
        b = np.array(gpclab.default_bounds(kernel, 3, X * c))
        np.testing.assert_allclose(b[first:], b0[first:] - 2 * np.log(c)[:, None], atol=1e-12)
    # the spread of one input is the median distance between its values, whatever the others
    x = np.array([0.0, 1.0, 3.0, 7.0])
    Z = np.column_stack([x, 1e6 * x, np.ones(4)])
    np.testing.assert_allclose(gpclab._column_spread(Z), [3.5, 3.5e6, 0.0])


def test_column_spread_is_numpys_median_of_the_distinct_pairs():
    """The spreads are taken from one sort of all columns; the reference is numpy's median of each
    column's nonzero pair distances, column by column: odd and even counts, ties, repeated values,
    constant columns, and a sample of 200 rows from more."""
    rng = np.random.default_rng(3)
    gpclab._spread_cache.clear()
    for n, d in ((2, 3), (3, 4), (7, 5), (40, 70), (450, 6)):
        X = np.round(rng.standard_normal((n, d)), 1) * rng.choice([1e-3, 1.0, 1e4], d)
        X[:, 0] = 2.5                                             # constant
        X[: n // 2, -1] = 1.0                                     # many ties
        sub = X[np.linspace(0, n - 1, min(n, 200)).astype(int)]
        i, j = np.triu_indices(sub.shape[0], 1)
        want = []
        for m in range(d):
            dist = np.abs(sub[i, m] - sub[j, m])
            want.append(np.median(dist[dist > 0]) if np.any(dist > 0) else 0.0)
        np.testing.assert_array_equal(gpclab._column_spread(X), want)


def _median_of_distinct_pairs(X, rows=200):
    """The reference: numpy's median of each column's nonzero pair distances (NaN pairs left out)."""
    sub = X[np.linspace(0, X.shape[0] - 1, min(X.shape[0], rows)).astype(int)]
    i, j = np.triu_indices(sub.shape[0], 1)
    out = []
    for m in range(X.shape[1]):
        dist = np.abs(sub[i, m] - sub[j, m])
        out.append(np.median(dist[dist > 0]) if np.any(dist > 0) else 0.0)
    return out


@pytest.mark.parametrize("kind", ["gaussian", "rounded", "few integers", "half tied", "log-normal", "two values"])
def test_column_spread_selection_is_exact_on_ties_and_few_distinct_distances(kind):
    """_column_spread selects the median among the pair distances without forming them (two values
    from a sample of them bracket its rank, the pairs between them are kept): the result must be
    numpy's median to the last bit, for odd and even counts, with many equal distances (integer
    columns: a handful of distinct distances, each thousands of times) and at every row count up to
    the sample of 200."""
    rng = np.random.default_rng(["gaussian", "rounded", "few integers", "half tied", "log-normal",
                                 "two values"].index(kind))
    for trial in range(60):
        n = int(rng.integers(2, 320))
        d = int(rng.integers(1, 4))
        X = rng.standard_normal((n, d)) * 10.0 ** rng.uniform(-5, 5, d)
        if kind == "rounded":
            X = np.round(X / X.std(axis=0), int(rng.integers(0, 3)))
        elif kind == "few integers":
            X = rng.integers(0, int(rng.integers(2, 6)), (n, d)).astype(float)
        elif kind == "half tied":
            X[: n // 2] = X[0]
        elif kind == "log-normal":
            X = np.exp(3.0 * rng.standard_normal((n, d)))
        elif kind == "two values":
            X = np.where(rng.random((n, d)) < 0.3, 1.0, 4.0)
        gpclab._spread_cache.clear()
        np.testing.assert_array_equal(gpclab._column_spread(X), _median_of_distinct_pairs(X),
                                      err_msg=f"{kind}, trial {trial}, n = {n}")
        np.testing.assert_array_equal(gpclab._column_spread(X, 64), _median_of_distinct_pairs(X, 64))


def test_column_spread_with_nan_leaves_those_pairs_out_as_numpy_does():
    """A NaN in X (data_log_hyp is given what the user has): the pairs with it are left out of the
    median, on the path that forms every pair, as before."""
    X = np.random.default_rng(1).standard_normal((30, 3))
    X[4, 1] = np.nan
    gpclab._spread_cache.clear()
    np.testing.assert_array_equal(gpclab._column_spread(X), _median_of_distinct_pairs(X))


@pytest.mark.parametrize("kernel", ["se", "kg_iso"])
def test_an_isotropic_kernel_on_inputs_in_different_units_warns(kernel):
    """One length-scale cannot serve inputs whose spreads differ 1e4 times: the fit says so and names
    the two ways out; inputs in one unit, 'ard', and a single input do not warn."""
    X, y, _ = problem()
    method = "emep" if kernel == "kg_iso" else "laplace"
    with pytest.warns(RuntimeWarning, match=r"spreads differ by .*StandardScaler.*kernel='ard'"):
        gpclab.GPClassifier(method=method, kernel=kernel, optimize=False).fit(X * [100.0, 0.01, 1.0], y)
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpclab.GPClassifier(kernel="se", optimize=False).fit(X * 1e4, y)             # all in one unit
        gpclab.GPClassifier(kernel="ard", optimize=False).fit(X * [100.0, 0.01, 1.0], y)
        gpclab.GPClassifier(kernel="se", optimize=False).fit(X[:, :1] * 1e-3, y)
    # a discrete input is compared for equality, not distance: its spread does not count
    Xd = np.column_stack([X[:, :2], np.repeat([0.0, 1000.0], 30)])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        gpclab.GPClassifier(kernel="se", optimize=False, discrete=[2]).fit(Xd, y)


def _vm_flags_at(address):
    """The VmFlags of the mapping of this process that holds `address` (/proc/self/smaps)."""
    start = None
    with open("/proc/self/smaps") as f:
        for line in f:
            head = line.split()[0]
            if "-" in head and not head.endswith(":"):
                lo, hi = (int(x, 16) for x in head.split("-"))
                start = lo <= address < hi
            elif head == "VmFlags:" and start:
                return line.split()[1:]
    raise AssertionError(f"no mapping holds {address:#x}")


@pytest.mark.skipif(not os.path.isdir("/sys/kernel/mm/transparent_hugepage"),
                    reason="madvise(MADV_HUGEPAGE) needs Linux with transparent huge pages")
def test_large_arrays_of_a_fit_are_advised_huge_pages():
    """_empty (the n x n arrays of the fits) marks the 2 MB pages inside an array of 4 MB or more
    MADV_HUGEPAGE ('hg' in the kernel's VmFlags of that memory, whether or not huge pages are
    free), as numpy does its own; the arrays are ordinary arrays. (A smaller array is not advised
    by _empty, but may sit on heap pages that an earlier large array left advised: not tested.)"""
    from numba import njit

    @njit
    def two(n):
        return gpclab._empty(n, n), gpclab._copy(np.ones((n, n)))

    big, copied = two(1100)                                  # 9.7 MB
    assert big.shape == (1100, 1100) and big.flags.c_contiguous and big.dtype == np.float64
    np.testing.assert_array_equal(copied, 1.0)
    for a in (big, copied):
        inside = (a.ctypes.data + 2**21 - 1) // 2**21 * 2**21 + 4096
        assert "hg" in _vm_flags_at(inside)
    # a kernel matrix k(X, X) of 1,100 cases is one of them
    X = np.random.default_rng(0).standard_normal((1100, 2))
    K = gpclab.kernel_matrix.unchecked("se", X, X, np.zeros(2), None)
    assert "hg" in _vm_flags_at((K.ctypes.data + 2**21 - 1) // 2**21 * 2**21)
