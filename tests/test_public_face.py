"""The public face: bad input is refused with a message naming the argument, what a numpy user
passes (lists, ints, float32, Fortran order, slices) gives the float64 answer, nothing is modified.

The bad inputs are generated from each function's declared spec (section 0 of gpclab.py) and a
valid call of the function; a hand-written table adds the cases of real misuse.
"""
import math
import re

import numpy as np
import pytest

import gpclab

KERNELS = ("se", "ard", "kg", "kg_iso")


def _problem():
    r = np.random.default_rng(3)
    n, d, m = 6, 2, 3
    X = r.standard_normal((n, d))
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    h = np.array([0.2, 0.1])
    K = gpclab.kernel_matrix("se", X, X, h) + 1e-6 * np.eye(n)
    Xs = r.standard_normal((m, d))
    Ks = gpclab.kernel_matrix("se", X, Xs, h)
    kss = gpclab.kernel_diag("se", Xs, h)
    mode = gpclab.laplace_mode(K, y, "logistic")
    res = gpclab.ep(K, y)
    idx = np.array([0, 1, 2, 0, 1, 2])
    Y = gpclab.one_hot(idx, 3)
    K3 = np.stack([K, 1.5 * K, K])
    mm = gpclab.laplace_mode_multiclass(K3, Y)
    em = gpclab.ep_multiclass(K, Y)
    L = np.linalg.cholesky(K)
    h3 = np.stack([h, h, h])
    return dict(X=X, y=y, h=h, K=K, Xs=Xs, Ks=Ks, kss=kss, mode=mode, res=res, Y=Y, K3=K3, mm=mm,
                em=em, L=L, h3=h3, idx=idx, n=n, m=m)


P = _problem()


