"""Every fit against its arithmetic floor, and ML-II's evaluations against a reference optimiser.

For each fit a user runs (Laplace and EP at fixed hyperparameters, multi-class Laplace and EP at fixed
hyperparameters, AIS, EM-EP, ML-II on Laplace's and on EP's evidence) this script times the fit, counts
the factorisations and solves it did, and times that much LAPACK/BLAS arithmetic on the same data, in
the same run, with the same libraries and the same number of BLAS threads (scipy.linalg.cho_factor,
solve_triangular, lapack.dpotri, blas.dsyrk, blas.dtrmv and numpy's matmul). The floor is

  Laplace (GPML Alg. 3.1)       per laplace_mode call: (Newton steps + 1) x cholesky(B), B n x n
                                (the last factorisation is the one at the mode, which log q needs)
  EP (GPML Alg. 3.5)            per ep call on N latents: sweeps x (N rank-one updates of Sigma, as
                                dsyrk in blocks of 48, + one refactorisation: cholesky(B), L \\ S~^1/2 K,
                                K - V^T V), + one refactorisation if it starts from sites (warm start)
  multi-class Laplace (3.3)     per call: (Newton steps + 1) x (C x (cholesky(B_c) + B_c^-1 from it)
                                + cholesky(sum_c E_c)); and the fit's C triangular solves G_c = M\\E_c
                                (multiclass_G, kept for the predictions)
  multi-class EP (K&G 4.2)      EP's floor on the N = n (J - 1) difference latents
  AIS (K&R Alg. 3)              cholesky(K) + T x R x leapfrog steps x two triangular mat-vecs
                                (f = L g and L^T grad); the R runs share the cores, the floor is one thread
  EM-EP (K&G 3.3)               E-steps: EP's floor; each M-step evaluation (em_ep_grad, K&G 31):
                                cholesky(C) + C^-1 from it + two n x n products (C^-1 A, C^-1 A C^-1);
                                each bound (em_ep_bound): two Choleskys and one triangular solve
  ML-II (Laplace, EP)           the mode's (or EP's) floor for every evaluation + the gradient's
                                O(n^3) part, B^-1 from L (dpotri), for every gradient
  (O(n^2) work, kernel matrices and Python are left out of the floor: the ratio shows them.)

The counts are taken by wrapping the `unchecked` entry of gpclab's public box functions (laplace_mode,
ep, ep_multiclass, laplace_mode_multiclass, multiclass_G, laplace_log_q_grad, ep_log_Z_grad, em_ep_grad, em_ep_bound),
which the fits call, and multi-class EP's evidence run (_ep_multiclass_run, counted as ep_multiclass);
the calls counted are printed under the table, so that a fit that reaches its arithmetic another way
shows up as uncounted (floor "n/a"), not as a fast fit.

Times: a fit under SHORT_FIT (2 s) is run up to REPEATS (3) times and its fastest run is kept (time, counts
and time in boxes), as each of the floor's operations is the best of a few runs on arrays already
touched; the first fit at a size pays for fresh memory (page faults, the allocator's growth: Laplace at
n = 1,000 took 72 ms the first time and 56-58 ms after, against a floor of 45 ms). Longer fits run once.

Evaluations: for ML-II, gpclab's evidence evaluations (its gradients) against a reference optimiser on
the same data, kernel ('se' = scikit-learn's ConstantKernel * RBF), start (data_log_hyp, the default
start of GPClassifier) and bounds (default_bounds): Laplace against scikit-learn's
GaussianProcessClassifier (its L-BFGS-B; its log_marginal_likelihood is wrapped to count the calls with
a gradient); EP and EM-EP against scipy's L-BFGS-B with scikit-learn's settings (scipy's defaults)
on gpclab's ep_evidence (log Z_EP, warm-started from the previous sites; for EM-EP's model, kernel 'kg'
with the step likelihood, the scale t0 held at its start, since log Z_EP does not change when K is
scaled). EM-EP's count is its E-steps (EP runs). The evidence each reaches is printed beside it. The
reference runs with the fit's BLAS threads (scikit-learn with two threads at n = 250 on a loaded two-core
machine: 37 s instead of 0.34 s, the threads spinning).

BLAS threads: gpclab runs BLAS on one thread while every dimension of a call's arrays is below 1500
(two threads only pay off above that; below, the threads spin and take a shared machine's cores), and on
all threads otherwise. The script reads the number of BLAS threads inside the fit's first counted call and
times the floor with that number (column "thr"). AIS's runs go in parallel on numba's threads.

Data: synthetic (seeded; d = 8 standardised Gaussian inputs, labels from the sign (binary) or argmax
(J = 3) of smooth functions plus noise) at each n of --n; and the real sets named by --sets, read from
--data-dir (UCI Ionosphere, Sonar; MASS Pima (tr + te), fgl), standardised, at their own n.
Hyperparameters of the fixed-hyperparameter fits: data_log_hyp for 'se', default_log_hyp for 'kg',
computed before the clock starts (such a fit is given them); ML-II's start, data_log_hyp, is timed, as
GPClassifier's default fit computes it.

Large fits: before a fit at a larger n the script expects its time from the same fit at the previous n
(cubic in n; AIS quadratic) and skips it, with the reason printed, when that is above --budget seconds; multi-class EP
is skipped above --max-latents difference latents (memory: several N x N matrices); a fit GPClassifier refuses to
start (expected over 10 minutes: EM-EP at n = 4,000 when run alone) is a skipped row with its estimate.

Usage: python benchmarks/bench_floor.py [--n 250 1000 2000 4000] [--sets ionosphere,sonar,pima,fgl]
       [--fits laplace,ep,mc-laplace,mc-ep,ais,emep,ml2-laplace,ml2-ep] [--no-reference]
       [--budget 900] [--max-latents 4000] [--ais-T 1000] [--ais-R 3] [--data-dir ../shared/datasets]
       [--out FILE.md]
--sets none runs the synthetic data only; --n with no value the real sets only.
"""
import argparse
import math
import os
import sys
import time
import warnings

