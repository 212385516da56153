"""Section 2 and 3.4: covariance functions, Algorithms 3.1/3.2 and the gradient of log q."""
import numpy as np
import pytest
import scipy.linalg as sl

import gpclab
import naive
from conftest import small_problem

LIKS = ["logistic", "probit"]


# --- covariance functions ------------------------------------------------------

def test_se_and_ard_kernels_equal_their_formulas(rng):
    X1, X2 = rng.standard_normal((7, 3)), rng.standard_normal((5, 3))
    np.testing.assert_allclose(gpclab.kernel_matrix("se", X1, X2, np.array([0.3, -0.2])),
                               naive.se_kernel(X1, X2, 0.3, -0.2), rtol=1e-13)
    h = np.array([0.5, -1.0, 0.1, -0.7, 1.2])
    np.testing.assert_allclose(gpclab.kernel_matrix("ard", X1, X2, h), naive.ard_kernel(X1, X2, h), rtol=1e-13)
    np.testing.assert_allclose(gpclab.kernel_diag("ard", X2, h), np.diag(naive.ard_kernel(X2, X2, h)), rtol=1e-13)
    np.testing.assert_allclose(gpclab.kernel_diag("se", X2, np.array([0.3, -0.2])), np.exp(-0.4), rtol=1e-13)


@pytest.mark.parametrize("kernel,h", [("se", [0.2, 0.4]), ("ard", [0.3, -1.5, 0.2, -0.4])])
def test_kernel_derivatives_equal_finite_differences(kernel, h, rng):
    X = rng.standard_normal((9, 2))
    h = np.array(h)
    K = gpclab.kernel_matrix(kernel, X, X, h)
    for j in range(h.size):
        e = np.zeros_like(h)
        e[j] = 1e-6
        fd = (gpclab.kernel_matrix(kernel, X, X, h + e) - gpclab.kernel_matrix(kernel, X, X, h - e)) / 2e-6
        np.testing.assert_allclose(gpclab.kernel_grad(kernel, X, h, K, j), fd, rtol=1e-7, atol=1e-10)


# --- Algorithm 3.1 -----------------------------------------------------------------

def _problem(seed, lik_scale=1.0, n=14):
    X, y = small_problem(seed, n=n)
    K = naive.se_kernel(X, X, 0.2, np.log(2.0 * lik_scale)) + 0.1 * np.eye(n)  # jitter: naive inverses stay exact
    return X, y, K


