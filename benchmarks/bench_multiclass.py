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
test information in bits (information_bits_multiclass) for both, and the
Monte Carlo standard error of gpclab's averaged probabilities: the spread over
8 seeds of each pi_bar_*c (largest and median over test cases and classes),
beside the same for S independent samples per test case (Algorithm 3.4 as
the box draws them; computed here from the same mu_* and Sigma_*).

Usage: python benchmarks/bench_multiclass.py
"""
import math
import time

import numpy as np
from numba import njit
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


@njit(cache=True)
def independent_samples(mu_star, Sigma_star, S, seed):
    """Lines 17-22 of Algorithm 3.4 with S independent samples per test case."""
    C, m = mu_star.shape
    np.random.seed(seed)
    out = np.zeros((C, m))
    f = np.empty(C)
    for j in range(m):
        L = np.linalg.cholesky(Sigma_star[j] + 1e-12 * np.eye(C))
        for _ in range(S):
            z = np.random.standard_normal(C)
            for c in range(C):
                f[c] = mu_star[c, j] + (L[c, :c + 1] * z[:c + 1]).sum()
            f = np.exp(f - f.max())
            out[:, j] += f / f.sum()
    return out / S


def mc_standard_errors(gp, X_test, S=1000, seeds=8):
    """Largest and median (over test cases and classes) standard deviation over seeds of pi_bar_*:
    gpclab's antithetic pairs, then S independent samples per test case."""
    hyp = gp._class_hyp(gp.log_hyp_)
    K_star = np.stack([gpclab.kernel_matrix("se", gp.X_train_, X_test, h) for h in hyp])
    kss = np.stack([gpclab.kernel_diag("se", X_test, h) for h in hyp])
    res = gp.result_
    runs = [gpclab.laplace_predict_multiclass(gp.K_, gp.y_train_, res.f_hat, K_star, kss, S, s, res.E, res.M)
            for s in range(seeds)]
    mu, Sig = runs[0][1], runs[0][2]
    ref = [independent_samples(mu, Sig, S, 1000 + s) for s in range(seeds)]
    out = []
    for P in ([r[0] for r in runs], ref):
        sd = np.std(np.stack(P), axis=0, ddof=1)
        out.append((float(sd.max()), float(np.median(sd))))
    return out


def predict_ratio(n=500, repeats=3):
    """sklearn OvR predict_proba time / gpclab predict_proba time on digits at n training cases.

    Returns a dict: 'gpclab' and 'sklearn' (s, median of repeats, one BLAS thread), 'ratio',
    'se_max' and 'se_max_independent' (largest Monte Carlo standard error, S = 1000)."""
    X, y = load_digits(return_X_y=True)
    X = X / 16.0
    perm = np.random.default_rng(0).permutation(len(y))
    tr, te = perm[:n], perm[n:]
    with threadpool_limits(1):
        gp = gpclab.GPClassifier(log_hyp=LOG_HYP, optimize=False, n_samples=1000).fit(X[tr], y[tr])
        gp.predict_proba(X[te[:5]])
        t_pred, _ = timed(lambda: gp.predict_proba(X[te]), repeats)
        kern = ConstantKernel(np.exp(2 * LOG_HYP[1]), "fixed") * RBF(np.exp(LOG_HYP[0]), "fixed")
        sk = GaussianProcessClassifier(kern, optimizer=None, multi_class="one_vs_rest").fit(X[tr], y[tr])
        s_pred, _ = timed(lambda: sk.predict_proba(X[te]), repeats)
        (se, _), (se_iid, _) = mc_standard_errors(gp, X[te])
    return {"gpclab": t_pred, "sklearn": s_pred, "ratio": s_pred / t_pred, "se_max": se,
            "se_max_independent": se_iid}


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
            rows.append((n, len(te), t_fit, t_pred, s_fit, s_pred, scores, mc_standard_errors(gp, X[te])))
    print("\n10-class digits at fixed hyperparameters; one BLAS thread; time in s")
    print(f"{'n':>5} {'m':>5} | {'gpclab fit':>10} {'predict':>8} {'error':>6} {'bits':>5} | "
          f"{'sklearn OvR fit':>15} {'predict':>8} {'error':>6} {'bits':>5} | {'fit ratio':>9} {'predict ratio':>13}")
    for n, m, tf, tp, sf, sp, ((e1, i1), (e2, i2)), _ in rows:
        print(f"{n:5d} {m:5d} | {tf:10.3f} {tp:8.3f} {e1:6.3f} {i1:5.2f} | {sf:15.3f} {sp:8.3f} {e2:6.3f} "
              f"{i2:5.2f} | {sf / tf:9.1f} {sp / tp:13.2f}")
    print("\nMonte Carlo standard error of pi_bar_* at S = 1000 (sd over 8 seeds; largest, median)")
    for n, m, *_, ((a_max, a_med), (b_max, b_med)) in rows:
        print(f"{n:5d} {m:5d} | antithetic pairs (gpclab) {a_max:.4f} {a_med:.1e} | "
              f"independent samples {b_max:.4f} {b_med:.1e} | bound 0.5 sqrt(2/S) = {0.5 * math.sqrt(2e-3):.4f}")


if __name__ == "__main__":
    main()
