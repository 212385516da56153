"""Section 3.5: multi-class Laplace (Algorithms 3.3, 3.4) and its gradient."""
import numpy as np
import pytest

import gpclab
import naive


def _problem(seed, C, n=10, d=2, jitter=0.1, per_class=True):
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, d))
    labels = np.argmax(X @ r.standard_normal((d, C)) + 0.5 * r.standard_normal((n, C)), axis=1)
    y = np.zeros((C, n))
    y[labels, np.arange(n)] = 1.0
    h = np.column_stack([r.uniform(-0.5, 0.5, C), r.uniform(0.0, 1.0, C)]) if per_class else np.tile([0.0, 0.5], (C, 1))
    K = np.stack([gpclab.kernel_matrix("se", X, X, h[c]) + jitter * np.eye(n) for c in range(C)])
    return X, y, h, K


@pytest.mark.parametrize("C", [3, 6])
@pytest.mark.parametrize("seed", [0, 1])
def test_mode_and_log_q_equal_naive_dense(C, seed):
    """Against Cn x Cn matrices built explicitly (3.38, 3.39, 3.44): f_hat and log q to 1e-8."""
    X, y, h, K = _problem(seed, C)
    res = gpclab.laplace_mode_multiclass(K, y)
    assert res.converged
    f_ref = naive.multiclass_mode(K, y)
    np.testing.assert_allclose(res.f_hat, f_ref, rtol=1e-8, atol=1e-10)
    assert res.log_q == pytest.approx(naive.multiclass_log_q(K, y, f_ref), rel=1e-8, abs=1e-10)


def test_mode_satisfies_f_equals_K_times_y_minus_pi():
    """At the mode f_hat^c = K_c (y^c - pi^c) (3.36, 3.41)."""
    X, y, h, K = _problem(2, 4, n=40, jitter=0.0)
    res = gpclab.laplace_mode_multiclass(K, y)
    pi = gpclab.softmax(res.f_hat)
    for c in range(4):
        np.testing.assert_allclose(res.f_hat[c], K[c] @ (y[c] - pi[c]), rtol=1e-7, atol=1e-9)


def test_W_is_positive_semidefinite_with_ones_in_its_null_space():
    """Exercise 3.10.2: W = diag(pi) - Pi Pi^T is PSD, not PD: the ones vector of each case is a null vector."""
    r = np.random.default_rng(3)
    C, n = 5, 4
    pi = gpclab.softmax(r.standard_normal((C, n)) * 2)
    W = naive.multiclass_W(pi)
    assert np.linalg.eigvalsh(W).min() > -1e-14
    for i in range(n):
        ones_i = np.zeros((C, n))
        ones_i[:, i] = 1.0
        np.testing.assert_allclose(W @ ones_i.ravel(), 0.0, atol=1e-15)
    assert np.sum(np.linalg.eigvalsh(W) < 1e-12) == n  # exactly one zero eigenvalue per case


@pytest.mark.parametrize("C", [3, 5])
def test_predictive_mean_and_covariance_equal_naive_dense(C):
    X, y, h, K = _problem(4, C)
    res = gpclab.laplace_mode_multiclass(K, y)
    Xs = np.random.default_rng(9).standard_normal((3, 2))
    K_star = np.stack([gpclab.kernel_matrix("se", X, Xs, h[c]) for c in range(C)])
    kss = np.stack([gpclab.kernel_diag("se", Xs, h[c]) + 0.1 for c in range(C)])  # same jitter as K: x_* has its own noise-free value
    _, mu, Sig = gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 10)
    _, mu2, Sig2 = gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 10, 0, res.E, res.M,
                                                     gpclab.multiclass_G(res.E, res.M))   # G unused: per-class k_*
    for j in range(3):
        m_ref, c_ref = naive.multiclass_predict(K, y, res.f_hat, K_star[:, :, j], kss[:, j])
        np.testing.assert_allclose(mu[:, j], m_ref, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(Sig[j], c_ref, rtol=1e-8, atol=1e-10)
        np.testing.assert_allclose(Sig2[j], Sig[j], rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("m", [3, 25])
def test_shared_covariance_predictions_equal_naive_dense(m):
    """Classes sharing one covariance function (one k_* for all): Sigma_* through G_c = M\\E_c,
    with line 15's b^T k_* taken from the cross terms, equals the Cn x Cn reference, whether G is
    given, computed inside (m > n) or not used (m <= n)."""
    C, n = 4, 10
    X, y, h, K = _problem(5, C, n=n, per_class=False)
    res = gpclab.laplace_mode_multiclass(K, y)
    Xs = np.random.default_rng(4).standard_normal((m, 2))
    K_star = np.stack([gpclab.kernel_matrix("se", X, Xs, h[0])] * C)
    kss = np.stack([gpclab.kernel_diag("se", Xs, h[0]) + 0.1] * C)
    G = gpclab.multiclass_G(res.E, res.M)
    for c in range(C):
        np.testing.assert_allclose(res.M @ G[c], res.E[c], rtol=1e-10, atol=1e-13)
    runs = [gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 10),
            gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 10, 0, res.E, res.M, G)]
    for p, mu, Sig in runs:
        for j in range(m):
            m_ref, c_ref = naive.multiclass_predict(K, y, res.f_hat, K_star[:, :, j], kss[:, j])
            np.testing.assert_allclose(mu[:, j], m_ref, rtol=1e-8, atol=1e-10)
            np.testing.assert_allclose(Sig[j], c_ref, rtol=1e-8, atol=1e-10)
    np.testing.assert_allclose(runs[0][0], runs[1][0], rtol=1e-9, atol=1e-12)


