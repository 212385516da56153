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
        log_Z, log_w, se, _, _ = gpclab.ais(K, y, "probit", 10000, 8, 0.1, 20, trial)
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
    for bad in (np.linspace(0, 1, 5), np.linspace(0.1, 1, 11), np.array([0, 0.5, 0.3, 0.6, 0.7, 0.8, 0.9, 0.9, 0.9, 0.9, 1])):
        with pytest.raises(ValueError, match="ais: schedule must have T \\+ 1 increasing temperatures from 0 to 1"):
            gpclab.ais(K, y, "probit", 10, 2, 0.1, 5, 0, bad)
    lz, _, _, _, _ = gpclab.ais(K, y, "probit", 4, 2, 0.1, 5, 0, np.linspace(0, 1, 5))  # any increasing schedule
    assert np.isfinite(lz)


def _hmc_moments(K, y, lik, seed=0):
    F, acc, _ = gpclab.hmc_latent(K, y, lik, 20000, 0.3, 10, seed, 500, 2)
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
    F, acc, _ = gpclab.hmc_latent(K, y, "logistic", 20000, 0.5, 5, 1, 100, 1, 0.0)
    assert acc > 0.95
    assert np.all(np.abs(F.mean(0)) < 4 * np.sqrt(np.diag(K) / 2000))
    np.testing.assert_allclose(np.cov(F.T), K, atol=0.1 * np.abs(K).max())
    F2, _, _ = gpclab.hmc_latent(K, y, "logistic", 100, 0.5, 5, 1, 100, 1, 0.0)
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
    with pytest.raises(ValueError, match="x0 must contain only values >= 0"):
        gpclab.truncated_gaussian_gibbs(np.eye(2), 10, 0, np.array([1.0, -1.0]))
    with pytest.raises(ValueError, match="T must be a positive integer"):
        gpclab.ais(np.eye(2), np.ones(2), "probit", 0)


def test_mcmc_predict_equals_a_direct_monte_carlo_average():
    """Rao-Blackwellised predictions against drawing f_* | f and averaging Phi(f_*) directly."""
    rng = np.random.default_rng(2)
    X = rng.standard_normal((6, 2))
    Xs = rng.standard_normal((3, 2))
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0])
    h = np.array([0.0, 0.7])
    K = gpclab.kernel_matrix("se", X, X, h)
    Ks = gpclab.kernel_matrix("se", X, Xs, h)
    kss = gpclab.kernel_diag("se", Xs, h)
    F, _, _ = gpclab.hmc_latent(K, y, "probit", 400, 0.3, 10, 0, 100, 1)
    p, means = gpclab.mcmc_predict(F, K, "probit", Ks, kss)
    mean_ref = F @ np.linalg.solve(K, Ks)
    np.testing.assert_allclose(means, mean_ref, rtol=1e-8, atol=1e-10)
    var = kss - np.einsum("ij,ij->j", Ks, np.linalg.solve(K, Ks))
    draws = mean_ref[:, None, :] + np.sqrt(var) * rng.standard_normal((400, 2000, 3))
    direct = norm.cdf(draws).mean(axis=(0, 1))
    np.testing.assert_allclose(p, direct, atol=0.01)
    np.testing.assert_allclose(p, norm.cdf(mean_ref / np.sqrt(1 + var)).mean(0), rtol=1e-12)


def test_hmc_over_hyperparameters_samples_the_right_posterior():
    """The chain's mean and sd match the posterior q(y|theta) p(theta) evaluated on a fine grid."""
    X, y = gpclab.make_three_gaussians(seed=0)
    out = gpclab.hmc_hyperparameters(X, y, "se", "logistic", [1.0, 1.0], n_iter=3000, n_leapfrog=10,
                                     step=0.15, prior=(-3.0, 3.0), seed=2)
    assert out["samples"].shape == (3000, 2) and 0.5 < out["acceptance"] <= 1.0
    le = np.linspace(-2, 4, 121)
    ls = np.linspace(-1, 5, 121)
    grid = gpclab.evidence_grid(X, y, le, ls, progress=False)["log_q"]
    logp = grid - 0.5 * ((le[None, :] + 3) / 3) ** 2 - 0.5 * ((ls[:, None] + 3) / 3) ** 2
    w = np.exp(logp - logp.max())
    w /= w.sum()
    assert w[0].sum() + w[-1].sum() + w[:, 0].sum() + w[:, -1].sum() < 1e-3  # the grid holds the posterior
    m = np.array([(w * le[None, :]).sum(), (w * ls[:, None]).sum()])
    sd = np.sqrt([(w * (le[None, :] - m[0]) ** 2).sum(), (w * (ls[:, None] - m[1]) ** 2).sum()])
    s = out["samples"][500:]
    np.testing.assert_allclose(s.mean(0), m, atol=0.1)
    np.testing.assert_allclose(s.std(0), sd, rtol=0.1)


