"""Submissions for ex3_10_2 (see ex3_10_1.py for the format)."""

CORRECT = {
    "multinomial_and_blocks": {
        "partA_answer": '''
def sample_covariance(pi, n_samples, seed):
    Y = np.random.default_rng(seed).multinomial(1, pi, size=n_samples).astype(float)
    D = Y - Y.mean(axis=0)
    return D.T @ D / n_samples          # the 1/S estimator
''',
        "partB_answer": '''
def softmax_W(pi):
    C, n = pi.shape
    W = np.zeros((C * n, C * n))
    for i in range(n):
        idx = np.arange(C) * n + i      # class-major positions of case i
        p = pi[:, i]
        W[np.ix_(idx, idx)] = np.diag(p) - np.outer(p, p)
    return W
''',
        "partC_answer": '''
def psd_not_pd(W, C, n):
    V = np.kron(np.ones((C, 1)), np.eye(n))     # column i: ones at entries c n + i
    return np.linalg.eigvalsh(W)[0], np.abs(W @ V).max()
''',
    },
    "inverse_cdf_and_scatter": {
        "partA_answer": '''
def sample_covariance(pi, n_samples, seed):
    u = np.random.default_rng(seed).random(n_samples)
    states = np.minimum(np.searchsorted(np.cumsum(pi), u, side="right"), len(pi) - 1)
    return np.cov(np.eye(len(pi))[states].T)
''',
        "partB_answer": '''
def softmax_W(pi):
    C, n = pi.shape
    Pi = np.zeros((C * n, n))
    Pi[np.arange(C * n), np.tile(np.arange(n), C)] = pi.ravel()
    return np.diag(pi.ravel()) - Pi @ Pi.T
''',
        "partC_answer": '''
def psd_not_pd(W, C, n):
    smallest = min(np.linalg.eigvalsh(0.5 * (W + W.T)))
    worst = 0.0
    for i in range(n):
        v = np.zeros(C * n)
        v[i::n] = 1.0
        worst = max(worst, float(np.max(np.abs(W @ v))))
    return smallest, worst
''',
    },
}

MISTAKES = {
    "formula_not_samples": ({"partA_sampling"}, {"partA_answer": '''
def sample_covariance(pi, n_samples, seed):
    return np.diag(pi) - np.outer(pi, pi)
'''}),
    "second_moment": ({"partA_limit"}, {"partA_answer": '''
def sample_covariance(pi, n_samples, seed):
    rng = np.random.default_rng(seed)
    Y = np.eye(len(pi))[rng.choice(len(pi), size=n_samples, p=pi)]
    return Y.T @ Y / n_samples
'''}),
    "case_major_order": ({"partB_class_major"}, {"partB_answer": '''
def softmax_W(pi):
    from scipy.linalg import block_diag
    return block_diag(*[np.diag(p) - np.outer(p, p) for p in pi.T])
'''}),
    "one_ones_vector": ({"partC_null_residual"}, {"partC_answer": '''
def psd_not_pd(W, C, n):
    return np.linalg.eigvalsh(W).min(), np.abs(W @ np.ones(C * n)).max()
'''}),
    # the largest signed entry of W v_i instead of the largest absolute one
    "signed_residual": ({"partC_null_residual"}, {"partC_answer": '''
def psd_not_pd(W, C, n):
    smallest = np.linalg.eigvalsh(W).min()
    residual = 0.0
    for i in range(n):
        v = np.zeros((C, n))
        v[:, i] = 1.0
        residual = max(residual, (W @ v.ravel()).max())
    return smallest, residual
'''}),
}