import numpy as np
import scipy.linalg as sla
from scipy.linalg import blas, lapack
from threadpoolctl import ThreadpoolController, threadpool_limits

import gpclab

SHORT_FIT = 2.0   # seconds: a fit shorter than this is run up to REPEATS times, its fastest run kept
REPEATS = 3

ALL_FITS = ["laplace", "ep", "mc-laplace", "mc-ep", "ais", "emep", "ml2-laplace", "ml2-ep"]
LABEL = {"laplace": "Laplace", "ep": "EP", "mc-laplace": "multi-class Laplace", "mc-ep": "multi-class EP",
         "ais": "AIS", "emep": "EM-EP", "ml2-laplace": "ML-II Laplace", "ml2-ep": "ML-II EP"}
MULTICLASS = {"mc-laplace", "mc-ep"}
COUNTED = ["laplace_mode", "ep", "ep_multiclass", "laplace_mode_multiclass", "multiclass_G", "laplace_log_q_grad",
           "ep_log_Z_grad", "em_ep_grad", "em_ep_bound"]
BLOCK = 48              # rank-one updates of EP's floor applied together, one dsyrk of rank 48
D = 8                   # inputs of the synthetic data
_BLAS = [c for c in ThreadpoolController().lib_controllers if c.user_api == "blas"]


def blas_threads():
    return max((c.get_num_threads() for c in _BLAS), default=1)


# ---------------------------------------------------------------- data

def synthetic(n, classes=2, seed=0):
    """n seeded cases, D standardised inputs; labels from smooth functions plus noise."""
    r = np.random.default_rng(1000 * classes + seed)
    X = r.standard_normal((n, D))
    W = r.standard_normal((classes, D))
    F = np.sin(X @ W.T / np.sqrt(D) * 2.0) + 0.5 * (X[:, :1] ** 2 - 1) * (np.arange(classes) % 2) \
        + 0.4 * r.standard_normal((n, classes))
    y = (F[:, 0] > F[:, 1]).astype(int) if classes == 2 else F.argmax(axis=1)
    return standardise(X), y


def standardise(X):
    """Each input to mean 0 and s.d. 1 (EM-EP's start then needs no shift for the unit of X)."""
    sd = X.std(axis=0)
    sd[sd == 0] = 1.0
    return (X - X.mean(axis=0)) / sd


