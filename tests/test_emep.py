"""Section 8: EM-EP (Kim & Ghahramani): covariance (13)-(14), the bound, eq. 31, the eps update,
Theorem 1, the EM loop, the multi-class difference latents (41)-(54) and GPClassifier(method="emep")."""
import warnings

import numpy as np
import pytest
from scipy import integrate
from scipy.optimize import minimize_scalar
from scipy.stats import multivariate_normal, norm

import gpclab
import naive
from conftest import small_problem

H = np.array([0.5, -2.0, -1.0, 0.2, -0.6])   # log t0, log t1, log t2, log l_1, log l_2


def _q(X, y, h, eps, tol=1e-13):
    K = gpclab.kernel_matrix("kg", X, X, h)
    res = gpclab.ep(K, y, None, None, tol, 500, "natural", 0, "step", eps)
    return K, res


def _three_class(seed, n=12):
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, 2))
    idx = np.digitize(X[:, 0] + 0.5 * r.standard_normal(n), [-0.4, 0.4])
    return X, idx, gpclab.one_hot(idx, 3)


# --- covariance (K&G 13-14) ---------------------------------------------------------


def _kg_naive(X1, X2, h, disc, iso=False):
    """K&G eq. 13 term by term (without the delta term), eq. 14 per input."""
    t0, t1 = np.exp(h[0]), np.exp(h[1])
    d = X1.shape[1]
    ell = np.full(d, np.exp(h[3])) if iso else np.exp(h[3:])
    K = np.empty((len(X1), len(X2)))
    for i in range(len(X1)):
        for j in range(len(X2)):
            s = sum(ell[m] * ((X1[i, m] != X2[j, m]) * 1.0 if disc[m] else (X1[i, m] - X2[j, m]) ** 2)
                    for m in range(d))
            K[i, j] = t0 * np.exp(-0.5 * s) + t1
    return K


@pytest.mark.parametrize("kernel", ["kg", "kg_iso"])
def test_kg_covariance_with_discrete_inputs(kernel):
    """Check eqs. 13-14 against a term-by-term evaluation, and every derivative by finite differences."""
    r = np.random.default_rng(3)
    X = np.column_stack([r.standard_normal(9), r.integers(0, 3, 9), r.standard_normal(9)])
    X2 = np.column_stack([r.standard_normal(4), r.integers(0, 3, 4), r.standard_normal(4)])
    disc = np.array([False, True, False])
    h = np.array([0.3, -1.5, -2.0, 0.4, -0.3, 0.2]) if kernel == "kg" else np.array([0.3, -1.5, -2.0, -0.4])
    K = gpclab.kernel_matrix(kernel, X, X, h, disc)
    np.testing.assert_allclose(K, _kg_naive(X, X, h, disc, kernel == "kg_iso") + np.exp(h[2]) * np.eye(9),
                               rtol=1e-13)
    np.testing.assert_allclose(gpclab.kernel_matrix(kernel, X, X2, h, disc),
                               _kg_naive(X, X2, h, disc, kernel == "kg_iso"), rtol=1e-13)
    # a discrete input: the same value twice is distance 0, any two different values distance 1
    same = np.array([[0.0, 2.0, 0.0], [0.0, 2.0, 0.0]])
    other = np.array([[0.0, 2.0, 0.0], [0.0, 7.0, 0.0]])
    k_same = gpclab.kernel_matrix(kernel, same[:1], same[1:], h, disc)[0, 0]
    k_other = gpclab.kernel_matrix(kernel, other[:1], other[1:], h, disc)[0, 0]
    ell = np.exp(h[4] if kernel == "kg" else h[3])
    assert k_same == pytest.approx(np.exp(h[0]) + np.exp(h[1]), rel=1e-14)
    assert k_other == pytest.approx(np.exp(h[0]) * np.exp(-0.5 * ell) + np.exp(h[1]), rel=1e-14)
    for j in range(h.size):
        e = np.zeros(h.size)
        e[j] = 1e-6
        fd = (gpclab.kernel_matrix(kernel, X, X, h + e, disc) - gpclab.kernel_matrix(kernel, X, X, h - e, disc)) / 2e-6
        np.testing.assert_allclose(gpclab.kernel_grad(kernel, X, h, K, j, disc), fd, rtol=1e-7, atol=1e-10)


