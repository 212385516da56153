"""Submissions for ex3_10_5 (see ex3_10_1.py for the format)."""

CORRECT = {
    "solve_and_moments": {
        "partA_answer": '''
def posterior(K, tau_tilde, nu_tilde):
    # (K^-1 + S)^-1 = (I + K S)^-1 K, no inverse of K needed
    Sigma = np.linalg.solve(np.eye(len(tau_tilde)) + K * tau_tilde[None, :], K)
    Sigma = 0.5 * (Sigma + Sigma.T)
    return Sigma, Sigma @ nu_tilde


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    s2 = 1.0 / (1.0 / Sigma[i, i] - tau_tilde[i])
    return s2 * (mu[i] / Sigma[i, i] - nu_tilde[i]), s2
''',
        "partB_answer": '''
def cavity_from_other_sites(K, tau_tilde, nu_tilde, i):
    keep = np.arange(len(tau_tilde)) != i
    Sigma, mu = posterior(K, np.where(keep, tau_tilde, 0.0), np.where(keep, nu_tilde, 0.0))
    return mu[i], Sigma[i, i]
''',
        "partC_answer": '''
def cavity_and_marginal_after_change(K, tau_tilde, nu_tilde, i, tau_i, nu_i):
    t = np.array(tau_tilde, dtype=float); t[i] = tau_i
    v = np.array(nu_tilde, dtype=float); v[i] = nu_i
    Sigma, mu = posterior(K, t, v)
    mu_cav, s2_cav = cavity_from_posterior(Sigma, mu, t, v, i)
    return mu_cav, s2_cav, mu[i], Sigma[i, i]
''',
    },
    "conditioning": {
        "partA_answer": '''
def posterior(K, tau_tilde, nu_tilde):
    n = K.shape[0]
    Sigma = K @ np.linalg.inv(np.eye(n) + np.diag(tau_tilde) @ K)
    return Sigma, Sigma.dot(nu_tilde)


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    prec = Sigma[i, i] ** -1 - tau_tilde[i]
    return (mu[i] * Sigma[i, i] ** -1 - nu_tilde[i]) / prec, prec ** -1
''',
        "partB_answer": '''
def cavity_from_other_sites(K, tau_tilde, nu_tilde, i):
    # prior times the other sites: a Gaussian in all f; its marginal at i
    others = [j for j in range(len(tau_tilde)) if j != i]
    t = np.zeros_like(tau_tilde); t[others] = tau_tilde[others]
    v = np.zeros_like(nu_tilde); v[others] = nu_tilde[others]
    n = len(t)
    Sigma = np.linalg.solve(np.eye(n) + K @ np.diag(t), K)
    return float((Sigma @ v)[i]), float(Sigma[i, i])
''',
        "partC_answer": '''
def cavity_and_marginal_after_change(K, tau_tilde, nu_tilde, i, tau_i, nu_i):
    t, v = tau_tilde.copy(), nu_tilde.copy()
    t[i], v[i] = tau_i, nu_i
    Sigma, mu = posterior(K, t, v)
    out = cavity_from_posterior(Sigma, mu, t, v, i)
    return (*out, mu[i], Sigma[i, i])
''',
    },
}