def real(name, data_dir):
    """(X standardised, labels) of a real data set read from data_dir (never copied)."""
    import pandas as pd

    path = lambda f: os.path.join(data_dir, f)          # noqa: E731
    if name == "ionosphere":
        X, y = gpclab.load_ionosphere(path("ionosphere.data"))
    elif name == "sonar":
        d = pd.read_csv(path("sonar.all-data"))
        X, y = d.iloc[:, :60].to_numpy(float), d.iloc[:, 60].astype(str).to_numpy()
    elif name == "pima":
        d = pd.concat([pd.read_csv(path("Pima.tr.csv")), pd.read_csv(path("Pima.te.csv"))])
        X = d[["npreg", "glu", "bp", "skin", "bmi", "ped", "age"]].to_numpy(float)
        y = d["type"].astype(str).to_numpy()
    elif name == "fgl":
        d = pd.read_csv(path("fgl.csv"))
        X = d.drop(columns=["rownames", "type"], errors="ignore").to_numpy(float)
        y = d["type"].astype(str).to_numpy()
    else:
        raise ValueError(f"bench_floor: unknown data set {name!r} (ionosphere, sonar, pima, fgl)")
    return standardise(np.asarray(X, float)), np.asarray(y)


# ---------------------------------------------------------------- counting the calls

class Counter:
    """Within the block, every call of the `unchecked` entry of the COUNTED box functions is recorded
    as (name, size of its first matrix, its result, whether it started from given sites), with the BLAS
    threads at the first call."""

    def __init__(self):
        self.calls = []
        self.threads = None
        self.inside = 0.0           # seconds inside the counted calls (outermost only)
        self._depth = 0

    def __enter__(self):
        self.saved = {}
        for name in COUNTED:
            f = getattr(gpclab, name, None)
            if f is None or not hasattr(f, "unchecked"):
                continue
            self.saved[name] = f.__dict__.get("unchecked")
            f.unchecked = self._wrap(name, f.unchecked)
        # multi-class EP's evidence (ML-II and GPClassifier's fit) runs ep_multiclass's body in its
        # lean mode (_ep_multiclass_run, no face): counted as ep_multiclass
        self.saved_run = gpclab._ep_multiclass_run
        gpclab._ep_multiclass_run = self._wrap("ep_multiclass",
                                               lambda *a: gpclab.EPResult(*self.saved_run(*a)))
        return self

    def _wrap(self, name, orig):
        def counted(*args, **kwargs):
            if self.threads is None:
                self.threads = blas_threads()
            self._depth += 1
            t = time.perf_counter()
            try:
                out = orig(*args, **kwargs)
            finally:
                self._depth -= 1
                if self._depth == 0:
                    self.inside += time.perf_counter() - t
            first = args[0] if args else next(iter(kwargs.values()))
            sites = args[2] if len(args) > 2 else kwargs.get("nu_tilde_init")    # ep, ep_multiclass
            warm = name in ("ep", "ep_multiclass") and sites is not None and bool(np.any(sites))
            self.calls.append((name, np.shape(first), out, bool(warm)))
            return out
        return counted

    def __exit__(self, *exc):
        gpclab._ep_multiclass_run = self.saved_run
        for name, saved in self.saved.items():
            f = getattr(gpclab, name)
            if saved is None:
                del f.unchecked
            else:
                f.unchecked = saved

    def summary(self):
        out = {}
        for name, shape, res, warm in self.calls:
            c = out.setdefault(name, [0, 0])
            c[0] += 1
            c[1] += int(getattr(res, "n_sweeps", getattr(res, "n_iter", 0)) or 0)
        return out


# ---------------------------------------------------------------- timing the floor's operations

def _best(fn, repeat):
    best = np.inf
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


