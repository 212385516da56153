"""Multi-class Laplace (GPML Algorithms 3.3 + 3.4) against scikit-learn's one-vs-rest GPC.

scikit-learn's 8x8 digits, 10 classes, inputs scaled to [0, 1]; n = 500 and
1000 training cases, the rest (1297 and 797) for testing. The same SE
covariance for both, at fixed hyperparameters near the evidence maximum of
lectures/sec3_05_multiclass_laplace.ipynb (l = e^1.4, sf = e^2.7):
  * gpclab: one softmax model (Algorithm 3.3), predictions by Algorithm 3.4
    with 1000 Monte Carlo samples per test case;
  * scikit-learn: GaussianProcessClassifier(optimizer=None), one binary
    Laplace model per class (one-vs-rest), probabilities renormalised.
Prints fit and predict times (one BLAS thread, median of 3), test error and
test information in bits (information_bits_multiclass) for both.

Usage: python benchmarks/bench_multiclass.py
"""
import time

import numpy as np
from sklearn.datasets import load_digits
from sklearn.gaussian_process import GaussianProcessClassifier
from sklearn.gaussian_process.kernels import RBF, ConstantKernel
from threadpoolctl import threadpool_limits

import gpclab

LOG_HYP = np.array([1.4, 2.7])


def timed(fn, repeats=3):
    times, out = [], None
    for _ in range(repeats):
        t = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t)
    return float(np.median(times)), out


def main():
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    perm = np.random.default_rng(0).permutation(len(y))
    rows = []
    with threadpool_limits(1):
        gpclab.GPClassifier(log_hyp=LOG_HYP, optimize=False, n_samples=10).fit(X[:60], y[:60]).predict_proba(X[:5])
        for n in (500, 1000):
            tr, te = perm[:n], perm[n:]
            gp = gpclab.GPClassifier(log_hyp=LOG_HYP, optimize=False, n_samples=1000)
            t_fit, gp = timed(lambda: gp.fit(X[tr], y[tr]))
            t_pred, P = timed(lambda: gp.predict_proba(X[te]))
            kern = ConstantKernel(np.exp(2 * LOG_HYP[1]), "fixed") * RBF(np.exp(LOG_HYP[0]), "fixed")
            sk = GaussianProcessClassifier(kern, optimizer=None, multi_class="one_vs_rest")
            s_fit, sk = timed(lambda: sk.fit(X[tr], y[tr]))
            s_pred, Q = timed(lambda: sk.predict_proba(X[te]))
            scores = []
            for probs in (P, Q):
                err = np.mean(np.argmax(probs, axis=1) != y[te])
                info = gpclab.information_bits_multiclass(np.clip(probs, 1e-300, 1), y[te], y[tr])
                scores.append((err, info))
            rows.append((n, len(te), t_fit, t_pred, s_fit, s_pred, scores))
    print("\n10-class digits at fixed hyperparameters; one BLAS thread; time in s")
    print(f"{'n':>5} {'m':>5} | {'gpclab fit':>10} {'predict':>8} {'error':>6} {'bits':>5} | "
          f"{'sklearn OvR fit':>15} {'predict':>8} {'error':>6} {'bits':>5} | {'fit ratio':>9} {'predict ratio':>13}")
    for n, m, tf, tp, sf, sp, ((e1, i1), (e2, i2)) in rows:
        print(f"{n:5d} {m:5d} | {tf:10.3f} {tp:8.3f} {e1:6.3f} {i1:5.2f} | {sf:15.3f} {sp:8.3f} {e2:6.3f} "
              f"{i2:5.2f} | {sf / tf:9.1f} {sp / tp:13.1f}")


if __name__ == "__main__":
    main()