def test_predict_averaged_is_the_mean_of_laplace_predictions():
    X, y = gpclab.make_three_gaussians(seed=1)
    Xs = np.linspace(-8, 4, 7)[:, None]
    S = np.array([[0.5, 1.0], [1.0, 2.0], [0.8, 1.5]])
    p = gpclab.predict_averaged(X, y, Xs, S, "se", "logistic")
    ref = np.mean([gpclab.GPClassifier(log_hyp=h, optimize=False).fit(X, y).predict_proba(Xs)[:, 1] for h in S], axis=0)
    np.testing.assert_allclose(p, ref, rtol=1e-12)


def test_mcmc_posterior_and_ais_grid():
    X, y = gpclab.make_three_gaussians(seed=2)
    X, y = X[::4], y[::4]
    out = gpclab.mcmc_posterior(X, y, [1.0, 1.0], X_test=np.array([[-6.0], [0.0]]), n_samples=3000, step=0.3)
    assert out["F"].shape == (3000, 15) and out["acceptance"] > 0.5
    assert out["p_test"][0] > 0.7 and out["p_test"][1] < 0.3
    ep = gpclab.GPClassifier(likelihood="probit", method="ep", log_hyp=[1.0, 1.0], optimize=False).fit(X, y)
    np.testing.assert_allclose(out["F"].mean(0), ep.result_.mu, atol=0.25)  # EP's mean is close to the truth
    g = gpclab.ais_grid(X, y, [1.0], [0.0, 1.0], T=2000, R=4, step=0.2, progress=False)
    for i, ls in enumerate([0.0, 1.0]):
        K = gpclab.kernel_matrix("se", X, X, np.array([1.0, ls])) + 1e-8 * np.exp(2 * ls) * np.eye(15)
        exact = gpclab.exact_log_evidence_probit(K, np.where(y > 0, 1.0, -1.0))
        assert abs(g["log_Z"][i, 0] - exact) < max(4 * g["se"][i, 0], 0.05)


def test_autocorrelation_time_of_an_ar1_process():
    """For x_t = phi x_t-1 + e_t the integrated autocorrelation time is (1 + phi) / (1 - phi)."""
    rng = np.random.default_rng(0)
    for phi in (0.0, 0.5, 0.9):
        e = rng.standard_normal(200_000)
        x = np.empty_like(e)
        x[0] = e[0]
        for t in range(1, e.size):
            x[t] = phi * x[t - 1] + e[t]
        assert gpclab.autocorrelation_time(x) == pytest.approx((1 + phi) / (1 - phi), rel=0.1)


def test_gibbs_mixes_faster_than_metropolis_hastings():
    """The Gibbs option earns its place: far shorter autocorrelation on a correlated truncated Gaussian."""
    C = np.array([[1.0, 0.8], [0.8, 1.0]])
    G = gpclab.truncated_gaussian_gibbs(C, 40000, 0)[4000:]
    tau_mh = min(gpclab.autocorrelation_time(gpclab.truncated_gaussian_mh(C, 40000, s, 0)[0][4000:, 0])
                 for s in (0.4, 0.8, 1.6))
    assert gpclab.autocorrelation_time(G[:, 0]) < tau_mh / 3


# --- defaults that mix, diagnostics, non-finite proposals ---------------------------

def _crabs_like(n=40, log_sf=3.0, seed=0):
    X, y = gpclab.make_three_gaussians(seed=seed)
    idx = np.random.default_rng(seed).choice(len(y), n, replace=False)
    X, y = X[idx], np.where(y[idx] == np.unique(y)[1], 1.0, -1.0)
    return X, y, gpclab.kernel_matrix("se", X, X, np.array([0.5, log_sf]))


