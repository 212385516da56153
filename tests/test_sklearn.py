"""GPClassifier as a scikit-learn estimator: scikit-learn's own checks, its tools (clone,
cross-validation, grid search, pipelines, calibration, one-vs-rest), fitted state, random
states, threads, and a fit that does not depend on the unit of the inputs."""
import threading
import warnings

import numpy as np
import pytest
from sklearn.base import clone
from sklearn.calibration import CalibratedClassifierCV
from sklearn.exceptions import NotFittedError
from sklearn.model_selection import GridSearchCV, cross_val_score
from sklearn.multiclass import OneVsRestClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.utils.estimator_checks import parametrize_with_checks

import gpclab
from gpclab import GPClassifier


def _data(n=40, seed=1, labels=("a", "b")):
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, 2))
    y = np.where(X[:, 0] + 0.5 * X[:, 1] + 0.5 * r.standard_normal(n) > 0, *labels)
    return X, y


# scikit-learn's checks run about 55 fits per estimator on up to 300 cases and three classes:
# few ML-II iterations (EM rounds) keep them to seconds; the fit itself is tested elsewhere
@parametrize_with_checks([GPClassifier(method="laplace", max_iter=2), GPClassifier(method="ep", max_iter=2),
                          GPClassifier(method="emep", max_iter=1)],
                         expected_failed_checks=lambda est: est.EXPECTED_FAILED_CHECKS)
def test_scikit_learn_checks(estimator, check):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)   # ML-II stopped at max_iter: as asked
        check(estimator)


def test_clone_keeps_parameters_and_drops_the_fit():
    X, y = _data()
    m = GPClassifier(method="ep", max_iter=3, random_state=5).fit(X, y)
    c = clone(m)
    assert c.get_params() == m.get_params()
    assert not hasattr(c, "log_hyp_")


@pytest.mark.parametrize("scoring", ["accuracy", "neg_log_loss"])
def test_cross_val_score(scoring):
    X, y = _data(60)
    s = cross_val_score(GPClassifier(max_iter=20), X, y, cv=3, scoring=scoring)
    assert s.shape == (3,) and np.all(np.isfinite(s))
    # the same folds by hand
    from sklearn.metrics import accuracy_score, log_loss
    from sklearn.model_selection import StratifiedKFold
    for k, (tr, te) in enumerate(StratifiedKFold(3).split(X, y)):
        m = GPClassifier(max_iter=20).fit(X[tr], y[tr])
        want = (accuracy_score(y[te], m.predict(X[te])) if scoring == "accuracy"
                else -log_loss(y[te], m.predict_proba(X[te]), labels=m.classes_))
        assert s[k] == pytest.approx(want, rel=1e-12)


def test_grid_search_over_parameters():
    X, y = _data(40)
    gs = GridSearchCV(GPClassifier(max_iter=10), {"likelihood": ["logistic", "probit"]}, cv=2).fit(X, y)
    assert gs.best_params_["likelihood"] in ("logistic", "probit")
    assert gs.best_estimator_.likelihood_ == gs.best_params_["likelihood"]


def test_pipeline_with_a_scaler_equals_scaling_by_hand():
    X, y = _data(40)
    X = X * [1e3, 1e-2] + [5.0, -7.0]
    pipe = make_pipeline(StandardScaler(), GPClassifier(max_iter=20)).fit(X, y)
    Xs = StandardScaler().fit(X).transform(X)
    m = GPClassifier(max_iter=20).fit(Xs, y)
    np.testing.assert_allclose(pipe.predict_proba(X), m.predict_proba(Xs), rtol=1e-10, atol=1e-12)


def test_calibration_and_one_vs_rest():
    X, y = _data(45)
    cal = CalibratedClassifierCV(GPClassifier(max_iter=10), cv=3).fit(X, y)
    P = cal.predict_proba(X)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    X3 = np.random.default_rng(2).standard_normal((45, 2))
    y3 = np.digitize(X3[:, 0], [-0.4, 0.4])
    ovr = OneVsRestClassifier(GPClassifier(max_iter=10)).fit(X3, y3)
    assert len(ovr.estimators_) == 3
    assert np.mean(ovr.predict(X3) == y3) > 0.8


