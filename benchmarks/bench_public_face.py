"""What the public face costs: interrupt checks inside numba loops, and the argument checks.

1. Interrupt checks. Each long loop calls check_interrupt() once per outer iteration. This
   script compiles a second copy of each function with check_interrupt replaced by an empty
   njit function and times both side by side, alternating, at n = 767 (the size of K&R's
   USPS 3-vs-5 problem): ratio = with checks / without, least CPU time of several runs with
   one BLAS thread (CPU time rather than wall time: other work on the machine disturbs less).
2. Argument checks. gpclab.f(...) against gpclab.f.unchecked(...) (the same njit call
   without conversion and checks). A covariance argument costs one O(n^2) pass (symmetry,
   diagonal, 2 x 2 minors) and, up to n = 300, a Cholesky that proves it positive semidefinite.
3. Interrupt latency: SIGINT to a subprocess in the middle of each call, time until the
   KeyboardInterrupt arrives (tests/test_interrupt.py does the same, for more calls).

Run from the repository root: python benchmarks/bench_public_face.py [--n 767]
"""
import argparse
import os
import sys
import time
import types

import numpy as np
from numba import njit

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import gpclab  # noqa: E402


@njit(cache=True)
def _no_check():
    pass


def without_checks(public):
    """A fresh njit copy of public's body whose check_interrupt() does nothing."""
    py = public.py_func
    g = dict(py.__globals__)
    g["check_interrupt"] = _no_check
    return njit(types.FunctionType(py.__code__, g, py.__name__, py.__defaults__))


def best(f, reps):
    """Least CPU time of reps calls (one BLAS thread): steadier than wall time on a busy machine."""
    t = []
    for _ in range(reps):
        t0 = time.process_time()
        f()
        t.append(time.process_time() - t0)
    return min(t)


def main():
    from threadpoolctl import threadpool_limits
    threadpool_limits(1)
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=767)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--checks-only", action="store_true", help="only section 2, the argument checks")
    args = ap.parse_args()
    n = args.n
    r = np.random.default_rng(0)
    X = r.standard_normal((n, 3))
    y = np.where(X[:, 0] + 0.5 * r.standard_normal(n) > 0, 1.0, -1.0)
    h = np.array([0.5, 1.0])
    K = gpclab.kernel_matrix("se", X, X, h) + 1e-6 * np.eye(n)
    L = np.linalg.cholesky(K)
    step, nl = gpclab.hmc_step_size(K, "probit")
    cases = {
        "laplace_mode": (gpclab.laplace_mode, (K, y, "logistic", None, 1e-10, 100)),
        "ep": (gpclab.ep, (K, y, None, None, 1e-9, 100, "natural", 0, "probit", 0.0)),
        "kernel_matrix": (gpclab.kernel_matrix, ("se", X, X, h, None)),
        "hmc_latent (200 samples)": (gpclab.hmc_latent, (K, y, "probit", 200, step, nl, 0, 0, 1, 1.0)),
        "ais (T = 200, R = 2)": (gpclab.ais, (K, y, "probit", 200, 2, step, nl, 0, None)),
    }
    print(f"n = {n}; load average {os.getloadavg()[0]:.1f} (timings are disturbed by other work)")
    print("\n1. interrupt checks (with / without, best of %d):" % args.reps)
    for name, (f, a) in cases.items():
        if name.startswith("ais") or args.checks_only:
            continue   # ais's blocks are a parallel loop: compare the blocked and unblocked forms
        plain = without_checks(f)
        f.unchecked(*a)
        plain(*a)
        t_with, t_without = [], []
        for _ in range(args.reps):
            t_with.append(best(lambda: f.unchecked(*a), 1))
            t_without.append(best(lambda: plain(*a), 1))
        print(f"   {name:28s} {min(t_with) * 1e3:9.2f} ms  {min(t_without) * 1e3:9.2f} ms  "
              f"ratio {min(t_with) / min(t_without):.3f}")
    print("\n2. argument checks (checked / unchecked call, best of %d):" % args.reps)
    C, m = 3, 200
    labels = np.argmax(np.stack([X[:, 0], X[:, 1], -X[:, 0] - X[:, 1]]), axis=0)
    Y = gpclab.one_hot(labels, C)
    KC = np.stack([K] * C)
    Xs = r.standard_normal((m, 3))
    Ks = np.stack([gpclab.kernel_matrix("se", X, Xs, h)] * C)
    kss = np.stack([gpclab.kernel_diag("se", Xs, h)] * C)
    f_hat = gpclab.laplace_mode_multiclass(KC, Y).f_hat
    checked = dict(cases)
    checked["laplace_predict_multiclass (C = 3, m = 200)"] = (
        gpclab.laplace_predict_multiclass, (KC, Y, f_hat, Ks, kss), dict(S=100, seed=0))
    for name, case in checked.items():
        f, a, kw = case if len(case) == 3 else case + ({},)
        f(*a, **kw)
        t_c = best(lambda: f(*a, **kw), args.reps)
        t_u = best(lambda: f.unchecked(*a, **kw), args.reps)
        print(f"   {name:44s} {t_c * 1e3:9.2f} ms  {t_u * 1e3:9.2f} ms  ratio {t_c / t_u:.3f}")
    del L


if __name__ == "__main__":
    main()
