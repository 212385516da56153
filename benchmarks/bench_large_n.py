"""Large n: ML-II on a random subset of m points against ML-II on all n, and the fit's own estimate.

Synthetic two-input problem (make_large_n_data below: p(y=+1|x) = Phi(2 sin(x1) + x2 - x1 x2 / 3),
x uniform on [-3, 3]^2), Laplace with the logistic likelihood and kernel 'se', default start
(data_log_hyp). For each (n, m): ML-II on all n (gpclab.ml2), ML-II on a random subset of m
followed by the approximation at all n with those hyperparameters (what GPClassifier's
max_ml2_n=m does), and for both: log_hyp, the Laplace log q at all n, test accuracy and mean
log predictive probability on 5,000 test points, and wall time.

Usage: python benchmarks/bench_large_n.py [--n 2000 --m 1000]   (each pair runs minutes at n >= 2000)
       python benchmarks/bench_large_n.py --fit 10000 --m 2000    (GPClassifier.fit by hand, verbose)
"""
import argparse
import resource
import time

import numpy as np
from scipy.special import ndtr

import gpclab


def make_large_n_data(n, seed=0):
    """n inputs uniform on [-3, 3]^2 and labels -1/+1 drawn from Phi(2 sin(x1) + x2 - x1 x2 / 3)."""
    r = np.random.default_rng(seed)
    X = r.uniform(-3.0, 3.0, (n, 2))
    p = ndtr(2.0 * np.sin(X[:, 0]) + X[:, 1] - X[:, 0] * X[:, 1] / 3.0)
    return X, np.where(r.uniform(size=n) < p, 1.0, -1.0)


def scores(X, y, h, X_test, y_test):
    clf = gpclab.GPClassifier(log_hyp=h, optimize=False).fit(X, y)
    p = clf.predict_proba(X_test)[:, 1]
    acc = float(np.mean((p > 0.5) == (y_test > 0)))
    mlpp = float(np.mean(np.log(np.where(y_test > 0, p, 1.0 - p))))
    return clf.log_marginal_likelihood_, acc, mlpp


def subset_vs_full(n, m, seed=0):
    X, y = make_large_n_data(n, seed)
    X_test, y_test = make_large_n_data(5000, seed + 1)
    h0 = gpclab.data_log_hyp("se", X, (y > 0).astype(int))
    rows = {}
    t = time.perf_counter()
    h_full, _, res = gpclab.ml2(X, y, h0)
    rows["full"] = (h_full, time.perf_counter() - t, res.nfev)
    sub = np.sort(np.random.default_rng(seed).choice(n, m, replace=False))
    t = time.perf_counter()
    h_sub, _, res = gpclab.ml2(X[sub], y[sub], gpclab.data_log_hyp("se", X[sub], (y[sub] > 0).astype(int)))
    rows[f"subset m={m}"] = (h_sub, time.perf_counter() - t, res.nfev)
    for name, (h, sec, nfev) in rows.items():
        log_q, acc, mlpp = scores(X, y, h, X_test, y_test)
        print(f"n={n} {name:>14}: log_hyp {np.round(h, 3)}, {nfev} evaluations, ML-II {sec:6.1f} s; "
              f"log q at all n {log_q:.2f}, test accuracy {acc:.4f}, mean log p(y*) {mlpp:.4f}", flush=True)


def fit_by_hand(n, m):
    X, y = make_large_n_data(n)
    t = time.perf_counter()
    clf = gpclab.GPClassifier(max_ml2_n=m, verbose=True).fit(X, y)
    sec = time.perf_counter() - t
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2 ** 20
    print(f"n={n}, max_ml2_n={m}: fit {sec:.1f} s, peak resident memory {peak:.2f} GiB, "
          f"log_hyp {np.round(clf.log_hyp_, 3)}, {clf.n_iter_} iterations", flush=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--m", type=int, default=1000)
    ap.add_argument("--fit", type=int, default=0)
    a = ap.parse_args()
    if a.fit:
        fit_by_hand(a.fit, a.m if a.m else None)
    else:
        subset_vs_full(a.n, a.m)