def test_not_fitted_error():
    X, _ = _data()
    for method in ("predict", "predict_proba", "predict_latent", "log_marginal_likelihood"):
        with pytest.raises(NotFittedError, match="not fitted"):
            getattr(GPClassifier(), method)(*(() if method == "log_marginal_likelihood" else (X,)))


def test_feature_names_of_a_data_frame():
    pd = pytest.importorskip("pandas")
    X, y = _data()
    df = pd.DataFrame(X, columns=["height", "weight"])
    m = GPClassifier(max_iter=10).fit(df, y)
    assert m.n_features_in_ == 2
    assert list(m.feature_names_in_) == ["height", "weight"]
    np.testing.assert_array_equal(m.predict_proba(df), m.predict_proba(X))
    with pytest.raises(ValueError, match="feature names"):       # swapped columns
        m.predict(df[["weight", "height"]])
    assert not hasattr(GPClassifier(max_iter=10).fit(X, y), "feature_names_in_")


@pytest.mark.parametrize("random_state", [None, 7, np.random.RandomState(7), np.random.default_rng(7)])
def test_random_state_kinds(random_state):
    X, y = _data(30, labels=(0, 1))
    X3 = np.random.default_rng(3).standard_normal((30, 2))
    y3 = np.digitize(X3[:, 0], [-0.4, 0.4])
    m = GPClassifier(n_restarts=1, max_iter=5, random_state=random_state, n_samples=50).fit(X3, y3)
    P = m.predict_proba(X3)
    np.testing.assert_array_equal(P, m.predict_proba(X3))     # the Monte Carlo seed is the fit's
    assert GPClassifier(n_restarts=1, max_iter=5, random_state=random_state).fit(X, y).converged_ in (True, False)
    if isinstance(random_state, int):
        again = GPClassifier(n_restarts=1, max_iter=5, random_state=random_state, n_samples=50).fit(X3, y3)
        np.testing.assert_array_equal(again.predict_proba(X3), P)


@pytest.mark.parametrize("bad", [1.5, "0", True, -1, 2 ** 31])
def test_random_state_refused(bad):
    X, y = _data(20)
    with pytest.raises((TypeError, ValueError), match="GPClassifier: random_state"):
        GPClassifier(random_state=bad).fit(X, y)


def test_refit_with_another_method_leaves_no_stale_attributes():
    X, y = _data(30)
    m = GPClassifier(method="laplace", max_iter=5).fit(X, y)
    assert hasattr(m, "f_hat_")
    m.set_params(method="ep").fit(X, y)
    assert not hasattr(m, "f_hat_") and hasattr(m, "nu_tilde_") and m.emep_ is None
    fresh = GPClassifier(method="ep", max_iter=5).fit(X, y)
    assert sorted(k for k in vars(m) if k.endswith("_")) == sorted(k for k in vars(fresh) if k.endswith("_"))
    m.set_params(method="emep", max_iter=2).fit(X, y)
    assert not hasattr(m, "f_hat_") and m.emep_ is not None
    m.set_params(method="laplace").fit(X, y)
    assert not hasattr(m, "nu_tilde_") and m.emep_ is None
    with pytest.raises(ValueError):                            # a failed fit leaves no fit behind
        m.fit(X, np.zeros(len(y)))
    assert not hasattr(m, "log_hyp_")


def test_fitting_from_four_threads_leaves_the_warning_filters_alone():
    X, y = _data(30)
    before = list(warnings.filters)
    errors, models = [], []

    def fit(seed):
        try:
            models.append(GPClassifier(n_restarts=2, max_iter=5, random_state=seed).fit(X, y))
        except Exception as e:                                 # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=fit, args=(s,)) for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(models) == 4
    assert list(warnings.filters) == before


def test_multiclass_ep_needs_no_likelihood():
    X = np.random.default_rng(4).standard_normal((45, 2))
    y = np.digitize(X[:, 0], [-0.4, 0.4])
    m = GPClassifier(method="ep", max_iter=3).fit(X, y)
    assert m.likelihood_ == "step" and m.kernel_ == "kg"
    with pytest.raises(ValueError, match="GPClassifier.fit: y has 3 classes: multi-class EP"):
        GPClassifier(method="ep", likelihood="probit").fit(X, y)


