"""Binary Laplace GPC: gpclab against scikit-learn, side by side in one run.

For n = 200, 767, 1500 training points (d = 10, synthetic, SE kernel, logistic
likelihood, the same fixed hyperparameters for both):
  * log q (3.32) and its gradient in the hyperparameters, from a cold start
    (f = 0), as one ML-II step needs it;
  * predict_proba on 773 test points after fitting.
Both run with one BLAS thread (threadpoolctl). Medians over repeats; the ratio
is scikit-learn's time over gpclab's. The agreement of log q is printed too.

Then the start-up cost of gpclab:
  * a fresh Python process with a warm numba cache: import, build K, first
    laplace_mode result;
  * the same with an empty cache directory: everything compiles.

Usage: python benchmarks/bench_laplace.py [--quick]
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


def median_time(fn, repeats):
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times))


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

        gpclab_lq = gp_lq()[0]
        sk_lq_value = sk_lq()[0]
        model = gpclab.GPClassifier(log_hyp=LOG_HYP, optimize=False).fit(X, t)
        t_sk = median_time(sk_lq, repeats)
        t_gp = median_time(gp_lq, repeats)
        p_sk = median_time(lambda: sk.predict_proba(Xs), repeats)
        p_gp = median_time(lambda: model.predict_proba(Xs), repeats)
        dp = np.max(np.abs(sk.predict_proba(Xs) - model.predict_proba(Xs)))
        rows.append((n, t_sk, t_gp, p_sk, p_gp, abs(gpclab_lq - sk_lq_value), dp))
    print(f"\nlog q + gradient (cold start) and predict_proba on {N_TEST} test points; one BLAS thread")
    print(f"{'n':>5} | {'sklearn lq+grad':>15} {'gpclab':>9} {'ratio':>6} | "
          f"{'sklearn predict':>15} {'gpclab':>9} {'ratio':>6} | {'|d log q|':>9} {'max|dp|':>8}")
    for n, a, b, c, d, e, f in rows:
        print(f"{n:5d} | {a:13.4f} s {b:7.4f} s {a / b:6.1f} | {c:13.4f} s {d:7.4f} s {c / d:6.1f} | {e:9.1e} {f:8.1e}")
    print("(max|dp|: scikit-learn approximates the averaged logistic prediction (3.25) with a sum of "
          "five erf terms; gpclab integrates it to 1e-9)")


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
        bench_sizes(sizes, 3 if quick else 7)
    bench_startup()


if __name__ == "__main__":
    main()