class Floor:
    """Times of the floor's operations at size N, with `threads` BLAS threads, on matrices built from
    the fit's own K (an SPD B = I + s K s with s of the order of W^1/2); each the best of a few runs."""

    def __init__(self, K, threads):
        self.K, self.threads, self.cache = K, threads, {}

    def op(self, name, N):
        key = (name, N)
        if key not in self.cache:
            with threadpool_limits(self.threads, user_api="blas"):
                self.cache[key] = self._time(name, N)
        return self.cache[key]

    def _matrices(self, N):
        n = self.K.shape[0]
        idx = np.arange(N) % n
        K = self.K[np.ix_(idx, idx)] + (np.eye(N) * 1e-6 if N > n else 0.0)   # difference latents: N > n
        s = np.full(N, 0.5)
        B = np.eye(N) + s[:, None] * K * s[None, :]
        return K, B

    def _time(self, name, N):
        K, B = self._matrices(N)
        rep = 3 if N <= 2000 else 2           # the best of a few: a loaded machine's outliers are slow
        L = np.asfortranarray(sla.cholesky(B, lower=True, check_finite=False))
        if name == "chol":
            return _best(lambda: sla.cho_factor(B, lower=True, check_finite=False), rep)
        if name == "potri":
            return _best(lambda: lapack.dpotri(L, lower=1), rep)
        if name == "trsm":
            return _best(lambda: sla.solve_triangular(L, K, lower=True, check_finite=False), rep)
        if name == "syrk":
            V = np.asfortranarray(K)
            return _best(lambda: blas.dsyrk(-1.0, V, beta=1.0, c=np.asfortranarray(K), trans=1, lower=1), rep)
        if name == "gemm":
            return _best(lambda: K @ B, rep)
        if name == "rank1":        # N rank-one updates of the lower triangle, BLOCK at a time
            U = np.asfortranarray(np.random.default_rng(0).standard_normal((BLOCK, N)) * 1e-3)
            S = np.asfortranarray(K)
            blocks = math.ceil(N / BLOCK)

            def run():
                for _ in range(blocks):
                    blas.dsyrk(-1.0, U, beta=1.0, c=S, trans=1, lower=1, overwrite_c=1)
            return _best(run, rep)
        if name == "trmv":         # one triangular mat-vec, less the cost of a call at N = 8
            x = np.random.default_rng(0).standard_normal(N)
            calls = max(20, int(2e7 / N ** 2))

            def run(Lm, v):
                for _ in range(calls):
                    blas.dtrmv(Lm, v, lower=1)
            L8, x8 = np.asfortranarray(L[:8, :8]), x[:8]
            t = _best(lambda: run(L, x), rep) - _best(lambda: run(L8, x8), rep)
            return max(t, 0.0) / calls
        raise ValueError(name)

    def refactor(self, N):
        return self.op("chol", N) + self.op("trsm", N) + self.op("syrk", N)

    def ep(self, N, sweeps, warm):
        return sweeps * (self.op("rank1", N) + self.refactor(N)) + (self.refactor(N) if warm else 0.0)


def floor_of(calls, floor):
    """The floor, in seconds, of the recorded calls (see the module docstring), and the names
    of the calls that it counts."""
    total = 0.0
    for name, shape, res, warm in calls:
        N = shape[-1]
        if name == "laplace_mode":
            total += (res.n_iter + 1) * floor.op("chol", N)
        elif name in ("ep", "ep_multiclass"):
            N = res.nu_tilde.shape[0]
            total += floor.ep(N, res.n_sweeps, warm)
        elif name == "laplace_mode_multiclass":
            C = shape[0]
            total += (res.n_iter + 1) * (C * (floor.op("chol", N) + floor.op("potri", N)) + floor.op("chol", N))
        elif name == "multiclass_G":                 # the fit keeps G_c = M\E_c for its predictions
            total += shape[0] * floor.op("trsm", N)
        elif name in ("laplace_log_q_grad", "ep_log_Z_grad"):
            total += floor.op("potri", N)
        elif name == "em_ep_grad":
            total += floor.op("chol", N) + floor.op("potri", N) + 2 * floor.op("gemm", N)
        elif name == "em_ep_bound":
            total += 2 * floor.op("chol", N) + floor.op("trsm", N)
    return total


# ---------------------------------------------------------------- the reference optimisers

