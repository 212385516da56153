"""Section 8: EM-EP (Kim & Ghahramani): bound, eq. 31, the eps update, Theorem 1, the EM loop."""
import numpy as np
import pytest
from scipy.optimize import minimize_scalar

import gpclab
from conftest import small_problem

H = np.array([0.5, -2.0, -1.0, 0.2, -0.6])   # log t0, log t1, log t2, log l_1, log l_2


def _q(X, y, h, eps, tol=1e-13):
    K = gpclab.kernel_matrix("kg", X, X, h)
    res = gpclab.ep(K, y, None, None, tol, 500, "natural", 0, "step", eps)
    return K, res


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_theorem_1_eq31_is_the_gradient_of_log_Z_EP(eps):
    """K&G Theorem 1: at an EP fixed point eq. 31 equals d log Z_EP / d theta_cov (central differences)."""
    X, y = small_problem(4, n=20)
    K, res = _q(X, y, H, eps)
    g31 = gpclab.em_ep_grad(K, X, "kg", H, res.mu, res.Sigma)
    fd = np.empty(H.size)
    for j in range(H.size):
        e = np.zeros(H.size)
        e[j] = 1e-5
        fd[j] = (_q(X, y, H + e, eps)[1].log_Z - _q(X, y, H - e, eps)[1].log_Z) / 2e-5
    np.testing.assert_allclose(g31, fd, rtol=1e-5, atol=1e-7)
    # and K&R's eq. 51 gives the same numbers
    g51 = gpclab.ep_log_Z_grad(K, X, "kg", H, res.nu_tilde, res.tau_tilde, res.L)
    np.testing.assert_allclose(g31, g51, rtol=1e-6, atol=1e-8)


def test_eq31_is_the_gradient_of_F_with_q_fixed():
    X, y = small_problem(5, n=15)
    K, res = _q(X, y, H, 0.05)
    g = gpclab.em_ep_grad(K, X, "kg", H, res.mu, res.Sigma)
    fd = np.empty(H.size)
    for j in range(H.size):
        e = np.zeros(H.size)
        e[j] = 1e-5
        Fp = gpclab.em_ep_bound(gpclab.kernel_matrix("kg", X, X, H + e), y, 0.05, res.mu, res.Sigma)[0]
        Fm = gpclab.em_ep_bound(gpclab.kernel_matrix("kg", X, X, H - e), y, 0.05, res.mu, res.Sigma)[0]
        fd[j] = (Fp - Fm) / 2e-5
    np.testing.assert_allclose(g, fd, rtol=1e-6, atol=1e-8)


def test_eps_update_maximises_F():
    X, y = small_problem(6, n=25)
    K, res = _q(X, y, H, 0.1)
    eps_closed = gpclab.em_ep_eps(y, res.mu, res.Sigma)
    num = minimize_scalar(lambda e: -gpclab.em_ep_bound(K, y, e, res.mu, res.Sigma)[0],
                          bounds=(1e-6, 0.5 - 1e-6), method="bounded", options={"xatol": 1e-10})
    assert eps_closed == pytest.approx(num.x, abs=1e-6)


def test_bound_is_below_log_Z_and_F_never_decreases_in_the_M_step():
    X, y = small_problem(7, n=30)
    out = gpclab.em_ep(X, y, H, max_iter=15)
    F = out["F"]
    assert F.size >= 2 and np.all(np.isfinite(F))
    # F after each M-step is at least F after the E-step before it (same q)
    assert np.all(F[1::2] >= F[0::2][: F[1::2].size] - 1e-9)
    # Jensen: the bound lies below EP's evidence
    assert np.all(F[0::2] <= out["log_Z"][: F[0::2].size] + 1e-6)
    assert out["log_hyp"].shape == H.shape and 0 <= out["eps"] < 0.5


def test_em_ep_converges_on_a_synthetic_problem():
    r = np.random.default_rng(8)
    X = r.uniform(-3, 3, (60, 2))
    y = np.where(np.sin(X[:, 0]) + 0.1 * r.standard_normal(60) > 0, 1.0, -1.0)
    y[r.uniform(size=60) < 0.15] *= -1                       # some label noise: the scale is identified
    # eps = 0 with latent noise t2: the probit model (K&G section 3.2)
    out = gpclab.em_ep(X, y, np.array([0.0, -2.0, 0.0, 0.0, 0.0]), eps0=0.0, learn_eps=False, max_iter=200,
                       tol=1e-5)
    assert out["converged"]
    assert abs(out["log_Z"][-1] - out["log_Z"][-2]) < 1e-5
    assert np.all(np.diff(out["log_Z"]) > -1e-6), "log Z_EP rises from one EM round to the next here"
    # K&G's l_m are inverse length-scales: the input that matters keeps a large one, the other goes to ~0
    assert np.exp(out["log_hyp"][3]) > 100 * np.exp(out["log_hyp"][4])


def test_em_ep_bad_input():
    X, y = small_problem(0)
    with pytest.raises(ValueError, match="eps0 must lie"):
        gpclab.em_ep(X, y, eps0=0.6)
    with pytest.raises(ValueError, match="log_hyp0 for kernel 'kg'"):
        gpclab.em_ep(X, y, [0.0, 0.0])