def test_classifier_keeps_G_and_predicts_as_the_public_function():
    X, y, h, K = _problem(6, 3, n=30, per_class=False)
    labels = np.argmax(y, axis=0)
    model = gpclab.GPClassifier(log_hyp=h[0], optimize=False, n_samples=200).fit(X, labels)
    np.testing.assert_allclose(model.G_, gpclab.multiclass_G(model.result_.E, model.result_.M))
    Xs = np.random.default_rng(1).standard_normal((20, 2))   # m < n: the public call does not make G itself
    Ks = np.stack([gpclab.kernel_matrix("se", X, Xs, h[0])] * 3)
    kss = np.stack([gpclab.kernel_diag("se", Xs, h[0])] * 3)
    p, _, _ = gpclab.laplace_predict_multiclass(model.K_, model.y_train_, model.f_hat_, Ks, kss, 200)
    np.testing.assert_allclose(model.predict_proba(Xs), p.T, rtol=1e-10, atol=1e-12)


def test_monte_carlo_predictions_are_reproducible_and_converge_for_two_classes():
    """For C = 2 the softmax average is E[lambda(f1 - f2)]: a 1-D integral (quadrature)."""
    X, y, h, K = _problem(5, 2, n=15)
    res = gpclab.laplace_mode_multiclass(K, y)
    Xs = np.random.default_rng(2).standard_normal((4, 2))
    K_star = np.stack([gpclab.kernel_matrix("se", X, Xs, h[c]) for c in range(2)])
    kss = np.stack([gpclab.kernel_diag("se", Xs, h[c]) for c in range(2)])
    p1, mu, Sig = gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 200_000, 11)
    p2, _, _ = gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 200_000, 11)
    np.testing.assert_array_equal(p1, p2)
    p3, _, _ = gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, 200_000, 12)
    assert not np.array_equal(p1, p3)
    for j in range(4):
        m = mu[0, j] - mu[1, j]
        v = Sig[j, 0, 0] + Sig[j, 1, 1] - 2 * Sig[j, 0, 1]
        ref = gpclab.logistic_gaussian_integral(m, v)
        se = np.sqrt(ref * (1 - ref) / 200_000)
        assert abs(p1[0, j] - ref) < 5 * se + 1e-12
    np.testing.assert_allclose(p1.sum(axis=0), 1.0)


@pytest.mark.parametrize("prior_var", [1.0, 1e5])
def test_antithetic_averages_agree_with_independent_sampling(prior_var):
    """Check the averaged softmax (line 20) against plain numpy sampling from the same N(mu_*, Sigma_*),
    within the standard error the docstring states, 0.5 sqrt(2/S), plus the reference's own. A prior
    variance of 1e5 makes the latents spread over hundreds, the path with one exp per sample."""
    X, y, h, K = _problem(7, 4, n=12)
    res = gpclab.laplace_mode_multiclass(K, y)
    Xs = np.random.default_rng(3).standard_normal((3, 2))
    K_star = np.stack([gpclab.kernel_matrix("se", X, Xs, h[c]) for c in range(4)])
    kss = np.stack([gpclab.kernel_diag("se", Xs, h[c]) for c in range(4)]) + prior_var - 1.0
    S, S_ref = 40_000, 400_000
    p, mu, Sig = gpclab.laplace_predict_multiclass(K, y, res.f_hat, K_star, kss, S, 3)
    r = np.random.default_rng(0)
    for j in range(3):
        F = r.multivariate_normal(mu[:, j], Sig[j], size=S_ref)
        P = np.exp(F - F.max(axis=1, keepdims=True))
        P /= P.sum(axis=1, keepdims=True)
        se = np.sqrt(0.25 * 2 / S + P.var(axis=0) / S_ref)
        assert np.all(np.abs(p[:, j] - P.mean(axis=0)) < 4 * se)
        assert P.mean(axis=0).min() > 0.01          # not a trivial case: every class has some mass
    np.testing.assert_allclose(p.sum(axis=0), 1.0)


@pytest.mark.parametrize("kernel", ["se", "ard"])
def test_gradient_equals_finite_differences(kernel):
    X, y, h, K = _problem(6, 3, n=20, d=2, jitter=0.0)
    if kernel == "ard":
        h = np.array([[0.5, -1.0, 0.3, -0.2], [0.2, -2.0, -0.1, 0.4], [0.8, -1.5, 0.0, 0.0]])
    K = np.stack([gpclab.kernel_matrix(kernel, X, X, h[c]) for c in range(3)])
    res = gpclab.laplace_mode_multiclass(K, y, None, 1e-15, 200)
    grad = gpclab.laplace_log_q_grad_multiclass(K, X, kernel, h, y, res.f_hat, res.a, res.E, res.M)

    def log_q(hh):
        KK = np.stack([gpclab.kernel_matrix(kernel, X, X, hh[c]) for c in range(3)])
        return gpclab.laplace_mode_multiclass(KK, y, None, 1e-15, 200).log_q

    fd = np.zeros_like(h)
    for idx in np.ndindex(h.shape):
        e = np.zeros_like(h)
        e[idx] = 1e-5
        fd[idx] = (log_q(h + e) - log_q(h - e)) / 2e-5
    np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-7)


