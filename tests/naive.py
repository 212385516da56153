"""Dense reference implementations written the naive way, with explicit inverses.

They follow the equations, not the algorithm boxes, and are only for small,
well-conditioned problems: independent oracles for the tests.
"""
import numpy as np
from scipy.special import expit, log_ndtr, ndtr


def logistic_lik(y, f):
    """log p, d/df, d2/df2 of the logistic likelihood (3.15), plainly."""
    pi = expit(f)
    t = (y + 1) / 2
    return -np.log1p(np.exp(-y * f)), t - pi, -pi * (1 - pi)


def probit_lik(y, f):
    """log p, d/df, d2/df2 of the probit likelihood (3.16), plainly."""
    npdf = np.exp(-0.5 * f ** 2) / np.sqrt(2 * np.pi)
    Phi = ndtr(y * f)
    d1 = y * npdf / Phi
    d2 = -npdf ** 2 / Phi ** 2 - y * f * npdf / Phi
    return log_ndtr(y * f), d1, d2


LIKS = {"logistic": logistic_lik, "probit": probit_lik}


def laplace_mode(K, y, lik, iters=200):
    """Newton iteration (3.18) with (K^-1 + W)^-1 formed explicitly."""
    Ki = np.linalg.inv(K)
    f = np.zeros(len(y))
    for _ in range(iters):
        _, g, h = LIKS[lik](y, f)
        W = np.diag(-h)
        f_new = np.linalg.inv(Ki + W) @ (W @ f + g)
        if np.max(np.abs(f_new - f)) < 1e-13:
            f = f_new
            break
        f = f_new
    return f


def laplace_log_q(K, y, lik, f):
    """(3.32) with log|B| = log|K| + log|K^-1 + W| and f^T K^-1 f by inversion (3.12)."""
    Ki = np.linalg.inv(K)
    lp, _, h = LIKS[lik](y, f)
    W = np.diag(-h)
    logdet_B = np.linalg.slogdet(K)[1] + np.linalg.slogdet(Ki + W)[1]
    return -0.5 * f @ Ki @ f + lp.sum() - 0.5 * logdet_B


def laplace_predict(K, y, lik, f, K_star, kss):
    """Mean (3.21, first form) and variance (3.23/3.24, first form) by explicit inverses."""
    Ki = np.linalg.inv(K)
    _, _, h = LIKS[lik](y, f)
    W = np.diag(-h)
    mean = K_star.T @ Ki @ f
    A = np.linalg.inv(Ki + W)
    var = kss - np.einsum("ij,ik,kj->j", K_star, Ki, K_star) + np.einsum(
        "ij,ik,kl,lm,mj->j", K_star, Ki, A, Ki, K_star)
    return mean, var


def se_kernel(X1, X2, log_l, log_sf):
    d2 = ((X1[:, None, :] - X2[None, :, :]) ** 2).sum(-1)
    return np.exp(2 * log_sf) * np.exp(-0.5 * d2 / np.exp(2 * log_l))


def ard_kernel(X1, X2, log_hyp):
    v0, v1, w = np.exp(log_hyp[0]), np.exp(log_hyp[1]), np.exp(log_hyp[2:])
    d2 = (w * (X1[:, None, :] - X2[None, :, :]) ** 2).sum(-1)
    return v0 * np.exp(-0.5 * d2) + v1


def ep(K, y, sweeps):
    """EP (3.53)-(3.59) with the posterior recomputed by explicit inversion after every site."""
    from scipy.stats import norm

    n = len(y)
    tau = np.zeros(n)
    nu = np.zeros(n)
    Ki = np.linalg.inv(K)
    for _ in range(sweeps):
        for i in range(n):
            Sigma = np.linalg.inv(Ki + np.diag(tau))          # (3.53)
            mu = Sigma @ nu
            tau_cav = 1 / Sigma[i, i] - tau[i]                  # (3.56)
            mu_cav = (mu[i] / Sigma[i, i] - nu[i]) / tau_cav
            s2 = 1 / tau_cav
            z = y[i] * mu_cav / np.sqrt(1 + s2)                 # (3.58)
            ratio = norm.pdf(z) / norm.cdf(z)
            mu_hat = mu_cav + y[i] * s2 * ratio / np.sqrt(1 + s2)
            s2_hat = s2 - s2 ** 2 * ratio / (1 + s2) * (z + ratio)
            tau[i] = 1 / s2_hat - tau_cav                       # (3.59)
            nu[i] = mu_hat / s2_hat - tau_cav * mu_cav
    Sigma = np.linalg.inv(Ki + np.diag(tau))
    mu = Sigma @ nu
    return nu, tau, Sigma, mu