@pytest.mark.parametrize("y,match", [
    (np.array(["a", 1, None] * 10, dtype=object), "mixes labels of types"),
    (np.array([1, "a"] * 15, dtype=object), "mixes labels of types"),
    (np.linspace(0, 1, 30), "Unknown label type"),
    (np.r_[np.zeros(29), np.nan], "Input y contains NaN"),
])
def test_labels_refused_with_a_message(y, match):
    X, _ = _data(30)
    with pytest.raises(ValueError, match=match):
        GPClassifier().fit(X, y)


# --- the unit of the inputs ---------------------------------------------------------

@pytest.mark.parametrize("method", ["laplace", "ep", "emep"])
def test_the_fit_does_not_depend_on_the_unit_of_x(method):
    """x scaled by 1e-5 ... 1e5: the same predictions and evidence (ML-II's start and its
    length-scale bounds follow the spread of x; EM-EP's start and bounds divide each w_m by its
    input's variance). Before, the bounds were fixed at |log l| <= 10 and at 1e5 the
    probabilities changed by up to 0.52 (EM-EP: 0.50, and 9.3 nats of evidence)."""
    X, y = _data(40)
    Xt = np.random.default_rng(9).standard_normal((30, 2))
    ref = GPClassifier(method=method).fit(X, y)
    p0 = ref.predict_proba(Xt)[:, 1]
    for c in (1e-5, 1e-3, 1e3, 1e5):
        with warnings.catch_warnings():
            warnings.simplefilter("error")                     # no bound warning either
            m = GPClassifier(method=method).fit(X * c, y)
        assert np.max(np.abs(m.predict_proba(Xt * c)[:, 1] - p0)) < 1e-6, c
        assert m.log_marginal_likelihood_ == pytest.approx(ref.log_marginal_likelihood_, abs=1e-6), c
        if method == "emep":       # K&G's w = 1/l^2 for each input: w / c^2
            np.testing.assert_allclose(m.log_hyp_[3:] + 2 * np.log(c), ref.log_hyp_[3:], atol=1e-4)
        else:
            assert m.log_hyp_[0] - np.log(c) == pytest.approx(ref.log_hyp_[0], abs=1e-4), c


def test_default_bounds_follow_the_spread_of_x():
    X, _ = _data(40)
    from scipy.spatial.distance import pdist
    r = np.median(pdist(X))
    (lo, hi), _ = gpclab.default_bounds("se", 2, X)
    assert (lo, hi) == pytest.approx((np.log(r) - 10, np.log(r) + 10))
    # ARD: each input's own spread r_m, the median |x_m - x'_m| over pairs; w_m = 1 / (d r_m^2) at the centre
    for m, (lo, hi) in enumerate(gpclab.default_bounds("ard", 2, 1e3 * X)[2:]):
        r_m = np.median([abs(1e3 * (a - b)) for i, a in enumerate(X[:, m]) for b in X[i + 1:, m]])
        assert (lo, hi) == pytest.approx((-20 - np.log(2 * r_m ** 2), 10 - np.log(2 * r_m ** 2)))
    assert gpclab.default_bounds("se", 2) == [(-10.0, 10.0), (-10.0, 0.5 * np.log(1e5))]


def test_ml2_warns_when_a_length_scale_sits_on_its_bound():
    X, y = _data(40)
    y_pm = np.where(y == "b", 1.0, -1.0)
    with pytest.warns(RuntimeWarning, match="ml2: a length-scale ended on its bound"):
        h, _, _ = gpclab.ml2(X, y_pm, [3.0, 1.0], bounds=[(2.0, 3.0), (-5.0, 5.0)])
    assert h[0] == 2.0                       # the evidence wanted a shorter length-scale