def test_hmc_rejects_non_finite_proposals():
    """Step 5 with 400 leapfrog steps diverges: every such proposal is rejected, the chain stays finite."""
    _, y, K = _crabs_like()
    F, acc, _ = gpclab.hmc_latent(K, y, "probit", 30, 5.0, 400, 0)
    assert np.all(np.isfinite(F)) and acc < 0.2
    lz, _, _, acc_ais, _ = gpclab.ais(K, y, "probit", 50, 2, 5.0, 400, 0)
    assert np.isfinite(lz) and acc_ais < 0.5


def test_default_step_mixes_at_a_typical_signal_variance():
    """log sf = 3: the default step moves the chain (step 0.1 froze it), the acceptance is a real
    rate, and ess equals n_samples over the largest autocorrelation time computed by FFT."""
    _, y, K = _crabs_like()
    F, acc, ess = gpclab.hmc_latent(K, y, "probit", 400, seed=1, burn_in=100)
    assert 0.3 < acc < 0.995
    assert len(np.unique(F[:, 0])) > 300
    ref = 400 / max(gpclab.autocorrelation_time(F[:, i]) for i in range(F.shape[1]))
    assert ess == pytest.approx(ref, rel=1e-8) and ess > 40
    _, acc_old, ess_old = gpclab.hmc_latent(K, y, "probit", 400, 0.1, 10, 1, 100)
    assert acc_old < 0.05 and ess_old < 10


def test_acceptance_outside_the_healthy_range_warns():
    X, y, _ = _crabs_like(n=15)
    with pytest.warns(RuntimeWarning, match="below 0.3"):
        gpclab.mcmc_posterior(X, y, [0.5, 3.0], n_samples=50, step=0.5, n_leapfrog=10, burn_in=0)
    with pytest.warns(RuntimeWarning, match="above 0.995"):
        gpclab.mcmc_posterior(X, y, [0.5, 3.0], n_samples=50, step=1e-4, n_leapfrog=2, burn_in=0)


def test_ais_with_near_duplicate_inputs_matches_the_exact_evidence():
    """Duplicated inputs make K singular; AIS uses the module's jitter and still matches the
    orthant probability (which needs only K + I)."""
    rng = np.random.default_rng(4)
    X = rng.standard_normal((5, 2))
    X = np.vstack([X, X[:3] + 1e-9])
    y = np.array([1.0, -1.0, 1.0, 1.0, -1.0, 1.0, -1.0, 1.0])
    K = gpclab.kernel_matrix("se", X, X, np.array([0.0, 1.0]))
    with pytest.raises(np.linalg.LinAlgError):
        np.linalg.cholesky(K)
    exact = gpclab.exact_log_evidence_probit(K, y)
    log_Z, _, se, acc, ess = gpclab.ais(K, y, "probit", 3000, 4, seed=0)
    assert abs(log_Z - exact) < max(3 * se, 0.1), (log_Z, exact, se)
    assert 0.3 < acc < 0.995 and 1.0 <= ess <= 4.0


def test_elliptical_slice_sampling_matches_quadrature():
    """n = 2, probit, opposite labels at a large signal variance: the posterior mean and covariance
    by 2-D quadrature on a fine grid, against elliptical slice samples (the Monte Carlo error is judged
    with the sampler's own effective sample size)."""
    K = np.array([[25.0, 15.0], [15.0, 25.0]])
    y = np.array([1.0, -1.0])
    F, evaluations, ess = gpclab.elliptical_slice_latent(K, y, "probit", 40000, seed=3, burn_in=500)
    g = np.linspace(-30, 30, 1201)
    A, B = np.meshgrid(g, g, indexing="ij")
    Kinv = np.linalg.inv(K)
    logd = (-0.5 * (Kinv[0, 0] * A ** 2 + 2 * Kinv[0, 1] * A * B + Kinv[1, 1] * B ** 2)
            + norm.logcdf(A) + norm.logcdf(-B))
    w = np.exp(logd - logd.max())
    w /= w.sum()
    m = np.array([(w * A).sum(), (w * B).sum()])
    cov = np.array([[(w * (A - m[0]) ** 2).sum(), (w * (A - m[0]) * (B - m[1])).sum()],
                    [(w * (A - m[0]) * (B - m[1])).sum(), (w * (B - m[1]) ** 2).sum()]])
    assert ess > 1000 and 1.0 <= evaluations < 10.0
    se = np.sqrt(np.diag(cov) / ess)
    np.testing.assert_array_less(np.abs(F.mean(axis=0) - m), 4 * se)
    np.testing.assert_allclose(np.cov(F.T), cov, rtol=0.1, atol=0.1 * np.sqrt(cov[0, 0] * cov[1, 1]))
    # the same seed gives the same chain; another seed another
    F2 = gpclab.elliptical_slice_latent(K, y, "probit", 50, seed=3, burn_in=500)[0]
    np.testing.assert_array_equal(F2, F[:50])
    assert not np.array_equal(F2, gpclab.elliptical_slice_latent(K, y, "probit", 50, seed=4, burn_in=500)[0])


