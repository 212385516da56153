"""Submissions for ex3_10_6 (see ex3_10_1.py for the format)."""

CORRECT = {
    "gpclab_other_calls": {
        "partA_answer": '''
def fit_laplace(X, y, log_ell, log_sf):
    hyp = np.array([log_ell, log_sf])
    K = gpclab.kernel_matrix("se", X, X, hyp)
    mode = gpclab.laplace_mode(K, y, "logistic", tol=1e-12)
    _, _, d2, _ = gpclab.logistic(y, mode.f_hat)        # W = -d2 log p
    return mode.f_hat, -d2, mode.log_q
''',
        "partB_answer": '''
def predictive_probabilities(X, y, X_test, log_ell, log_sf):
    hyp = np.array([log_ell, log_sf])
    K = gpclab.kernel_matrix("se", X, X, hyp)
    mode = gpclab.laplace_mode(K, y, "logistic")
    out = gpclab.laplace_predict(mode.f_hat, K, y, "logistic", gpclab.kernel_matrix("se", X, X_test, hyp),
                                 gpclab.kernel_diag("se", X_test, hyp), rule="average", L=mode.L)
    return out[0]
''',
        "partC_answer": '''
def hyperparameter_study(X, y, X_test, log_ells, log_sfs):
    rows = {k: [] for k in ("f_norm", "W_mean", "log_q", "p_spread")}
    for le in log_ells:
        r = {k: [] for k in rows}
        for ls in log_sfs:
            f_hat, W, log_q = fit_laplace(X, y, le, ls)
            r["f_norm"].append(np.sqrt(np.sum(f_hat ** 2)))
            r["W_mean"].append(W.mean())
            r["log_q"].append(log_q)
            r["p_spread"].append(np.mean(np.abs(predictive_probabilities(X, y, X_test, le, ls) - 0.5)))
        for k in rows:
            rows[k].append(r[k])
    return {k: np.array(v) for k, v in rows.items()}
''',
    },
    "own_newton": {
        "partA_answer": '''
def _se(A, B, log_ell, log_sf):
    d2 = ((A[:, None, :] - B[None, :, :]) ** 2).sum(-1)
    return np.exp(2 * log_sf - 0.5 * d2 * np.exp(-2 * log_ell))


def fit_laplace(X, y, log_ell, log_sf):
    n = len(y)
    K = _se(X, X, log_ell, log_sf)
    f = np.zeros(n)
    for _ in range(100):
        p = 1 / (1 + np.exp(-f))
        W = p * (1 - p)
        g = (y > 0) - p
        f_new = K @ np.linalg.solve(np.eye(n) + W[:, None] * K, W * f + g)
        done = np.max(np.abs(f_new - f)) < 1e-11
        f = f_new
        if done:
            break
    p = 1 / (1 + np.exp(-f))
    W = p * (1 - p)
    g = (y > 0) - p                       # at the mode f = K g, so a = K^-1 f = g
    B = np.eye(n) + np.sqrt(W)[:, None] * K * np.sqrt(W)[None, :]
    log_q = -0.5 * g @ f - np.sum(np.log1p(np.exp(-y * f))) - 0.5 * np.linalg.slogdet(B)[1]
    return f, W, log_q
''',
        "partB_answer": '''
def predictive_probabilities(X, y, X_test, log_ell, log_sf):
    f, W, _ = fit_laplace(X, y, log_ell, log_sf)
    K = _se(X, X, log_ell, log_sf)
    Ks = _se(X, X_test, log_ell, log_sf)
    g = (y > 0) - 1 / (1 + np.exp(-f))
    mean = Ks.T @ g
    var = np.exp(2 * log_sf) - np.einsum("ij,ij->j", Ks, np.linalg.solve(K + np.diag(1 / W), Ks))
    return gpclab.averaged_probability("logistic", mean, var, "average")
''',
        "partC_answer": '''
def hyperparameter_study(X, y, X_test, log_ells, log_sfs):
    shape = (len(log_ells), len(log_sfs))
    f_norm, W_mean, log_q, spread = (np.empty(shape) for _ in range(4))
    for (i, le), (j, ls) in ((a, b) for a in enumerate(log_ells) for b in enumerate(log_sfs)):
        f, W, q = fit_laplace(X, y, le, ls)
        f_norm[i, j], W_mean[i, j], log_q[i, j] = np.linalg.norm(f), W.mean(), q
        spread[i, j] = np.abs(predictive_probabilities(X, y, X_test, le, ls) - 0.5).mean()
    return dict(f_norm=f_norm, W_mean=W_mean, log_q=log_q, p_spread=spread)
''',
    },
    "keywords_and_own_parts": {
        "partA_answer": '''
def fit_laplace(X, y, log_ell, log_sf):
    K = gpclab.kernel_matrix("se", X, X, np.array([log_ell, log_sf]))
    mode = gpclab.laplace_mode(K, y, "logistic")
    return mode.f_hat, mode.sW ** 2, mode.log_q
''',
        "partB_answer": '''
def predictive_probabilities(X, y, X_test, log_ell, log_sf):
    # reuses Part A: the latent mean and variance of (3.21)-(3.24) from f_hat and W
    f_hat, W, _ = fit_laplace(X, y, log_ell=log_ell, log_sf=log_sf)
    hyp = np.array([log_ell, log_sf])
    K = gpclab.kernel_matrix("se", X, X, hyp)
    Ks = gpclab.kernel_matrix("se", X, X_test, hyp)
    grad = (y + 1) / 2 - 1 / (1 + np.exp(-f_hat))
    sW = np.sqrt(W)
    L = np.linalg.cholesky(np.eye(len(y)) + sW[:, None] * K * sW[None, :])
    v = np.linalg.solve(L, sW[:, None] * Ks)
    var = gpclab.kernel_diag("se", X_test, hyp) - (v ** 2).sum(0)
    return gpclab.averaged_probability("logistic", Ks.T @ grad, var, "average")
''',
        "partC_answer": '''
def hyperparameter_study(X, y, X_test, log_ells, log_sfs):
    out = {k: np.zeros((len(log_ells), len(log_sfs))) for k in ("f_norm", "W_mean", "log_q", "p_spread")}
    for i, le in enumerate(log_ells):
        for j, ls in enumerate(log_sfs):
            f_hat, W, log_q = fit_laplace(X, y, log_ell=le, log_sf=ls)
            p = predictive_probabilities(X=X, y=y, X_test=X_test, log_ell=le, log_sf=ls)
            out["f_norm"][i, j] = np.linalg.norm(f_hat)
            out["W_mean"][i, j] = W.mean()
            out["log_q"][i, j] = log_q
            out["p_spread"][i, j] = np.abs(p - 0.5).mean()
    return out
''',
    },
}