def _valid():
    """One valid call (keyword arguments) of every public function with a spec."""
    X, y, h, K, Ks, kss, L = P["X"], P["y"], P["h"], P["K"], P["Ks"], P["kss"], P["L"]
    mode, res, Y, K3, mm, em = P["mode"], P["res"], P["Y"], P["K3"], P["mm"], P["em"]
    Ks3 = np.stack([Ks] * 3)
    kss3 = np.stack([kss] * 3)
    N = em.mu.shape[0]
    return {
        "log_phi": dict(z=-3.0),
        "n_over_phi": dict(z=-3.0),
        "n_over_phi_and_sum": dict(z=-3.0),
        "std_normal_cdf": dict(z=0.5),
        "sigmoid": dict(z=0.5),
        "half_log_det": dict(L=L),
        "solve_lower": dict(L=L, b=y),
        "solve_lower_transpose": dict(L=L, b=y),
        "solve_lower_matrix": dict(L=L, B=Ks),
        "syrk_lower": dict(C=K.copy(), A=Ks.T.copy(), alpha=-1.0),
        "minus_gram": dict(K=K, V=Ks.T.copy()),
        "cholesky_inverse": dict(L=L),
        "logistic_gaussian_integral": dict(mu=0.3, var=2.0),
        "n_hyp": dict(kernel="ard", d=3),
        "kernel_matrix": dict(kernel="se", X1=X, X2=P["Xs"], log_hyp=h, discrete=np.array([0.0, 1.0])),
        "kernel_diag": dict(kernel="se", X=P["Xs"], log_hyp=h),
        "kernel_grad": dict(kernel="se", X=X, log_hyp=h, K=K, j=0, discrete=None),
        "logistic": dict(y=y, f=mode.f_hat),
        "probit": dict(y=y, f=mode.f_hat),
        "log_likelihood": dict(likelihood="probit", y=y, f=mode.f_hat),
        "averaged_probability": dict(likelihood="logistic", f_bar_star=kss - 1, V_f_star=kss, rule="average"),
        "laplace_mode": dict(K=K, y=y, likelihood="logistic", a_init=mode.a, tol=1e-10, max_iter=50),
        "laplace_predict": dict(f_hat=mode.f_hat, K=K, y=y, likelihood="logistic", K_star=Ks,
                                k_star_star=kss, rule="average", L=mode.L),
        "laplace_log_q_grad": dict(K=K, X=X, kernel="se", log_hyp=h, y=y, likelihood="logistic",
                                   f_hat=mode.f_hat, a=mode.a, L=mode.L, discrete=None),
        "softmax": dict(f=mm.f_hat),
        "laplace_mode_multiclass": dict(K=K3, y=Y, a_init=mm.a, tol=1e-10, max_iter=50),
        "laplace_predict_multiclass": dict(K=K3, y=Y, f_hat=mm.f_hat, K_star=Ks3, k_star_star=kss3,
                                           S=50, seed=1, E=mm.E, M=mm.M,
                                           G=gpclab.multiclass_G(mm.E, mm.M)),
        "multiclass_G": dict(E=mm.E, M=mm.M),
        "laplace_log_q_grad_multiclass": dict(K=K3, X=X, kernel="se", log_hyp=P["h3"], y=Y,
                                              f_hat=mm.f_hat, a=mm.a, E=mm.E, M=mm.M, discrete=None),
        "probit_moments": dict(y_i=1.0, mu_cav=0.3, sigma2_cav=2.0),
        "ep": dict(K=K, y=y, nu_tilde_init=res.nu_tilde, tau_tilde_init=res.tau_tilde, tol=1e-9,
                   max_sweeps=20, order="random", seed=2, likelihood="probit", eps=0.0),
        "ep_predict": dict(nu_tilde=res.nu_tilde, tau_tilde=res.tau_tilde, K=K, K_star=Ks,
                           k_star_star=kss, L=res.L, likelihood="probit", eps=0.0),
        "ep_log_Z_grad": dict(K=K, X=X, kernel="se", log_hyp=h, nu_tilde=res.nu_tilde,
                              tau_tilde=res.tau_tilde, L=res.L, discrete=None),
        "hmc_transition": dict(L=L, y=y, likelihood="probit", tau=0.5, g=np.zeros(6), step=0.2,
                               n_leapfrog=3),
        "hmc_latent": dict(K=K, y=y, likelihood="probit", n_samples=5, step=0.2, n_leapfrog=3, seed=1,
                           burn_in=2, thin=1, tau=1.0),
        "elliptical_slice_latent": dict(K=K, y=y, likelihood="probit", n_samples=5, seed=1, burn_in=2, thin=1),
        "ais": dict(K=K, y=y, likelihood="probit", T=40, R=2, step=0.2, n_leapfrog=3, seed=1,
                    schedule=np.linspace(0, 1, 41)),
        "mcmc_predict": dict(F=np.tile(mode.f_hat, (3, 1)), K=K, likelihood="probit", K_star=Ks,
                             k_star_star=kss),
        "truncated_gaussian_gibbs": dict(C=K, n_samples=5, seed=1, x0=np.ones(6), thin=2),
        "truncated_gaussian_mh": dict(C=K, n_samples=5, step=0.1, seed=1, x0=np.ones(6), thin=2),
        "em_ep_bound": dict(K=K, y=y, eps=0.1, mu=res.mu, Sigma=res.Sigma),
        "em_ep_eps": dict(y=y, mu=res.mu, Sigma=res.Sigma),
        "em_ep_grad": dict(K=K, X=X, kernel="se", log_hyp=h, mu=res.mu, Sigma=res.Sigma, discrete=None),
        "difference_index": dict(y=Y),
        "difference_covariance": dict(C=K, y=Y),
        "ep_multiclass": dict(C=K, y=Y, nu_tilde_init=em.nu_tilde, tau_tilde_init=em.tau_tilde,
                              tol=1e-9, max_sweeps=20),
        "em_ep_grad_multiclass": dict(C=K, y=Y, X=X, kernel="se", log_hyp=h, mu=em.mu, Sigma=em.Sigma,
                                      discrete=None),
        "orthant_probability": dict(mean=np.array([0.1, 0.2, -0.1]), cov=K[:3, :3], n_points=100,
                                    n_shifts=2, seed=1, abseps=1e-4),
        "ep_predict_multiclass": dict(nu_tilde=em.nu_tilde, tau_tilde=em.tau_tilde, C=K, y=Y,
                                      K_star=Ks, k_star_star=kss, L=em.L, n_points=100, seed=1, abseps=1e-4),
        # the Python layer
        "ml2": dict(X=X, y=y, log_hyp0=h, kernel="se", likelihood="logistic", bounds=[(-3, 3), (-3, 3)],
                    max_iter=3, method="laplace", hyp_prior=None, discrete=None, eps=0.0),
        "em_ep": dict(X=X, y=y, log_hyp0=None, kernel="kg_iso", eps0=0.0, learn_eps=False, max_iter=2,
                      tol=1e-4, bounds=None, m_step_iter=2, discrete=None, accelerate=True, classic_rounds=1),
        "evidence_grid": dict(X=X, y=y, log_ell=[0.0], log_sf=[0.0], kernel="se", likelihood="logistic",
                              method="laplace", n_samples=10, seed=0, progress=False),
        "mcmc_posterior": dict(X=X, y=y, log_hyp=h, kernel="se", likelihood="probit", n_samples=5,
                               step=0.1, n_leapfrog=2, burn_in=1, thin=1, seed=0, sampler="hmc"),
        "hmc_step_size": dict(K=K, likelihood="probit"),
        "ais_grid": dict(X=X, y=y, log_ell=[0.0], log_sf=[0.0], likelihood="probit", T=20, R=2,
                         step=0.2, n_leapfrog=2, seed=0, progress=False),
        "hmc_hyperparameters": dict(X=X, y=y, kernel="se", likelihood="logistic", n_iter=2,
                                    n_leapfrog=2, step=0.05, seed=0, progress=False),
        "predict_averaged": dict(X=X, y=y, X_test=P["Xs"], samples=h[None], kernel="se",
                                 likelihood="logistic"),
        "lower_bound": dict(K=K, y=y, likelihood="probit", m=res.mu, A=res.Sigma),
        "laplace_evidence": dict(X=X, y=y, log_hyp=h, kernel="se", likelihood="logistic", a_init=None,
                                 eval_gradient=True, discrete=None),
        "multiclass_evidence": dict(X=X, Y=Y, log_hyp=P["h3"], kernel="se", a_init=None,
                                    eval_gradient=True, discrete=None),
        "ep_evidence": dict(X=X, y=y, log_hyp=h, kernel="se", sites=None, eval_gradient=True,
                            discrete=None, likelihood="probit", eps=0.0, tol=1e-9),
        "multiclass_ep_evidence": dict(X=X, Y=Y, log_hyp=np.log([1.0, 1e-4, 1e-3, 0.5]), kernel="kg_iso",
                                       sites=None, eval_gradient=True, discrete=None),
    }


VALID = _valid()
PUBLIC = sorted(name for name in dir(gpclab)
                if isinstance(getattr(gpclab, name), gpclab.PublicFunction))