def ep_log_Z(K, y, nu, tau):
    """log Z_EP by (3.65) term by term, with explicit inverses and determinants."""
    from scipy.stats import norm

    Sigma = np.linalg.inv(np.linalg.inv(K) + np.diag(tau))
    mu = Sigma @ nu
    s2_site = 1 / tau
    mu_site = nu / tau
    tau_cav = 1 / np.diag(Sigma) - tau
    s2_cav = 1 / tau_cav
    mu_cav = (mu / np.diag(Sigma) - nu) / tau_cav
    KS = K + np.diag(s2_site)
    return (-0.5 * np.linalg.slogdet(KS)[1] - 0.5 * mu_site @ np.linalg.solve(KS, mu_site)
            + norm.logcdf(y * mu_cav / np.sqrt(1 + s2_cav)).sum()
            + 0.5 * np.log(s2_cav + s2_site).sum()
            + ((mu_cav - mu_site) ** 2 / (2 * (s2_cav + s2_site))).sum())


def ep_predict(K, nu, tau, K_star, kss):
    """(3.60), (3.61) with explicit inverses."""
    KS = K + np.diag(1 / tau)
    mean = K_star.T @ np.linalg.solve(KS, nu / tau)
    var = kss - np.einsum("ij,ij->j", K_star, np.linalg.solve(KS, K_star))
    return mean, var


def multiclass_blocks(K_blocks):
    """The Cn x Cn block-diagonal prior covariance from its C blocks."""
    from scipy.linalg import block_diag

    return block_diag(*K_blocks)


def multiclass_W(pi):
    """W = diag(pi) - Pi Pi^T (3.38), Cn x Cn, class-major, pi of shape (C, n)."""
    C, n = pi.shape
    p = pi.ravel()
    Pi = np.vstack([np.diag(pi[c]) for c in range(C)])        # Cn x n
    return np.diag(p) - Pi @ Pi.T


def multiclass_mode(K_blocks, y, iters=100):
    """Newton (3.39) with (K^-1 + W)^-1 formed explicitly."""
    from scipy.special import softmax

    C, n = y.shape
    K = multiclass_blocks(K_blocks)
    Ki = np.linalg.inv(K)
    f = np.zeros(C * n)
    for _ in range(iters):
        pi = softmax(f.reshape(C, n), axis=0)
        W = multiclass_W(pi)
        f_new = np.linalg.inv(Ki + W) @ (W @ f + y.ravel() - pi.ravel())
        done = np.max(np.abs(f_new - f)) < 1e-13
        f = f_new
        if done:
            break
    return f.reshape(C, n)


def multiclass_log_q(K_blocks, y, f):
    """(3.44) with f^T K^-1 f by inversion and log|I + W^1/2 K W^1/2| = log|I + K W|."""
    from scipy.special import logsumexp, softmax

    C, n = y.shape
    K = multiclass_blocks(K_blocks)
    fv = f.ravel()
    W = multiclass_W(softmax(f, axis=0))
    logdet = np.linalg.slogdet(np.eye(C * n) + K @ W)[1]
    return (-0.5 * fv @ np.linalg.solve(K, fv) + y.ravel() @ fv
            - logsumexp(f, axis=0).sum() - 0.5 * logdet)