def test_kg_iso_is_kg_with_equal_length_scales():
    X, _ = small_problem(1, n=8, d=3)
    h_iso = np.array([0.1, -3.0, -1.0, -0.7])
    h = np.concatenate([h_iso[:3], np.full(3, h_iso[3])])
    np.testing.assert_allclose(gpclab.kernel_matrix("kg_iso", X, X, h_iso), gpclab.kernel_matrix("kg", X, X, h),
                               rtol=1e-14)
    K = gpclab.kernel_matrix("kg", X, X, h)
    # d/d log l of the shared l is the sum of the per-input derivatives
    np.testing.assert_allclose(gpclab.kernel_grad("kg_iso", X, h_iso, K, 3),
                               sum(gpclab.kernel_grad("kg", X, h, K, 3 + m) for m in range(3)), rtol=1e-12)


def test_discrete_flags_rejects_bad_input():
    assert gpclab.discrete_flags(None, 3) is None
    np.testing.assert_array_equal(gpclab.discrete_flags([0, 2], 3), [True, False, True])
    with pytest.raises(ValueError, match="discrete has a column index out of range"):
        gpclab.discrete_flags([3], 3)
    with pytest.raises(ValueError, match="discrete as a boolean mask must have one entry"):
        gpclab.discrete_flags(np.array([True, False]), 3)
    with pytest.raises(ValueError, match="discrete must be a boolean mask or a list of column indices"):
        gpclab.discrete_flags([0.5], 3)
    X = np.zeros((2, 3))
    with pytest.raises(ValueError, match="discrete must have shape \\(d,\\) with d = 3"):
        gpclab.kernel_matrix("kg", X, X, np.zeros(6), np.array([True]))


# --- binary EM-EP ------------------------------------------------------------------