def test_mcmc_posterior_with_elliptical_slice_sampling_refuses_a_step():
    X, y = np.linspace(-2, 2, 6)[:, None], np.array([-1.0, -1, -1, 1, 1, 1])
    out = gpclab.mcmc_posterior(X, y, [0.0, 0.0], X_test=X, n_samples=20, burn_in=5, sampler="elliptical")
    assert out["F"].shape == (20, 6) and out["evaluations"] >= 1.0 and out["p_test"].shape == (6,)
    with pytest.raises(ValueError, match="step and n_leapfrog are for sampler 'hmc'"):
        gpclab.mcmc_posterior(X, y, [0.0, 0.0], n_samples=20, step=0.1, sampler="elliptical")
    with pytest.raises(ValueError, match="sampler must be one of"):
        gpclab.mcmc_posterior(X, y, [0.0, 0.0], n_samples=20, sampler="slice")



@pytest.mark.parametrize("log_sf", [22.0, 100.0, 299.0])
def test_automatic_step_at_any_signal_variance(log_sf):
    """sf^2 = e^44 ~ 1e19 ... e^598: the automatic leapfrog step 1.5 / sqrt(1 + w lambda_max) is tiny, and
    its number of steps min(50, ceil(1.5 / step)) = 50, where ceil(1.5 / step) alone overflows int64."""
    X = np.linspace(-1, 1, 6).reshape(-1, 1)
    y = np.array([1.0, 1.0, -1.0, 1.0, -1.0, -1.0])
    K = gpclab.kernel_matrix("se", X, X, [0.0, log_sf])
    lam = np.linalg.eigvalsh(K)[-1]
    step, n_lf = gpclab.hmc_step_size(K, "probit")
    assert n_lf == 50 and step == pytest.approx(1.5 / math.sqrt(1 + lam), rel=1e-12)
    F, acc, _ = gpclab.hmc_latent(K, y, "probit", 5)
    assert np.all(np.isfinite(F)) and 0 <= acc <= 1
    log_Z, log_w, _, acc, _ = gpclab.ais(K, y, "probit", T=20, R=2)
    assert np.isfinite(log_Z) and np.all(np.isfinite(log_w))


def test_ais_serial_path_gives_the_parallel_result():
    """A block whose leapfrog work is above _AIS_SERIAL_WORK runs the runs one after the other in the
    calling thread (which sees Ctrl-C); the random numbers, and so the result, are the same."""
    X = np.linspace(-1, 1, 12).reshape(-1, 1)
    y = np.where(X[:, 0] > 0.1, 1.0, -1.0)
    K = gpclab.kernel_matrix("se", X, X, [0.0, 0.0])
    T, R, n_lf = 40, 3, 7
    tau = (np.arange(T + 1) / T) ** 4
    L = np.linalg.cholesky(K + 1e-8 * np.eye(12))
    steps, n_lfs = np.full(T + 1, 0.2), np.full(T + 1, n_lf)
    results = []
    for serial in (False, True):
        g = np.random.default_rng(0).standard_normal((R, 12))
        f = g @ L.T
        ll = np.array([gpclab.log_likelihood("probit", y, fr)[0].sum() for fr in f])
        log_w, n_acc = np.zeros(R), np.zeros(R)
        for t0 in range(1, T + 1, 32):
            if serial:
                for r in range(R):
                    gpclab._ais_run(L, y, "probit", tau, t0, min(t0 + 32, T + 1), g, ll, log_w, n_acc, steps,
                                    n_lfs, 5, r, True)
            else:
                gpclab._ais_temperatures(L, y, "probit", tau, t0, min(t0 + 32, T + 1), g, ll, log_w, n_acc,
                                         steps, n_lfs, 5, False)
        results.append((g.copy(), log_w.copy(), n_acc.copy()))
    for a, b in zip(*results):
        np.testing.assert_array_equal(a, b)