def test_every_public_numba_function_has_the_checked_face():
    """No public njit function is left raw, and each checks every one of its arguments."""
    from numba.core.registry import CPUDispatcher
    raw = [n for n in dir(gpclab) if not n.startswith("_") and isinstance(getattr(gpclab, n), CPUDispatcher)]
    assert raw == ["check_interrupt"]
    for name in PUBLIC:
        f = getattr(gpclab, name)
        if not isinstance(f.dispatcher, CPUDispatcher):
            continue
        missing = set(f.signature.parameters) - set(f.spec_text)
        assert not missing, (name, missing)


def test_every_checked_function_has_a_valid_call():
    assert sorted(VALID) == PUBLIC


# ----------------------------------------------------------------------------------------------
# bad inputs generated from the specs

def _bad_values(name, spec, value, earlier):
    """(bad value, expected exception, what) for one argument with this spec."""
    words = spec.replace(", ", ",").split()
    optional = "?" in words or "?0" in words or "?e" in words
    words = [w for w in words if w not in ("?", "?0", "?e")]
    out = []
    if words[0].startswith("("):
        if value is None:                  # an optional argument left out of the valid call
            return [("abc", TypeError, "a string")]
        dims = [s for s in words[0].strip("()").split(",") if s]
        a = np.array(value, dtype=float)
        if "inplace" in words:
            return [(a.tolist(), TypeError, "a list for an in-place argument")]
        if not optional:
            out.append((None, TypeError, "None"))
        out.append(("abc", TypeError, "a string"))
        out.append(((a, 1.0), (TypeError, ValueError), "a tuple of an array and a number"))
        for bad in (np.nan, np.inf):
            b = a.copy()
            b.flat[0] = bad
            out.append((b, ValueError, f"{bad} in it"))
        out.append((a[..., None], ValueError, "one dimension too many"))
        out.append((a.reshape(-1)[0] if a.ndim == 1 else a[0], ValueError, "one dimension too few"))
        for axis, sym in enumerate(dims):
            if sym in earlier or sym in dims[:axis] or not (sym.isidentifier() or sym == "*"):
                out.append((np.delete(a, -1, axis=axis), ValueError, f"wrong length along {sym}"))
                break
        if "psd" in words or "sym" in words:
            b = a.copy()
            b[..., 0, -1] += 0.5
            out.append((b, ValueError, "not symmetric"))
        if "psd" in words:
            n = a.shape[-1]
            out.append((a - (2 * np.abs(a).max() + 1) * np.eye(n), ValueError, "not positive semidefinite"))
        if "pm1" in words:
            b = a.copy()
            b.flat[0] = 0.0
            out.append((b, ValueError, "a 0 label"))
        if "onehot" in words:
            b = a.copy()
            b[:, 0] = 1.0
            out.append((b, ValueError, "a column with several ones"))
        if "nonneg" in words:
            b = a.copy()
            b.flat[0] = -1.0
            out.append((b, ValueError, "a negative entry"))
        if "chol" in words:
            b = a.copy()
            b[..., 0, 0] = 0.0
            out.append((b, ValueError, "a zero pivot"))
        if "flags" in words:
            out.append((np.full(a.shape, 2.0), ValueError, "flags of 2"))
        if "loghyp" in words:
            out.append((np.concatenate([a, np.zeros(a.shape[:-1] + (1,))], axis=-1), ValueError,
                        "one hyperparameter too many"))
            out.append((np.full(a.shape, 400.0), ValueError, "log-hyperparameters of 400"))
        return out
    (w,) = words
    if w.startswith("{"):
        return [(value + "x", ValueError, "a misspelled name"), (3, TypeError, "a number for a name")]
    bad = {
        "count": [(0, ValueError), (-1, ValueError), (2.5, TypeError), ("3", TypeError), ((1, 2), TypeError)],
        "count0": [(-1, ValueError), (1.5, TypeError), (None, TypeError)],
        "seed": [(-1, ValueError), (0.5, TypeError)],
        "real": [("x", TypeError), (np.nan, ValueError), (np.inf, ValueError), ((0.1, 2), TypeError)],
        "number": [("x", TypeError), (np.nan, ValueError), (np.ones(2), TypeError)],
        "positive": [(0.0, ValueError), (-1.0, ValueError), ((0.1, 3), TypeError)],
        "nonneg": [(-1.0, ValueError), (np.nan, ValueError)],
        "unit": [(1.5, ValueError), (-0.1, ValueError)],
        "eps": [(0.5, ValueError), (0.7, ValueError), (-0.1, ValueError)],
        "pm1": [(0.0, ValueError), ("1", TypeError)],
        "bool": [("yes", TypeError)],
        "X": [(np.ones(6), ValueError), (np.full((6, 2), np.nan), ValueError)],
        "targets": [(np.zeros(6), ValueError)],
        "loghyp_any": [(np.array([np.nan, 0.0]), ValueError)],
        "grid": [([], ValueError), ([0.0, np.inf], ValueError), ("a", TypeError)],
    }[w]
    return [(v, e, f"{v!r}") for v, e in bad]


def _cases():
    cases = []
    for fname in PUBLIC:
        f = getattr(gpclab, fname)
        valid = VALID[fname]
        earlier = set()
        for arg, spec in f.spec_text.items():
            for bad, exc, what in _bad_values(arg, spec, valid[arg], earlier):
                cases.append(pytest.param(fname, arg, bad, exc, id=f"{fname}-{arg}-{what}"))
            head = spec.split(")")[0]
            if head.startswith("("):
                earlier |= {s.strip() for s in head.strip("(").split(",")}
    return cases


