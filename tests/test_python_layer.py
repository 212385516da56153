"""Edges of Part II (the Python layer): information in bits at p = 0 and for empty or one-class
input, the loaders on what is not a data file, and messages that name the function called."""
import math
import os
import sys

import numpy as np
import pytest

import gpclab


# --- information_bits -------------------------------------------------------------

def test_information_bits_of_a_certain_wrong_prediction_is_minus_infinity():
    y_tr = np.array([1, -1, 1, -1])
    assert gpclab.information_bits(np.array([0.0, 0.5]), np.array([1, -1]), y_tr) == -math.inf
    assert gpclab.information_bits(np.array([1.0, 0.5]), np.array([-1, 1]), y_tr) == -math.inf
    # a certain right prediction is fine: log2 1 = 0, plus the base line of 1 bit
    assert gpclab.information_bits(np.array([0.0, 1.0]), np.array([-1, 1]), y_tr) == pytest.approx(1.0)
    P = np.array([[0.0, 1.0], [0.5, 0.5]])
    assert gpclab.information_bits_multiclass(P, np.array([0, 1]), np.array([0, 1])) == -math.inf


@pytest.mark.parametrize("args,match", [
    ((np.zeros(0), np.zeros(0), np.array([1, -1])), "information_bits: p_star and y_test must not be empty"),
    ((np.array([0.5]), np.array([1]), np.array([1, 1, 1])), "information_bits: y_train must hold both classes"),
    ((np.array([0.5]), np.array([1]), np.zeros(0)), "information_bits: y_train must hold both classes"),
    ((np.array([1.5]), np.array([1]), np.array([1, -1])), "information_bits: p_star must be probabilities"),
])
def test_information_bits_refuses_what_it_cannot_define(args, match):
    with pytest.raises(ValueError, match=match):
        gpclab.information_bits(*args)


@pytest.mark.parametrize("P,yt,ytr,match", [
    (np.zeros((0, 3)), np.zeros(0, int), np.array([0, 1, 2]), "P, y_test and y_train must not be empty"),
    (np.full((2, 3), 1 / 3), np.array([0, 2]), np.array([0, 1, 1]), r"y_test holds class\(es\) \[2\] that y_train lacks"),
    (np.full((2, 3), 0.5), np.array([0, 1]), np.array([0, 1, 2]), r"each row of P must sum to 1 .* got 1.5 in row 0"),
])
def test_information_bits_multiclass_refuses_what_it_cannot_define(P, yt, ytr, match):
    with pytest.raises(ValueError, match="information_bits_multiclass: " + match):
        gpclab.information_bits_multiclass(P, yt, ytr)


# --- loaders ----------------------------------------------------------------------

def _line(k, label="g"):
    return ",".join(f"{0.01 * (k + j):.2f}" for j in range(34)) + "," + label


@pytest.mark.parametrize("loader", [gpclab.load_ionosphere, gpclab.load_usps])
def test_loaders_refuse_none_and_non_paths(loader):
    for bad in (None, 3, True):
        with pytest.raises(TypeError, match=f"{loader.__name__}: path must be a str or os.PathLike"):
            loader(bad)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("loader", [gpclab.load_ionosphere, gpclab.load_usps])
def test_loaders_refuse_a_fifo_a_device_and_a_directory_without_reading(tmp_path, loader):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)                        # opening it would block until a writer comes
    with pytest.raises(ValueError, match="is a FIFO, not a regular file"):
        loader(str(fifo))
    if os.path.exists("/dev/zero"):       # reading it would never end
        with pytest.raises(ValueError, match="is a device, not a regular file"):
            loader("/dev/zero")
    with pytest.raises(ValueError, match="is a directory, not a regular file"):
        loader(str(tmp_path))


@pytest.mark.parametrize("loader,limit", [(gpclab.load_ionosphere, 50), (gpclab.load_usps, 500)])
def test_loaders_refuse_an_impossibly_large_file(tmp_path, loader, limit):
    p = tmp_path / "big"
    with open(p, "wb") as fh:             # sparse: no disk space used
        fh.truncate((limit + 1) * 2 ** 20)
    with pytest.raises(ValueError, match=f"more than {limit} MB"):
        loader(str(p))


