"""Section 3.6: EP (Algorithms 3.5, 3.6), log Z_EP and its gradient, the exact probit evidence, the lower bound."""
import math
import warnings

import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

import gpclab
import naive
from conftest import small_problem


def _problem(seed, n=12, sf=2.0):
    X, y = small_problem(seed, n=n)
    K = naive.se_kernel(X, X, 0.0, np.log(sf)) + 0.05 * np.eye(n)  # jitter: naive inverses stay exact
    return X, y, K


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ep_equals_naive_dense_ep(seed):
    """Same order and number of sweeps: sites, log Z_EP, posterior and predictions agree to 1e-8."""
    X, y, K = _problem(seed)
    res = gpclab.ep(K, y, None, None, 0.0, 6)  # tol = 0: exactly 6 sweeps
    assert res.n_sweeps == 6
    nu, tau, Sigma, mu = naive.ep(K, y, 6)
    np.testing.assert_allclose(res.tau_tilde, tau, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(res.nu_tilde, nu, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(res.Sigma, Sigma, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(res.mu, mu, rtol=1e-8, atol=1e-12)
    assert res.log_Z == pytest.approx(naive.ep_log_Z(K, y, nu, tau), rel=1e-8, abs=1e-10)
    Xs = np.random.default_rng(seed).standard_normal((7, 2))
    K_star = naive.se_kernel(X, Xs, 0.0, np.log(2.0))
    kss = np.full(7, 4.0)
    p, mean, var = gpclab.ep_predict(res.nu_tilde, res.tau_tilde, K, K_star, kss)
    m_ref, v_ref = naive.ep_predict(K, nu, tau, K_star, kss)
    np.testing.assert_allclose(mean, m_ref, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(var, v_ref, rtol=1e-8, atol=1e-12)
    np.testing.assert_allclose(p, norm.cdf(m_ref / np.sqrt(1 + v_ref)), rtol=1e-8)  # (3.63)
    p_L, _, _ = gpclab.ep_predict(res.nu_tilde, res.tau_tilde, K, K_star, kss, res.L)
    np.testing.assert_allclose(p_L, p, rtol=1e-13)


@pytest.mark.parametrize("k,y", [(0.3, 1.0), (9.0, -1.0), (1e4, 1.0)])
def test_ep_is_exact_for_one_point(k, y):
    """n = 1: Z = Phi(0) = 1/2 and the EP posterior has the exact moments (3.58) of N(0, k) Phi(y f)."""
    res = gpclab.ep(np.array([[k]]), np.array([y]))
    assert res.log_Z == pytest.approx(math.log(0.5), abs=1e-12)
    f = np.linspace(-60 * math.sqrt(k), 60 * math.sqrt(k), 200001)
    post = norm.pdf(f, 0, math.sqrt(k)) * norm.cdf(y * f)
    Z = np.trapezoid(post, f)
    m1 = np.trapezoid(f * post, f) / Z
    m2 = np.trapezoid((f - m1) ** 2 * post, f) / Z
    assert res.mu[0] == pytest.approx(m1, rel=1e-7)
    assert res.Sigma[0, 0] == pytest.approx(m2, rel=1e-7)


@pytest.mark.filterwarnings("ignore::scipy.integrate.IntegrationWarning")
@pytest.mark.parametrize("z_mu,s2", [(0.3, 1.0), (-4.0, 9.0), (-40.0, 1.0), (-1000.0, 0.5), (30.0, 2.0),
                                     (1.0, 1e10), (-5.0, 1e10), (50.0, 1e4)])
def test_moments_equal_quadrature(z_mu, s2):
    """(3.58) against direct quadrature of N(f|mu, s2) Phi(f), scaled to stay finite in the tails."""
    mu = z_mu * math.sqrt(1 + s2)   # so that z = mu / sqrt(1 + s2) = z_mu
    log_Z, mu_hat, s2_hat = gpclab.probit_moments(1.0, mu, s2)
    # integrate with respect to the tilted density around its own location to avoid underflow
    sd = math.sqrt(s2)
    lo, hi = min(mu, 0.0) - 40 * sd - 50, max(mu, 0.0) + 40 * sd + 50
    c = norm.logpdf(mu_hat, mu, sd) + norm.logcdf(mu_hat)
    dens = lambda f: math.exp(norm.logpdf(f, mu, sd) + norm.logcdf(f) - c)
    pts = sorted({mu_hat, mu, 0.0})
    kw = dict(points=[p for p in pts if lo < p < hi], limit=1000, epsabs=0, epsrel=1e-13)
    Z0 = integrate.quad(dens, lo, hi, **kw)[0]
    m1 = integrate.quad(lambda f: f * dens(f), lo, hi, **kw)[0] / Z0
    m2 = integrate.quad(lambda f: (f - m1) ** 2 * dens(f), lo, hi, **kw)[0] / Z0
    assert log_Z == pytest.approx(math.log(Z0) + c, rel=1e-9, abs=1e-9)
    assert mu_hat == pytest.approx(m1, rel=1e-8, abs=1e-8 * sd)
    assert s2_hat == pytest.approx(m2, rel=1e-6)


def test_site_update_equals_direct_form_and_stays_positive():
    """The cancellation-free site update equals (3.59) where the direct form is accurate."""
    for y, tau_cav, nu_cav in [(1.0, 0.5, 0.2), (-1.0, 2.0, 1.5), (1.0, 0.01, -0.3)]:
        s2 = 1 / tau_cav
        _, mu_hat, s2_hat = gpclab.probit_moments(y, nu_cav * s2, s2)
        tau_new, nu_new = gpclab._site_update(y, tau_cav, nu_cav, 1.0, 0.0)
        assert tau_new == pytest.approx(1 / s2_hat - tau_cav, rel=1e-10)
        assert nu_new == pytest.approx(mu_hat / s2_hat - nu_cav, rel=1e-10)
    # a very well classified site: the direct difference has no digits left, the stable form is > 0
    tau_new, _ = gpclab._site_update(1.0, 1e-3, 1.0, 1.0, 0.0)
    assert 0 < tau_new < 1e-100


def test_ep_log_Z_is_closer_to_the_exact_evidence_than_laplace():
    """K&R's central claim, on random problems with n <= 10, and EP within 0.2 nats of the truth."""
    rng = np.random.default_rng(42)
    wins = 0
    for trial in range(10):
        n = int(rng.integers(3, 11))
        X = rng.standard_normal((n, 2))
        y = np.where(rng.uniform(size=n) < 0.5, 1.0, -1.0)
        h = np.array([rng.uniform(-1, 1), rng.uniform(0, 2.5)])
        K = gpclab.kernel_matrix("se", X, X, h)
        exact = gpclab.exact_log_evidence_probit(K, y)
        ep = gpclab.ep(K, y).log_Z
        la = gpclab.laplace_mode(K, y, "probit").log_q
        assert abs(ep - exact) < 0.2, (trial, ep, exact)
        wins += abs(ep - exact) < abs(la - exact)
    assert wins == 10


def test_exact_evidence_equals_quadrature_for_two_points():
    K = np.array([[2.0, 1.2], [1.2, 1.5]])
    for y in ([1.0, 1.0], [1.0, -1.0]):
        y = np.array(y)
        Kinv = np.linalg.inv(K)
        dens = lambda f2, f1: (norm.cdf(y[0] * f1) * norm.cdf(y[1] * f2) * math.exp(
            -0.5 * np.array([f1, f2]) @ Kinv @ np.array([f1, f2])) / (2 * math.pi * math.sqrt(np.linalg.det(K))))
        ref = integrate.dblquad(dens, -15, 15, -15, 15, epsabs=1e-12, epsrel=1e-10)[0]
        assert gpclab.exact_log_evidence_probit(K, y) == pytest.approx(math.log(ref), abs=1e-7)


def _log_Z(kernel, X, y, h):
    K = gpclab.kernel_matrix(kernel, X, X, h)
    return gpclab.ep(K, y, None, None, 1e-15, 500).log_Z


@pytest.mark.parametrize("kernel,h", [("se", [0.3, 0.8]), ("se", [-0.5, 2.0]),
                                      ("ard", [1.0, -1.0, 0.5, -1.2, 0.0])])
def test_gradient_equals_finite_differences(kernel, h):
    """K&R eq. 51 at a tightly converged fixed point matches central differences to 1e-5 (relative)."""
    X, y = small_problem(8, n=25, d=3)
    h = np.array(h)
    K = gpclab.kernel_matrix(kernel, X, X, h)
    res = gpclab.ep(K, y, None, None, 1e-15, 500)
    grad = gpclab.ep_log_Z_grad(K, X, kernel, h, res.nu_tilde, res.tau_tilde, res.L)
    eps = 1e-5
    fd = np.array([(_log_Z(kernel, X, y, h + eps * e) - _log_Z(kernel, X, y, h - eps * e)) / (2 * eps)
                   for e in np.eye(h.size)])
    np.testing.assert_allclose(grad, fd, rtol=1e-5, atol=1e-7)


def test_large_signal_variance_is_finite_and_flat():
    """K&R appendix B: up to sf = 1e3 and beyond EP runs without NaN, and on separable data
    log Z_EP levels off in sf (the likelihood acts as a hard truncation), while Laplace's keeps falling."""
    r = np.random.default_rng(0)
    X = r.standard_normal((30, 2))
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    ep_values, la_values = [], []
    for sf in [10.0, 1e2, 1e3, 1e4]:
        K = gpclab.kernel_matrix("se", X, X, np.array([0.0, np.log(sf)]))
        res = gpclab.ep(K, y)
        assert res.converged and np.isfinite(res.log_Z)
        assert np.all(np.isfinite(res.nu_tilde)) and np.all(res.tau_tilde >= 0)
        ep_values.append(res.log_Z)
        la_values.append(gpclab.laplace_mode(K, y, "probit").log_q)
    assert abs(ep_values[3] - ep_values[2]) < 1e-4 < abs(ep_values[1] - ep_values[0])
    assert la_values[3] < la_values[2] - 0.5


def test_warm_start_and_random_order_reach_the_same_fixed_point():
    X, y, K = _problem(3, n=20)
    ref = gpclab.ep(K, y, None, None, 1e-13, 200)
    rnd = gpclab.ep(K, y, None, None, 1e-13, 200, "random", 7)
    near = gpclab.ep(K * 1.02, y, None, None, 1e-13, 200)  # sites at nearby hyperparameters
    warm = gpclab.ep(K, y, near.nu_tilde, near.tau_tilde, 1e-13, 200)
    for other in (rnd, warm):
        np.testing.assert_allclose(other.tau_tilde, ref.tau_tilde, rtol=1e-5)
        assert other.log_Z == pytest.approx(ref.log_Z, abs=1e-9)
    assert warm.n_sweeps < ref.n_sweeps
    again = gpclab.ep(K, y, None, None, 1e-13, 200, "random", 7)
    np.testing.assert_array_equal(again.tau_tilde, rnd.tau_tilde)


def test_lower_bound_against_quadrature_and_below_the_evidence():
    K = np.array([[2.0, 1.2], [1.2, 1.5]])
    y = np.array([1.0, -1.0])
    res = gpclab.ep(K, y)
    m, A = res.mu, res.Sigma
    bound = gpclab.lower_bound(K, y, "probit", m, A)
    # (35b) by 2-D quadrature over q(f) = N(m, A)
    Ai, Ki = np.linalg.inv(A), np.linalg.inv(K)
    lq = lambda f: -0.5 * (f - m) @ Ai @ (f - m) - 0.5 * np.linalg.slogdet(2 * np.pi * A)[1]
    lp = lambda f: (norm.logcdf(y[0] * f[0]) + norm.logcdf(y[1] * f[1]) - 0.5 * f @ Ki @ f
                    - 0.5 * np.linalg.slogdet(2 * np.pi * K)[1])
    integrand = lambda f2, f1: math.exp(lq(np.array([f1, f2]))) * (lp(np.array([f1, f2])) - lq(np.array([f1, f2])))
    sd = np.sqrt(np.diag(A))
    ref = integrate.dblquad(integrand, m[0] - 12 * sd[0], m[0] + 12 * sd[0],
                            m[1] - 12 * sd[1], m[1] + 12 * sd[1], epsabs=1e-11, epsrel=1e-10)[0]
    assert bound == pytest.approx(ref, abs=1e-7)
    exact = gpclab.exact_log_evidence_probit(K, y)
    assert bound < exact < res.log_Z + 0.05


def test_bad_input_raises():
    K = np.eye(3)
    with pytest.raises(ValueError, match="y must contain only"):
        gpclab.ep(K, np.array([1.0, 2.0, -1.0]))
    with pytest.raises(ValueError, match="ep: order must be one of"):
        gpclab.ep(K, np.ones(3), None, None, 1e-9, 10, "backwards")
    with pytest.raises(ValueError, match="ep: nu_tilde_init and tau_tilde_init go together: give both"):
        gpclab.ep(K, np.ones(3), np.zeros(3))
    with pytest.raises(ValueError, match="give both"):
        gpclab.ep(K, np.ones(3), tau_tilde_init=np.ones(3))
    with pytest.raises(ValueError, match="ep_multiclass: nu_tilde_init and tau_tilde_init go together"):
        gpclab.ep_multiclass(K, np.eye(3), np.zeros(6))
    with pytest.raises(ValueError, match="ep: nu_tilde_init and tau_tilde_init go together"):
        gpclab.ep.unchecked(K, np.ones(3), np.zeros(3))   # so does the unchecked call (no half warm start)
    with pytest.raises(ValueError, match="go together"):
        gpclab.ep_evidence(np.eye(3), np.ones(3), np.zeros(2), sites=(np.zeros(3), None))
    with pytest.raises(ValueError, match="K must have shape"):
        gpclab.exact_log_evidence_probit(np.eye(2), np.ones(3))
    with pytest.raises(ValueError, match="K must be positive definite"):
        gpclab.lower_bound(np.ones((2, 2)), np.ones(2), "probit", np.zeros(2), np.eye(2))
    with pytest.raises(ValueError, match="A must be positive definite"):
        gpclab.lower_bound(np.eye(2), np.ones(2), "probit", np.zeros(2), -np.eye(2))
    with pytest.raises(ValueError, match="small problems"):
        gpclab.exact_log_evidence_probit(np.eye(30), np.ones(30))


def test_classifier_with_ep():
    X, y = gpclab.make_three_gaussians(seed=0)
    with pytest.raises(ValueError, match="needs likelihood 'probit' or 'step'"):
        gpclab.GPClassifier(method="ep", likelihood="logistic").fit(X, y)
    m = gpclab.GPClassifier(method="ep").fit(X, y)
    assert m.likelihood_ == "probit" and m.kernel_ == "se"            # the defaults for EP
    v, g = m.log_marginal_likelihood(eval_gradient=True)
    assert v == pytest.approx(m.log_marginal_likelihood_)
    assert np.max(np.abs(g)) < 1e-3
    for dh in ([0.05, 0], [-0.05, 0], [0, 0.05], [0, -0.05]):
        assert m.log_marginal_likelihood(m.log_hyp_ + np.array(dh)) < v
    P = m.predict_proba(X)
    np.testing.assert_allclose(P.sum(1), 1)
    assert m.score(X, y) > 0.85
    # the grid agrees with the classifier at one point
    out = gpclab.evidence_grid(X, y, [m.log_hyp_[0]], [m.log_hyp_[1]], likelihood="probit",
                               method="ep", X_test=X, y_test=y, progress=False)
    assert out["log_q"][0, 0] == pytest.approx(v, abs=1e-7)
    assert out["information"][0, 0] == pytest.approx(gpclab.information_bits(P[:, 1], y, y), abs=1e-6)


def test_nonconvergence_warns_with_sweeps_and_change():
    X, y = gpclab.make_three_gaussians(seed=0)
    K = gpclab.kernel_matrix("se", X, X, np.log([2.6, 7.0]))
    res = gpclab.ep(K, y, None, None, 1e-9, 1)
    assert not res.converged and res.n_sweeps == 1
    with pytest.warns(RuntimeWarning, match=r"EP did not converge in 1 sweeps \(last relative change"):
        gpclab._warn_not_converged(res, "test")


@pytest.mark.parametrize("eps", [0.0, 0.05, 0.2])
@pytest.mark.parametrize("y_i,mu_cav,s2", [(1.0, 0.4, 2.0), (-1.0, 1.5, 0.3), (1.0, -3.0, 1.0)])
def test_step_site_update_equals_quadrature(eps, y_i, mu_cav, s2):
    """K&G's labelling-noise site (eqs. 10, 20-21): the new site matches the tilted moments by quadrature."""
    sd = math.sqrt(s2)
    lik = lambda f: eps + (1 - 2 * eps) * (y_i * f > 0)
    w = lambda f: norm.pdf(f, mu_cav, sd) * lik(f)
    pts = [0.0]
    Z = integrate.quad(w, mu_cav - 30 * sd, mu_cav + 30 * sd, points=pts, epsabs=1e-13)[0]
    m1 = integrate.quad(lambda f: f * w(f), mu_cav - 30 * sd, mu_cav + 30 * sd, points=pts, epsabs=1e-13)[0] / Z
    m2 = integrate.quad(lambda f: (f - m1) ** 2 * w(f), mu_cav - 30 * sd, mu_cav + 30 * sd, points=pts,
                        epsabs=1e-13)[0] / Z
    tau_new, nu_new = gpclab._site_update(y_i, 1 / s2, mu_cav / s2, 0.0, eps)
    if 1 / m2 - 1 / s2 >= 0:
        assert tau_new == pytest.approx(1 / m2 - 1 / s2, rel=1e-7, abs=1e-12)
        assert nu_new == pytest.approx(m1 / m2 - mu_cav / s2, rel=1e-7, abs=1e-12)
    else:  # tilted wider than the cavity: tau~ clipped to 0, the posterior mean still the tilted mean
        assert tau_new == 0.0
        assert nu_new == pytest.approx((m1 - mu_cav) / s2, rel=1e-7, abs=1e-12)


def test_step_likelihood_with_unit_noise_is_the_probit_model():
    """K&G: eps = 0 with latent noise theta2 = 1 in the prior is the probit model (exercise 3.10.1)."""
    X, y, K = _problem(2, n=15)
    probit = gpclab.ep(K, y, None, None, 1e-12, 200)
    step = gpclab.ep(K + np.eye(15), y, None, None, 1e-12, 200, "natural", 0, "step", 0.0)
    assert step.log_Z == pytest.approx(probit.log_Z, abs=1e-8)
    # sites on the noisy latent carry the unit noise in their variance: 1/tau_step = 1/tau_probit - 1
    np.testing.assert_allclose(1 / step.tau_tilde, 1 / probit.tau_tilde - 1, rtol=1e-6)
    # predictions agree: (3.63) for probit, P(f_* + e_* > 0) (K&G eq. 25) with k(x_*, x_*) + 1 for the step model
    Xs = np.random.default_rng(1).standard_normal((4, 2))
    Ks = naive.se_kernel(X, Xs, 0.0, np.log(2.0))
    kss = np.full(4, 4.05)
    p_probit, _, _ = gpclab.ep_predict(probit.nu_tilde, probit.tau_tilde, K, Ks, kss)
    p_step, g_bar, V = gpclab.ep_predict(step.nu_tilde, step.tau_tilde, K + np.eye(15), Ks, kss + 1,
                                         None, "step", 0.0)
    np.testing.assert_allclose(norm.cdf(g_bar / np.sqrt(V)), p_probit, rtol=1e-7)
    np.testing.assert_allclose(p_step, p_probit, rtol=1e-7)
    # K&G eq. 26: a test label that may itself be flipped with probability eps
    p_eps, _, _ = gpclab.ep_predict(step.nu_tilde, step.tau_tilde, K + np.eye(15), Ks, kss + 1,
                                    None, "step", 0.2)
    np.testing.assert_allclose(p_eps, 0.2 + 0.6 * p_probit, rtol=1e-7)
    with pytest.raises(ValueError, match="eps must be in \\[0, 0.5\\)"):
        gpclab.ep(K, y, None, None, 1e-9, 10, "natural", 0, "step", 0.7)
    # labelling noise on the probit site is the step site with eps on the noisy latent
    noisy_probit = gpclab.ep(K, y, None, None, 1e-12, 200, "natural", 0, "probit", 0.1)
    noisy_step = gpclab.ep(K + np.eye(15), y, None, None, 1e-12, 200, "natural", 0, "step", 0.1)
    assert noisy_probit.log_Z == pytest.approx(noisy_step.log_Z, abs=1e-8)
    assert noisy_probit.log_Z < probit.log_Z             # these labels are clean: noise lowers the evidence


def _tilted_moments(y_i, mu_cav, s2_cav, eps):
    """Mean and variance of N(f|mu_cav, s2_cav) (eps + (1 - 2 eps) H(y_i f)) by quadrature (K&G 10)."""
    sd = math.sqrt(s2_cav)
    lo, hi = mu_cav - 40 * sd, mu_cav + 40 * sd
    cuts = [lo, min(max(0.0, lo), hi), hi]  # the step at f = 0

    def moment(k, c):
        g = lambda f: (f - c) ** k * norm.pdf(f, mu_cav, sd) * (eps + (1 - 2 * eps) * (y_i * f > 0))
        return sum(integrate.quad(g, cuts[j], cuts[j + 1], epsabs=0, epsrel=1e-12, limit=200)[0]
                   for j in range(2))

    Z = moment(0, 0.0)
    m = mu_cav + moment(1, mu_cav) / Z
    return m, moment(2, m) / Z


@pytest.mark.parametrize("eps", [0.05, 0.15])
def test_step_ep_with_label_noise_is_at_a_fixed_point(eps):
    """K&G's likelihood with eps > 0 (not log-concave): sites clipped to tau~ = 0 still match the
    tilted mean; at convergence every posterior marginal has the tilted mean (and variance where
    tau~ > 0) by quadrature of the tilted distribution."""
    rng = np.random.default_rng(1)
    X = rng.uniform(-3, 3, (40, 1))
    y = np.where(np.sin(1.5 * X[:, 0]) > 0, 1.0, -1.0)
    y[rng.permutation(40)[:6]] *= -1                       # 15 % flipped labels
    K = naive.se_kernel(X, X, 0.0, 1.0) + 1e-6 * np.eye(40)
    res = gpclab.ep(K, y, None, None, 1e-12, 1000, "natural", 0, "step", eps)
    assert res.converged and res.n_skipped == 0 and np.isfinite(res.log_Z)
    assert np.sum(res.tau_tilde == 0) >= 3                 # the case that was wrong: clipped sites
    for i in range(40):
        tau_cav = 1 / res.Sigma[i, i] - res.tau_tilde[i]
        nu_cav = res.mu[i] / res.Sigma[i, i] - res.nu_tilde[i]
        m, v = _tilted_moments(y[i], nu_cav / tau_cav, 1 / tau_cav, eps)
        assert abs(res.mu[i] - m) < 1e-6 * math.sqrt(v), (i, res.mu[i], m)
        if res.tau_tilde[i] > 0:
            assert res.Sigma[i, i] == pytest.approx(v, rel=1e-6), i


def test_skipped_sites_are_reported():
    """A site whose cavity precision rounds to 0 is counted, log Z_EP is nan (no log1p of a negative
    number), and the evidence function warns."""
    X = np.array([[0.0], [5.0], [10.0]])
    y = np.array([1.0, -1.0, 1.0])
    K = gpclab.kernel_matrix("se", X, X, np.array([0.0, 0.0]))
    nu0, tau0 = np.zeros(3), np.array([1e20, 0.0, 0.0])   # 1/Sigma_11 - tau~_1 rounds to 0
    with np.errstate(invalid="raise"):
        res = gpclab.ep(K, y, nu0, tau0, 1e-9, 1)
    assert res.n_skipped == 1 and np.isnan(res.log_Z)
    with pytest.warns(RuntimeWarning, match="skipped 1 site"):
        gpclab.ep_evidence(X, y, np.array([0.0, 0.0]), sites=(nu0, tau0), eval_gradient=False)


@pytest.mark.parametrize("n_updates", [1, 47, 48, 49, 130])
def test_blocked_rank_one_update_equals_the_plain_one(n_updates):
    """ep's line 10 (_rank_one_update, with _current_column for the columns of the pending updates)
    against Sigma - c s s^T applied one at a time; both signs of c, across block boundaries."""
    rng = np.random.default_rng(n_updates)
    n = 20
    A = rng.standard_normal((n, n))
    Sigma0 = A @ A.T + n * np.eye(n)
    Sigma = Sigma0.copy()
    U, c, s = np.empty((48, n)), np.empty(48), np.empty(n)
    m = 0
    columns, coefficients = [], []
    for j in range(n_updates):
        i = int(rng.integers(n))
        gpclab._current_column(Sigma, U, c, m, i, s)       # column i of the current Sigma
        expected = naive.rank_one_updates(Sigma0, columns, coefficients)
        np.testing.assert_allclose(s, expected[:, i], rtol=1e-12, atol=1e-12 * n)
        ci = 0.1 * rng.standard_normal() / expected[i, i]
        columns.append(s.copy())
        coefficients.append(ci)
        m = gpclab._rank_one_update(Sigma, U, c, m, s, ci)
        assert m == (j + 1) % 48
    gpclab._apply_pending(Sigma, U, c, m)
    expected = naive.rank_one_updates(Sigma0, columns, coefficients)
    low = np.tril_indices(n)
    np.testing.assert_allclose(Sigma[low], expected[low], rtol=1e-12, atol=1e-12 * n)


@pytest.mark.parametrize("likelihood", ["probit", "step"])
def test_ep_on_a_zero_covariance_is_exact(likelihood):
    """K = 0: f = 0 and p(y|X) = (1/2)^n for both sites, as Laplace gives; a zero row adds log 1/2."""
    n = 7
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0])
    res = gpclab.ep(np.zeros((n, n)), y, likelihood=likelihood, eps=0.1 if likelihood == "step" else 0.0)
    assert res.converged and res.n_skipped == 0
    assert res.log_Z == pytest.approx(n * math.log(0.5), rel=1e-14)
    lap = gpclab.laplace_mode(np.zeros((n, n)), y, "probit")
    assert res.log_Z == pytest.approx(lap.log_q, rel=1e-12)
    # a case with no prior variance is independent of the rest and contributes its factor 1/2
    X, y2, K = _problem(3, n=12)
    K0 = np.zeros((13, 13))
    K0[:12, :12] = K if likelihood == "probit" else K + np.eye(12)
    y0 = np.append(y2, -1.0)
    full = gpclab.ep(K0[:12, :12], y2, likelihood=likelihood)
    part = gpclab.ep(K0, y0, likelihood=likelihood)
    assert part.converged and part.n_skipped == 0
    assert part.log_Z == pytest.approx(full.log_Z + math.log(0.5), abs=1e-9)


def test_multiclass_ep_on_a_zero_covariance_is_exact():
    """C = 0: every class ties at f = 0, p(y_i) = 1/J, n log(1/J) as multi-class Laplace gives."""
    n, J = 6, 3
    Y = gpclab.one_hot(np.arange(n) % J, J)
    res = gpclab.ep_multiclass(np.zeros((n, n)), Y)
    assert res.converged and res.n_skipped == 0
    assert res.log_Z == pytest.approx(n * math.log(1 / J), rel=1e-14)
    lap = gpclab.laplace_mode_multiclass(np.zeros((J, n, n)), Y)
    assert res.log_Z == pytest.approx(lap.log_q, rel=1e-12)


def test_step_ep_on_overlapping_classes_keeps_B_factorisable():
    """The book's three Gaussians (1-D, classes interleaved near x = 1) with a smooth SE kernel: the
    noise-free step sites ask for precisions that grow a hundredfold a sweep (f must change sign
    between inputs 0.003 apart), until B = I + S~^1/2 K S~^1/2 lost its Cholesky factor to K's
    rounding. With tau~ <= 1 / (sqrt(u) max K_ii) EP runs, and GPClassifier fits."""
    X, y = gpclab.make_three_gaussians(seed=0)
    K = gpclab.kernel_matrix("se", X, X, [0.8228497, 0.69314718])
    tau_max = 1 / (math.sqrt(2.0 ** -53) * K.diagonal().max())
    res = gpclab.ep(K, y, max_sweeps=20, likelihood="step")
    assert np.isfinite(res.log_Z) and res.n_skipped == 0
    assert res.tau_tilde.max() == pytest.approx(tau_max, rel=1e-12)      # the bound is reached
    assert np.all(res.tau_tilde <= tau_max)
    for seed in (0, 2):
        X, y = gpclab.make_three_gaussians(seed=seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)          # EP may not converge there: it says so
            clf = gpclab.GPClassifier(method="ep", likelihood="step").fit(X, y)
        assert np.isfinite(clf.log_marginal_likelihood_)
        assert (clf.predict(X) == y).mean() > 0.9