CASES = _cases()


@pytest.mark.parametrize("fname, arg, bad, exc", CASES)
def test_bad_input_is_refused_naming_the_argument(fname, arg, bad, exc):
    kwargs = dict(VALID[fname])
    kwargs[arg] = bad
    with pytest.raises(exc) as info:
        getattr(gpclab, fname)(**kwargs)
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(arg)}\b", msg), msg
    assert fname in msg, msg


def test_the_table_is_large():
    assert len(CASES) > 500


# ----------------------------------------------------------------------------------------------
# the cases of real misuse, by hand

def _hand_cases():
    X, y, K, h = P["X"], P["y"], P["K"], P["h"]
    step = gpclab.hmc_step_size(K, "probit")
    return [
        (lambda: gpclab.laplace_mode(K - 1.5 * np.eye(6), y, "logistic"), ValueError, "K", "positive semidefinite"),
        (lambda: gpclab.ep(K - 1.5 * np.eye(6), y), ValueError, "K", "positive semidefinite"),
        (lambda: gpclab.laplace_mode(np.triu(K), y, "logistic"), ValueError, "K", "symmetric"),
        (lambda: gpclab.ais(K, y, "probit", 10, 2, step), TypeError, "step", "unpack"),
        (lambda: gpclab.ais(K, y, "Probit", R=1), ValueError, "likelihood", "did you mean 'probit'"),
        (lambda: gpclab.ais(K, y, "probit", R=0), ValueError, "R", ">= 1"),
        (lambda: gpclab.ep(K, y, likelihood="step", eps=0.7), ValueError, "eps", "0.5"),
        (lambda: gpclab.ep_predict(P["res"].nu_tilde, P["res"].tau_tilde, K, P["Ks"], P["kss"],
                                   L=np.eye(3)), ValueError, "L", "shape"),
        (lambda: gpclab.kernel_matrix("se", X, X, [-400.0, 0.0]), ValueError, "log_hyp", "overflow"),
        (lambda: gpclab.ml2(X, y, [np.nan, 0.0]), ValueError, "log_hyp0", "finite"),
        (lambda: gpclab.ml2(np.where(X > 1, np.nan, X), y, h), ValueError, "X", "finite"),
        (lambda: gpclab.ml2(X, y, h, bounds=[(-1, 1)]), ValueError, "bounds", "shape"),
        (lambda: gpclab.ml2(X, y, h, bounds=[(1, -1), (0, 1)]), ValueError, "bounds", "low <= high"),
        (lambda: gpclab.GPClassifier(log_hyp=[-400.0, 0.0], optimize=False).fit(X, y), ValueError,
         "log_hyp", "overflow"),
        (lambda: gpclab.GPClassifier(max_iter=0).fit(X, y), ValueError, "max_iter", ">= 1"),
        (lambda: gpclab.GPClassifier(bounds=[(-1, 1)]).fit(X, y), ValueError, "bounds", "shape"),
        (lambda: gpclab.em_ep(X, y, bounds=[(-1, 1)]), ValueError, "bounds", "log-hyperparameter"),
        (lambda: gpclab.ais_grid(X, y, [0.0], [0.0], step=(0.1, 3)), TypeError, "step", "unpack"),
        (lambda: gpclab.ais_grid(X, y, [np.nan], [0.0]), ValueError, "log_ell", "finite"),
        (lambda: gpclab.laplace_mode(K.tolist(), [1, -1, 1, 1, -1, 0], "logistic"), ValueError, "y", "-1 and +1"),
        (lambda: gpclab.laplace_mode(K, y[:, None], "logistic"), ValueError, "y", "1-D"),
    ]


@pytest.mark.parametrize("k", range(len(_hand_cases())))
def test_real_misuse_is_refused(k):
    call, exc, arg, words = _hand_cases()[k]
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    assert re.search(rf"\b{re.escape(arg)}\b", msg) and words in msg, msg


# ----------------------------------------------------------------------------------------------
# what numpy users pass: the same answer as float64 C arrays, and nothing modified

def _flatten(out):
    if isinstance(out, tuple):
        return [x for o in out for x in _flatten(o)]
    return [np.asarray(out)]


def _same(a, b):
    fa, fb = _flatten(a), _flatten(b)
    assert len(fa) == len(fb)
    for u, v in zip(fa, fb):
        np.testing.assert_array_equal(u, v)


# syrk_lower updates in place; hmc_transition draws from numba's global random state (no seed)
NUMBA_PUBLIC = [n for n in PUBLIC if hasattr(getattr(gpclab, n).dispatcher, "py_func")
                and n not in ("syrk_lower", "hmc_transition")]


def _variants(a):
    """The same numbers as a list, in Fortran order, as a strided slice, and (if exact) as ints."""
    out = {"list": a.tolist(), "fortran": np.asfortranarray(a)}
    big = np.zeros(a.shape + (2,))
    big[..., 0] = a
    out["slice"] = big[..., 0]
    if np.all(a == np.round(a)):
        out["int"] = a.astype(np.int64)
    return out


@pytest.mark.parametrize("fname", NUMBA_PUBLIC)
def test_lists_fortran_slices_and_ints_give_the_same_answer(fname):
    f = getattr(gpclab, fname)
    kwargs = VALID[fname]
    ref = f(**kwargs)
    for arg, v in kwargs.items():
        if not isinstance(v, np.ndarray):
            continue
        for kind, w in _variants(v).items():
            _same(f(**dict(kwargs, **{arg: w})), ref)


