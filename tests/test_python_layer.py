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
