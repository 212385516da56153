"""The fits a user runs, before and after, in one run: each fit in its own process, the two checkouts interleaved.

The fit table of issue 32, measured on two checkouts of gpclab side by side: --before (an older checkout,
e.g. `git archive d82ee6d | tar -x -C /tmp/gpclab_before`) and --after (default: this checkout). Every
fit runs in a subprocess with PYTHONPATH set to the checkout, before and after one after the other, so
that a machine whose load changes slows both alike; each subprocess first loads (or compiles) the numba
code it needs on a few rows (not timed), then times the fit. A fit that takes longer than --timeout
seconds (default 600) is stopped and reported as "> 600 s".

  EM-EP, 5-fold CV, sonar (208 x 60) and ionosphere (351 x 34): GPClassifier(method="emep") with its
      defaults on each training part (inputs standardised with the training part's mean and s.d.; folds
      a seeded split): time per fit, folds that did not converge, the warnings; beside it, per fit,
      Laplace (GPClassifier() defaults) and ML-II on log Z_EP for the same model (method "ep", kernel
      'kg', likelihood 'step': by K&G's Theorem 1 EM-EP's fixed point is a stationary point of it)
  EM-EP, Pima (Pima.tr + Pima.te, 532 x 7), full fit: the same three
  multi-class EP (K&G), MASS fgl (214 x 9, 6 classes): GPClassifier(method="ep") fit; predict_proba of the
      214 rows (the median of 3, after one call on 5 rows); the largest |row sum - 1|; multi-class Laplace fit
  ML-II, n = 2,000 (synthetic, seeded, d = 8): GPClassifier() (Laplace) and GPClassifier(method="ep"):
      time, iterations, log evidence
  fixed hyperparameters, n = 10,000: GPClassifier(optimize=False) (Laplace): time and peak RSS of the process
  ML-II, n = 10,000: GPClassifier() (Laplace)
(--skip-10k leaves the last two out.) Each fold of a cross-validation is a fit of its own, with its own
timeout. Data are read from --data-dir (never copied); the synthetic sets are drawn in the subprocess
from a fixed seed, the same for both checkouts.

Usage: python benchmarks/bench_fits.py --before /tmp/gpclab_before [--after .] [--timeout 600]
       [--skip-10k] [--fits emep-sonar,emep-ionosphere,emep-pima,mcep-fgl,ml2-2000,fixed-10k,ml2-10k]
       [--folds 5] [--max-folds N] [--data-dir ../shared/datasets] [--out FILE.md]
Without --before only --after is measured.
"""
import argparse
import json
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
ALL = ["emep-sonar", "emep-ionosphere", "emep-pima", "mcep-fgl", "ml2-2000", "fixed-10k", "ml2-10k"]


# ------------------------------------------------------------------ the child: one fit, one process

def _load(name, data_dir):
    import numpy as np
    import pandas as pd

    import gpclab

    path = lambda f: os.path.join(data_dir, f)          # noqa: E731
    if name == "ionosphere":
        return gpclab.load_ionosphere(path("ionosphere.data"))
    if name == "sonar":
        d = pd.read_csv(path("sonar.all-data"))
        return d.iloc[:, :60].to_numpy(float), d.iloc[:, 60].astype(str).to_numpy()
    if name == "pima":
        d = pd.concat([pd.read_csv(path("Pima.tr.csv")), pd.read_csv(path("Pima.te.csv"))])
        return (d[["npreg", "glu", "bp", "skin", "bmi", "ped", "age"]].to_numpy(float),
                d["type"].astype(str).to_numpy())
    if name == "fgl":
        d = pd.read_csv(path("fgl.csv"))
        return (d.drop(columns=["rownames", "type"], errors="ignore").to_numpy(float),
                d["type"].astype(str).to_numpy())
    if name.startswith("synthetic"):
        n = int(name.split("-")[1])
        r = np.random.default_rng(2)
        X = r.standard_normal((n, 8))
        w = r.standard_normal(8)
        y = np.where(np.sin(X @ w / np.sqrt(8) * 2.0) + 0.4 * r.standard_normal(n) > 0, 1, 0)
        return X, y
    raise ValueError(f"bench_fits: unknown data set {name!r}")