def test_bad_input_raises():
    K = np.stack([np.eye(3)] * 2)
    with pytest.raises(ValueError, match="one-hot"):
        gpclab.laplace_mode_multiclass(K, np.array([[1.0, 0, 1], [0, 1, 1]]))
    with pytest.raises(ValueError, match="one-hot"):
        gpclab.laplace_mode_multiclass(K, np.array([[0.5, 0, 1], [0.5, 1, 0]]))
    with pytest.raises(ValueError, match="y must have shape \\(C, n\\) with n = 4 from K"):
        gpclab.laplace_mode_multiclass(np.stack([np.eye(4)] * 2), np.array([[1.0, 0, 1], [0, 1, 0]]))
    y = np.array([[1.0, 0, 1], [0, 1, 0]])
    res = gpclab.laplace_mode_multiclass(K, y)
    with pytest.raises(ValueError, match="S must be a positive integer"):
        gpclab.laplace_predict_multiclass(K, y, res.f_hat, np.zeros((2, 3, 1)), np.ones((2, 1)), 0)
    with pytest.raises(ValueError, match="laplace_predict_multiclass: E and M go together"):
        gpclab.laplace_predict_multiclass(K, y, res.f_hat, np.zeros((2, 3, 1)), np.ones((2, 1)), E=res.E)


def test_step_search_equals_plain_halving_for_the_softmax():
    """The step halving of Alg. 3.3 line 14 is Alg. 3.1's _step_search on (C, n) arrays: it takes the
    step a plain halving loop takes on the softmax objective (3.35)."""
    X, y, h, K = _problem(2, 3)
    r = np.random.default_rng(4)
    a = 0.1 * r.standard_normal(y.shape)
    f = np.stack([K[c] @ a[c] for c in range(3)])
    psi = naive.newton_objective(a, f, y, None)
    e = np.exp(f - f.max(axis=0))
    ascent = y - e / e.sum(axis=0) - a                          # K^-1 grad Psi(f), (3.36)
    steps = []
    for scale in [0.1, 100.0]:
        da = scale * ascent
        df = np.stack([K[c] @ da[c] for c in range(3)])
        t_ref, psi_ref = naive.step_search(a, da, f, df, psi, y, None)
        a_t, f_t, psi_t, t = gpclab._step_search(gpclab._multiclass_objective, a, da, f, df, psi, y, "softmax")
        assert t == t_ref
        np.testing.assert_array_equal(f_t, f + t * df)
        assert psi_t == pytest.approx(psi_ref, rel=1e-12)
        steps.append(t)
    assert steps[0] == 1.0 and 0.0 < steps[1] < 0.5
    a_t, f_t, psi_t, t = gpclab._step_search(gpclab._multiclass_objective, a, -da, f, -df, psi + 1.0, y, "softmax")
    assert t == 0.0 and psi_t == psi + 1.0
    np.testing.assert_array_equal(a_t, a)


def test_a_worse_warm_start_is_not_taken():
    """Alg. 3.3 line 2 with a warm start worse than f = 0 gives the cold start's result, bit for bit."""
    X, y, h, K = _problem(1, 3)
    cold = gpclab.laplace_mode_multiclass(K, y)
    bad = -3.0 * cold.a
    f_bad = np.stack([K[c] @ bad[c] for c in range(3)])
    assert naive.newton_objective(bad, f_bad, y, None) < naive.newton_objective(0 * bad, 0 * bad, y, None)
    warm = gpclab.laplace_mode_multiclass(K, y, bad)
    np.testing.assert_array_equal(warm.f_hat, cold.f_hat)
    assert warm.log_q == cold.log_q and warm.n_iter == cold.n_iter


def _three_blobs(seed, n_per=15):
    r = np.random.default_rng(seed)
    centres = np.array([[0.0, 2.0], [-2.0, -1.0], [2.0, -1.0]])
    X = np.vstack([c + 0.9 * r.standard_normal((n_per, 2)) for c in centres])
    labels = np.repeat(np.array(["a", "b", "c"]), n_per)
    return X, labels


@pytest.mark.parametrize("shared", [True, False])
def test_classifier_multiclass_ml2(shared):
    """GPClassifier with three classes of any label type: ML-II by the analytic gradient."""
    X, labels = _three_blobs(0)
    m = gpclab.GPClassifier(shared_hyp=shared, n_samples=500).fit(X, labels)
    assert m.multiclass_ and list(m.classes_) == ["a", "b", "c"]
    assert m.log_hyp_.shape == ((2,) if shared else (3, 2))
    v, g = m.log_marginal_likelihood(eval_gradient=True)
    assert v == pytest.approx(m.log_marginal_likelihood_)
    assert g.shape == m.log_hyp_.shape and np.max(np.abs(g)) < 1e-3
    for k in range(m.log_hyp_.size):
        step = np.zeros(m.log_hyp_.size)
        step[k] = 0.05
        for sgn in (1, -1):
            # <=, not <: a class whose signal variance goes to its bound leaves its length-scale flat
            assert m.log_marginal_likelihood(m.log_hyp_ + sgn * step.reshape(m.log_hyp_.shape)) <= v + 1e-8
    P = m.predict_proba(X)
    assert P.shape == (45, 3)
    np.testing.assert_allclose(P.sum(axis=1), 1.0)
    np.testing.assert_array_equal(P, m.predict_proba(X))  # seeded Monte Carlo
    assert m.score(X, labels) > 0.9
    mean, cov = m.predict_latent(X[:4])
    assert mean.shape == (4, 3) and cov.shape == (4, 3, 3)
    with pytest.raises(ValueError, match="rule must be 'average'"):
        m.predict_proba(X, rule="map")