def test_load_ionosphere_never_drops_a_data_row(tmp_path):
    p = tmp_path / "ionosphere.data"
    p.write_text(_line(0).replace("0.05", "0.0x5", 1) + "\n" + _line(1) + "\n")   # a typo in row 1
    with pytest.raises(ValueError, match=r"line 1: expected 34 numbers and a label g or b, got '0.0x5'"):
        gpclab.load_ionosphere(str(p))
    p.write_text(_line(0) + "\n" + _line(1) + "\n")
    X, y = gpclab.load_ionosphere(str(p))
    assert X.shape == (2, 34)                       # no header: both rows kept
    p.write_text(",".join(f"a{j}" for j in range(34)) + ",class\n" + _line(0) + "\n")
    assert gpclab.load_ionosphere(str(p))[0].shape == (1, 34)


@pytest.mark.parametrize("field", ["1_0", "0x10", "1,5e", "inf", "nan"])
def test_load_ionosphere_reads_decimal_numbers_only(tmp_path, field):
    p = tmp_path / "ionosphere.data"
    p.write_text(_line(0) + "\n" + _line(1).replace("0.02", field, 1) + "\n")
    with pytest.raises(ValueError, match="load_ionosphere: .*line 2: "):
        gpclab.load_ionosphere(str(p))


def test_load_ionosphere_accepts_a_path_object(tmp_path):
    p = tmp_path / "ionosphere.data"
    p.write_text(_line(0, "b") + "\n")
    X, y = gpclab.load_ionosphere(p)
    assert X.shape == (1, 34) and y.tolist() == ["b"]


# --- messages name the function called -------------------------------------------

def _binary(n=12):
    r = np.random.default_rng(0)
    X = r.standard_normal((n, 2))
    return X, np.where(X[:, 0] > 0, 1.0, -1.0)


@pytest.mark.parametrize("call,exc,match", [
    (lambda X, y: gpclab.cross_validate(X, y, seed=1.5), TypeError, "cross_validate: seed must be an integer"),
    (lambda X, y: gpclab.cross_validate(X, y, max_iter=0), ValueError, "cross_validate: max_iter must be a positive"),
    (lambda X, y: gpclab.cross_validate(X[:, 0], y), ValueError, "cross_validate: X must be 2-D"),
    (lambda X, y: gpclab.cross_validate(X, y[:-1]), ValueError, "cross_validate: X and y must have the same"),
    (lambda X, y: gpclab.cross_validate(X, np.ones_like(y)), ValueError, "cross_validate: y must contain exactly two"),
    (lambda X, y: gpclab.cross_validate(X, y, method="emep"), ValueError, "cross_validate: method must be one of"),
    (lambda X, y: gpclab.cross_validate(X, y, log_hyp0=[np.nan, 0.0]), ValueError, "cross_validate: log_hyp0 must be finite"),
    (lambda X, y: gpclab.evidence_grid(X, y, [0.0], [0.0], method="vb", progress=False), ValueError,
     "evidence_grid: method must be one of"),
    (lambda X, y: gpclab.evidence_grid(X[:, 0], y, [0.0], [0.0], progress=False), ValueError,
     "evidence_grid: X must be 2-D"),
    (lambda X, y: gpclab.ais_grid(X, np.ones_like(y), [0.0], [0.0], progress=False), ValueError,
     "ais_grid: y must contain exactly two"),
    (lambda X, y: gpclab.ais_grid(X, y, [0.0, 1.0], [0.0], seed=2 ** 31 - 1, progress=False), ValueError,
     r"ais_grid: seed must leave room .* at most 2147482647, got 2147483647"),
    (lambda X, y: gpclab.mcmc_posterior(X, y[:-1], [0.0, 0.0]), ValueError,
     "mcmc_posterior: X and y must have the same"),
    (lambda X, y: gpclab.hmc_hyperparameters(np.full_like(X, np.nan), y), ValueError,
     "hmc_hyperparameters: X must be finite"),
    (lambda X, y: gpclab.predict_averaged(X, y, X[:, 0], [[0.0, 0.0, 0.0, 0.0]], kernel="ard"), ValueError,
     "predict_averaged: X_test must be 2-D"),
])
def test_python_layer_errors_name_the_function(call, exc, match):
    X, y = _binary()
    with pytest.raises(exc, match=match):
        call(X, y)