@pytest.mark.parametrize("eps", [0.0, 0.05])
def test_theorem_1_eq31_is_the_gradient_of_log_Z_EP(eps):
    """K&G Theorem 1: at an EP fixed point eq. 31 equals d log Z_EP / d theta_cov (central differences)."""
    X, y = small_problem(4, n=20)
    K, res = _q(X, y, H, eps)
    _, g31 = gpclab.em_ep_grad(K, X, "kg", H, res.mu, res.Sigma)
    fd = np.empty(H.size)
    for j in range(H.size):
        e = np.zeros(H.size)
        e[j] = 1e-5
        fd[j] = (_q(X, y, H + e, eps)[1].log_Z - _q(X, y, H - e, eps)[1].log_Z) / 2e-5
    np.testing.assert_allclose(g31, fd, rtol=1e-5, atol=1e-7)
    # and K&R's eq. 51 gives the same numbers
    g51 = gpclab.ep_log_Z_grad(K, X, "kg", H, res.nu_tilde, res.tau_tilde, res.L)
    np.testing.assert_allclose(g31, g51, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("eps", [0.0, 0.1])
def test_log_Z_EP_equals_kg_eq_23(eps):
    """Check log Z_EP against K&G eq. 23 written out: |Lambda|^1/2 |C + Lambda|^-1/2 exp(-r/2) prod_i s_i,
    with the sites' v_i, m_i and s_i = Z_i sqrt(1 + lambda_i / v_i) exp((h_i - m_i)^2 / (2 (v_i + lambda_i))),
    the normaliser that makes each site reproduce Z_i of eq. 20 against its cavity N(h_i, lambda_i)."""
    X, y = small_problem(14, n=12)
    K, res = _q(X, y, H, eps)
    v, m = 1 / res.tau_tilde, res.nu_tilde / res.tau_tilde                # site variances and means (K&G 16)
    lam = 1 / (1 / np.diag(res.Sigma) - res.tau_tilde)                     # cavity variance (K&G 19)
    h = lam * (res.mu / np.diag(res.Sigma) - res.nu_tilde)                 # cavity mean
    Z = eps + (1 - 2 * eps) * norm.cdf(y * h / np.sqrt(lam))                # (K&G 20)
    log_s = np.log(Z) + 0.5 * np.log1p(lam / v) + (h - m) ** 2 / (2 * (v + lam))
    A = np.linalg.inv(np.linalg.inv(K) + np.diag(1 / v))                   # (K&G 22)
    r = np.sum(m ** 2 / v) - (m / v) @ A @ (m / v)
    log_Z23 = 0.5 * np.sum(np.log(v)) - 0.5 * np.linalg.slogdet(K + np.diag(v))[1] - r / 2 + log_s.sum()
    assert res.log_Z == pytest.approx(log_Z23, rel=1e-10)


def _F_cov_naive(K, mu, Sigma):
    """E_q[log N(f|0, K)] (K&G 56) with explicit inverses."""
    Ki = np.linalg.inv(K)
    return (-0.5 * np.linalg.slogdet(2 * np.pi * K)[1] - 0.5 * mu @ Ki @ mu - 0.5 * np.trace(Ki @ Sigma))


def test_eq31_is_the_gradient_of_F_with_q_fixed():
    X, y = small_problem(5, n=15)
    disc = np.array([False, True])
    X[:, 1] = np.round(X[:, 1])                               # a discrete input
    K = gpclab.kernel_matrix("kg", X, X, H, disc)
    res = gpclab.ep(K, y, None, None, 1e-13, 500, "natural", 0, "step", 0.05)
    F_cov, g = gpclab.em_ep_grad(K, X, "kg", H, res.mu, res.Sigma, disc)
    assert F_cov == pytest.approx(_F_cov_naive(K, res.mu, res.Sigma), rel=1e-11)
    fd_F, fd_cov = np.empty(H.size), np.empty(H.size)
    for j in range(H.size):
        e = np.zeros(H.size)
        e[j] = 1e-5
        Kp, Km = (gpclab.kernel_matrix("kg", X, X, H + s * e, disc) for s in (1, -1))
        fd_F[j] = (gpclab.em_ep_bound(Kp, y, 0.05, res.mu, res.Sigma)[0]
                   - gpclab.em_ep_bound(Km, y, 0.05, res.mu, res.Sigma)[0]) / 2e-5
        fd_cov[j] = (_F_cov_naive(Kp, res.mu, res.Sigma) - _F_cov_naive(Km, res.mu, res.Sigma)) / 2e-5
    np.testing.assert_allclose(g, fd_F, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g, fd_cov, rtol=1e-6, atol=1e-8)


def test_bound_F_against_quadrature_and_an_independent_formula():
    """F (K&G 29) = sum of 1-D expectations of log p(y|f) + E_q log N(f|0, K) + entropy, each computed apart."""
    X, y = small_problem(9, n=10)
    K, res = _q(X, y, H, 0.1)
    lik = 0.0
    for i in range(10):
        sd = np.sqrt(res.Sigma[i, i])
        P = integrate.quad(lambda f: norm.pdf(f, res.mu[i], sd), 0, np.inf)[0] if y[i] > 0 else \
            integrate.quad(lambda f: norm.pdf(f, res.mu[i], sd), -np.inf, 0)[0]
        lik += P * np.log(0.9) + (1 - P) * np.log(0.1)
    entropy = 0.5 * np.linalg.slogdet(2 * np.pi * np.e * res.Sigma)[1]
    F, F_cov = gpclab.em_ep_bound(K, y, 0.1, res.mu, res.Sigma)
    assert F == pytest.approx(lik + _F_cov_naive(K, res.mu, res.Sigma) + entropy, rel=1e-9)
    assert F_cov == pytest.approx(_F_cov_naive(K, res.mu, res.Sigma), rel=1e-11)
    assert F < res.log_Z                                      # Jensen
    assert gpclab.em_ep_bound(K, y, 0.0, res.mu, res.Sigma)[0] == -np.inf


def test_eps_update_maximises_F():
    X, y = small_problem(6, n=25)
    K, res = _q(X, y, H, 0.1)
    eps_closed = gpclab.em_ep_eps(y, res.mu, res.Sigma)
    num = minimize_scalar(lambda e: -gpclab.em_ep_bound(K, y, e, res.mu, res.Sigma)[0],
                          bounds=(1e-6, 0.5 - 1e-6), method="bounded", options={"xatol": 1e-10})
    assert eps_closed == pytest.approx(num.x, abs=1e-6)


def test_bound_is_below_log_Z_and_F_never_decreases_in_the_M_step():
    X, y = small_problem(7, n=30)
    out = gpclab.em_ep(X, y, H, eps0=0.05, learn_eps=True, max_iter=15)
    F = out.F
    assert out.n_iter >= 2 and F.size == 2 * out.n_iter + 1 and np.all(np.isfinite(F))
    # F after each M-step is at least F after the E-step before it (same q). An E-step need not
    # raise F: EP's q is not the maximiser of F (see the EM-EP lecture)
    assert np.all(F[1::2] >= F[0:-1:2] - 1e-9)
    # Jensen: the bound lies below EP's evidence
    assert np.all(F[0::2] <= out.log_Z + 1e-6)
    assert out.log_hyp.shape == H.shape and 0 < out.eps < 0.5


def test_em_ep_converges_on_a_synthetic_problem_to_the_ML_II_point():
    r = np.random.default_rng(8)
    X = r.uniform(-3, 3, (60, 2))
    y = np.where(np.sin(X[:, 0]) + 0.1 * r.standard_normal(60) > 0, 1.0, -1.0)
    y[r.uniform(size=60) < 0.15] *= -1                       # some label noise: the scale is identified
    # eps = 0 with latent noise t2: the probit model (K&G section 3.2)
    # the classic M-step (L-BFGS-B on F with q held fixed): EM's properties
    out = gpclab.em_ep(X, y, np.array([0.0, -2.0, 0.0, 0.0, 0.0]), max_iter=300, tol=1e-6, accelerate=False)
    assert out.converged
    assert abs(out.log_Z[-1] - out.log_Z[-2]) < 1e-6
    assert np.all(np.diff(out.log_Z) > -1e-6), "log Z_EP rises from one EM round to the next here"
    assert np.all(out.F_cov[1::2] >= out.F_cov[0:-1:2] - 1e-9)  # every M-step raises F's covariance part
    # K&G's l_m are inverse length-scales: the input that matters keeps a large one, the other goes to ~0
    assert np.exp(out.log_hyp[3]) > 100 * np.exp(out.log_hyp[4])
    # Theorem 1: the EM fixed point is a stationary point of log Z_EP: ML-II on log Z_EP, started there,
    # gains almost nothing, and the gradient of log Z_EP is small in the identified directions
    _, g, _ = gpclab.ep_evidence(X, np.asarray(y), out.log_hyp, "kg", likelihood="step")
    free = (out.log_hyp > -14.9) & (out.log_hyp < 9.9)      # not at a bound
    assert np.max(np.abs(g[free])) < 0.05
    h_ml, v_ml, _ = gpclab.ml2(X, y, out.log_hyp, "kg", "step", method="ep")
    assert v_ml - out.log_Z[-1] < 0.02


def test_accelerated_em_ep_converges_without_warning_to_the_fixed_point():
    """The default M-step (a quasi-Newton step whose curvature is kept across rounds, the step accepted
    on the next E-step's log Z_EP) converges in few rounds with no warning, to a stationary point of
    log Z_EP (central differences of EP's log Z, not eq. 31), at least as high as the classic M-step's
    and as ML-II's on the same evidence (K&R 51, another code path)."""
    r = np.random.default_rng(8)
    X = r.uniform(-3, 3, (60, 2))
    y = np.where(np.sin(X[:, 0]) + 0.1 * r.standard_normal(60) > 0, 1.0, -1.0)
    y[r.uniform(size=60) < 0.15] *= -1
    h0 = np.array([0.0, -2.0, 0.0, 0.0, 0.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = gpclab.em_ep(X, y, h0)
    assert out.converged and out.n_iter <= 30                    # measured: 18
    assert out.log_hyp[0] == h0[0]                               # the scale of K, flat for the step, held
    assert np.all(np.diff(out.log_Z) > 0)                        # every round raises log Z_EP
    # classic_rounds: the classic rounds first, the scale of K held from where they leave it
    classic3 = gpclab.em_ep(X, y, h0, max_iter=3, accelerate=False)
    mixed = gpclab.em_ep(X, y, h0, classic_rounds=3)
    np.testing.assert_array_equal(mixed.log_Z[:4], classic3.log_Z)
    assert mixed.converged and mixed.log_hyp[0] == classic3.log_hyp[0] != h0[0]
    assert mixed.log_Z[-1] == pytest.approx(out.log_Z[-1], abs=1e-3)
    assert out.F.size == out.F_cov.size == 2 * out.n_iter + 1 and out.log_Z.size == out.n_iter + 1

    def log_Z(h):
        K = gpclab.kernel_matrix("kg", X, X, h)
        return gpclab.ep(K, y, None, None, 1e-12, 500, "natural", 0, "step", 0.0).log_Z

    assert out.log_Z[-1] == pytest.approx(log_Z(out.log_hyp), abs=1e-7)   # result is the last E-step
    lo, hi = np.array(gpclab.default_bounds("kg", 2)).T
    free = (np.arange(5) > 0) & (out.log_hyp > lo + 0.1) & (out.log_hyp < hi - 0.1)
    assert free.sum() >= 2
    fd = np.empty(5)
    for j in range(5):
        e = np.zeros(5)
        e[j] = 1e-5
        fd[j] = (log_Z(out.log_hyp + e) - log_Z(out.log_hyp - e)) / 2e-5
    g0 = np.abs([(log_Z(h0 + e) - log_Z(h0 - e)) / 2e-5 for e in 1e-5 * np.eye(5)])
    assert np.max(g0[free]) > 0.5                               # 50 times steeper at the start
    assert np.max(np.abs(fd[free])) < 1e-2
    classic = gpclab.em_ep(X, y, h0, max_iter=300, tol=1e-6, accelerate=False)
    assert classic.converged and out.log_Z[-1] > classic.log_Z[-1] - 1e-4
    _, v_ml, _ = gpclab.ml2(X, y, h0, "kg", "step", method="ep", ftol=1e-10)
    assert out.log_Z[-1] > v_ml - 1e-3


def test_em_ep_bad_input():
    X, y = small_problem(0)
    with pytest.raises(ValueError, match="eps0 must be in \\[0, 0.5\\)"):
        gpclab.em_ep(X, y, eps0=0.6)
    with pytest.raises(ValueError, match="log_hyp0 for kernel 'kg'"):
        gpclab.em_ep(X, y, [0.0, 0.0])
    with pytest.raises(ValueError, match="multi-class EM-EP has eps = 0"):
        gpclab.em_ep(X, np.arange(len(y)) % 3, learn_eps=True)
    with pytest.raises(ValueError, match="max_iter must be a non-negative integer"):
        gpclab.em_ep(X, y, max_iter=-1)


# --- multi-class: difference latents (K&G 4.2) ---------------------------------------


def test_difference_covariance_is_the_linear_map_of_the_class_latents():
    """K&G 41-43: Cov(g) = T (I_J kron C) T^T with g = T f, built densely from the class-major f of (36)."""
    X, idx, Y = _three_class(0, n=7)
    C = gpclab.kernel_matrix("kg", X, X, H)
    J, n = Y.shape
    rows = []
    for i in range(n):
        for j in range(J):
            if j != idx[i]:                                   # g_i^{y_i, j} = f_i^{y_i} - f_i^j  (K&G 45)
                t = np.zeros(J * n)
                t[idx[i] * n + i] = 1.0
                t[j * n + i] = -1.0
                rows.append(t)
    T = np.array(rows)
    np.testing.assert_allclose(gpclab.difference_covariance(C, Y), T @ np.kron(np.eye(J), C) @ T.T,
                               rtol=1e-14, atol=1e-14)
    y, case, cls = gpclab.difference_index(Y)
    np.testing.assert_array_equal(y, idx)
    assert case.shape == (n * (J - 1),) and np.all(cls != y[case])


def test_multiclass_ep_with_two_classes_is_the_binary_model():
    """K&G: for J = 2 the difference formulation is the binary GPC (g_i = y_i (f^1 - f^2), covariance 2 C)."""
    X, y = small_problem(11, n=16)
    C = gpclab.kernel_matrix("kg", X, X, H)
    Y = np.vstack([(y == 1).astype(float), (y == -1).astype(float)])      # class 0 is y = +1
    binary = gpclab.ep(C, y, None, None, 1e-12, 500, "natural", 0, "step", 0.0)
    multi = gpclab.ep_multiclass(C, Y, None, None, 1e-12, 500)
    assert multi.log_Z == pytest.approx(binary.log_Z, abs=1e-9)
    np.testing.assert_allclose(multi.mu, np.sqrt(2) * y * binary.mu, rtol=1e-6)   # g = y (f^1 - f^2)
    Xs = np.random.default_rng(2).standard_normal((6, 2))
    Ks, kss = gpclab.kernel_matrix("kg", X, Xs, H), gpclab.kernel_diag("kg", Xs, H)
    p_b, f_b, _ = gpclab.ep_predict(binary.nu_tilde, binary.tau_tilde, C, Ks, kss, None, "step", 0.0)
    p_m, f_m, _, label = gpclab.ep_predict_multiclass(multi.nu_tilde, multi.tau_tilde, C, Y, Ks, kss)
    np.testing.assert_allclose(p_m[0], p_b, rtol=1e-7)
    np.testing.assert_allclose(p_m[1], 1 - p_b, rtol=1e-7)
    np.testing.assert_allclose(f_m[0] - f_m[1], np.sqrt(2) * f_b, rtol=1e-6)
    np.testing.assert_array_equal(label, np.where(f_b > 0, 0, 1))


def test_multiclass_predictions_against_dense_gaussian_conditioning():
    """The predictive Gaussian of the J test latents, by explicit inverses: q(g) = N((Kg^-1 + S)^-1 nu, .),
    f_* | g Gaussian from the joint prior; probabilities against sampling, eq. 54 against argmax."""
    X, idx, Y = _three_class(1, n=14)
    C = gpclab.kernel_matrix("kg", X, X, H)
    res = gpclab.ep_multiclass(C, Y, None, None, 1e-12, 500)
    Kg = gpclab.difference_covariance(C, Y)
    Sig_g = np.linalg.inv(np.linalg.inv(Kg) + np.diag(res.tau_tilde))
    mu_g = Sig_g @ res.nu_tilde
    np.testing.assert_allclose(res.mu, mu_g, rtol=1e-8, atol=1e-10)
    Xs = np.random.default_rng(3).standard_normal((5, 2)) * 1.5
    Ks, kss = gpclab.kernel_matrix("kg", X, Xs, H), gpclab.kernel_diag("kg", Xs, H)
    p, f_bar, V, label = gpclab.ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss)
    y, case, cls = gpclab.difference_index(Y)
    Kgi = np.linalg.inv(Kg)
    rng = np.random.default_rng(0)
    for t in range(5):
        A = np.array([[int(c == y[case[a]]) - int(c == cls[a]) for c in range(3)] for a in range(len(case))]) \
            * Ks[case, t][:, None]                            # Cov(g, f_*)
        mean = A.T @ Kgi @ mu_g
        cov = kss[t] * np.eye(3) - A.T @ Kgi @ A + A.T @ Kgi @ Sig_g @ Kgi @ A
        np.testing.assert_allclose(f_bar[:, t], mean, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(V[t], cov, rtol=1e-7, atol=1e-9)
        draws = rng.multivariate_normal(mean, cov, 200_000)
        freq = np.bincount(np.argmax(draws, axis=1), minlength=3) / 200_000
        np.testing.assert_allclose(p[:, t], freq, atol=4e-3)
    np.testing.assert_allclose(p.sum(axis=0), 1.0, atol=1e-12)          # J = 3: exact bivariate cdfs
    np.testing.assert_array_equal(label, np.argmax(f_bar, axis=0))       # (K&G 52-54) picks the largest mean


def test_orthant_probability_against_quadrature_and_scipy():
    r = np.random.default_rng(5)
    assert gpclab.orthant_probability(np.array([0.7]), np.array([[2.0]]))[0] == pytest.approx(
        norm.cdf(0.7 / np.sqrt(2.0)), rel=1e-15)
    for _ in range(30):                                       # k = 2: exact up to |rho| = 0.925, QMC beyond
        rho = r.uniform(-0.99, 0.99)
        s = np.exp(r.normal(size=2))
        S = np.array([[s[0] ** 2, rho * s[0] * s[1]], [rho * s[0] * s[1], s[1] ** 2]])
        m = 2.5 * r.standard_normal(2)
        b, sd = S[1, 0] / S[0, 0], np.sqrt(S[1, 1] - S[1, 0] ** 2 / S[0, 0])
        ref = integrate.quad(lambda z: norm.pdf(z, m[0], s[0]) * norm.cdf((m[1] + b * (z - m[0])) / sd),
                             0, np.inf, epsabs=1e-15, epsrel=1e-13)[0]
        P, se = gpclab.orthant_probability(m, S)
        assert P == pytest.approx(ref, abs=1e-13 if abs(rho) <= 0.925 else 5e-6)
    for k in (3, 4, 6):
        A = r.standard_normal((k, k))
        S = A @ A.T + 0.5 * np.eye(k)
        m = r.standard_normal(k)
        P, se = gpclab.orthant_probability(m, S, 20_000)
        ref = multivariate_normal(np.zeros(k), S, abseps=1e-10, releps=1e-10, maxpts=10 ** 7).cdf(m)
        assert abs(P - ref) < max(5 * se, 1e-7)
        assert se < 5e-6
    with pytest.raises(ValueError, match="cov must have shape"):
        gpclab.orthant_probability(np.zeros(2), np.eye(3))


def test_multiclass_theorem_1_and_eq31_with_q_fixed():
    X, idx, Y = _three_class(2, n=10)
    C = gpclab.kernel_matrix("kg", X, X, H)
    res = gpclab.ep_multiclass(C, Y, None, None, 1e-13, 500)
    Kg = gpclab.difference_covariance(C, Y)
    F_cov, g = gpclab.em_ep_grad_multiclass(C, Y, X, "kg", H, res.mu, res.Sigma)
    assert F_cov == pytest.approx(_F_cov_naive(Kg, res.mu, res.Sigma), rel=1e-11)
    fd_cov, fd_Z = np.empty(H.size), np.empty(H.size)
    for j in range(H.size):
        e = np.zeros(H.size)
        e[j] = 1e-5
        Cp, Cm = (gpclab.kernel_matrix("kg", X, X, H + s * e) for s in (1, -1))
        fd_cov[j] = (_F_cov_naive(gpclab.difference_covariance(Cp, Y), res.mu, res.Sigma)
                     - _F_cov_naive(gpclab.difference_covariance(Cm, Y), res.mu, res.Sigma)) / 2e-5
        fd_Z[j] = (gpclab.ep_multiclass(Cp, Y, None, None, 1e-13, 500).log_Z
                   - gpclab.ep_multiclass(Cm, Y, None, None, 1e-13, 500).log_Z) / 2e-5
    np.testing.assert_allclose(g, fd_cov, rtol=1e-6, atol=1e-8)
    np.testing.assert_allclose(g, fd_Z, rtol=1e-5, atol=1e-7)             # K&G Theorem 1


def test_multiclass_em_ep_raises_F_and_log_Z():
    X, idx, _ = _three_class(4, n=24)
    out = gpclab.em_ep(X, idx, max_iter=20, accelerate=False)
    assert out.n_iter >= 2 and out.result.mu.shape == (48,)
    assert np.all(out.F_cov[1::2] >= out.F_cov[0:-1:2] - 1e-9)           # each M-step raises F
    assert np.all(np.diff(out.log_Z) > -1e-3)
    assert out.log_Z[-1] > out.log_Z[0] + 1.0
    # the accelerated M-step: every round raises log Z_EP (L-BFGS-B's sufficient increase) and
    # ends higher than the 20 classic rounds
    fast = gpclab.em_ep(X, idx, max_iter=20)
    assert fast.n_iter >= 2 and fast.F.size == 2 * fast.n_iter + 1
    assert np.all(np.diff(fast.log_Z) > 0)
    assert fast.log_Z[-1] >= out.log_Z[-1] - 1e-6


# --- GPClassifier(method="emep") ---------------------------------------------------------


def test_classifier_emep_binary_and_multiclass():
    X, y = small_problem(12, n=30)
    m = gpclab.GPClassifier(method="emep", max_iter=30).fit(X, y)
    assert m.kernel_ == "kg" and m.likelihood_ == "step" and m.emep_ is not None
    assert m.log_marginal_likelihood_ == pytest.approx(m.emep_.log_Z[-1])
    P = m.predict_proba(X)
    assert P.shape == (30, 2) and np.allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(m.predict(X), m.classes_[np.argmax(P, axis=1)])
    v, g = m.log_marginal_likelihood(eval_gradient=True)
    assert v == pytest.approx(m.log_marginal_likelihood_, abs=1e-8)
    j = 3
    e = np.zeros(m.log_hyp_.size)
    e[j] = 1e-5
    fd = (m.log_marginal_likelihood(m.log_hyp_ + e) - m.log_marginal_likelihood(m.log_hyp_ - e)) / 2e-5
    assert g[j] == pytest.approx(fd, rel=1e-4, abs=1e-6)

    X3, idx, _ = _three_class(6, n=24)
    labels = np.array(["a", "b", "c"])[idx]
    with pytest.warns(RuntimeWarning, match="EM-EP did not converge in 2 rounds"):
        m3 = gpclab.GPClassifier(method="emep", kernel="kg_iso", discrete=np.array([False, False]),
                                 max_iter=2).fit(X3, labels)
    P3 = m3.predict_proba(X3)
    assert P3.shape == (24, 3) and np.allclose(P3.sum(axis=1), 1.0, atol=1e-12)
    assert m3.score(X3, labels) > 0.6
    f_bar, V = m3.predict_latent(X3[:3])
    assert f_bar.shape == (3, 3) and V.shape == (3, 3, 3)
    v3, g3 = m3.log_marginal_likelihood(eval_gradient=True)
    assert v3 == pytest.approx(m3.log_marginal_likelihood_, abs=1e-8) and g3.shape == (4,)
    # ML-II on the same multi-class log Z_EP (method 'ep', likelihood 'step') is not worse than EM-EP
    m3_ml = gpclab.GPClassifier(method="ep", likelihood="step", kernel="kg_iso", max_iter=50).fit(X3, labels)
    assert m3_ml.log_marginal_likelihood_ > m3.log_marginal_likelihood_ - 0.5


def test_classifier_emep_learns_eps_and_uses_discrete_inputs():
    X, y = small_problem(13, n=40)
    X = np.column_stack([X, np.arange(40) % 2])              # an irrelevant discrete input
    with pytest.warns(RuntimeWarning, match="EM-EP did not converge"):
        m = gpclab.GPClassifier(method="emep", discrete=[2], eps=0.05, learn_eps=True, max_iter=5).fit(X, y)
    assert 0 < m.eps_ < 0.5 and m.eps_ == m.emep_.eps
    assert m.discrete_.tolist() == [False, False, True]
    P = m.predict_proba(X)
    assert np.all(P >= m.eps_ - 1e-12) and np.all(P <= 1 - m.eps_ + 1e-12)   # (K&G 26)


@pytest.mark.parametrize("kwargs,match", [
    ({"method": "emep", "likelihood": "probit"}, "method 'emep' needs likelihood 'step'"),
    ({"method": "ep", "likelihood": "logistic"}, "method 'ep' needs likelihood 'probit' or 'step'"),
    ({"method": "laplace", "likelihood": "step"}, "method 'laplace' needs likelihood"),
    ({"likelihood": "probit", "eps": 0.1}, "eps is the labelling noise of likelihood 'step'"),
    ({"method": "emep", "eps": 0.7}, r"eps must be a number in \[0, 0.5\)"),
    ({"method": "ep", "likelihood": "step", "learn_eps": True}, "learn_eps is for method 'emep'"),
    ({"method": "emep", "kernel": "kg_iso", "log_hyp": [0.0] * 5}, "log_hyp for kernel 'kg_iso'"),
    ({"method": "emep", "discrete": [5]}, "discrete has a column index out of range"),
    ({"method": "emep", "hyp_prior": (-3, 3)}, "hyp_prior is for ML-II"),
])
def test_classifier_emep_rejects_bad_parameters(kwargs, match):
    X, y = small_problem(0)
    with pytest.raises(ValueError, match=match):
        gpclab.GPClassifier(**kwargs).fit(X, y)


def test_classifier_multiclass_ep_rejects_bad_parameters():
    X, idx, _ = _three_class(0)
    with pytest.raises(ValueError, match="multi-class EP has eps = 0"):
        gpclab.GPClassifier(method="emep", eps=0.1).fit(X, idx)
    with pytest.raises(ValueError, match="shared_hyp must be True"):
        gpclab.GPClassifier(method="emep", shared_hyp=False).fit(X, idx)
    with pytest.raises(ValueError, match="multi-class EP is Kim & Ghahramani's model"):
        gpclab.GPClassifier(method="ep", likelihood="probit").fit(X, idx)


def test_load_ionosphere_reads_the_uci_format(tmp_path):
    """Check the loader on a tiny file in the UCI layout, with and without a header line."""
    r = np.random.default_rng(0)
    X = np.round(r.uniform(-1, 1, (3, 34)), 5)
    body = "".join(",".join(f"{v:g}" for v in row) + f",{lab}\n" for row, lab in zip(X, "gbg"))
    (tmp_path / "plain.data").write_text(body)
    (tmp_path / "header.data").write_text(",".join(f"c{k}" for k in range(34)) + ",label\n" + body)
    for name in ("plain.data", "header.data"):
        Xl, yl = gpclab.load_ionosphere(str(tmp_path / name))
        np.testing.assert_allclose(Xl, X)
        assert yl.tolist() == ["g", "b", "g"]
    (tmp_path / "bad.data").write_text(body.replace(",b\n", ",x\n"))
    with pytest.raises(ValueError, match="line 2: expected 34 numbers and a label g or b"):
        gpclab.load_ionosphere(str(tmp_path / "bad.data"))
    with pytest.raises(ValueError, match="path must be a readable ionosphere.data file"):
        gpclab.load_ionosphere(str(tmp_path / "missing.data"))


@pytest.mark.parametrize("kernel", ["ard", "kg"])
@pytest.mark.parametrize("with_discrete", [False, True])
def test_the_weights_gradient_in_one_pass_is_the_sum_over_each_derivative_matrix(kernel, with_discrete):
    """em_ep_grad's eq. 31 (and multi-class EP's gradient) sums 1/2 Q_ik dC_ik for each input's
    weight in one pass over the pairs (_ard_weight_grad) instead of forming each dC. The reference
    forms every dC with kernel_grad and sums 1/2 Q * dC over the whole matrix, for a Q that is not
    symmetric (both triangles count), with and without discrete inputs (K&G 14)."""
    rng = np.random.default_rng(7 + with_discrete)
    n, d = 40, 5
    X = rng.standard_normal((n, d))
    disc = np.zeros(d)
    if with_discrete:
        disc[[0, 3]] = 1.0
        X[:, [0, 3]] = rng.integers(0, 3, (n, 2))
    off = 3 if kernel == "kg" else 2
    h = np.concatenate([[0.4, -1.5, -4.0][:off], rng.normal(-1.0, 1.0, d)])
    C = gpclab.kernel_matrix(kernel, X, X, h, disc)
    Q = rng.standard_normal((n, n))
    want = [0.5 * np.sum(Q * gpclab.kernel_grad(kernel, X, h, C, j, disc)) for j in range(h.size)]
    got = gpclab._weighted_kernel_grad(Q, X, kernel, h, C, disc)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12 * np.max(np.abs(want)))