@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_mode_and_log_q_equal_naive_dense(lik, seed):
    X, y, K = _problem(seed)
    res = gpclab.laplace_mode(K, y, lik)
    assert res.converged
    f_ref = naive.laplace_mode(K, y, lik)
    np.testing.assert_allclose(res.f_hat, f_ref, rtol=1e-8, atol=1e-10)
    assert res.log_q == pytest.approx(naive.laplace_log_q(K, y, lik, f_ref), rel=1e-8, abs=1e-10)
    np.testing.assert_allclose(res.a, np.linalg.solve(K, res.f_hat), rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("lik", LIKS)
def test_mode_satisfies_self_consistency(lik):
    """At the mode f_hat = K grad log p(y|f_hat) (3.17)."""
    X, y = small_problem(3, n=40)
    K = gpclab.kernel_matrix("se", X, X, np.array([0.0, 1.0]))
    res = gpclab.laplace_mode(K, y, lik)
    _, dlp, _, _ = gpclab.log_likelihood(lik, y, res.f_hat)
    np.testing.assert_allclose(res.f_hat, K @ dlp, rtol=1e-7, atol=1e-9)


def _plain_newton_objectives(K, y, lik, iters):
    """Algorithm 3.1 without step-size control: Psi after each full Newton step."""
    n = len(y)
    f, a, out = np.zeros(n), np.zeros(n), []
    for _ in range(iters):
        lp, dlp, d2lp, _ = gpclab.log_likelihood(lik, y, f)
        out.append(-0.5 * a @ f + lp.sum())
        sW = np.sqrt(-d2lp)
        L = np.linalg.cholesky(np.eye(n) + sW[:, None] * K * sW)
        b = -d2lp * f + dlp
        a = b - sW * sl.cho_solve((L, True), sW * (K @ b))
        f = K @ a
    return np.array(out)


@pytest.mark.parametrize("lik", LIKS)
def test_newton_safeguard_converges_where_full_steps_overshoot(lik):
    """With a large signal variance full Newton steps lower the objective; Alg. 3.1 with step control still converges."""
    r = np.random.default_rng(9)
    X = r.uniform(0, 5, (13, 1))
    y = np.where(r.uniform(size=13) < 0.5, 1.0, -1.0)
    K = gpclab.kernel_matrix("se", X, X, np.array([0.5, np.log(300.0)]))
    psi_plain = _plain_newton_objectives(K, y, lik, 15)
    assert np.min(np.diff(psi_plain)) < -1.0  # the undamped iteration overshoots here
    res = gpclab.laplace_mode(K, y, lik)
    assert res.converged
    lp, dlp, _, _ = gpclab.log_likelihood(lik, y, res.f_hat)
    np.testing.assert_allclose(res.f_hat, K @ dlp, rtol=1e-6, atol=1e-6 * np.abs(res.f_hat).max())
    assert -0.5 * res.a @ res.f_hat + lp.sum() >= psi_plain.max() - 1e-9


def test_warm_start_reaches_the_same_mode():
    X, y, K = _problem(4)
    cold = gpclab.laplace_mode(K, y, "logistic")
    warm = gpclab.laplace_mode(K, y, "logistic", cold.a * 0.9)
    np.testing.assert_allclose(warm.f_hat, cold.f_hat, rtol=1e-8, atol=1e-10)
    assert warm.n_iter < cold.n_iter


@pytest.mark.parametrize("lik", LIKS)
def test_step_search_equals_plain_halving(lik):
    """_step_search (the safeguard of Alg. 3.1 line 8 and 3.3 line 14) takes the step a plain halving
    loop takes: a full step, some halvings, or none (t = 0, the point unchanged)."""
    X, y, K = _problem(4)
    r = np.random.default_rng(1)
    a = 0.1 * r.standard_normal(len(y))
    f = K @ a
    psi = naive.newton_objective(a, f, y, lik)
    ascent = naive.LIKS[lik](y, f)[1] - a                       # da along K^-1 grad Psi(f)
    steps = []
    for scale in [0.1, 100.0]:
        da = scale * ascent
        t_ref, psi_ref = naive.step_search(a, da, f, K @ da, psi, y, lik)
        a_t, f_t, psi_t, t = gpclab._step_search(gpclab._objective, a, da, f, K @ da, psi, y, lik)
        assert t == t_ref
        np.testing.assert_array_equal(a_t, a + t * da)
        assert psi_t == pytest.approx(psi_ref, rel=1e-12)
        steps.append(t)
    assert steps[0] == 1.0 and 0.0 < steps[1] < 0.5             # a full step and several halvings
    # downhill (Psi is concave) nothing reaches psi + 1
    a_t, f_t, psi_t, t = gpclab._step_search(gpclab._objective, a, -da, f, -K @ da, psi + 1.0, y, lik)
    assert t == 0.0 and psi_t == psi + 1.0
    np.testing.assert_array_equal(a_t, a)
    np.testing.assert_array_equal(f_t, f)


@pytest.mark.parametrize("lik", LIKS)
def test_a_worse_warm_start_is_not_taken(lik):
    """Alg. 3.1 line 2 with a warm start whose objective is below that of f = 0: the iteration starts
    at f = 0, so the result is the cold start's, bit for bit."""
    X, y, K = _problem(4)
    cold = gpclab.laplace_mode(K, y, lik)
    bad = -3.0 * cold.a
    assert naive.newton_objective(bad, K @ bad, y, lik) < naive.newton_objective(0 * bad, 0 * bad, y, lik)
    warm = gpclab.laplace_mode(K, y, lik, bad)
    np.testing.assert_array_equal(warm.f_hat, cold.f_hat)
    assert warm.log_q == cold.log_q and warm.n_iter == cold.n_iter


def test_nonconvergence_is_flagged():
    X, y, K = _problem(5)
    res = gpclab.laplace_mode(K, y, "logistic", None, 1e-10, 1)
    assert not res.converged and res.n_iter == 1


# --- Algorithm 3.2 ------------------------------------------------------------------

@pytest.mark.parametrize("lik", LIKS)
def test_predictions_equal_naive_dense(lik):
    X, y, K = _problem(6)
    Xs = np.random.default_rng(0).standard_normal((9, 2))
    K_star = naive.se_kernel(X, Xs, 0.2, np.log(2.0))
    kss = np.full(9, 4.0)
    res = gpclab.laplace_mode(K, y, lik)
    p, mean, var = gpclab.laplace_predict(res.f_hat, K, y, lik, K_star, kss)
    m_ref, v_ref = naive.laplace_predict(K, y, lik, res.f_hat, K_star, kss)
    p_L, mean_L, var_L = gpclab.laplace_predict(res.f_hat, K, y, lik, K_star, kss, "average", res.L)
    np.testing.assert_allclose(var_L, var, rtol=1e-12, atol=1e-14)  # reusing L from Alg. 3.1
    np.testing.assert_allclose(mean, m_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(var, v_ref, rtol=1e-8, atol=1e-10)
    if lik == "probit":  # (3.82)
        from scipy.special import ndtr
        np.testing.assert_allclose(p, ndtr(m_ref / np.sqrt(1 + v_ref)), rtol=1e-10)
    else:  # (3.25) by brute-force quadrature on a fine grid
        z = np.linspace(-40, 40, 400001)
        dens = np.exp(-0.5 * (z[None] - m_ref[:, None]) ** 2 / v_ref[:, None]) / np.sqrt(2 * np.pi * v_ref[:, None])
        ref = np.trapezoid(dens / (1 + np.exp(-z[None])), z, axis=1)
        np.testing.assert_allclose(p, ref, atol=1e-8)


def test_map_and_mackay_rules_and_same_decisions():
    X, y, K = _problem(7)
    Xs = np.random.default_rng(1).standard_normal((30, 2))
    K_star = naive.se_kernel(X, Xs, 0.2, np.log(2.0))
    kss = np.full(30, 4.0)
    res = gpclab.laplace_mode(K, y, "logistic")
    p_avg, fb, V = gpclab.laplace_predict(res.f_hat, K, y, "logistic", K_star, kss, "average")
    p_map, _, _ = gpclab.laplace_predict(res.f_hat, K, y, "logistic", K_star, kss, "map")
    p_mk, _, _ = gpclab.laplace_predict(res.f_hat, K, y, "logistic", K_star, kss, "mackay")
    np.testing.assert_allclose(p_map, 1 / (1 + np.exp(-fb)), rtol=1e-13)
    np.testing.assert_allclose(p_mk, 1 / (1 + np.exp(-fb / np.sqrt(1 + np.pi * V / 8))), rtol=1e-13)
    assert np.all((p_avg > 0.5) == (p_map > 0.5))  # identical binary decisions (section 3.4.2)
    assert np.all(np.abs(p_avg - 0.5) <= np.abs(p_map - 0.5) + 1e-15)  # averaging softens
    assert np.max(np.abs(p_mk - p_avg)) < 0.02  # MacKay's rule is a close approximation


# --- the gradient of log q (K&R appendix A) -------------------------------------------

def _log_q(kernel, X, y, lik, h):
    K = gpclab.kernel_matrix(kernel, X, X, h)
    return gpclab.laplace_mode(K, y, lik, None, 1e-15, 200).log_q


@pytest.mark.parametrize("lik", LIKS)
@pytest.mark.parametrize("kernel,h", [("se", [0.3, 0.8]), ("se", [-0.5, 2.0]),
                                      ("ard", [1.0, -1.0, 0.5, -1.2, 0.0])])
def test_gradient_equals_finite_differences(lik, kernel, h):
    X, y = small_problem(8, n=25, d=3)
    h = np.array(h)
    K = gpclab.kernel_matrix(kernel, X, X, h)
    res = gpclab.laplace_mode(K, y, lik, None, 1e-15, 200)
    grad = gpclab.laplace_log_q_grad(K, X, kernel, h, y, lik, res.f_hat, res.a, res.L)
    eps = 1e-5
    fd = np.array([(_log_q(kernel, X, y, lik, h + eps * e) - _log_q(kernel, X, y, lik, h - eps * e)) / (2 * eps)
                   for e in np.eye(h.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7)


def test_log_q_and_gradient_equal_scikit_learn_on_breast_cancer():
    """Same kernel, hyperparameters and data: log q and gradient agree to 1e-8 (relative)."""
    from sklearn.datasets import load_breast_cancer
    from sklearn.gaussian_process import GaussianProcessClassifier
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel

    X, t = load_breast_cancer(return_X_y=True)
    X = (X - X.mean(0)) / X.std(0)
    y = np.where(t == 1, 1.0, -1.0)
    for ell, sf in [(3.0, 2.0), (8.0, 5.0)]:
        gpc = GaussianProcessClassifier(ConstantKernel(sf ** 2) * RBF(ell), optimizer=None).fit(X, t)
        lml, g_sk = gpc.log_marginal_likelihood(gpc.kernel_.theta, eval_gradient=True)
        h = np.log([ell, sf])
        lq, grad, _ = gpclab.laplace_evidence(X, y, h, "se", "logistic")
        assert lq == pytest.approx(lml, rel=1e-8)
        # scikit-learn's theta is (log sf^2, log l)
        np.testing.assert_allclose([grad[1] / 2, grad[0]], g_sk, rtol=1e-8)


# --- bad input ----------------------------------------------------------------------

def test_numba_functions_reject_bad_input():
    K = np.eye(3)
    with pytest.raises(ValueError, match="y must contain only -1 and \\+1"):
        gpclab.laplace_mode(K, np.array([1.0, 0.0, -1.0]), "logistic")
    with pytest.raises(ValueError, match="y must have shape \\(n,\\) with n = 4 from K"):
        gpclab.laplace_mode(np.eye(4), np.ones(3), "logistic")
    with pytest.raises(ValueError, match="y must not be empty"):
        gpclab.laplace_mode(np.zeros((0, 0)), np.zeros(0), "logistic")
    with pytest.raises(ValueError, match="likelihood must be"):
        gpclab.laplace_mode(K, np.ones(3), "tanh")
    with pytest.raises(ValueError, match="log_hyp for kernel 'se' on d = 2 inputs must have length 2"):
        gpclab.kernel_matrix("se", np.zeros((2, 2)), np.zeros((2, 2)), np.zeros(3))
    with pytest.raises(ValueError, match="kernel must be"):
        gpclab.kernel_matrix("matern", np.zeros((2, 2)), np.zeros((2, 2)), np.zeros(2))
    with pytest.raises(ValueError, match="rule must be"):
        gpclab.averaged_probability("logistic", np.zeros(1), np.ones(1), "median")


def test_kim_ghahramani_kernel(rng):
    """K&G eq. 13 (continuous inputs): t0 exp(-1/2 sum l_m d_m^2) + t1 + t2 delta(i, j), and its derivatives."""
    X1, X2 = rng.standard_normal((6, 2)), rng.standard_normal((4, 2))
    h = np.array([0.4, -1.0, -0.5, 0.3, -0.8])
    K = gpclab.kernel_matrix("kg", X1, X1, h)
    ref = naive.ard_kernel(X1, X1, np.delete(h, 2)) + np.exp(h[2]) * np.eye(6)
    np.testing.assert_allclose(K, ref, rtol=1e-13)
    np.testing.assert_allclose(gpclab.kernel_matrix("kg", X1, X2, h), naive.ard_kernel(X1, X2, np.delete(h, 2)),
                               rtol=1e-13)  # no delta between different points
    np.testing.assert_allclose(gpclab.kernel_diag("kg", X2, h), np.exp(h[0]) + np.exp(h[1]) + np.exp(h[2]))
    for j in range(h.size):
        e = np.zeros_like(h)
        e[j] = 1e-6
        fd = (gpclab.kernel_matrix("kg", X1, X1, h + e) - gpclab.kernel_matrix("kg", X1, X1, h - e)) / 2e-6
        np.testing.assert_allclose(gpclab.kernel_grad("kg", X1, h, K, j), fd, rtol=1e-7, atol=1e-10)


# --- Algorithm 3.1 at a huge signal variance (separable data) -------------------------

def _separable(log_sf):
    X = np.linspace(-3, 3, 40)[:, None]
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    return X, y, gpclab.kernel_matrix("se", X, X, np.array([0.0, log_sf]))


@pytest.mark.parametrize("lik,log_sf", [("logistic", 12.0), ("logistic", 15.0), ("probit", 6.0),
                                        ("probit", 15.0)])
def test_log_q_at_a_huge_signal_variance_equals_a_50_digit_newton(lik, log_sf):
    """Separable 1-D data: f_hat runs off towards infinity, Psi is flat long before f and log|B|
    settle. log q equals Newton's method in 50 digits on the same K to 1e-6."""
    _, y, K = _separable(log_sf)
    res = gpclab.laplace_mode(K, y, lik)
    ref, _ = naive.laplace_log_q_mp(K, y, lik)
    assert res.converged
    assert abs(res.log_q - float(ref)) < 1e-6, (res.log_q, float(ref))


@pytest.mark.parametrize("log_sf", [0.0, 6.0])
def test_log_q_on_separable_data_equals_scikit_learn(log_sf):
    """scikit-learn's Laplace GPC (GPML Alg. 3.1 in numpy) on the separable data. (It is no
    reference at log sf >= 9 here: its W = pi (1 - pi) keeps no digits once |f| > 20.)"""
    from sklearn.gaussian_process._gpc import _BinaryGaussianProcessClassifierLaplace
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel
    X, y, K = _separable(log_sf)
    kern = ConstantKernel(np.exp(2 * log_sf), "fixed") * RBF(1.0, "fixed")
    sk = _BinaryGaussianProcessClassifierLaplace(kernel=kern, optimizer=None).fit(X, (y > 0).astype(int))
    res = gpclab.laplace_mode(K, y, "logistic")
    assert res.converged
    assert abs(res.log_q - sk.log_marginal_likelihood_value_) < 1e-6


def test_failed_line_search_is_not_convergence():
    """K indefinite (B still positive definite at f = 0): no step along the Newton direction
    raises Psi, and the flag says so instead of reporting the start as the mode."""
    K = np.array([[1.0, 2.0], [2.0, 1.0]])
    # the checked entry refuses such a K at the door; the body's own flag is tested unchecked
    with pytest.raises(ValueError, match="K must be positive semidefinite"):
        gpclab.laplace_mode(K, np.array([1.0, -1.0]), "logistic")
    res = gpclab.laplace_mode.unchecked(K, np.array([1.0, -1.0]), "logistic")
    assert not res.converged and res.n_iter == 0


def test_huge_signal_variance_fails_clearly_and_the_grid_goes_on():
    """At log sf = 20 K is not positive definite in floating point: laplace_evidence says so in a
    ValueError, and evidence_grid marks that point nan with one warning naming it."""
    X, y, K = _separable(20.0)
    assert np.linalg.eigvalsh(K)[0] < 0
    with pytest.raises(ValueError, match="not positive semidefinite in floating point"):
        gpclab.laplace_evidence(X, y, np.array([0.0, 20.0]), eval_gradient=False)
    with pytest.warns(RuntimeWarning) as rec:
        out = gpclab.evidence_grid(X, y, [0.0], [3.0, 20.0], progress=False)
    failed = [str(w.message) for w in rec if "marked nan" in str(w.message)]
    assert len(failed) == 1 and "(0, 20)" in failed[0]
    assert np.isnan(out["log_q"][1, 0]) and np.isfinite(out["log_q"][0, 0])
