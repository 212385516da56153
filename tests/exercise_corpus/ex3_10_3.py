"""Submissions for ex3_10_3 (see ex3_10_1.py for the format)."""

CORRECT = {
    "eigh_and_scipy_softmax": {
        "partA_answer": '''
from scipy.special import softmax as _softmax

def averaged_softmax(mean, cov, n_samples, seed):
    lam, U = np.linalg.eigh(cov)
    z = np.random.default_rng(seed).standard_normal((n_samples, len(mean)))
    F = np.asarray(mean) + (z * np.sqrt(np.clip(lam, 0.0, None))) @ U.T
    return _softmax(F, axis=1).mean(axis=0)
''',
        "partB_answer": '''
def covariance_for_winner(c):
    if c == 1:
        return np.zeros((3, 3))          # no uncertainty: the MAP class wins
    v = np.zeros(3)
    v[c - 1] = 5.0
    return np.outer(v, v)                # variance 25 on f_c alone
''',
        "partC_answer": '''
def z_covariance(cov_f):
    s = cov_f
    v22 = s[1, 1] + s[0, 0] - 2 * s[0, 1]
    v33 = s[2, 2] + s[0, 0] - 2 * s[0, 2]
    v23 = s[1, 2] - s[1, 0] - s[0, 2] + s[0, 0]
    return np.array([[v22, v23], [v23, v33]])


def region(z):
    z2, z3 = z
    denom = 1 + np.exp(z2) + np.exp(z3)
    probs = [1 / denom, np.exp(z2) / denom, np.exp(z3) / denom]
    return probs.index(max(probs)) + 1
''',
    },
    "svd_and_logsumexp": {
        "partA_answer": '''
from scipy.special import logsumexp

def averaged_softmax(mean, cov, n_samples, seed):
    F = np.random.default_rng(seed).multivariate_normal(mean, cov, size=n_samples)   # svd: fine if singular
    return np.exp(F - logsumexp(F, axis=1, keepdims=True)).mean(axis=0)
''',
        "partB_answer": '''
def covariance_for_winner(c):
    cov = 0.001 * np.eye(3)
    if c != 1:
        cov[c - 1, c - 1] = 50.0
    return cov
''',
        "partC_answer": '''
def z_covariance(cov_f):
    return np.einsum("ij,jk,lk->il", T, cov_f, T)


def region(z):
    if z[0] < 0 and z[1] < 0:
        return 1
    return 2 if z[0] >= z[1] else 3
''',
    },
}

MISTAKES = {
    "softmax_of_the_mean": ({"partA_average"}, {"partA_answer": '''
def averaged_softmax(mean, cov, n_samples, seed):
    e = np.exp(np.asarray(mean) - np.max(mean))
    return e / e.sum()
'''}),
    "overflow": ({"partA_softmax"}, {"partA_answer": '''
def averaged_softmax(mean, cov, n_samples, seed):
    rng = np.random.default_rng(seed)
    F = rng.multivariate_normal(mean, cov, size=n_samples, method="eigh")
    E = np.exp(F)
    return (E / E.sum(axis=1, keepdims=True)).mean(axis=0)
'''}),
    "zero_based_class": ({"partB_class2", "partB_class3"}, {"partB_answer": '''
def covariance_for_winner(c):
    if c == 1:
        return 0.01 * np.eye(3)
    cov = np.zeros((3, 3))
    cov[c, c] = 100.0
    return cov
'''}),
    "region_zero_based": ({"partC_region"}, {"partC_answer": '''
def z_covariance(cov_f):
    return T @ cov_f @ T.T


def region(z):
    return int(np.argmax([0.0, z[0], z[1]]))
'''}),
    "no_cross_terms": ({"partC_z_covariance"}, {"partC_answer": '''
def z_covariance(cov_f):
    v = np.diag(cov_f)
    return np.array([[v[1] + v[0], v[0]], [v[0], v[2] + v[0]]])


def region(z):
    return int(np.argmax([0.0, z[0], z[1]])) + 1
'''}),
    # a Cholesky factor of the covariance: fails (LinAlgError) on the singular covariances
    "cholesky_sampling": ({"partA_average"}, {"partA_answer": '''
def averaged_softmax(mean, cov, n_samples, seed):
    rng = np.random.default_rng(seed)
    L = np.linalg.cholesky(cov)
    F = mean + rng.standard_normal((n_samples, len(mean))) @ L.T
    F = F - F.max(axis=1, keepdims=True)
    E = np.exp(F)
    return (E / E.sum(axis=1, keepdims=True)).mean(axis=0)
'''}),
}
