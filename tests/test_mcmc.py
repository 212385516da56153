"""Section 7: HMC on whitened latents, annealed importance sampling, truncated Gaussians."""
import math

import numba
import numpy as np
import pytest
from scipy import integrate
from scipy.stats import norm

import gpclab


def test_ais_matches_the_exact_probit_evidence():
    """K&R Algorithm 3 against the orthant probability: within 3 standard errors and 0.1 nats."""
    rng = np.random.default_rng(7)
    for trial in range(8):
        n = int(rng.integers(5, 16))
        X = rng.standard_normal((n, 2))
        y = np.where(rng.uniform(size=n) < 0.5, 1.0, -1.0)
        h = np.array([rng.uniform(-1, 1), rng.uniform(0, 2.5)])
        K = gpclab.kernel_matrix("se", X, X, h) + 1e-8 * np.eye(n)
        exact = gpclab.exact_log_evidence_probit(K, y)
        log_Z, log_w, se = gpclab.ais(K, y, "probit", 10000, 8, 0.1, 20, trial)
        assert log_w.shape == (8,) and se > 0
        assert abs(log_Z - exact) < 3 * se, (trial, log_Z, exact, se)
        assert abs(log_Z - exact) < 0.1, (trial, log_Z, exact)


def test_ais_is_reproducible_whatever_the_thread_count():
    rng = np.random.default_rng(1)
    X = rng.standard_normal((6, 2))
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    K = gpclab.kernel_matrix("se", X, X, np.array([0.0, 1.0]))
    out = []
    for threads in (1, numba.config.NUMBA_NUM_THREADS):
        numba.set_num_threads(threads)
        out.append(gpclab.ais(K, y, "logistic", 300, 3, 0.2, 5, 11)[1])
    numba.set_num_threads(numba.config.NUMBA_NUM_THREADS)
    np.testing.assert_array_equal(out[0], out[1])
    assert not np.array_equal(out[0], gpclab.ais(K, y, "logistic", 300, 3, 0.2, 5, 12)[1])


def test_ais_schedule_is_checked():
    K, y = np.eye(2), np.array([1.0, -1.0])
    with pytest.raises(ValueError, match="T \\+ 1 temperatures"):
        gpclab.ais(K, y, "probit", 10, 2, 0.1, 5, 0, np.linspace(0, 1, 5))
    with pytest.raises(ValueError, match="start at 0 and end at 1"):
        gpclab.ais(K, y, "probit", 4, 2, 0.1, 5, 0, np.linspace(0.1, 1, 5))
    with pytest.raises(ValueError, match="increasing"):
        gpclab.ais(K, y, "probit", 4, 2, 0.1, 5, 0, np.array([0.0, 0.5, 0.3, 0.9, 1.0]))
    lz, _, _ = gpclab.ais(K, y, "probit", 4, 2, 0.1, 5, 0, np.linspace(0, 1, 5))  # any increasing schedule
    assert np.isfinite(lz)


def _hmc_moments(K, y, lik, seed=0):
    F, acc = gpclab.hmc_latent(K, y, lik, 20000, 0.3, 10, seed, 500, 2)
    return F, acc


def test_hmc_one_point_matches_quadrature():
    """n = 1: the posterior N(f|0, 4) Phi(f) has its mean and variance by quadrature."""
    K = np.array([[4.0]])
    F, acc = _hmc_moments(K, np.array([1.0]), "probit")
    dens = lambda f: norm.pdf(f, 0, 2) * norm.cdf(f)
    Z = integrate.quad(dens, -30, 30)[0]
    m = integrate.quad(lambda f: f * dens(f), -30, 30)[0] / Z
    v = integrate.quad(lambda f: (f - m) ** 2 * dens(f), -30, 30)[0] / Z
    assert 0.6 < acc <= 1.0
    se = math.sqrt(v / 2000)  # 20000 correlated samples: at least 2000 effective, conservatively
    assert abs(F[:, 0].mean() - m) < 4 * se
    assert abs(F[:, 0].var() - v) < 0.05 * v