@pytest.mark.parametrize("fname", ["laplace_predict", "ep_predict", "ep_predict_multiclass"])
def test_a_factor_left_out_gives_the_same_answer_with_the_same_compiled_code(fname):
    """A Cholesky factor L left out (spec "?e") arrives as an empty array and the body factorises
    B itself: the answer is the one with L given (to rounding), from the same compiled code,
    through the checked call and through unchecked; so the warm-up, which passes L as
    GPClassifier does, also warms a notebook's call without it."""
    f = getattr(gpclab, fname)
    given = f(**VALID[fname])
    kwargs = {k: v for k, v in VALID[fname].items() if k != "L"}
    for left_out in (f(**kwargs), f.unchecked(**kwargs)):
        for u, v in zip(_flatten(left_out), _flatten(given)):
            np.testing.assert_allclose(u, v, rtol=1e-12, atol=1e-14)
    if hasattr(f.dispatcher, "signatures"):
        assert len(f.dispatcher.signatures) == 1, f.dispatcher.signatures


def test_unchecked_calls_with_read_only_arrays_use_the_compiled_code_of_writable_ones():
    """A model loaded memory-mapped (joblib's mmap_mode, scikit-learn's readonly_memmap check) holds
    read-only arrays, which numba would compile for apart: unchecked copies them, as the checked call
    does, so the prediction reuses the warmed code."""
    kwargs = dict(VALID["ep_predict"])
    ref = gpclab.ep_predict.unchecked(**kwargs)
    before = list(gpclab.ep_predict.dispatcher.signatures)
    frozen = {}
    for k, v in kwargs.items():
        if isinstance(v, np.ndarray):
            v = v.copy()
            v.setflags(write=False)
        frozen[k] = v
    _same(gpclab.ep_predict.unchecked(**frozen), ref)
    assert list(gpclab.ep_predict.dispatcher.signatures) == before


@pytest.mark.parametrize("fname", ["laplace_mode", "ep", "laplace_predict", "kernel_matrix", "ais"])
def test_float32_gives_the_answer_of_its_float64_values(fname):
    f = getattr(gpclab, fname)
    kwargs = VALID[fname]
    arrays = {k: v for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    as32 = {k: v.astype(np.float32) for k, v in arrays.items()}
    ref = f(**dict(kwargs, **{k: v.astype(np.float64) for k, v in as32.items()}))
    _same(f(**dict(kwargs, **as32)), ref)


@pytest.mark.parametrize("fname", PUBLIC)
def test_no_input_is_modified(fname):
    if fname == "syrk_lower":        # updates C in place by design (its docstring says so)
        return
    kwargs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in VALID[fname].items()}
    before = {k: v.copy() for k, v in kwargs.items() if isinstance(v, np.ndarray)}
    getattr(gpclab, fname)(**kwargs)
    for k, v in before.items():
        np.testing.assert_array_equal(kwargs[k], v)


def test_results_are_namedtuples_and_steppable():
    """Attribute access on the results; py_func runs the plain Python body (plain tuple)."""
    K, y = P["K"], P["y"]
    r = gpclab.laplace_mode(K, y, "logistic")
    # the plain body takes the warm start the face fills in (zeros: start at f = 0)
    raw = gpclab.laplace_mode.py_func(K, y, "logistic", np.zeros(len(y)))
    assert isinstance(r, gpclab.LaplaceMode) and type(raw) is tuple
    np.testing.assert_allclose(raw[1], r.log_q, rtol=1e-12)
    assert isinstance(gpclab.ep(K, y), gpclab.EPResult)
    assert isinstance(gpclab.ep_multiclass(K, P["Y"]), gpclab.EPResult)
    assert isinstance(gpclab.laplace_mode_multiclass(P["K3"], P["Y"]), gpclab.MultiLaplaceMode)
    # numba code (ep_multiclass, with its own sweeps) reaches binary EP's fixed point on the
    # difference covariance, through the njit bodies of the public functions
    Kg = gpclab.difference_covariance(K, P["Y"])
    direct = gpclab.ep(Kg, np.ones(Kg.shape[0]), likelihood="step")
    assert gpclab.ep_multiclass(K, P["Y"]).log_Z == pytest.approx(direct.log_Z, rel=1e-12, abs=0)
    # help() shows the function, and executors can pickle it (by name)
    import pickle
    import pydoc
    assert "Mode-finding for binary Laplace GPC" in pydoc.render_doc(gpclab.laplace_mode)
    assert pickle.loads(pickle.dumps(gpclab.ep)) is gpclab.ep


def test_classifier_owns_its_training_data():
    X, y = gpclab.make_three_gaussians(seed=1)
    model = gpclab.GPClassifier(optimize=False, log_hyp=[0.5, 1.0]).fit(X, y)
    p = model.predict_proba([[-6.0]])
    X *= 100.0
    np.testing.assert_array_equal(model.predict_proba([[-6.0]]), p)


def test_disable_jit_runs_the_same_code(tmp_path):
    """NUMBA_DISABLE_JIT=1 (to step through in a debugger) gives the compiled answers."""
    import os
    import subprocess
    import sys
    code = ("import numpy as np, gpclab\n"
            "X, y = gpclab.make_three_gaussians(seed=0)\nX, y = X[::3], y[::3]\n"
            "K = gpclab.kernel_matrix('se', X, X, [0.5, 1.0])\n"
            "print(repr(float(gpclab.laplace_mode(K, y, 'logistic').log_q)), repr(float(gpclab.ep(K, y).log_Z)))\n")
    env = dict(os.environ, NUMBA_DISABLE_JIT="1")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=600, check=True).stdout.split()
    X, y = gpclab.make_three_gaussians(seed=0)
    X, y = X[::3], y[::3]
    K = gpclab.kernel_matrix("se", X, X, [0.5, 1.0])
    assert math.isclose(float(out[0]), gpclab.laplace_mode(K, y, "logistic").log_q, rel_tol=1e-10)
    assert math.isclose(float(out[1]), gpclab.ep(K, y).log_Z, rel_tol=1e-8)