def _first_clause(message):
    """A warning's message up to its first ';' or sentence end: what happened, without the advice."""
    cut = [k for k in (message.find("; "), message.find(". "), message.find("\n")) if k > 0]
    return message[:min(cut)] if cut else message[:200]


def _standardise(Xtr, Xte):
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0
    return (Xtr - mu) / sd, (Xte - mu) / sd


def child(spec):
    """Run one job (a dict) and return its measurements (a dict)."""
    import resource
    import warnings

    import numpy as np

    import gpclab

    out = {"gpclab": os.path.abspath(gpclab.__file__)}
    X, y = _load(spec["data"], spec["data_dir"])
    if "fold" in spec:                                   # one fold of a seeded k-fold split
        parts = np.array_split(np.random.default_rng(0).permutation(len(y)), spec["folds"])
        train = np.setdiff1d(np.arange(len(y)), parts[spec["fold"]])
        X, _ = _standardise(X[train], X[:1])
        y = y[train]
    elif not spec["data"].startswith("synthetic"):
        X, _ = _standardise(X, X[:1])
    kind = spec["kind"]
    models = {"emep": dict(method="emep"), "laplace": dict(), "ml2-ep-same": dict(method="ep", kernel="kg",
              likelihood="step"), "ep": dict(method="ep"), "fixed": dict(optimize=False)}

    # load (or compile) what the fit needs, on a few rows, untimed
    t = time.perf_counter()
    small = np.concatenate([np.flatnonzero(y == c)[:8] for c in np.unique(y)])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for m in spec["models"]:
            w = gpclab.GPClassifier(**models[m], max_iter=2).fit(X[small], y[small])
            if kind == "mcep" and m == "ep":
                w.predict_proba(X[small][:5])
    out["warm-up"] = time.perf_counter() - t

    for m in spec["models"]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            t = time.perf_counter()
            model = gpclab.GPClassifier(**models[m]).fit(X, y)
            out[m + " fit"] = time.perf_counter() - t
        out[m + " converged"] = bool(getattr(model, "converged_", True))
        out[m + " iterations"] = int(getattr(model, "n_iter_", -1))
        out[m + " log evidence"] = float(getattr(model, "log_marginal_likelihood_", np.nan))
        out[m + " warnings"] = sorted({_first_clause(str(w.message)) for w in caught})
        if kind == "mcep" and m == "ep":
            model.predict_proba(X[:5])
            times = []
            for _ in range(3):
                t = time.perf_counter()
                P = model.predict_proba(X)
                times.append(time.perf_counter() - t)
            out["predict"] = float(np.median(times))
            out["row sum error"] = float(np.abs(P.sum(axis=1) - 1.0).max())
    out["peak RSS GB"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 1e9
    return out


# ------------------------------------------------------------------ the parent

def jobs(args):
    """The list of (fit name, job spec) to run, each spec one subprocess."""
    out = []
    base = {"data_dir": args.data_dir}
    for name in ("sonar", "ionosphere"):
        if f"emep-{name}" in args.fits:
            for k in range(args.max_folds or args.folds):
                out.append((f"emep-{name}", dict(base, kind="cv", data=name, fold=k, folds=args.folds,
                                                 models=["emep", "laplace", "ml2-ep-same"])))
    if "emep-pima" in args.fits:
        out.append(("emep-pima", dict(base, kind="full", data="pima", models=["emep", "laplace", "ml2-ep-same"])))
    if "mcep-fgl" in args.fits:
        out.append(("mcep-fgl", dict(base, kind="mcep", data="fgl", models=["ep", "laplace"])))
    if "ml2-2000" in args.fits:
        out.append(("ml2-2000", dict(base, kind="ml2", data="synthetic-2000", models=["laplace"])))
        out.append(("ml2-2000", dict(base, kind="ml2", data="synthetic-2000", models=["ep"])))
    if not args.skip_10k:
        if "fixed-10k" in args.fits:
            out.append(("fixed-10k", dict(base, kind="fixed", data="synthetic-10000", models=["fixed"])))
        if "ml2-10k" in args.fits:
            out.append(("ml2-10k", dict(base, kind="ml2", data="synthetic-10000", models=["laplace"])))
    return out


def run(checkout, spec, timeout):
    """One job in a subprocess with PYTHONPATH = checkout: its measurements, or {'timeout': s}."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(checkout))
    cmd = [sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)]
    t = time.perf_counter()
    p = subprocess.Popen(cmd, env=env, cwd=os.path.abspath(checkout), stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        stdout, stderr = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, 9)                 # the child's own process group (start_new_session)
        p.communicate()
        return {"timeout": timeout, "wall": time.perf_counter() - t}
    for line in stdout.splitlines():
        if line.startswith("RESULT "):
            r = json.loads(line[7:])
            r["wall"] = time.perf_counter() - t
            return r
    return {"error": (stderr.strip().splitlines() or ["no output"])[-1][:300], "wall": time.perf_counter() - t}


def _time(rs, key, timeout):
    """Mean seconds per fit over the results rs, or '> timeout s' if any timed out."""
    if any("timeout" in r for r in rs):
        done = [r[key] for r in rs if key in r]
        return f"> {timeout:.0f} s" + (f" ({len(rs) - len(done)} of {len(rs)} timed out)" if len(rs) > 1 else "")
    if any("error" in r for r in rs):
        return "error: " + next(r["error"] for r in rs if "error" in r)
    v = [r[key] for r in rs if key in r]
    if not v:
        return "-"
    t = sum(v) / len(v)
    return f"{t:.3g} s" if t < 10 else f"{t:.0f} s"


def rows_of(fit, rs, timeout):
    """The table's rows (quantity, value) of one fit's results rs (a list: folds, or one or two jobs)."""
    ok = [r for r in rs if "timeout" not in r and "error" not in r]
    if fit.startswith("emep"):
        per = "fit time" if fit == "emep-pima" else "time per fit"
        unconv = sum(not r["emep converged"] for r in ok)
        counts = {}
        for r in ok:
            for w in r["emep warnings"]:
                counts[w] = counts.get(w, 0) + 1
        warns = [f"{w} (x {k})" if len(ok) > 1 else w for w, k in sorted(counts.items())]
        return [(f"EM-EP {per}", _time(rs, "emep fit", timeout)),
                ("EM-EP not converged", f"{unconv} of {len(ok)}" + (" fit" if fit == "emep-pima" else " folds")),
                ("EM-EP rounds (median)", str(sorted(r["emep iterations"] for r in ok)[len(ok) // 2]) if ok else "-"),
                ("EM-EP warnings", "; ".join(warns) if warns else "none"),
                (f"Laplace {per}", _time(rs, "laplace fit", timeout)),
                (f"ML-II on log Z_EP (same model) {per}", _time(rs, "ml2-ep-same fit", timeout)),
                ("log Z_EP: EM-EP / ML-II (mean)", " / ".join(
                    f"{sum(r[k] for r in ok) / len(ok):.3f}" for k in ("emep log evidence", "ml2-ep-same log evidence"))
                 if ok else "-")]
    if fit == "mcep-fgl":
        r = ok[0] if ok else {}
        return [("EP fit", _time(rs, "ep fit", timeout)),
                ("predict_proba, 214 rows", _time(rs, "predict", timeout)),
                ("largest abs(row sum - 1)", f"{r['row sum error']:.1e}" if r else "-"),
                ("multi-class Laplace fit", _time(rs, "laplace fit", timeout)),
                ("EP fit / Laplace fit", f"{r['ep fit'] / r['laplace fit']:.1f}" if r else "-"),
                ("EP warnings", "; ".join(r.get("ep warnings", [])) or "none" if r else "-")]
    if fit in ("ml2-2000", "ml2-10k"):
        out = []
        for r, label in zip(rs, ["Laplace", "EP"]):
            m = "ep" if label == "EP" else "laplace"
            out.append((f"ML-II {label}", _time([r], m + " fit", timeout)
                        + (f" ({r[m + ' iterations']} iterations, log evidence {r[m + ' log evidence']:.3f})"
                           if m + " fit" in r else "")))
            if m + " warnings" in r and r[m + " warnings"]:
                out.append((f"ML-II {label} warnings", "; ".join(r[m + " warnings"])))
        return out
    if fit == "fixed-10k":
        r = ok[0] if ok else {}
        return [("fit time (Laplace)", _time(rs, "fixed fit", timeout)),
                ("peak RSS", f"{r['peak RSS GB']:.2f} GB" if r else "-")]
    return []


TITLE = {"emep-sonar": "EM-EP, 5-fold CV, sonar 208 x 60", "emep-ionosphere": "EM-EP, 5-fold CV, ionosphere 351 x 34",
         "emep-pima": "EM-EP, Pima 532 x 7 (full fit)", "mcep-fgl": "multi-class EP (K&G), fgl 214 x 9, 6 classes",
         "ml2-2000": "ML-II, n = 2,000", "fixed-10k": "fixed hyperparameters, n = 10,000",
         "ml2-10k": "ML-II, n = 10,000"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--before", default=None, help="checkout of the older gpclab (the folder holding gpclab.py)")
    ap.add_argument("--after", default=ROOT, help="checkout of the newer gpclab (default: this one)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds per fit")
    ap.add_argument("--skip-10k", action="store_true", help="leave out the two fits at n = 10,000")
    ap.add_argument("--fits", default=",".join(ALL))
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--max-folds", type=int, default=None, help="run only the first folds (a shorter run)")
    ap.add_argument("--data-dir",
                    default=os.environ.get("GPCLAB_DATA", os.path.join(ROOT, "..", "shared", "datasets")))
    ap.add_argument("--out", default=None, help="also write the table to this markdown file")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child is not None:
        print("RESULT " + json.dumps(child(json.loads(args.child))), flush=True)
        return
    args.fits = [f.strip() for f in args.fits.split(",") if f.strip()]
    bad = [f for f in args.fits if f not in ALL]
    if bad:
        ap.error(f"--fits: unknown {bad}; choose from {ALL}")
    args.data_dir = os.path.abspath(args.data_dir)
    sides = [("before", args.before)] if args.before else []
    sides.append(("after", args.after))
    for label, path in sides:
        if not os.path.isfile(os.path.join(path, "gpclab.py")):
            ap.error(f"--{label}: no gpclab.py in {path!r}")
    print(f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; "
          + ", ".join(f"{label}: {os.path.abspath(p)}" for label, p in sides), flush=True)
    results = {label: {} for label, _ in sides}
    t0 = time.perf_counter()
    for fit, spec in jobs(args):
        for label, path in sides:                 # interleaved: before, after, before, after, ...
            r = run(path, spec, args.timeout)
            results[label].setdefault(fit, []).append(r)
            what = ("timed out" if "timeout" in r else r["error"] if "error" in r else
                    ", ".join(f"{k} {r[k]:.2f} s" for k in r if k.endswith(" fit"))
                    + f" (warm-up {r['warm-up']:.0f} s)")
            print(f"  {fit} {spec.get('fold', '')} {label}: {what} [{time.perf_counter() - t0:.0f} s]", flush=True)
    head = "| fit | quantity | " + " | ".join(label for label, _ in sides) + " |"
    lines = [head, "|---|---|" + "---|" * len(sides)]
    for fit in ALL:
        if fit not in results[sides[-1][0]]:
            continue
        cols = [rows_of(fit, results[label][fit], args.timeout) for label, _ in sides]
        for k, (quantity, _) in enumerate(cols[-1]):
            vals = [c[k][1] if k < len(c) else "-" for c in cols]
            lines.append(f"| {TITLE[fit] if k == 0 else ''} | {quantity} | " + " | ".join(vals) + " |")
    text = "\n".join(lines) + (f"\n\n{os.cpu_count()} cores; each fit in its own process after an untimed "
                               f"warm-up; timeout {args.timeout:.0f} s per fit; "
                               f"total {time.perf_counter() - t0:.0f} s.")
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