def test_hmc_two_points_match_quadrature():
    K = np.array([[2.0, 1.2], [1.2, 1.5]])
    y = np.array([1.0, -1.0])
    F, acc = _hmc_moments(K, y, "logistic", seed=3)
    Ki = np.linalg.inv(K)
    dens = lambda f2, f1: (math.exp(-0.5 * np.array([f1, f2]) @ Ki @ np.array([f1, f2]))
                           / (1 + math.exp(-f1)) / (1 + math.exp(f2)))
    lim = (-12, 12)
    Z = integrate.dblquad(dens, *lim, *lim)[0]
    for i in range(2):
        fi = (lambda f2, f1: f1) if i == 0 else (lambda f2, f1: f2)
        m = integrate.dblquad(lambda f2, f1: fi(f2, f1) * dens(f2, f1), *lim, *lim)[0] / Z
        v = integrate.dblquad(lambda f2, f1: (fi(f2, f1) - m) ** 2 * dens(f2, f1), *lim, *lim)[0] / Z
        assert abs(F[:, i].mean() - m) < 4 * math.sqrt(v / 2000)
        assert abs(F[:, i].var() - v) < 0.06 * v


def test_hmc_leaves_a_gaussian_invariant_and_reproduces_with_a_seed():
    """At tau = 0 the target is the prior N(0, K): sample mean 0 and covariance K."""
    r = np.random.default_rng(0)
    A = r.standard_normal((3, 3))
    K = A @ A.T + np.eye(3)
    y = np.ones(3)
    F, acc = gpclab.hmc_latent(K, y, "logistic", 20000, 0.5, 5, 1, 100, 1, 0.0)
    assert acc > 0.95
    assert np.all(np.abs(F.mean(0)) < 4 * np.sqrt(np.diag(K) / 2000))
    np.testing.assert_allclose(np.cov(F.T), K, atol=0.1 * np.abs(K).max())
    F2, _ = gpclab.hmc_latent(K, y, "logistic", 100, 0.5, 5, 1, 100, 1, 0.0)
    np.testing.assert_array_equal(F2, F[:100])


def _truncated_bivariate_moments(C):
    """Mean and variance of x1 for N(0, C) truncated to x >= 0, by numerical integration of
    the marginal p(x1) ~ N(x1|0, C11) Phi(mu_2|1 / sigma_2|1) (K&R Figure 2(b))."""
    s21 = C[1, 0] / C[0, 0]
    sd = math.sqrt(C[1, 1] - C[1, 0] ** 2 / C[0, 0])
    marg = lambda x: norm.pdf(x, 0, math.sqrt(C[0, 0])) * norm.cdf(s21 * x / sd)
    Z = integrate.quad(marg, 0, 40)[0]
    m = integrate.quad(lambda x: x * marg(x), 0, 40)[0] / Z
    v = integrate.quad(lambda x: (x - m) ** 2 * marg(x), 0, 40)[0] / Z
    return m, v


@pytest.mark.parametrize("rho", [-0.8, 0.0, 0.9])
def test_truncated_gaussian_samplers_match_the_exact_marginal(rho):
    C = np.array([[1.0, rho * 1.5], [rho * 1.5, 2.25]])
    m, v = _truncated_bivariate_moments(C)
    G = gpclab.truncated_gaussian_gibbs(C, 40000, 0)
    M, acc = gpclab.truncated_gaussian_mh(C, 40000, 0.8, 0, None, 5)
    assert 0.1 < acc < 0.9
    for S in (G, M):
        assert np.all(S >= 0)
        assert abs(S[:, 0].mean() - m) < 4 * math.sqrt(v / 4000)
        assert abs(S[:, 0].var() - v) < 0.08 * v


def test_truncnorm_tail_draws():
    """The one-sided truncated normal sampler against the exact mean N(a)/(1 - Phi(a)), deep in the tail."""
    from numba import njit

    @njit
    def draws(a, n, seed):
        np.random.seed(seed)
        out = np.empty(n)
        for i in range(n):
            out[i] = gpclab._truncnorm_lower(a)
        return out

    for a in (-1.0, 0.3, 2.0, 8.0):
        z = draws(a, 50000, 4)
        exact = norm.pdf(a) / norm.sf(a)
        assert np.all(z >= a)
        assert abs(z.mean() - exact) < 4 * z.std() / math.sqrt(50000)


def test_mcmc_bad_input():
    with pytest.raises(ValueError, match="n_samples"):
        gpclab.hmc_latent(np.eye(2), np.ones(2), "probit", 0)
    with pytest.raises(ValueError, match="x0 must lie"):
        gpclab.truncated_gaussian_gibbs(np.eye(2), 10, 0, np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="T and R"):
        gpclab.ais(np.eye(2), np.ones(2), "probit", 0)