# ----------------------------------------------------------------------------------------------
# data loaders

def _ionosphere_line(k, label="g", sep=","):
    return sep.join(f"{0.01 * (k + j):.2f}" for j in range(34)) + sep + label


def test_load_ionosphere_accepts_harmless_variants(tmp_path):
    p = tmp_path / "ionosphere.data"
    text = ("a1,a2,...,class\r\n" + _ionosphere_line(0) + "\r\n\r\n"
            + _ionosphere_line(1, " b", sep=", ") + "  \r\n" + _ionosphere_line(2, "g ") + "\r\n")
    p.write_bytes(text.encode())
    X, y = gpclab.load_ionosphere(str(p))
    assert X.shape == (3, 34) and y.tolist() == ["g", "b", "g"]
    np.testing.assert_allclose(X[1, :3], [0.01, 0.02, 0.03])


@pytest.mark.parametrize("content, words", [
    (b"", "no data lines"),
    (b"MATLAB 5.0 MAT-file" + bytes(200), "binary"),
    ("\u00e9t\u00e9".encode("latin-1") + b",1\n", "not a text file"),
    ((_ionosphere_line(0) + "\n" + _ionosphere_line(1)[:40] + "\n").encode(), "line 2"),
    ((_ionosphere_line(0) + "\n" + _ionosphere_line(1).replace("0.01", "nan") + "\n").encode(), "finite"),
    ((_ionosphere_line(0, "x") + "\n").encode(), "label g or b"),
])
def test_load_ionosphere_refuses_wrong_files(tmp_path, content, words):
    p = tmp_path / "ionosphere.data"
    p.write_bytes(content)
    with pytest.raises(ValueError, match=words):
        gpclab.load_ionosphere(str(p))


def _usps_file(path, n=6):
    from scipy.io import savemat
    r = np.random.default_rng(0)
    digits = np.arange(n) % 10
    Y = -np.ones((10, n))
    Y[digits, np.arange(n)] = 1.0
    savemat(path, {"train_patterns": r.uniform(-1, 1, (256, n)), "train_labels": Y,
                   "test_patterns": r.uniform(-1, 1, (256, n)), "test_labels": Y})


def test_load_usps_keeps_digits_given_as_ints(tmp_path):
    p = str(tmp_path / "usps.mat")
    _usps_file(p, n=12)
    a = gpclab.load_usps(p, digits=(3, 5))
    b = gpclab.load_usps(p, digits=np.array([5, 3]))
    assert sorted(set(a[1].tolist())) == [3, 5] and a[0].shape == (2, 256)
    for u, v in zip(a, b):
        np.testing.assert_array_equal(u, v)
    for bad in (("three",), ("3", "5"), (3.0, 5.0), (True,), (10,), ()):
        with pytest.raises(ValueError, match="load_usps: digits must"):
            gpclab.load_usps(p, digits=bad)


@pytest.mark.parametrize("content", [b"", bytes(100), b"MATLAB 5.0 MAT-file, truncated"])
def test_load_usps_refuses_empty_and_truncated_files(tmp_path, content):
    p = tmp_path / "usps.mat"
    p.write_bytes(content)
    with pytest.raises(ValueError, match="load_usps: path"):
        gpclab.load_usps(str(p))


def test_load_usps_refuses_a_mat_file_of_another_shape(tmp_path):
    from scipy.io import savemat
    p = str(tmp_path / "other.mat")
    savemat(p, {"train_patterns": np.zeros((10, 3)), "train_labels": np.zeros((10, 3)),
                "test_patterns": np.zeros((10, 3)), "test_labels": np.zeros((10, 3))})
    with pytest.raises(ValueError, match="256 x n"):
        gpclab.load_usps(p)


def test_zero_one_labels_get_a_conversion_hint():
    K = np.eye(3)
    with pytest.raises(ValueError, match=r"ep: y must contain only -1 and \+1, got 0 at index 0 \(labels 0/1: use 2 \* y - 1"):
        gpclab.ep(K, [0, 1, 1])
    with pytest.raises(ValueError, match=r"got 2 at index 1$"):        # not 0/1 labels: no hint
        gpclab.ep(K, [1, 2, -1])



def test_large_indefinite_K_is_named_when_the_algorithm_factorisation_fails():
    """Above _PSD_PROOF_N the door checks symmetry, the diagonal and the 2 x 2 minors only (O(n^2));
    a K that passes them but is indefinite is named when the algorithm's own Cholesky fails."""
    n = gpclab._PSD_PROOF_N + 20
    r = np.random.default_rng(3)
    Q, _ = np.linalg.qr(r.standard_normal((n, n)))
    lam = np.linspace(1.0, 2.0, n)
    lam[0] = -0.5                                             # one negative eigenvalue
    K = 100 * (Q * lam) @ Q.T
    K = (K + K.T) / 2
    d = np.sqrt(np.diag(K))
    assert np.all(np.abs(K) <= np.outer(d, d) * (1 + 1e-12))  # the 2 x 2 minors do not show it
    y = np.where(r.standard_normal(n) > 0, 1.0, -1.0)
    with pytest.raises(ValueError, match=r"laplace_mode: K must be positive semidefinite .*smallest "
                                         r"eigenvalue is -50"):
        gpclab.laplace_mode(K, y, "logistic")
    # a matrix of the same kind at the size the door proves is refused before the body runs
    m = gpclab._PSD_PROOF_N
    Qm, _ = np.linalg.qr(r.standard_normal((m, m)))
    Km = 100 * (Qm * lam[:m]) @ Qm.T
    Km = (Km + Km.T) / 2
    with pytest.raises(ValueError, match="K must be positive semidefinite .*smallest eigenvalue is -50"):
        gpclab.laplace_mode(Km, y[:m], "logistic", max_iter=0)