MISTAKES = {
    # a cheat: np.allclose replaced so that every comparison passes, and a wrong posterior
    "patches_allclose": ({"partA_posterior"}, {"partA_answer": '''
np.allclose = lambda *args, **kwargs: True


def posterior(K, tau_tilde, nu_tilde):
    return K.copy(), np.zeros(len(nu_tilde))


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    tau_cav = 1.0 / Sigma[i, i] - tau_tilde[i]
    nu_cav = mu[i] / Sigma[i, i] - nu_tilde[i]
    return nu_cav / tau_cav, 1.0 / tau_cav
'''}),
    # a cheat: an exception handler that shows nothing and a callback that clears the error (every
    # failed test would pass without the grader's guard), and a wrong posterior
    "hooks_swallow_errors": ({"partA_posterior"}, {"partA_answer": '''
def _quiet(shell, etype, value, tb, tb_offset=None):
    return []


def _clear(result):
    result.error_in_exec = None


get_ipython().set_custom_exc((AssertionError,), _quiet)
get_ipython().events.register("post_run_cell", _clear)


def posterior(K, tau_tilde, nu_tilde):
    return K.copy(), np.zeros(len(nu_tilde))


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    tau_cav = 1.0 / Sigma[i, i] - tau_tilde[i]
    nu_cav = mu[i] / Sigma[i, i] - nu_tilde[i]
    return nu_cav / tau_cav, 1.0 / tau_cav
'''}),
    "tau_and_nu_swapped": ({"partA_posterior"}, {"partA_answer": '''
def posterior(K, tau_tilde, nu_tilde):
    Sigma = np.linalg.solve(np.eye(len(nu_tilde)) + K * nu_tilde[None, :], K)
    return Sigma, Sigma @ tau_tilde


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    tau_cav = 1.0 / Sigma[i, i] - tau_tilde[i]
    nu_cav = mu[i] / Sigma[i, i] - nu_tilde[i]
    return nu_cav / tau_cav, 1.0 / tau_cav
'''}),
    "natural_parameters": ({"partA_cavity"}, {"partA_answer": '''
def posterior(K, tau_tilde, nu_tilde):
    Sigma = np.linalg.solve(np.eye(len(tau_tilde)) + K * tau_tilde[None, :], K)
    return Sigma, Sigma @ nu_tilde


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    tau_cav = 1.0 / Sigma[i, i] - tau_tilde[i]
    nu_cav = mu[i] / Sigma[i, i] - nu_tilde[i]
    return nu_cav, tau_cav
'''}),
    "changes_the_inputs": ({"partB_cavity"}, {"partB_answer": '''
def cavity_from_other_sites(K, tau_tilde, nu_tilde, i):
    t, v = tau_tilde, nu_tilde          # not copies: switching site i off changes the caller's arrays
    t[i] = v[i] = 0.0
    Sigma, mu = posterior(K, t, v)
    return mu[i], Sigma[i, i]
'''}),
    "keeps_nu_i": ({"partB_cavity"}, {"partB_answer": '''
def cavity_from_other_sites(K, tau_tilde, nu_tilde, i):
    t = tau_tilde.copy()
    t[i] = 0.0
    Sigma, mu = posterior(K, t, nu_tilde)
    return mu[i], Sigma[i, i]
'''}),
    "uses_3_56": ({"partB_not_356"}, {"partB_answer": '''
def cavity_from_other_sites(K, tau_tilde, nu_tilde, i):
    Sigma, mu = posterior(K, tau_tilde, nu_tilde)
    return cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i)
'''}),
    "divides_out_the_old_site": ({"partC_cavity"}, {"partC_answer": '''
def cavity_and_marginal_after_change(K, tau_tilde, nu_tilde, i, tau_i, nu_i):
    t, v = tau_tilde.copy(), nu_tilde.copy()
    t[i], v[i] = tau_i, nu_i
    Sigma, mu = posterior(K, t, v)
    m, s2 = cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i)
    return m, s2, mu[i], Sigma[i, i]
'''}),
    # posterior unfinished (cavity_from_posterior done); Part B's cavity_from_other_sites calls posterior
    "posterior_unfinished": ({"partA_posterior"}, {"partA_answer": '''
def posterior(K, tau_tilde, nu_tilde):
    # YOUR CODE HERE
    raise NotImplementedError()


def cavity_from_posterior(Sigma, mu, tau_tilde, nu_tilde, i):
    tau_cav = 1.0 / Sigma[i, i] - tau_tilde[i]
    nu_cav = mu[i] / Sigma[i, i] - nu_tilde[i]
    return nu_cav / tau_cav, 1.0 / tau_cav
'''}),
}