def sklearn_reference(X, idx, h0, bounds):
    """scikit-learn's GPC (Laplace, logistic, its L-BFGS-B) from gpclab's start and within its bounds:
    (evaluations with a gradient, log evidence reached)."""
    from sklearn.gaussian_process import GaussianProcessClassifier, _gpc
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    (l_lo, l_hi), (s_lo, s_hi) = bounds
    kernel = ConstantKernel(np.exp(2 * h0[1]), (np.exp(2 * s_lo), np.exp(2 * s_hi))) * \
        RBF(np.exp(h0[0]), (np.exp(l_lo), np.exp(l_hi)))
    cls = getattr(_gpc, "_BinaryGaussianProcessClassifierLaplace", None) or _gpc._BinaryGPCLaplace
    orig = cls.log_marginal_likelihood
    count = [0]

    def counted(self, theta=None, eval_gradient=False, **kwargs):
        count[0] += bool(eval_gradient)
        return orig(self, theta, eval_gradient, **kwargs)

    cls.log_marginal_likelihood = counted
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = GaussianProcessClassifier(kernel, n_restarts_optimizer=0).fit(X, idx)
    finally:
        cls.log_marginal_likelihood = orig
    return count[0], float(m.base_estimator_.log_marginal_likelihood_value_)


def lbfgs_reference(X, y_pm, h0, bounds, kernel, likelihood, hold=None):
    """scipy's L-BFGS-B with its defaults (as scikit-learn calls it) on gpclab's log Z_EP:
    (evaluations, log Z_EP reached). hold: index of a hyperparameter held at its start."""
    from scipy.optimize import minimize

    bounds = [tuple(b) for b in bounds]
    if hold is not None:
        bounds[hold] = (h0[hold], h0[hold])
    state = {"sites": None}

    def neg(x):
        try:
            v, g, res = gpclab.ep_evidence(X, y_pm, np.ascontiguousarray(x), kernel, state["sites"],
                                           likelihood=likelihood)
            if not np.isfinite(v):
                raise FloatingPointError
        except (FloatingPointError, np.linalg.LinAlgError, ValueError):
            state["sites"] = None
            v, g, res = gpclab.ep_evidence(X, y_pm, np.ascontiguousarray(x), kernel, None, likelihood=likelihood)
        state["sites"] = (res.nu_tilde, res.tau_tilde)
        if not np.isfinite(v):
            return np.inf, np.zeros_like(x)
        return -v, -np.asarray(g)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = minimize(neg, np.clip(h0, [b[0] for b in bounds], [b[1] for b in bounds]), jac=True,
                     method="L-BFGS-B", bounds=bounds)
    return int(r.nfev), -float(r.fun)


# ---------------------------------------------------------------- the fits

def _first_clause(message):
    """A warning's message up to its first ';' or sentence end: what happened, without the advice."""
    cut = [k for k in (message.find("; "), message.find(". "), message.find("\n")) if k > 0]
    return message[:min(cut)] if cut else message[:200]


def fit_once(fit, X, y, args):
    """One run of the fit, counted: dict(time, counter, evidence, evaluations (None here), ais for AIS).
    Each run starts as a first fit in a process on new data: the checks of X's spread and the
    machine's speed (multi-class EP on 800 latents or more measures it to choose its BLAS threads)
    are not kept from an earlier run."""
    classes = np.unique(y)
    idx = np.searchsorted(classes, y)
    y_pm = np.where(idx == 1, 1.0, -1.0)
    out = {"evidence": None, "evaluations": None}
    gpclab._spread_cache.clear()      # each fit measures its own checks of X, as a first fit on new data
    gpclab._machine_speed_cache.clear()
    fixed = fit in ("laplace", "ep", "mc-laplace", "mc-ep")
    if fixed:   # the hyperparameters a fixed fit is given (not timed: the fit does not compute them)
        kernel = "kg" if fit == "mc-ep" else "se"
        h = gpclab.default_log_hyp(kernel, X) if kernel == "kg" else gpclab.data_log_hyp(kernel, X, idx)
    with Counter() as counter:
        t = time.perf_counter()
        if fixed:
            method = "ep" if fit.endswith("ep") else "laplace"
            m = gpclab.GPClassifier(method=method, kernel=kernel, log_hyp=h, optimize=False).fit(X, y)
            out["evidence"] = m.log_marginal_likelihood_
        elif fit == "ais":
            K = gpclab.kernel_matrix("se", X, X, gpclab.data_log_hyp("se", X, idx))
            t_pre = time.perf_counter()
            step, n_lf = gpclab.hmc_step_size(K, "probit")       # not timed: an eigenvalue problem
            t += time.perf_counter() - t_pre
            res = gpclab.ais(K, y_pm, "probit", T=args.ais_T, R=args.ais_R, step=step, n_leapfrog=n_lf)
            out["evidence"] = float(res[0])
            out["ais"] = (args.ais_T, args.ais_R, n_lf)
        elif fit == "emep":
            m = gpclab.GPClassifier(method="emep").fit(X, y)
            out["evidence"] = m.log_marginal_likelihood_
        else:
            method = "ep" if fit == "ml2-ep" else "laplace"
            h0 = gpclab.data_log_hyp("se", X, idx)
            m = gpclab.GPClassifier(method=method, kernel="se", log_hyp=h0).fit(X, y)
            out["evidence"] = m.log_marginal_likelihood_
        out["time"] = time.perf_counter() - t
    out["counter"] = counter
    return out