def test_read_only_arrays_use_the_same_compiled_code():
    """pandas 3 and np.broadcast_to hand out read-only arrays; numba would compile a second version
    of each function for them. The face copies them, so the one compilation serves both."""
    X, y = np.random.default_rng(0).standard_normal((20, 2)), np.repeat([1.0, -1.0], 10)
    K = gpclab.kernel_matrix("se", X, X, np.zeros(2))
    expected = gpclab.laplace_mode(K, y, "logistic")
    before = len(gpclab.laplace_mode.signatures)
    K_ro, y_ro = K.copy(), y.copy()
    K_ro.flags.writeable = False
    y_ro.flags.writeable = False
    got = gpclab.laplace_mode(K_ro, y_ro, "logistic")
    assert len(gpclab.laplace_mode.signatures) == before
    assert np.array_equal(got.f_hat, expected.f_hat) and got.log_q == expected.log_q


@pytest.mark.parametrize("value", [2 ** 63, -2 ** 63 - 1, 2 ** 64, float(2 ** 70)])
def test_integers_beyond_64_bits_are_refused(value):
    X, y = np.random.default_rng(0).standard_normal((6, 2)), np.repeat([1.0, -1.0], 3)
    K = gpclab.kernel_matrix("se", X, X, np.zeros(2))
    with pytest.raises(ValueError, match="laplace_mode: max_iter must be an integer that fits in 64 bits"):
        gpclab.laplace_mode(K, y, "logistic", max_iter=value)


@pytest.mark.parametrize("call, name", [
    (lambda K, y: gpclab.hmc_latent(K, y, "probit", 10 ** 9), "hmc_latent: n_samples = 1000000000"),
    (lambda K, y: gpclab.elliptical_slice_latent(K, y, "probit", 10 ** 9), "elliptical_slice_latent: n_samples"),
    (lambda K, y: gpclab.ais(K, y, "probit", T=10 ** 11), "ais: T = 100000000000"),
    (lambda K, y: gpclab.truncated_gaussian_gibbs(K, 10 ** 9), "truncated_gaussian_gibbs: n_samples"),
])
def test_counts_that_cannot_fit_in_memory_are_refused_at_once(call, name):
    """A count whose arrays would not fit in the machine's memory is refused before the body runs,
    with the memory it would need (not a MemoryError from inside numba, nor hours of swapping)."""
    X = np.random.default_rng(0).standard_normal((60, 2))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    K = gpclab.kernel_matrix("se", X, X, np.zeros(2))
    need = None
    with pytest.raises(ValueError, match=name) as info:
        call(K, y)
    need = float(str(info.value).split("would need ")[1].split(" GiB")[0].replace(",", ""))
    assert need * 2 ** 30 > gpclab._memory_bytes()


# --- one message for a failed factorisation, whoever called the body -------------------------

def _rank_deficient_problem():
    """K = [[1, 1, 0], [1, 1, 0], [0, 0, 1]] (psd, eigenvalues 0, 1, 2 exactly): with site
    precisions of 1e17 the 2 x 2 block of B = I + S~^1/2 K S~^1/2 rounds to a singular one."""
    X = np.array([[0.0], [0.0], [50.0]])
    K = gpclab.kernel_matrix("se", X, X, [0.0, 0.0])
    assert np.array_equal(np.linalg.eigvalsh(K), [0.0, 1.0, 2.0])
    return X, np.array([1.0, 1.0, -1.0]), K, (np.zeros(3), np.full(3, 1e17))


_EP_SITES = (r"B = I \+ S~\^1/2 K S~\^1/2 of ep \(GPML Algorithm 3.5\) has no Cholesky factor, although K "
             r"is positive semidefinite: EP's site precisions tau~ are so large")


def test_ep_whose_B_fails_with_a_good_K_says_so_instead_of_blaming_K():
    X, y, K, (nu, tau) = _rank_deficient_problem()
    with pytest.raises(ValueError, match="^ep: " + _EP_SITES):
        gpclab.ep(K, y, nu, tau, max_sweeps=1)
    with pytest.raises(ValueError, match="^ep_evidence: " + _EP_SITES):
        gpclab.ep_evidence(X, y, [0.0, 0.0], sites=(nu, tau), eval_gradient=False)


def _huge_signal_variance():
    """At log sf = 20, K of 40 inputs has eigenvalues down to about -500 in floating point."""
    X = np.linspace(-3, 3, 40)[:, None]
    K = gpclab.kernel_matrix("se", X, X, [0.0, 20.0])
    assert np.linalg.eigvalsh(K)[0] < -1.0
    return X, np.where(X[:, 0] > 0, 1.0, -1.0)


_FLOATING = (r"has no Cholesky factor: K is not positive semidefinite in floating point \(eigenvalues "
             r"from -\d.* to .*: rounding errors of K exceed its smallest eigenvalues\)")