def test_classifier_multiclass_matches_the_numba_layer():
    X, labels = _three_blobs(1)
    h = np.array([0.3, 1.0])
    m = gpclab.GPClassifier(log_hyp=h, optimize=False, n_samples=300, random_state=4).fit(X, labels)
    idx = np.searchsorted(m.classes_, labels)
    Y = gpclab.one_hot(idx, 3)
    K = np.stack([gpclab.kernel_matrix("se", X, X, h)] * 3)
    res = gpclab.laplace_mode_multiclass(K, Y)
    assert m.log_marginal_likelihood_ == pytest.approx(res.log_q, rel=1e-12)
    Xs = X[:5]
    Ks = np.stack([gpclab.kernel_matrix("se", X, Xs, h)] * 3)
    kss = np.stack([gpclab.kernel_diag("se", Xs, h)] * 3)
    p, _, _ = gpclab.laplace_predict_multiclass(K, Y, res.f_hat, Ks, kss, 300, 4)
    np.testing.assert_allclose(m.predict_proba(Xs), p.T, rtol=1e-12)


def test_information_bits_multiclass_by_hand():
    P = np.array([[0.7, 0.2, 0.1], [0.1, 0.1, 0.8]])
    yt = np.array([0, 2])
    ytr = np.array([0, 0, 1, 2])
    base = -(0.5 * np.log2(0.5) + 0.5 * np.log2(0.25))   # (3.76) with C classes
    expect = 0.5 * (np.log2(0.7) + np.log2(0.8)) + base
    assert gpclab.information_bits_multiclass(P, yt, ytr) == pytest.approx(expect, rel=1e-14)
    with pytest.raises(ValueError, match="class indices"):
        gpclab.information_bits_multiclass(P, np.array([0, 3]), ytr)


def test_multiclass_grid_matches_the_classifier():
    X, labels = _three_blobs(2)
    Xt, lt = _three_blobs(3)
    out = gpclab.evidence_grid(X, labels, [0.0, 0.5], [1.0], X_test=Xt, y_test=lt, progress=False,
                               n_samples=400, seed=5)
    for j, le in enumerate([0.0, 0.5]):
        m = gpclab.GPClassifier(log_hyp=[le, 1.0], optimize=False, n_samples=400, random_state=5).fit(X, labels)
        assert out["log_q"][0, j] == pytest.approx(m.log_marginal_likelihood_, abs=1e-8)
        P = m.predict_proba(Xt)
        idx_t = np.searchsorted(m.classes_, lt)
        idx = np.searchsorted(m.classes_, labels)
        assert out["information"][0, j] == pytest.approx(gpclab.information_bits_multiclass(P, idx_t, idx), abs=1e-9)
        assert out["error"][0, j] == pytest.approx(np.mean(m.predict(Xt) != lt))


def test_penalised_ml2_moves_towards_the_prior():
    X, labels = _three_blobs(0)
    free = gpclab.GPClassifier(n_samples=100).fit(X, labels)
    pen = gpclab.GPClassifier(n_samples=100, hyp_prior=(-3.0, 0.3)).fit(X, labels)
    assert np.all(np.abs(pen.log_hyp_ + 3.0) < np.abs(free.log_hyp_ + 3.0))
    with pytest.raises(ValueError, match="hyp_prior"):
        gpclab.GPClassifier(hyp_prior=(0.0, -1.0)).fit(X, labels)


def test_load_usps_reads_the_mat_format(tmp_path):
    """A tiny file in the layout of GPML's usps_resampled.mat: patterns 256 x n, labels 10 x n in {-1, +1}."""
    from scipy.io import savemat

    r = np.random.default_rng(0)
    mats = {}
    for part, n in (("train", 7), ("test", 5)):
        labels = r.integers(0, 10, n)
        L = -np.ones((10, n))
        L[labels, np.arange(n)] = 1
        mats[f"{part}_patterns"] = r.uniform(-1, 1, (256, n))
        mats[f"{part}_labels"] = L
        mats[f"_{part}"] = labels
    savemat(tmp_path / "usps.mat", {k: v for k, v in mats.items() if not k.startswith("_")})
    Xtr, ytr, Xte, yte = gpclab.load_usps(str(tmp_path / "usps.mat"))
    np.testing.assert_array_equal(ytr, mats["_train"])
    np.testing.assert_array_equal(Xte, mats["test_patterns"].T)
    keep = np.isin(mats["_train"], [3, 5])
    X35, y35, _, _ = gpclab.load_usps(str(tmp_path / "usps.mat"), digits=(3, 5))
    np.testing.assert_array_equal(y35, mats["_train"][keep])
    savemat(tmp_path / "bad.mat", {"x": np.ones(3)})
    with pytest.raises(ValueError, match="not usps_resampled.mat"):
        gpclab.load_usps(str(tmp_path / "bad.mat"))
    with pytest.raises(ValueError, match="does not exist"):
        gpclab.load_usps(str(tmp_path / "missing.mat"))


# --- multi-class EP (K&G 4.2): predictions and the gradient of log Z_EP ----------------------


def _ep_problem(seed, J=5, n=30, d=2):
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, d))
    idx = np.argmax(X @ r.standard_normal((d, J)) + 0.7 * r.standard_normal((n, J)), axis=1)
    Y = gpclab.one_hot(idx, J)
    h = gpclab.default_log_hyp("kg", X)
    C = gpclab.kernel_matrix("kg", X, X, h)
    return X, Y, h, C, gpclab.ep_multiclass(C, Y, None, None, 1e-12, 500)