def multiclass_predict(K_blocks, y, f, K_star_blocks, kss):
    """Mean (3.41) and covariance (3.43, first line) with explicit inverses; one test case."""
    from scipy.special import softmax

    C, n = y.shape
    K = multiclass_blocks(K_blocks)
    Ki = np.linalg.inv(K)
    W = multiclass_W(softmax(f, axis=0))
    Q = np.zeros((C * n, C))
    for c in range(C):
        Q[c * n:(c + 1) * n, c] = K_star_blocks[c]
    mean = Q.T @ Ki @ f.ravel()
    Sig = np.diag([kss[c] - K_star_blocks[c] @ np.linalg.solve(K_blocks[c], K_star_blocks[c]) for c in range(C)])
    cov = Sig + Q.T @ Ki @ np.linalg.inv(Ki + W) @ Ki @ Q
    return mean, cov


def laplace_log_q_mp(K, y, lik, dps=50, max_iter=400):
    """Laplace log q (3.32) of the float64 matrix K, by Newton's method (3.18) in mpmath.

    The first iterations run in float64 with likelihood derivatives written in
    terms of exp(-|f|) and log_ndtr (no cancellation for large |f|) and a
    halving line search on Psi (3.12); the last ones in `dps` digits, where
    f := K (I + W K)^-1 (W f + grad log p) and log|B| = log|I + W K|. Returns
    (log_q, f_hat) as (mpf, list).
    """
    import mpmath as mp

    n = len(y)

    def lik64(f):
        z = y * f
        if lik == "logistic":
            e = np.exp(-np.abs(z))
            lp = np.where(z >= 0, -np.log1p(e), z - np.log1p(e))
            d1 = y * np.where(z >= 0, e / (1 + e), 1 / (1 + e))
            return lp, d1, e / (1 + e) ** 2
        lp = log_ndtr(z)
        r = np.exp(-0.5 * z ** 2 - 0.5 * np.log(2 * np.pi) - lp)
        return lp, y * r, r * (r + z)

    f = np.zeros(n)
    lp, d1, W = lik64(f)
    psi = lp.sum()
    for _ in range(max_iter):                       # float64 phase, solve with (I + W K)
        x = np.linalg.solve(np.eye(n) + W[:, None] * K, W * f + d1)
        f_new = K @ x
        step = 1.0
        while step > 1e-12:
            f_t = f + step * (f_new - f)
            a_t = np.linalg.lstsq(K, f_t, rcond=None)[0] if step < 1 else x
            lp_t, d1_t, W_t = lik64(f_t)
            psi_t = -0.5 * a_t @ f_t + lp_t.sum()
            if psi_t >= psi - 1e-12 * (1 + abs(psi)):
                break
            step *= 0.5
        done = np.max(np.abs(f_t - f)) < 1e-8 * (1 + np.max(np.abs(f)))
        f, psi, d1, W = f_t, psi_t, d1_t, W_t
        if done:
            break
    with mp.workdps(dps):
        Km = mp.matrix(K.tolist())
        ym = [mp.mpf(float(v)) for v in y]
        fm = [mp.mpf(float(v)) for v in f]

        def likmp(fv):
            out = []
            for yi, fi in zip(ym, fv):
                z = yi * fi
                if lik == "logistic":
                    e = mp.exp(-abs(z))
                    lpi = -mp.log1p(e) if z >= 0 else z - mp.log1p(e)
                    d1i = yi * (e / (1 + e) if z >= 0 else 1 / (1 + e))
                    Wi = e / (1 + e) ** 2
                else:
                    Phi = mp.ncdf(z)
                    r = mp.npdf(z) / Phi
                    lpi, d1i, Wi = mp.log(Phi), yi * r, r * (r + z)
                out.append((lpi, d1i, Wi))
            return out

        tol = mp.mpf(10) ** (-dps + 10)
        for _ in range(60):
            L3 = likmp(fm)
            A = mp.eye(n) + mp.diag([t[2] for t in L3]) * Km
            x = mp.lu_solve(A, mp.matrix([t[2] * fi + t[1] for t, fi in zip(L3, fm)]))
            f_new = Km * x
            change = max(abs(f_new[i] - fm[i]) for i in range(n))
            fm = [f_new[i] for i in range(n)]
            if change < tol:
                break
        L3 = likmp(fm)
        A = mp.eye(n) + mp.diag([t[2] for t in L3]) * Km
        x = mp.lu_solve(A, mp.matrix([t[2] * fi + t[1] for t, fi in zip(L3, fm)]))  # a = K^-1 f
        psi = -sum(x[i] * fm[i] for i in range(n)) / 2 + sum(t[0] for t in L3)
        return psi - mp.log(mp.det(A)) / 2, fm