def test_ml2_reports_an_optimiser_that_did_not_converge():
    X, y = _data(40)
    y_pm = np.where(y == "b", 1.0, -1.0)
    with pytest.warns(RuntimeWarning, match="ml2: L-BFGS-B stopped without converging after 1 iter"):
        _, _, res = gpclab.ml2(X, y_pm, [2.0, -1.0], max_iter=1)
    assert not res.success
    with pytest.warns(RuntimeWarning, match="GPClassifier.fit: ML-II L-BFGS-B stopped"):
        m = GPClassifier(max_iter=1).fit(X, y)
    assert m.converged_ is False and m.n_iter_ == 1
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert GPClassifier().fit(X, y).converged_ is True


@pytest.mark.parametrize("ftol,exc", [(-1.0, ValueError), (np.nan, ValueError), (np.inf, ValueError),
                                      ("1e-6", TypeError)])
def test_ml2_checks_ftol(ftol, exc):
    X, y = _data(20)
    with pytest.raises(exc, match="ml2: ftol"):
        gpclab.ml2(X, np.where(y == "b", 1.0, -1.0), [0.0, 0.0], ftol=ftol)


@pytest.mark.parametrize("y", [np.ones(20), np.ones(1)])
def test_ml2_refuses_one_class(y):
    X = np.random.default_rng(0).standard_normal((len(y), 2))
    with pytest.raises(ValueError, match="ml2: y must hold at least two classes"):
        gpclab.ml2(X, y, [0.0, 0.0])


@pytest.mark.parametrize("call,exc,match", [
    (lambda m, X: m.predict(X[:, :1]), ValueError, "GPClassifier.predict: X has 1 features, but GPClassifier is expecting 2"),
    (lambda m, X: m.predict_proba(np.full((2, 2), np.nan)), ValueError, "GPClassifier.predict_proba: Input X contains NaN"),
    (lambda m, X: m.predict_proba(X, rule="mean"), ValueError, "GPClassifier.predict_proba: rule must be one of"),
    (lambda m, X: m.predict_latent(X[:, 0]), ValueError, "GPClassifier.predict_latent: Expected 2D array"),
    (lambda m, X: m.log_marginal_likelihood([0.0, 1.0, 2.0]), ValueError,
     "GPClassifier.log_marginal_likelihood: log_hyp for kernel 'se' on d = 2 inputs must have length 2"),
    (lambda m, X: GPClassifier(log_hyp=[0.0, 1.0, 2.0]).fit(X, m.classes_[[0, 1] * 20]), ValueError,
     "GPClassifier.fit: log_hyp for kernel 'se'"),
    (lambda m, X: GPClassifier(discrete=[7]).fit(X, m.classes_[[0, 1] * 20]), ValueError,
     "GPClassifier.fit: discrete has a column index out of range"),
    (lambda m, X: GPClassifier().fit(X, m.classes_[[0, 1] * 19]), ValueError,
     "GPClassifier.fit: Found input variables with inconsistent numbers of samples"),
    (lambda m, X: GPClassifier().fit(np.where(X > 1, np.inf, X), m.classes_[[0, 1] * 20]), ValueError,
     "GPClassifier.fit: Input X contains infinity"),
    (lambda m, X: GPClassifier(method="emep", kernel="se").fit(X, m.classes_[[0, 1] * 20]), ValueError,
     "GPClassifier: method 'emep' needs kernel 'kg' or 'kg_iso'"),
])
def test_errors_name_the_method_called(call, exc, match):
    """scikit-learn's own messages (which its checks match) with the method called in front."""
    X, y = _data(40)
    m = GPClassifier(max_iter=5).fit(X, y)
    with pytest.raises(exc, match=match):
        call(m, X)


def test_voting_classifier_averages_the_probabilities():
    from sklearn.ensemble import VotingClassifier
    from sklearn.linear_model import LogisticRegression
    X, y = _data(50)
    members = [("laplace", GPClassifier(max_iter=10)), ("ep", GPClassifier(method="ep", max_iter=10)),
               ("lr", LogisticRegression())]
    vote = VotingClassifier(members, voting="soft").fit(X, y)
    by_hand = np.mean([clone(e).fit(X, y).predict_proba(X) for _, e in members], axis=0)
    np.testing.assert_allclose(vote.predict_proba(X), by_hand, rtol=1e-10)