@pytest.mark.parametrize("kwargs,exc,match", [
    ({"releps": np.nan}, ValueError, "exact_log_evidence_probit: releps must be finite"),
    ({"releps": -1.0}, ValueError, "exact_log_evidence_probit: releps must be >= 0"),
    ({"abseps": np.inf}, ValueError, "exact_log_evidence_probit: abseps must be finite"),
    ({"maxpts": 0}, ValueError, "exact_log_evidence_probit: maxpts must be a positive"),
    ({"K": np.array([[1.0, 0.5], [0.0, 1.0]])}, ValueError, r"exact_log_evidence_probit: K must be symmetric, got K\[0, 1\] = 0.5"),
    ({"y": np.array([[1.0, -1.0]])}, ValueError, "exact_log_evidence_probit: y must be 1-D"),
])
def test_exact_log_evidence_probit_checks_its_arguments(kwargs, exc, match):
    args = {"K": np.eye(2), "y": np.array([1.0, -1.0])}
    args.update(kwargs)
    with pytest.raises(exc, match=match):
        gpclab.exact_log_evidence_probit(**args)


@pytest.mark.parametrize("tol", [np.nan, -1.0, np.inf])
def test_ep_evidence_checks_tol(tol):
    X, y = _binary()
    with pytest.raises(ValueError, match="ep_evidence: tol must be"):
        gpclab.ep_evidence(X, y, [0.0, 0.0], tol=tol)


# --- parameters by type, data that float64 cannot hold, raw errors named -----------

def _fit(X=None, y=None, **kwargs):
    X0, y0 = _binary()
    return gpclab.GPClassifier(**kwargs).fit(X0 if X is None else X, y0 if y is None else y)


@pytest.mark.parametrize("name", ["optimize", "shared_hyp", "learn_eps"])
@pytest.mark.parametrize("value", ["no", "False", "True", "", None, 1, 0, 1.0, [True]])
def test_classifier_flags_are_booleans_not_truthy_values(name, value):
    """optimize='no' was read as True, optimize=None as False, shared_hyp='False' as True."""
    with pytest.raises(TypeError, match=f"GPClassifier: {name} must be True or False, got "):
        _fit(**{name: value})


@pytest.mark.parametrize("hyp_prior", [("a", "b"), (np.nan, 1.0), (0.0, np.inf), (0.0, -1.0), (0.0, 0.0),
                                       (1.0,), (0.0, 1.0, 2.0), "ab", 3.0, (True, 1.0)])
def test_hyp_prior_is_two_finite_numbers(hyp_prior):
    """a NaN prior mean gave 'laplace_evidence: log_hyp must be finite', strings a raw TypeError"""
    with pytest.raises(ValueError, match=r"GPClassifier: hyp_prior must be \(mean, sd\), two finite numbers"):
        _fit(hyp_prior=hyp_prior)
    X, y = _binary()
    with pytest.raises(ValueError, match=r"ml2: hyp_prior must be \(mean, sd\)"):
        gpclab.ml2(X, y, [0.0, 0.0], hyp_prior=hyp_prior)


def _one_entry(value):
    X, _ = _binary()
    X = X.copy()
    X[3, 1] = value
    return X


@pytest.mark.parametrize("make,match", [
    (lambda X: X * 1e-150, "X column 0 spreads over .* outside 1e-50 to 1e50"),
    (lambda X: X * 1e-300, "X column 0 spreads over .* outside 1e-50 to 1e50"),
    (lambda X: X * 1e60, "X column 0 spreads over .* outside 1e-50 to 1e50"),
    (lambda X: X * 1e150, r"X holds .*e\+150 at row \d+, column \d+: entries beyond \+-1e150"),
    (lambda X: X * np.array([1.0, 1e-200]), "X column 1 spreads over"),
    (lambda X: _one_entry(1e308), r"X holds 1e\+308 at row 3, column 1"),
    (lambda X: _one_entry(-1e200), r"X holds -1e\+200 at row 3, column 1"),
])
def test_x_that_float64_cannot_fit_is_named(make, match):
    """these gave 'laplace_evidence: log_hyp ...', naming an argument the user never passed"""
    X, y = _binary()
    with pytest.raises(ValueError, match="GPClassifier.fit: " + match):
        gpclab.GPClassifier().fit(make(X), y)
    with pytest.raises(ValueError, match="ml2: " + match):
        gpclab.ml2(make(X), y, [0.0, 0.0])