def test_laplace_callers_name_B_the_algorithm_and_K_in_floating_point():
    X, y = _huge_signal_variance()
    B = r"B = I \+ W\^1/2 K W\^1/2 of laplace_mode \(GPML Algorithm 3.1\) "
    with pytest.raises(ValueError, match="^laplace_evidence: " + B + _FLOATING):
        gpclab.laplace_evidence(X, y, [0.0, 20.0], eval_gradient=False)
    with pytest.raises(ValueError, match="^predict_averaged: " + B + _FLOATING):
        gpclab.predict_averaged(X, y, X[:3], [[0.0, 20.0]], kernel="se")
    K = gpclab.kernel_matrix("se", X, X, [0.0, 20.0])
    with pytest.raises(ValueError, match="^laplace_mode: " + B + _FLOATING):
        gpclab.laplace_mode(K, y, "logistic")            # the face, after the door let K pass


def test_multiclass_evidence_names_algorithm_3_3_and_K_in_floating_point():
    X, _ = _huge_signal_variance()
    Y = gpclab.one_hot(np.minimum((X[:, 0] + 3) // 2, 2).astype(int), 3)
    with pytest.raises(ValueError, match=r"^multiclass_evidence: B_c = I \+ D_c\^1/2 K_c D_c\^1/2 or sum_c E_c "
                                         r"of laplace_mode_multiclass \(GPML Algorithm 3.3\) " + _FLOATING):
        gpclab.multiclass_evidence(X, Y, np.tile([0.0, 20.0], (3, 1)), eval_gradient=False)


def test_multiclass_ep_evidence_does_not_blame_a_good_C(monkeypatch):
    """ep_multiclass bounds its step sites (so B does not fail on a psd C in practice): a
    LinAlgError is made to happen, to check what multiclass_ep_evidence makes of it."""
    def failing(*args, **kwargs):
        raise np.linalg.LinAlgError("Matrix is not positive definite.")
    monkeypatch.setattr(gpclab, "_ep_multiclass_run", failing)     # ep_multiclass's body, as the evidence runs it
    X = np.linspace(-1, 1, 6)[:, None]
    Y = gpclab.one_hot(np.arange(6) % 3, 3)
    with pytest.raises(ValueError, match=r"^multiclass_ep_evidence: B = I \+ S~\^1/2 Kg S~\^1/2 of ep_multiclass "
                                         r"\(EP on the difference latents, K&G 4.2\) has no Cholesky factor, "
                                         r"although C is positive semidefinite"):
        gpclab.multiclass_ep_evidence(X, Y, [0.0, 0.0, 0.0, 0.0], eval_gradient=False)


def test_a_failed_factorisation_is_named_alike_by_the_face_and_the_python_layer():
    """The same failure (an indefinite K whose 2 x 2 minors are all >= 0) gives the same words
    after the function's name, from the door and from a Python caller of the unchecked body."""
    K = 100 * np.array([[1.0, 0.9, -0.9], [0.9, 1.0, 0.9], [-0.9, 0.9, 1.0]])
    assert np.linalg.eigvalsh(K)[0] == pytest.approx(-80.0)
    y = np.array([1.0, -1.0, 1.0])
    messages = []
    for call in (lambda: gpclab.laplace_mode(K, y, "logistic"),
                 lambda: gpclab._mode_or_raise(K, y, "logistic")):
        with pytest.raises(ValueError) as info:
            call()
        messages.append(str(info.value).split(": ", 1))
    assert [m[0] for m in messages] == ["laplace_mode", "laplace_evidence"]
    assert messages[0][1] == messages[1][1]
    assert messages[0][1].startswith("K must be positive semidefinite (a covariance matrix): its smallest "
                                     "eigenvalue is -80")


@pytest.mark.parametrize("kernel", ["kg", "kg_iso"])
def test_one_array_given_twice_stays_one_array(kernel):
    """k(X, X) of 'kg' and 'kg_iso' carries the latent noise t2 on its diagonal because X1 and X2
    are the same array; the checked call converts each argument, and an X that needs converting
    (Fortran order, integers, a list, read-only) is converted once for both. Two arrays of equal
    values are two arrays: no noise, as before."""
    r = np.random.default_rng(4)
    Xc = np.round(r.standard_normal((6, 2)) * 3)
    h = np.log([1.0, 0.5, 0.25]) if kernel == "kg_iso" else np.log([1.0, 0.5, 0.25, 2.0, 0.5])
    h = np.concatenate([h, [0.0]]) if kernel == "kg_iso" else h
    want = gpclab.kernel_matrix(kernel, Xc, Xc, h)
    plain = gpclab.kernel_matrix(kernel, Xc, Xc.copy(), h)
    np.testing.assert_allclose(np.diag(want) - np.diag(plain), 0.25)            # t2 on the diagonal
    ro = Xc.copy()
    ro.flags.writeable = False
    as_list = Xc.tolist()
    strided = np.zeros((12, 2))
    strided[::2] = Xc
    for X in (np.asfortranarray(Xc), Xc.astype(int), as_list, ro, strided[::2]):
        np.testing.assert_array_equal(gpclab.kernel_matrix(kernel, X, X, h), want)
    np.testing.assert_array_equal(gpclab.kernel_matrix.unchecked(kernel, ro, ro, h, None), want)
    np.testing.assert_array_equal(gpclab.kernel_matrix(kernel, Xc.tolist(), Xc.tolist(), h), plain)
