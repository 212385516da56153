"""Binary Laplace GPC: gpclab against scikit-learn, side by side in one run.

For n = 200, 767, 1500 training points (d = 10, synthetic, SE kernel, logistic
likelihood, the same fixed hyperparameters for both):
  * log q (3.32) and its gradient in the hyperparameters, from a cold start
    (f = 0), as one ML-II step needs it;
  * predict_proba on 773 test points after fitting.
Both run with one BLAS thread (threadpoolctl). The two are called alternately,
so that a loaded machine slows both alike; the ratio is the median over the
pairs of scikit-learn's time over gpclab's. The agreement of log q and of the
gradient is printed too.

Then the start-up cost of gpclab:
  * a fresh Python process with a warm numba cache: import, build K, first
    laplace_mode result;
  * the same with an empty cache directory: everything compiles.

Usage: python benchmarks/bench_laplace.py [--quick] [--no-startup]
"""
import os
import subprocess
import sys
import tempfile
import time

import numpy as np
from threadpoolctl import threadpool_limits

import gpclab

N_TEST = 773
LOG_HYP = np.log([3.0, 2.0])  # length-scale 3, signal sd 2 on standardised inputs


def make_data(n, d=10, seed=0):
    rng = np.random.default_rng(seed)
    X = rng.standard_normal((n + N_TEST, d))
    w = rng.standard_normal(d)
    y = np.where(np.sin(X @ w / np.sqrt(d)) + 0.3 * rng.standard_normal(n + N_TEST) > 0, 1, 0)
    return X[:n], y[:n], X[n:]


def paired_times(fn_a, fn_b, repeats):
    """Times of fn_a and fn_b, called alternately (a, b, a, b, ...), so that a machine whose load
    changes during the run slows both alike; returns (min a, min b, median of a / b): on a
    loaded machine the least disturbed call is the better estimate of each one's cost."""
    ta, tb = [], []
    for _ in range(repeats):
        for fn, out in ((fn_a, ta), (fn_b, tb)):
            t = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t)
    ta, tb = np.array(ta), np.array(tb)
    return float(ta.min()), float(tb.min()), float(np.median(ta / tb))


def bench_sizes(sizes, repeats):
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    rows = []
    for n in sizes:
        X, t, Xs = make_data(n)
        y = np.where(t == 1, 1.0, -1.0)
        kern = ConstantKernel(np.exp(2 * LOG_HYP[1])) * RBF(np.exp(LOG_HYP[0]))
        sk = GaussianProcessClassifier(kern, optimizer=None).fit(X, t)
        theta = sk.kernel_.theta
        sk_est = sk.base_estimator_

        def sk_lq():
            return sk_est.log_marginal_likelihood(theta, eval_gradient=True)

        def gp_lq():
            return gpclab.laplace_evidence(X, y, LOG_HYP, "se", "logistic")

        gp_value, gp_grad, _ = gp_lq()
        sk_value, sk_grad = sk_lq()
        # scikit-learn's theta is (log sf^2, log l); gpclab's log_hyp is (log l, log sf)
        d_grad = np.max(np.abs(gp_grad - np.array([sk_grad[1], 2 * sk_grad[0]])))
        model = gpclab.GPClassifier(log_hyp=LOG_HYP, optimize=False).fit(X, t)
        t_sk, t_gp, r_lq = paired_times(sk_lq, gp_lq, repeats)
        p_sk, p_gp, r_p = paired_times(lambda: sk.predict_proba(Xs), lambda: model.predict_proba(Xs), repeats)
        dp = np.max(np.abs(sk.predict_proba(Xs) - model.predict_proba(Xs)))
        rows.append((n, t_sk, t_gp, r_lq, p_sk, p_gp, r_p, abs(gp_value - sk_value), d_grad, dp))
    print(f"\nlog q + gradient (cold start) and predict_proba on {N_TEST} test points; one BLAS thread;")
    print(f"each pair timed alternately, {repeats} pairs: fastest times, their ratio (min) and the "
          f"median of the paired ratios (pairs)")
    print(f"{'n':>5} | {'sklearn lq+grad':>15} {'gpclab':>9} {'min':>5} {'pairs':>5} | "
          f"{'sklearn predict':>15} {'gpclab':>9} {'min':>5} {'pairs':>5} | {'|d log q|':>9} {'|d grad|':>9} "
          f"{'max|dp|':>8}")
    for n, a, b, r, c, d, rp, e, g, f in rows:
        print(f"{n:5d} | {a:13.4f} s {b:7.4f} s {a / b:5.2f} {r:5.2f} | {c:13.4f} s {d:7.4f} s {c / d:5.2f} "
              f"{rp:5.2f} | {e:9.1e} {g:9.1e} {f:8.1e}")
    print("(max|dp|: scikit-learn approximates the averaged logistic prediction (3.25) with a sum of "
          "five erf terms; gpclab integrates it to 1e-9)")
    return rows


_FIRST_CALL = """
import time
t0 = time.perf_counter()
import numpy as np
import gpclab
X, y = gpclab.make_three_gaussians()
K = gpclab.kernel_matrix("se", X, X, np.log([2.6, 7.0]))
gpclab.laplace_mode(K, y, "logistic")
t1 = time.perf_counter()
gpclab.GPClassifier().fit(X, y).predict_proba(X)
gpclab.evidence_grid(X, y, [0.0], [0.0], progress=False)
print(t1 - t0, time.perf_counter() - t0)
"""


def bench_startup():
    env = dict(os.environ)
    with tempfile.TemporaryDirectory() as cache:
        env["NUMBA_CACHE_DIR"] = cache
        cold = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True,
                              text=True, check=True).stdout.split()
        warm = subprocess.run([sys.executable, "-c", _FIRST_CALL], env=env, capture_output=True,
                              text=True, check=True).stdout.split()
    print("\nstart-up of a fresh process (import, build K, first laplace_mode; then the whole "
          "binary Laplace path: ML-II fit, predict, grid)")
    print(f"  empty numba cache: first result {float(cold[0]):6.2f} s, everything compiled {float(cold[1]):6.2f} s")
    print(f"  warm numba cache:  first result {float(warm[0]):6.2f} s, whole path          {float(warm[1]):6.2f} s")


def main():
    quick = "--quick" in sys.argv
    sizes = [200, 767] if quick else [200, 767, 1500]
    with threadpool_limits(1):
        gpclab.laplace_evidence(*make_data(50)[:1], np.where(make_data(50)[1] == 1, 1.0, -1.0), LOG_HYP)
        bench_sizes(sizes, 9 if quick else 15)
    if "--no-startup" not in sys.argv:
        bench_startup()


if __name__ == "__main__":
    main()
