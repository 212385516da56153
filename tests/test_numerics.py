"""Section 1 and 3: special functions, solves, quadrature and likelihoods against references."""
import math

import mpmath
import numpy as np
import pytest
import scipy.linalg as sl
from scipy import integrate, special

import gpclab

mpmath.mp.dps = 50
ZS = np.concatenate([-np.logspace(3, -3, 200), [0.0], np.logspace(-3, 3, 200),
                     [-38.5, -37.0, -5.0, -5.0000001, -4.9999999, 5.0]])


def mp_log_phi(z):
    z = mpmath.mpf(z)
    if z > 0:  # log(1 - Phi(-z)): 1 - eps needs more digits than dps for z > 10
        return float(mpmath.log1p(-mpmath.ncdf(-z)))
    return float(mpmath.log(mpmath.ncdf(z)))


def mp_n_over_phi(z):
    z = mpmath.mpf(z)
    return float(mpmath.npdf(z) / mpmath.ncdf(z))


def test_log_phi_matches_high_precision_over_whole_range():
    """log Phi has relative error <= 1e-12 on [-1e3, 1e3], tails included."""
    for z in ZS:
        ref = mp_log_phi(z)
        got = gpclab.log_phi(z)
        assert abs(got - ref) <= 1e-12 * abs(ref) + 1e-300, (z, got, ref)


def test_log_phi_tails_equal_scipy():
    for z in [-1e3, -300.0, -40.0, -10.0, -5.5, 8.0, 30.0]:
        assert gpclab.log_phi(z) == pytest.approx(special.log_ndtr(z), rel=1e-12, abs=1e-300)


def test_n_over_phi_matches_high_precision():
    for z in ZS:
        ref = mp_n_over_phi(z)
        got = gpclab.n_over_phi(z)
        assert abs(got - ref) <= 1e-12 * abs(ref) + 1e-300, (z, got, ref)


def test_triangular_solves_equal_scipy(rng):
    n = 40
    A = rng.standard_normal((n, n))
    L = np.linalg.cholesky(A @ A.T + n * np.eye(n))
    b = rng.standard_normal(n)
    B = rng.standard_normal((n, 7))
    np.testing.assert_allclose(gpclab.solve_lower(L, b), sl.solve_triangular(L, b, lower=True), rtol=1e-12)
    np.testing.assert_allclose(gpclab.solve_lower_transpose(L, b),
                               sl.solve_triangular(L.T, b, lower=False), rtol=1e-12)
    np.testing.assert_allclose(gpclab.solve_lower_matrix(L, B), sl.solve_triangular(L, B, lower=True),
                               rtol=1e-12, atol=1e-14)
    np.testing.assert_allclose(gpclab.cholesky_inverse(L), np.linalg.inv(L @ L.T), rtol=1e-10, atol=1e-14)
    K = A @ A.T
    V = rng.standard_normal((n - 3, n))
    np.testing.assert_allclose(gpclab.minus_gram(K, V), K - V.T @ V, rtol=1e-12, atol=1e-12)


def _ref_logistic_gauss(mu, var):
    s = math.sqrt(var)
    f = lambda z: special.expit(z) * math.exp(-0.5 * ((z - mu) / s) ** 2) / (s * math.sqrt(2 * math.pi))
    # integrate piecewise, with breaks at 0 (the sigmoid's transition) and mu
    edges = sorted({mu - 40 * s, mu + 40 * s, min(max(0.0, mu - 40 * s), mu + 40 * s), mu})
    edges += [e for e in (-30.0, 30.0) if edges[0] < e < edges[-1]]
    edges = sorted(set(edges))
    return sum(integrate.quad(f, a, b, epsabs=1e-14, epsrel=1e-13, limit=500)[0]
               for a, b in zip(edges[:-1], edges[1:]))


@pytest.mark.parametrize("mu", [-40.0, -6.0, -1.0, -0.2, 0.0, 0.5, 3.0, 25.0])
@pytest.mark.parametrize("sd", [1e-3, 0.2, 1.0, 1.99, 2.01, 4.0, 15.0, 60.0])
def test_logistic_gaussian_integral_against_quadrature(mu, sd):
    """The averaged logistic prediction (3.25) is accurate to 1e-6 (measured: 1e-9)."""
    got = gpclab.logistic_gaussian_integral(mu, sd * sd)
    assert got == pytest.approx(_ref_logistic_gauss(mu, sd * sd), abs=1e-9)


def test_logistic_gaussian_integral_symmetry_at_huge_variance():
    """E[lambda(f)] = 1/2 exactly at mu = 0 and lambda(-f) = 1 - lambda(f) for any variance."""
    assert gpclab.logistic_gaussian_integral(0.0, 1e8) == pytest.approx(0.5, abs=1e-12)
    for mu, var in [(3.0, 1e6), (0.7, 50.0)]:
        s = gpclab.logistic_gaussian_integral(mu, var) + gpclab.logistic_gaussian_integral(-mu, var)
        assert s == pytest.approx(1.0, abs=1e-12)


@pytest.mark.parametrize("lik", ["logistic", "probit"])
def test_likelihood_derivatives_equal_finite_differences(lik):
    f = np.array([-30.0, -7.0, -2.0, -0.3, 0.0, 0.4, 1.5, 6.0, 25.0])
    for yv in (1.0, -1.0):
        y = np.full(f.shape, yv)
        lp, d1, d2, d3 = gpclab.log_likelihood(lik, y, f)
        h = 1e-5
        out = [gpclab.log_likelihood(lik, y, f + s * h) for s in (-1, 1)]
        np.testing.assert_allclose(d1, (out[1][0] - out[0][0]) / (2 * h), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(d2, (out[1][1] - out[0][1]) / (2 * h), rtol=1e-6, atol=1e-9)
        np.testing.assert_allclose(d3, (out[1][2] - out[0][2]) / (2 * h), rtol=1e-5, atol=1e-9)


def test_likelihood_values_equal_scipy():
    f = np.linspace(-50, 50, 101)
    y = np.where(np.arange(101) % 2 == 0, 1.0, -1.0)
    np.testing.assert_allclose(gpclab.logistic(y, f)[0], -np.logaddexp(0, -y * f), rtol=1e-13)
    np.testing.assert_allclose(gpclab.probit(y, f)[0], special.log_ndtr(y * f), rtol=1e-12, atol=1e-300)


@pytest.mark.parametrize("lik", ["logistic", "probit"])
def test_likelihood_finite_at_extreme_latents(lik):
    f = np.array([-1e3, -500.0, -40.0, 40.0, 500.0, 1e3])
    for yv in (1.0, -1.0):
        out = gpclab.log_likelihood(lik, np.full(6, yv), f)
        for arr in out:
            assert np.all(np.isfinite(arr))
        assert np.all(out[2] <= 0)  # log-concave: W >= 0


def test_probit_derivatives_in_far_tail_match_high_precision():
    """At z = y f = -1e3 the first two derivatives keep full relative accuracy."""
    z = -1e3
    r = mp_n_over_phi(z)
    _, d1, d2, _ = gpclab.probit(np.array([1.0]), np.array([z]))
    assert d1[0] == pytest.approx(r, rel=1e-13)
    zz = mpmath.mpf(z)
    rr = mpmath.npdf(zz) / mpmath.ncdf(zz)
    assert d2[0] == pytest.approx(float(-rr * (rr + zz)), rel=1e-10)


def test_bad_likelihood_name_raises():
    with pytest.raises(ValueError, match="likelihood"):
        gpclab.log_likelihood("cauchit", np.ones(2), np.zeros(2))
