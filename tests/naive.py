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