def test_x_at_the_ends_of_the_allowed_spread_fits_like_unit_x():
    X, y = _binary(20)
    p = gpclab.GPClassifier(kernel="ard").fit(X, y).predict_proba(X)
    for unit in (1e-45, 1e45):
        q = gpclab.GPClassifier(kernel="ard").fit(X * unit, y).predict_proba(X * unit)
        np.testing.assert_allclose(q, p, atol=1e-6)


def test_bounds_that_fix_every_hyperparameter_evaluate_that_point():
    """bounds=[(1, 1), (0.5, 0.5)] raised AttributeError: nit inside fit"""
    X, y = _binary()
    m = gpclab.GPClassifier(bounds=[(1, 1), (0.5, 0.5)]).fit(X, y)
    np.testing.assert_array_equal(m.log_hyp_, [1.0, 0.5])
    assert m.n_iter_ == 0 and m.converged_
    ref = gpclab.GPClassifier(log_hyp=[1.0, 0.5], optimize=False).fit(X, y)
    assert m.log_marginal_likelihood_ == ref.log_marginal_likelihood_
    h, v, res = gpclab.ml2(X, y, [0.0, 0.0], bounds=[(1, 1), (0.5, 0.5)])
    assert res.nit == 0 and v == ref.log_marginal_likelihood_


@pytest.mark.parametrize("labels", [np.array([b"no", b"yes"]), np.array([b"no", b"yes"], dtype=object)])
def test_bytes_labels_are_accepted_as_scikit_learn_does(labels):
    from sklearn.gaussian_process import GaussianProcessClassifier

    X, y = _binary()
    yb = labels[(y > 0).astype(int)]
    m = gpclab.GPClassifier(optimize=False).fit(X, yb)
    ref = GaussianProcessClassifier(optimizer=None).fit(X, yb)
    assert m.classes_.tolist() == ref.classes_.tolist() == [b"no", b"yes"]
    expect = np.where(_fit(optimize=False).predict(X) > 0, b"yes", b"no")   # the same fit on labels -1/+1
    assert m.predict(X).tolist() == expect.tolist()


def test_pandas_columns_that_are_not_numbers_or_not_unique_are_named():
    pd = pytest.importorskip("pandas")
    X, y = _binary()
    dated = pd.DataFrame({"a": X[:, 0], "when": pd.date_range("2020-01-01", periods=len(y))})
    with pytest.raises(TypeError, match="GPClassifier.fit: X column 'when' holds datetime64.* not numbers"):
        gpclab.GPClassifier().fit(dated, y)
    twice = pd.DataFrame(X, columns=["a", "a"])
    with pytest.raises(ValueError, match="GPClassifier.fit: X has duplicate column names 'a'"):
        gpclab.GPClassifier().fit(twice, y)
    m = gpclab.GPClassifier(optimize=False).fit(pd.DataFrame(X, columns=["a", "b"]), y)
    with pytest.raises(ValueError, match="GPClassifier.predict_proba: X has duplicate column names"):
        m.predict_proba(twice)


@pytest.mark.parametrize("call", [
    lambda big: gpclab.laplace_mode(np.eye(2), [1.0, -1.0], "logistic", **{big: 1}),
    lambda big: gpclab.laplace_mode(np.eye(2), [1.0, -1.0], big),
    lambda big: gpclab.laplace_mode(np.eye(2), [1.0, -1.0], "logistic", max_iter=big),
    lambda big: gpclab.ais(np.eye(2), [1.0, -1.0], "probit", T=[big]),
    lambda big: gpclab.GPClassifier(optimize=big).fit(*_binary()),
    lambda big: gpclab.GPClassifier(n_samples=big).fit(*_binary()),
    lambda big: gpclab.GPClassifier(hyp_prior=(big, 1)).fit(*_binary()),
    lambda big: gpclab.GPClassifier(bounds=big).fit(*_binary()),
    lambda big: gpclab.load_ionosphere(big),
])
def test_an_error_message_stays_short_whatever_it_was_given(call):
    """a million-character argument gave a million-character message (1,000,082 characters)"""
    big = "x" * 1_000_000
    with pytest.raises((ValueError, TypeError)) as info:
        call(big)
    assert len(str(info.value)) < 3000
    assert str(info.value).split(":")[0] in ("laplace_mode", "ais", "GPClassifier", "GPClassifier.fit",
                                             "load_ionosphere")