MISTAKES = {
    "hyperparameters_swapped": ({"partA_f_hat", "partA_W", "partA_log_q"}, {"partA_answer": '''
def fit_laplace(X, y, log_ell, log_sf):
    K = gpclab.kernel_matrix("se", X, X, np.array([log_sf, log_ell], dtype=float))
    mode = gpclab.laplace_mode(K, y, "logistic")
    return mode.f_hat, mode.sW ** 2, mode.log_q
'''}),
    "square_root_of_W": ({"partA_W"}, {"partA_answer": '''
def fit_laplace(X, y, log_ell, log_sf):
    K = gpclab.kernel_matrix("se", X, X, np.array([log_ell, log_sf], dtype=float))
    mode = gpclab.laplace_mode(K, y, "logistic")
    return mode.f_hat, mode.sW, mode.log_q
'''}),
    "map_predictions": ({"partB_predictions"}, {"partB_answer": '''
def predictive_probabilities(X, y, X_test, log_ell, log_sf):
    log_hyp = np.array([log_ell, log_sf], dtype=float)
    K = gpclab.kernel_matrix("se", X, X, log_hyp)
    mode = gpclab.laplace_mode(K, y, "logistic")
    K_star = gpclab.kernel_matrix("se", X, X_test, log_hyp)
    kss = gpclab.kernel_diag("se", X_test, log_hyp)
    return gpclab.laplace_predict(mode.f_hat, K, y, "logistic", K_star, kss, rule="map")[0]
'''}),
    "grid_transposed": ({"partC_latent", "partC_evidence_predictions"}, {"partC_answer": '''
def hyperparameter_study(X, y, X_test, log_ells, log_sfs):
    shape = (len(log_sfs), len(log_ells))
    out = {key: np.zeros(shape) for key in ("f_norm", "W_mean", "log_q", "p_spread")}
    for i, le in enumerate(log_ells):
        for j, ls in enumerate(log_sfs):
            f_hat, W, log_q = fit_laplace(X, y, le, ls)
            p = predictive_probabilities(X, y, X_test, le, ls)
            out["f_norm"][j, i] = np.linalg.norm(f_hat)
            out["W_mean"][j, i] = np.mean(W)
            out["log_q"][j, i] = log_q
            out["p_spread"][j, i] = np.mean(np.abs(p - 0.5))
    return out
'''}),
    "largest_f_not_norm": ({"partC_latent"}, {"partC_answer": '''
def hyperparameter_study(X, y, X_test, log_ells, log_sfs):
    shape = (len(log_ells), len(log_sfs))
    out = {key: np.zeros(shape) for key in ("f_norm", "W_mean", "log_q", "p_spread")}
    for i, le in enumerate(log_ells):
        for j, ls in enumerate(log_sfs):
            f_hat, W, log_q = fit_laplace(X, y, le, ls)
            p = predictive_probabilities(X, y, X_test, le, ls)
            out["f_norm"][i, j] = np.max(np.abs(f_hat))
            out["W_mean"][i, j] = np.mean(W)
            out["log_q"][i, j] = log_q
            out["p_spread"][i, j] = np.mean(np.abs(p - 0.5))
    return out
'''}),
    # Part A's mistake, with a correct Part B that calls Part A: only Part A loses points
    "square_root_of_W_reused": ({"partA_W"}, {"partA_answer": '''
def fit_laplace(X, y, log_ell, log_sf):
    K = gpclab.kernel_matrix("se", X, X, np.array([log_ell, log_sf], dtype=float))
    mode = gpclab.laplace_mode(K, y, "logistic")
    return mode.f_hat, mode.sW, mode.log_q
''', "partB_answer": '''
def predictive_probabilities(X, y, X_test, log_ell, log_sf):
    f_hat, W, _ = fit_laplace(X, y, log_ell, log_sf)
    hyp = np.array([log_ell, log_sf])
    Ks = gpclab.kernel_matrix("se", X, X_test, hyp)
    K = gpclab.kernel_matrix("se", X, X, hyp)
    grad = (y + 1) / 2 - 1 / (1 + np.exp(-f_hat))
    var = gpclab.kernel_diag("se", X_test, hyp) - np.einsum("ij,ij->j", Ks, np.linalg.solve(K + np.diag(1 / W), Ks))
    return gpclab.averaged_probability("logistic", Ks.T @ grad, var, "average")
'''}),
    "coarse_quadrature": ({"partB_predictions"}, {"partB_answer": '''
def predictive_probabilities(X, y, X_test, log_ell, log_sf):
    hyp = np.array([log_ell, log_sf])
    K = gpclab.kernel_matrix("se", X, X, hyp)
    mode = gpclab.laplace_mode(K, y, "logistic")
    Ks = gpclab.kernel_matrix("se", X, X_test, hyp)
    _, mean, var = gpclab.laplace_predict(mode.f_hat, K, y, "logistic", Ks, gpclab.kernel_diag("se", X_test, hyp),
                                          rule="map")
    z, w = np.polynomial.hermite_e.hermegauss(8)       # (3.25) by 8-node Gauss-Hermite quadrature
    f = mean[:, None] + np.sqrt(np.maximum(var, 0))[:, None] * z[None, :]
    return (w / (1 + np.exp(-f))).sum(1) / np.sqrt(2 * np.pi)
'''}),
}