def _dense_predictive(C, Y, res, Ks, kss, t):
    """Mean and covariance of the J test latents by explicit inverses: q(g) = N(Sigma nu~, Sigma),
    Sigma = (Kg^-1 + S~)^-1, and f_* | g Gaussian from the joint prior (K&G 43, 50)."""
    J = Y.shape[0]
    yc, case, cls = gpclab.difference_index(Y)
    Kg = gpclab.difference_covariance(C, Y)
    Kgi = np.linalg.inv(Kg)
    Sig = np.linalg.inv(Kgi + np.diag(res.tau_tilde))
    A = np.array([[int(c == yc[case[a]]) - int(c == cls[a]) for c in range(J)] for a in range(len(case))]) \
        * Ks[case, t][:, None]                                # Cov(g, f_*)
    return A.T @ Kgi @ Sig @ res.nu_tilde, kss[t] * np.eye(J) - A.T @ Kgi @ A + A.T @ Kgi @ Sig @ Kgi @ A


@pytest.mark.parametrize("J", [4, 5])
def test_ep_multiclass_predictions_sum_to_one_and_agree_with_scipy(J):
    """f_bar_* and V_* against explicit inverses; p(y_* = c) against scipy's multivariate normal cdf
    (Genz's algorithm in scipy, an independent implementation) of the J - 1 differences
    f_*^c - f_*^l > 0, within its tolerance and four of gpclab's standard errors; every column
    of p sums to 1 to 1e-12 (gpclab normalises the J estimates, which partition the space)."""
    from scipy.stats import multivariate_normal
    X, Y, h, C, res = _ep_problem(J, J)
    Xs = np.random.default_rng(7).standard_normal((6, 2)) * 1.3
    Ks, kss = gpclab.kernel_matrix("kg", X, Xs, h), gpclab.kernel_diag("kg", Xs, h)
    p, f_bar, V, label = gpclab.ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss)
    p2, _, _, _, se = gpclab._ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss, res.L, 128, 0, 1e-5)
    np.testing.assert_allclose(p, p2, rtol=1e-8)              # L given or formed again
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    for t in range(Xs.shape[0]):
        mean, cov = _dense_predictive(C, Y, res, Ks, kss, t)
        np.testing.assert_allclose(f_bar[:, t], mean, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(V[t], cov, rtol=1e-7, atol=1e-9)
        for c in range(J):
            D = -np.delete(np.eye(J), c, axis=0)
            D[:, c] = 1.0                                     # rows e_c - e_l, l != c
            ref = multivariate_normal(-D @ mean, D @ cov @ D.T, abseps=1e-7, releps=1e-7,
                                      maxpts=2_000_000).cdf(np.zeros(J - 1))
            assert abs(p[c, t] - ref) < 2e-6 + 4 * se[c, t] + 4 * se[:, t].sum(), (t, c, p[c, t], ref)
    np.testing.assert_array_equal(label, np.argmax(f_bar, axis=0))


def test_ep_multiclass_gradient_is_eq31_and_the_slope_of_log_Z():
    """multiclass_ep_evidence's gradient from the sites (b b^T - R) equals eq. 31 with q(g) from
    em_ep_grad_multiclass (to rounding), and central differences of log Z_EP."""
    X, Y, h, C, res = _ep_problem(3, J=4, n=20)
    _, g, _ = gpclab.multiclass_ep_evidence(X, Y, h, "kg", None, True, None, 1e-12)
    g31 = gpclab.em_ep_grad_multiclass(C, Y, X, "kg", h, res.mu, res.Sigma)[1]
    np.testing.assert_allclose(g, g31, rtol=1e-8, atol=1e-10)
    e = 1e-5
    for j in range(h.size):
        hp, hm = h.copy(), h.copy()
        hp[j] += e
        hm[j] -= e
        fd = (gpclab.multiclass_ep_evidence(X, Y, hp, "kg", None, False, None, 1e-13)[0]
              - gpclab.multiclass_ep_evidence(X, Y, hm, "kg", None, False, None, 1e-13)[0]) / (2 * e)
        assert g[j] == pytest.approx(fd, rel=1e-4, abs=1e-6)


# --- multi-class EP, the fast paths: sweeps without a refactorisation after each, folded predictions,
# orthant probabilities to a standard error -----------------------------------------------------------


def _tiny_ep_problem(seed, J, n):
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, 2))
    idx = np.argmax(X @ r.standard_normal((2, J)) + 0.7 * r.standard_normal((n, J)), axis=1)
    idx[:J] = np.arange(J)                                   # every class present
    Y = gpclab.one_hot(idx, J)
    h = gpclab.default_log_hyp("kg", X)
    return X, Y, h, gpclab.kernel_matrix("kg", X, X, h)