@pytest.mark.parametrize("loader", [gpclab.load_ionosphere, gpclab.load_usps])
def test_loaders_name_a_path_with_a_null_byte(loader):
    with pytest.raises(ValueError, match=f"{loader.__name__}: path .* cannot be read.*null byte"):
        loader("usps\0.mat")


@pytest.mark.parametrize("field", ["1e400", "-1e309", "1e999999"])
def test_load_ionosphere_refuses_numbers_beyond_float64(tmp_path, field):
    """1e400 is a decimal number and loaded as inf without a word"""
    p = tmp_path / "ionosphere.data"
    p.write_text(_line(0) + "\n" + _line(1).replace("0.02", field, 1) + "\n")
    with pytest.raises(ValueError, match=f"load_ionosphere: .*line 2: values must be finite, got '{field}'"):
        gpclab.load_ionosphere(str(p))


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 0.5, 0.0, 2.0])
def test_load_usps_refuses_labels_other_than_plus_and_minus_one(tmp_path, bad):
    """NaN or inf labels loaded as wrong digits (20 of 20 wrong)"""
    from scipy.io import savemat

    r = np.random.default_rng(0)
    mats = {}
    for part, n in (("train", 4), ("test", 3)):
        L = -np.ones((10, n))
        L[r.integers(0, 10, n), np.arange(n)] = 1
        mats[f"{part}_patterns"] = r.uniform(-1, 1, (256, n))
        mats[f"{part}_labels"] = L
    mats["test_labels"][mats["test_labels"][:, 1] == -1, 1] = bad     # nine entries of column 1
    savemat(tmp_path / "usps.mat", mats)
    with pytest.raises(ValueError, match=r"load_usps: test_labels must (be 10 x n with one \+1|hold only \+1 and -1)"):
        gpclab.load_usps(str(tmp_path / "usps.mat"))


def test_ais_warns_when_its_chains_do_not_move():
    """step = 50 gave log Z from a chain with acceptance 0.0 and no word"""
    import warnings

    X, y = _binary(20)
    K = gpclab.kernel_matrix("se", X, X, [0.0, 0.0])
    with pytest.warns(RuntimeWarning, match=r"ais: HMC acceptance 0 is below 0.1: the chains hardly move"):
        out = gpclab.ais(K, y, "probit", 50, 2, 50.0)
    assert out[3] == 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert gpclab.ais(K, y, "probit", 50, 2)[3] > 0.5          # the default step: no warning


@pytest.mark.parametrize("call", [
    lambda K, y, m, ks: gpclab.laplace_predict(m.f_hat, K, y, "logistic", K[:, :2], np.array([-1.0, 1.0])),
    lambda K, y, m, ks: gpclab.ep_predict(np.zeros(len(y)), np.ones(len(y)), K, K[:, :2], np.array([1.0, -1e-3])),
    lambda K, y, m, ks: gpclab.mcmc_predict(np.zeros((3, len(y))), K, "probit", K[:, :2], np.array([1.0, -1.0])),
    lambda K, y, m, ks: gpclab.laplace_predict_multiclass(
        np.stack([K, K]), gpclab.one_hot((y > 0).astype(int), 2), np.zeros((2, len(y))),
        np.stack([K[:, :2], K[:, :2]]), np.array([[1.0, 1.0], [1.0, -0.5]])),
    lambda K, y, m, ks: gpclab.ep_predict_multiclass(
        np.zeros(len(y)), np.ones(len(y)), K, gpclab.one_hot((y > 0).astype(int), 2), K[:, :2],
        np.array([-2.0, 1.0])),
])
def test_a_negative_prior_variance_at_a_test_point_is_refused(call):
    X, y = _binary()
    K = gpclab.kernel_matrix("se", X, X, [0.0, 0.0])
    m = gpclab.laplace_mode(K, y, "logistic")
    with pytest.raises(ValueError, match=r"k_star_star must contain only values >= 0, got -"):
        call(K, y, m, None)