def newton_objective(a, f, y, lik):
    """Psi = -1/2 a^T f + log p(y|f) (3.12, 3.35 up to constants): y (n,) with lik 'logistic' or
    'probit', or one-hot y (C, n) with the softmax (lik ignored)."""
    if y.ndim == 1:
        log_p = -np.logaddexp(0.0, -y * f) if lik == "logistic" else log_ndtr(y * f)
        return -0.5 * a @ f + log_p.sum()
    from scipy.special import logsumexp
    return -0.5 * (a * f).sum() + (y * f).sum() - logsumexp(f, axis=0).sum()


def step_search(a, da, f, df, psi, y, lik):
    """Newton step halving, plainly: the first t of 1, 1/2, ..., 2^-30 at which the objective is at
    least psi - 1e-12 (1 + |psi|), and the objective there; (0, psi) if there is none."""
    for k in range(31):
        t = 0.5 ** k
        value = newton_objective(a + t * da, f + t * df, y, lik)
        if value >= psi - 1e-12 * (1 + abs(psi)):
            return t, value
    return 0.0, psi


def rank_one_updates(Sigma, columns, coefficients):
    """Sigma - c_j s_j s_j^T applied one after the other (GPML 3.70), the plain form of the update."""
    Sigma = np.array(Sigma, dtype=float)
    for s, c in zip(columns, coefficients):
        Sigma = Sigma - c * np.outer(s, s)
    return Sigma


def ep_step(K, sweeps, nu0=None, tau0=None):
    """EP with K&G's step sites H(g_a) (label +1, no noise) in natural order, the posterior
    recomputed by explicit inversion before every site (3.53-3.59 with the step's moments):
    the dense reference of multi-class EP on the difference latents (K = Kg). From the sites
    nu0, tau0 if given, else from zeros."""
    from scipy.stats import norm

    n = K.shape[0]
    tau = np.zeros(n) if tau0 is None else np.array(tau0, dtype=float)
    nu = np.zeros(n) if nu0 is None else np.array(nu0, dtype=float)
    Ki = np.linalg.inv(K)
    for _ in range(sweeps):
        for i in range(n):
            Sigma = np.linalg.inv(Ki + np.diag(tau))
            mu = Sigma @ nu
            tau_cav = 1 / Sigma[i, i] - tau[i]
            mu_cav = (mu[i] / Sigma[i, i] - nu[i]) / tau_cav
            s2 = 1 / tau_cav
            z = mu_cav / np.sqrt(s2)                            # Z_i = Phi(mu_cav / sigma_cav)
            ratio = norm.pdf(z) / norm.cdf(z)
            mu_hat = mu_cav + np.sqrt(s2) * ratio
            s2_hat = s2 * (1 - ratio * (z + ratio))
            tau[i] = 1 / s2_hat - tau_cav
            nu[i] = mu_hat / s2_hat - tau_cav * mu_cav
    Sigma = np.linalg.inv(Ki + np.diag(tau))
    return nu, tau, Sigma, Sigma @ nu


def ep_step_log_Z(K, nu, tau):
    """log Z_EP (3.65) of step sites, term by term with explicit inverses and determinants."""
    from scipy.stats import norm

    Sigma = np.linalg.inv(np.linalg.inv(K) + np.diag(tau))
    mu = Sigma @ nu
    s2_site = 1 / tau
    mu_site = nu / tau
    tau_cav = 1 / np.diag(Sigma) - tau
    s2_cav = 1 / tau_cav
    mu_cav = (mu / np.diag(Sigma) - nu) / tau_cav
    KS = K + np.diag(s2_site)
    return (-0.5 * np.linalg.slogdet(KS)[1] - 0.5 * mu_site @ np.linalg.solve(KS, mu_site)
            + norm.logcdf(mu_cav / np.sqrt(s2_cav)).sum()
            + 0.5 * np.log(s2_cav + s2_site).sum()
            + ((mu_cav - mu_site) ** 2 / (2 * (s2_cav + s2_site))).sum())