@pytest.mark.parametrize("J, n, seed", [(3, 12, 0), (4, 10, 1), (6, 8, 2)])
@pytest.mark.parametrize("sweeps", [1, 3, 12])
def test_ep_multiclass_sweeps_equal_naive_dense_ep(J, n, seed, sweeps):
    """ep_multiclass (Sigma formed afresh only every 10th sweep and at the end) after 1, 3 and 12
    sweeps against EP with the posterior inverted explicitly before every site (naive.ep_step,
    K&G's step sites on the dense Kg): sites, Sigma, mu to 1e-9; L = cholesky(B) and log Z_EP
    (3.65 term by term, naive.ep_step_log_Z) to 1e-9."""
    X, Y, h, C = _tiny_ep_problem(seed, J, n)
    Kg = gpclab.difference_covariance(C, Y)
    res = gpclab.ep_multiclass(C, Y, None, None, 0.0, sweeps)     # tol 0: exactly `sweeps` sweeps
    assert res.n_sweeps == sweeps and not res.converged
    nu, tau, Sigma, mu = naive.ep_step(Kg, sweeps)
    assert 0 < tau.min() and tau.max() < gpclab._ep_tau_max(Kg)   # no site at ep's bounds [0, tau_max]
    np.testing.assert_allclose(res.tau_tilde, tau, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.nu_tilde, nu, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.Sigma, Sigma, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(res.mu, mu, rtol=1e-9, atol=1e-12)
    sS = np.sqrt(tau)
    np.testing.assert_allclose(res.L, np.linalg.cholesky(np.eye(len(tau)) + sS[:, None] * Kg * sS),
                               rtol=1e-9, atol=1e-12)
    assert res.log_Z == pytest.approx(naive.ep_step_log_Z(Kg, nu, tau), rel=1e-9, abs=1e-10)


@pytest.mark.parametrize("J, n, seed", [(4, 25, 3), (6, 30, 4)])
def test_ep_multiclass_converges_to_the_dense_ep_fixed_point(J, n, seed):
    """Converged (tol 1e-11, where the last test of log Z_EP uses Sigma's updated diagonal and only a
    new L): the sites are a fixed point of the dense EP (one more naive-free sweep of binary ep on Kg,
    which refactorises after every sweep, moves no site by more than 1e-5 relative), they agree
    with binary ep's own converged sites to 1e-4 relative, and Sigma, mu and log Z_EP are those of
    the returned sites (explicit inverses, naive.ep_step_log_Z) to 1e-9."""
    X, Y, h, C = _tiny_ep_problem(seed, J, n)
    Kg = gpclab.difference_covariance(C, Y)
    ones = np.ones(Kg.shape[0])
    res = gpclab.ep_multiclass(C, Y, None, None, 1e-11, 500)
    assert res.converged
    more = gpclab.ep(Kg, ones, res.nu_tilde, res.tau_tilde, 0.0, 1, "natural", 0, "step", 0.0)
    assert more.delta < 1e-5
    dense = gpclab.ep(Kg, ones, None, None, 1e-11, 2000, "natural", 0, "step", 0.0)
    np.testing.assert_allclose(res.tau_tilde, dense.tau_tilde, rtol=1e-4, atol=1e-8)
    np.testing.assert_allclose(res.nu_tilde, dense.nu_tilde, rtol=1e-4, atol=1e-8)
    Sigma = np.linalg.inv(np.linalg.inv(Kg) + np.diag(res.tau_tilde))
    np.testing.assert_allclose(res.Sigma, Sigma, rtol=1e-9, atol=1e-11)
    np.testing.assert_allclose(res.mu, Sigma @ res.nu_tilde, rtol=1e-9, atol=1e-11)
    ref = naive.ep_step_log_Z(Kg, res.nu_tilde, res.tau_tilde)
    assert res.log_Z == pytest.approx(ref, rel=1e-9, abs=1e-10)
    assert res.log_Z == pytest.approx(dense.log_Z, rel=1e-8)


@pytest.mark.parametrize("J, n, seed, tol", [(3, 20, 7, 1e-6), (5, 14, 8, 1e-8), (4, 15, 2, 1e-8)])
def test_ep_multiclass_stops_at_the_sweep_the_exact_log_Z_test_gives(J, n, seed, tol):
    """Between refactorisations the sweeps take log det B along their rank-one updates (determinant
    lemma), not from a new L. Their convergence test (sites within sqrt(tol), log Z_EP within tol of
    the sweep before) must pass at the sweep where it passes with log Z_EP computed afresh, term by
    term with explicit determinants (naive.ep_step, naive.ep_step_log_Z), after every sweep; in both
    ep_multiclass and the evidence's lean run, cold and warm. A wrong log det (a sign, a missed
    update) moves the change of log Z_EP by far more than tol and the stopping sweep with it."""
    X, Y, h, C = _tiny_ep_problem(seed, J, n)
    Kg = gpclab.difference_covariance(C, Y)

    def exact_stop(nu0, tau0, K):
        prev, log_Z_prev = (nu0, tau0), None
        for k in range(1, 60):
            nu, tau = naive.ep_step(K, k, nu0, tau0)[:2]
            delta = max(np.max(np.abs(tau - prev[1]) / (1 + tau)), np.max(np.abs(nu - prev[0]) / (1 + np.abs(nu))))
            log_Z = naive.ep_step_log_Z(K, nu, tau)
            if log_Z_prev is not None and delta < np.sqrt(tol) and abs(log_Z - log_Z_prev) < tol:
                return k
            prev, log_Z_prev = (nu, tau), log_Z
        raise AssertionError("the dense EP did not converge")

    want = exact_stop(np.zeros(Kg.shape[0]), np.zeros(Kg.shape[0]), Kg)
    assert want % gpclab._MC_REFRESH != 0                     # decided by the carried log det, not a refresh
    res = gpclab.ep_multiclass(C, Y, None, None, tol, 100)
    assert res.converged and res.n_sweeps == want
    v, _, lean = gpclab.multiclass_ep_evidence(X, Y, h, "kg", None, False, None, tol)
    assert lean.converged and lean.n_sweeps == want
    assert v == pytest.approx(naive.ep_step_log_Z(Kg, lean.nu_tilde, lean.tau_tilde), abs=1e-9)
    # warm: from these sites at other hyperparameters (log det B of the start from its L)
    h2 = h + 0.1
    C2 = gpclab.kernel_matrix("kg", X, X, h2)
    Kg2 = gpclab.difference_covariance(C2, Y)
    want2 = exact_stop(res.nu_tilde, res.tau_tilde, Kg2)
    warm = gpclab.ep_multiclass(C2, Y, res.nu_tilde, res.tau_tilde, tol, 100)
    assert warm.converged and warm.n_sweeps == want2 and want2 % gpclab._MC_REFRESH != 0
    v2, _, lean2 = gpclab.multiclass_ep_evidence(X, Y, h2, "kg", (res.nu_tilde, res.tau_tilde), False, None, tol)
    assert lean2.converged and lean2.n_sweeps == want2


def test_ep_multiclass_carries_log_det_B_through_its_sweeps(monkeypatch):
    """The log det B that the sweeps carry along their rank-one updates (1 + d Sigma_ii for each
    tau~_i += d) and hand to line 17 equals log det(I + S~^1/2 Kg S~^1/2) of that sweep's sites,
    computed afresh (numpy's slogdet), after every sweep of a cold and of a warm run, in both modes,
    to 1e-10 of its size."""
    X, Y, h, C = _tiny_ep_problem(3, 4, 15)
    Kg = gpclab.difference_covariance(C, Y)
    seen, current = [], {}
    real = gpclab._ep_log_Z_det

    def recording(y, tau_tilde, nu_tilde, Sigma, mu, L, noise, eps, log_det_B):
        if not np.isnan(log_det_B):
            seen.append((current["Kg"], tau_tilde.copy(), log_det_B))
        return real(y, tau_tilde, nu_tilde, Sigma, mu, L, noise, eps, log_det_B)

    monkeypatch.setattr(gpclab, "_ep_log_Z_det", recording)
    sweeps = gpclab._ep_multiclass_sweeps.py_func            # plain Python: its globals are looked up per call
    N = Kg.shape[0]
    current["Kg"] = Kg
    cold = sweeps(Kg, np.zeros(N), np.zeros(N), 1e-10, 30, False)
    current["Kg"] = Kg2 = gpclab.difference_covariance(gpclab.kernel_matrix("kg", X, X, h + 0.2), Y)
    sweeps(Kg2, cold[0], cold[1], 1e-10, 30, False)
    sweeps(Kg2, cold[0], cold[1], 1e-10, 30, True)
    assert len(seen) >= 20
    for K, tau, carried in seen:
        sS = np.sqrt(tau)
        sign, exact = np.linalg.slogdet(np.eye(N) + sS[:, None] * K * sS[None, :])
        assert sign > 0 and carried == pytest.approx(exact, rel=1e-10, abs=1e-10)


def test_ep_multiclass_warm_start_needs_fewer_sweeps_and_lands_on_the_same_sites():
    X, Y, h, C = _tiny_ep_problem(5, 5, 30)
    cold = gpclab.ep_multiclass(C, Y, None, None, 1e-10, 500)
    h2 = h + 0.05
    C2 = gpclab.kernel_matrix("kg", X, X, h2)
    fresh = gpclab.ep_multiclass(C2, Y, None, None, 1e-10, 500)
    warm = gpclab.ep_multiclass(C2, Y, cold.nu_tilde, cold.tau_tilde, 1e-10, 500)
    assert warm.converged and warm.n_sweeps < fresh.n_sweeps
    np.testing.assert_allclose(warm.tau_tilde, fresh.tau_tilde, rtol=1e-4, atol=1e-8)
    assert warm.log_Z == pytest.approx(fresh.log_Z, rel=1e-8)


@pytest.mark.parametrize("J", [4, 6])
def test_ep_predict_multiclass_within_its_standard_error_of_a_long_run(J):
    """Defaults (points per shift doubled from 32 until the standard error is at most abseps = 1e-5,
    the class of the largest mean as 1 - the others) against 20,000 points per shift with no early
    stop and every class estimated: each p within 4e-6 + 4 of its stated standard errors; every
    row sums to 1 to 1e-12; a smaller abseps is closer to the long run; f_bar and V are those of
    the folded path; GPClassifier's cached fold gives the same numbers."""
    X, Y, h, C, res = _ep_problem(10 + J, J, 40)
    Xs = np.random.default_rng(8).standard_normal((12, 2)) * 1.3
    Ks, kss = gpclab.kernel_matrix("kg", X, Xs, h), gpclab.kernel_diag("kg", Xs, h)
    p, f_bar, V, label, se = gpclab._ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss,
                                                           res.L, 128, 0, 1e-5)
    long_run, _, _, _, se_long = gpclab._ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss,
                                                               res.L, 20_000, 1, 0.0)
    assert se_long.max() < 2e-6
    assert np.all(np.abs(p - long_run) < 4e-6 + 4 * se), np.abs(p - long_run).max()
    np.testing.assert_allclose(p.sum(axis=0), 1.0, rtol=0, atol=1e-12)
    fine = gpclab._ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss, res.L, 4096, 0, 1e-7)[0]
    assert np.abs(fine - long_run).max() < np.abs(p - long_run).max() + 1e-7
    for t in range(Xs.shape[0]):
        mean, cov = _dense_predictive(C, Y, res, Ks, kss, t)
        np.testing.assert_allclose(f_bar[:, t], mean, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(V[t], cov, rtol=1e-7, atol=1e-9)
    public = gpclab.ep_predict_multiclass(res.nu_tilde, res.tau_tilde, C, Y, Ks, kss)   # L formed again
    np.testing.assert_allclose(public[0], p, rtol=1e-8, atol=1e-12)


def test_orthant_probability_stops_at_its_standard_error():
    """abseps > 0: fewer points where the standard error allows, the stated se at most abseps
    (or n_points reached), and the estimate within 4 se of a 20,000-point run."""
    r = np.random.default_rng(11)
    for k in (3, 5):
        A = r.standard_normal((k, k))
        S = A @ A.T + 0.5 * np.eye(k)
        m = r.standard_normal(k) + 1.0
        ref, se_ref = gpclab.orthant_probability(m, S, 20_000)
        for abseps in (1e-3, 1e-4, 1e-5):
            P, se = gpclab.orthant_probability(m, S, 4096, 8, 0, abseps)
            assert se <= abseps
            assert abs(P - ref) < 4 * se + 4 * se_ref
        P, se = gpclab.orthant_probability(m, S, 16, 8, 0, 1e-12)   # the cap: n_points per shift
        assert (P, se) == gpclab.orthant_probability(m, S, 16, 8, 0, 0.0)


def test_classifier_multiclass_ep_keeps_the_fold_of_its_fit():
    """GPClassifier(method='ep') predicts as ep_predict_multiclass with its defaults, from the folded
    training matrices formed at fit (ep_fold_, J (J + 1) / 2 blocks of (n, n)); predicting leaves the
    model as it was; a model without them (pickled before they existed) forms them and predicts the
    same."""
    r = np.random.default_rng(12)
    X = r.standard_normal((24, 2))
    labels = np.array(["a", "b", "c", "d"])[np.argmax(X @ r.standard_normal((2, 4)), axis=1)]
    labels[:4] = ["a", "b", "c", "d"]
    m = gpclab.GPClassifier(method="ep", optimize=False).fit(X, labels)
    assert m.ep_fold_[0].shape == (24, 4) and m.ep_fold_[1].shape == (10, 24, 24)
    Xs = r.standard_normal((7, 2))
    before = dict(vars(m))
    P = m.predict_proba(Xs)
    assert vars(m).keys() == before.keys() and all(vars(m)[k] is v for k, v in before.items())
    Ks = gpclab.kernel_matrix(m.kernel_, m.X_train_, Xs, m.log_hyp_)
    kss = gpclab.kernel_diag(m.kernel_, Xs, m.log_hyp_)
    p = gpclab.ep_predict_multiclass(m.nu_tilde_, m.tau_tilde_, m.K_, m.y_train_, Ks, kss, m.result_.L)[0]
    np.testing.assert_allclose(P, p.T, rtol=1e-8, atol=1e-12)      # to rounding
    np.testing.assert_allclose(P.sum(axis=1), 1.0, rtol=0, atol=1e-12)
    del m.ep_fold_
    np.testing.assert_allclose(m.predict_proba(Xs), P, rtol=1e-8, atol=1e-12)   # (BLAS's rounding)


def test_ep_multiclass_warm_start_after_large_site_changes_reaches_eps_fixed_point():
    """A warm start from the sites of far-away hyperparameters (relative site changes of 1e2 in the
    first sweeps, where the rank-one updates' rounding makes Sigma drift): ep_multiclass and the
    evidence's lean run end at EP's fixed point, that of a cold run to 1e-13, not at the drifted
    sweeps' own (4e-3 nats of log Z_EP away before Sigma was checked at convergence; 0.4 nats with
    the updated diagonal in the lean run)."""
    r = np.random.default_rng(6)
    X = r.standard_normal((24, 2))
    Y = gpclab.one_hot(np.digitize(X[:, 0] + 0.5 * r.standard_normal(24), [-0.4, 0.4]), 3)
    h1 = np.array([np.log(4.0), -0.327, -5.842, -0.668])
    h2 = np.array([np.log(4.0), -5.172, 11.513, 1.904])      # latent noise t2 = 1e5
    w = gpclab.ep_multiclass(gpclab.kernel_matrix("kg_iso", X, X, h1), Y, None, None, 1e-12, 500)
    C2 = gpclab.kernel_matrix("kg_iso", X, X, h2)
    ref = gpclab.ep_multiclass(C2, Y, None, None, 1e-13, 1000)
    warm = gpclab.ep_multiclass(C2, Y, w.nu_tilde, w.tau_tilde, 1e-9, 100)
    assert warm.converged and warm.log_Z == pytest.approx(ref.log_Z, abs=1e-8)
    np.testing.assert_allclose(warm.tau_tilde, ref.tau_tilde, rtol=1e-4, atol=1e-8)
    for tol in (1e-9, 1e-5):
        v, _, res = gpclab.multiclass_ep_evidence(X, Y, h2, "kg_iso", (w.nu_tilde, w.tau_tilde), False, None, tol)
        assert res.converged and v == pytest.approx(ref.log_Z, abs=10 * tol)
        assert res.Sigma.shape == (0, 0)
        # L is the factor of B for the sites returned, mu their posterior mean
        Kg = gpclab.difference_covariance(C2, Y)
        sS = np.sqrt(res.tau_tilde)
        B = np.eye(len(sS)) + sS[:, None] * Kg * sS[None, :]
        np.testing.assert_allclose(res.L @ res.L.T, B, rtol=0, atol=1e-9 * np.abs(B).max())
        Sigma = np.linalg.inv(np.linalg.inv(Kg) + np.diag(res.tau_tilde))
        np.testing.assert_allclose(res.mu, Sigma @ res.nu_tilde, rtol=1e-6, atol=1e-8)