def run_fit(fit, X, y, args):
    """Run one fit; returns dict(time, counter, evidence, evaluations, warnings, runs). A fit shorter than
    SHORT_FIT seconds is run up to REPEATS times and its fastest run kept (its time, its counts and
    its time in boxes), as the floor's operations are the best of a few runs: the first fit at a size
    pays for fresh memory (page faults, the allocator's growth) that later ones, and the floor's
    operations on arrays already touched, do not."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = fit_once(fit, X, y, args)
        runs = 1
        while out["time"] < SHORT_FIT and runs < REPEATS:
            runs += 1
            again = fit_once(fit, X, y, args)
            if again["time"] < out["time"]:
                out = again
        out["runs"] = runs
    counter = out["counter"]
    out["warnings"] = sorted({_first_clause(str(w.message)) for w in caught})
    s = counter.summary()
    if fit.startswith("ml2"):
        out["evaluations"] = s.get("ep_log_Z_grad" if fit == "ml2-ep" else "laplace_log_q_grad", [0])[0]
    elif fit == "emep":
        out["evaluations"] = s.get("ep", [0])[0]
    return out


def reference(fit, X, y):
    """(evaluations, evidence) of the reference optimiser for an ML-II or EM-EP fit, else None."""
    classes = np.unique(y)
    idx = np.searchsorted(classes, y)
    y_pm = np.where(idx == 1, 1.0, -1.0)
    if fit == "ml2-laplace":
        return sklearn_reference(X, idx, gpclab.data_log_hyp("se", X, idx), gpclab.default_bounds("se", X.shape[1], X))
    if fit == "ml2-ep":
        return lbfgs_reference(X, y_pm, gpclab.data_log_hyp("se", X, idx), gpclab.default_bounds("se", X.shape[1], X),
                               "se", "probit")
    if fit == "emep":
        return lbfgs_reference(X, y_pm, gpclab.default_log_hyp("kg", X), gpclab.default_bounds("kg", X.shape[1]),
                               "kg", "step", hold=0)
    return None


def warm_up(fits, with_reference):
    """Load (or compile) every path the fits use, on tiny data, before anything is timed."""
    X, y = synthetic(40)
    X3, y3 = synthetic(30, classes=3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for fit in fits:
            a = argparse.Namespace(ais_T=20, ais_R=2)
            fit_once(fit, X3 if fit in MULTICLASS else X, y3 if fit in MULTICLASS else y, a)
            if with_reference and fit in ("ml2-ep", "emep"):
                reference(fit, X, y)


# ---------------------------------------------------------------- the table

def fmt_t(t):
    return "n/a" if t is None or not np.isfinite(t) else f"{t:.3g} s" if t < 10 else f"{t:.0f} s"


def fmt_ev(v):
    return "" if v is None else f"{v:.3f}"


def table(rows):
    """The markdown table of the rows (dicts)."""
    lines = ["| fit | data | n | thr | time | in boxes | floor | ratio | evaluations (gpclab / ref) | "
             "evidence (gpclab / ref) |",
             "|---|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for r in rows:
        if r.get("skipped"):
            lines.append(f"| {LABEL[r['fit']]} | {r['data']} | {r['n']} | | skipped | | | | | {r['skipped']} |")
            continue
        ratio = f"{r['time'] / r['floor']:.2f}" if r["floor"] else "n/a"
        inside = r["counter"].inside if r["fit"] != "ais" else None
        ev = ""
        if r["evaluations"] is not None:        # 0: the fit's evaluations went by no counted function
            ev = f"{r['evaluations'] or 'n/a'} / {r['ref'][0] if r.get('ref') else '-'}"
        evid = fmt_ev(r["evidence"])
        if r.get("ref"):
            evid += f" / {fmt_ev(r['ref'][1])}"
        lines.append(f"| {LABEL[r['fit']]} | {r['data']} | {r['n']} | {r['threads']} | {fmt_t(r['time'])} | "
                     f"{fmt_t(inside) if inside else 'n/a'} | {fmt_t(r['floor']) if r['floor'] else 'n/a'} | "
                     f"{ratio} | {ev} | {evid} |")
    return "\n".join(lines)


def detail(r):
    s = r["counter"].summary()
    calls = ", ".join(f"{k} x {v[0]} ({v[1]} steps/sweeps)" if k in ("laplace_mode", "ep", "ep_multiclass",
                                                                     "laplace_mode_multiclass")
                      else f"{k} x {v[0]}" for k, v in s.items())
    extra = ""
    if "ais" in r:
        T, R, n_lf = r["ais"]
        extra = f"; AIS T = {T}, R = {R}, {n_lf} leapfrog steps"
    if r.get("ref"):
        extra += f"; reference optimiser {fmt_t(r['ref time'])}"
    w = f"; warnings: {' | '.join(r['warnings'])}" if r["warnings"] else ""
    runs = f"; the fastest of {r['runs']} runs" if r.get("runs", 1) > 1 else ""
    return f"- {LABEL[r['fit']]}, {r['data']}, n = {r['n']}: counted {calls or 'nothing'}{extra}{runs}{w}"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, nargs="*", default=[250, 1000, 2000, 4000])
    ap.add_argument("--sets", default="ionosphere,sonar,pima,fgl",
                    help="real data sets (comma-separated; 'none' for none)")
    ap.add_argument("--fits", default=",".join(ALL_FITS))
    ap.add_argument("--data-dir", default=os.environ.get("GPCLAB_DATA", os.path.join("..", "shared", "datasets")))
    ap.add_argument("--no-reference", action="store_true", help="skip the reference optimisers")
    ap.add_argument("--budget", type=float, default=900.0,
                    help="skip a fit expected (cubic in n from the previous n) to take longer, in seconds")
    ap.add_argument("--max-latents", type=int, default=4000, help="largest n (J - 1) for multi-class EP")
    ap.add_argument("--ais-T", type=int, default=1000)
    ap.add_argument("--ais-R", type=int, default=3)
    ap.add_argument("--out", default=None, help="also write the table and notes to this markdown file")
    args = ap.parse_args(argv)
    fits = [f.strip() for f in args.fits.split(",") if f.strip()]
    bad = [f for f in fits if f not in ALL_FITS]
    if bad:
        ap.error(f"--fits: unknown {bad}; choose from {ALL_FITS}")
    sets = [] if args.sets in ("", "none") else [s.strip() for s in args.sets.split(",")]

    print(f"gpclab from {os.path.dirname(os.path.abspath(gpclab.__file__))}; {os.cpu_count()} cores; "
          f"BLAS threads by default {blas_threads()}; load average {os.getloadavg()[0]:.1f}", flush=True)
    t0 = time.perf_counter()
    warm_up(fits, not args.no_reference)
    print(f"warm-up (numba cache load or compile) {time.perf_counter() - t0:.1f} s", flush=True)

    data = []           # (label, n-key, X, y, fits)
    for name in sets:
        X, y = real(name, args.data_dir)
        multi = len(np.unique(y)) > 2
        data.append((name, X, y, [f for f in fits if (f in MULTICLASS) == multi]))
    for n in sorted(args.n):
        X, y = synthetic(n)
        data.append((f"synthetic", X, y, [f for f in fits if f not in MULTICLASS]))
        X3, y3 = synthetic(n, classes=3)
        data.append((f"synthetic J=3", X3, y3, [f for f in fits if f in MULTICLASS]))

    rows, last, floors = [], {}, {}
    for name, X, y, todo in data:
        n = X.shape[0]
        J = len(np.unique(y))
        for fit in todo:
            row = {"fit": fit, "data": name, "n": n}
            if fit == "mc-ep" and n * (J - 1) > args.max_latents:
                row["skipped"] = (f"n (J - 1) = {n * (J - 1)} difference latents > --max-latents {args.max_latents}: "
                                  f"EP keeps several N x N matrices ({8 * (n * (J - 1)) ** 2 / 1e9:.1f} GB each)")
            elif fit in last and name.startswith("synthetic"):
                n0, t_prev = last[fit]
                power = 2 if fit == "ais" else 3         # AIS: mat-vecs, O(n^2) each; the others O(n^3)
                expect = t_prev * (n / n0) ** power
                if expect > args.budget:
                    row["skipped"] = (f"expected {expect:.0f} s ({t_prev:.1f} s at n = {n0}, O(n^{power})) "
                                      f"> --budget {args.budget:.0f} s")
            if row.get("skipped"):
                print(f"{LABEL[fit]}, {name}, n = {n}: skipped, {row['skipped']}", flush=True)
                rows.append(row)
                continue
            try:
                r = run_fit(fit, X, y, args)
            except RuntimeError as e:              # GPClassifier's refusal of a fit over 10 minutes
                if "not started" not in str(e):
                    raise
                row["skipped"] = "refused by GPClassifier: " + _first_clause(str(e).split(": ", 1)[-1])
                print(f"{LABEL[fit]}, {name}, n = {n}: skipped, {row['skipped']}", flush=True)
                rows.append(row)
                continue
            counter = r["counter"]
            # AIS's mat-vecs are gpclab's own loops on numba's threads, one run per thread: its floor is
            # one BLAS thread's; every other fit's is timed with the BLAS threads seen inside it
            threads = 1 if fit == "ais" else counter.threads if counter.threads is not None else blas_threads()
            key = (name, n, threads)
            if key not in floors:         # one set of timed operations per data set and thread count
                K = gpclab.kernel_matrix("se", X, X, gpclab.data_log_hyp("se", X, np.searchsorted(np.unique(y), y)))
                floors[key] = Floor(K, threads)
            fl = floors[key]
            floor = floor_of(counter.calls, fl)
            if fit == "ais":
                T, R, n_lf = r["ais"]
                floor = fl.op("chol", n) + T * R * n_lf * 2 * fl.op("trmv", n)
            row.update(r, threads=threads, floor=floor or None)
            if not args.no_reference and fit in ("ml2-laplace", "ml2-ep", "emep"):
                t_ref = time.perf_counter()
                with threadpool_limits(threads, user_api="blas"):    # the fit's BLAS threads for the peer too
                    row["ref"] = reference(fit, X, y)
                row["ref time"] = time.perf_counter() - t_ref
            if name.startswith("synthetic"):
                last[fit] = (n, r["time"])
            rows.append(row)
            print(f"{LABEL[fit]}, {name}, n = {n}: {fmt_t(r['time'])}, floor {fmt_t(row['floor'])}"
                  + (f", evaluations {r['evaluations']} / ref {row['ref'][0]}" if row.get("ref") else "")
                  + f"  [{time.perf_counter() - t0:.0f} s]", flush=True)

    text = table(rows) + "\n\n" + "\n".join(detail(r) for r in rows if not r.get("skipped"))
    text += ("\n\ntime: the whole fit (GPClassifier.fit; gpclab.ais for AIS), the fastest of up to "
             f"{REPEATS} runs for a fit under {SHORT_FIT:g} s, as the floor's operations are the best of a "
             "few; in boxes: the part of it inside the counted box functions; floor: their LAPACK/BLAS arithmetic (see the docstring); ratio = time / "
             "floor. thr: BLAS threads in the fit (gpclab uses one while every dimension is below 1500: two "
             "threads pay off only above that, and below it they spin on a shared machine's cores); the floor is "
             f"timed with the same number. Total {time.perf_counter() - t0:.0f} s; load average at the end "
             f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores.")
    print("\n" + text)
    if args.out:
        with open(args.out, "w") as fh:
            fh.write(text + "\n")
    return rows


if __name__ == "__main__":
    main()
