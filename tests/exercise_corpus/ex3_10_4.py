"""Submissions for ex3_10_4 (see ex3_10_1.py for the format)."""

CORRECT = {
    "diag_and_cholesky": {
        "partA_answer": '''
def newton_update_full(K, W, grad, f):
    n = len(f)
    return K @ np.linalg.solve(np.identity(n) + np.diag(W) @ K, W * f + grad)
''',
        "partB_answer": '''
from scipy.linalg import cho_factor, cho_solve

def newton_update_partitioned(K, W, grad, f, idx1):
    idx1 = np.asarray(idx1)
    idx2 = np.array([j for j in range(len(f)) if j not in set(idx1.tolist())], dtype=int)
    K11 = K[idx1][:, idx1]
    f1 = K11 @ np.linalg.solve(np.identity(len(idx1)) + np.diag(W[idx1]) @ K11, W[idx1] * f[idx1] + grad[idx1])
    f2 = K[idx2][:, idx1] @ cho_solve(cho_factor(K11), f1)
    order = np.argsort(np.concatenate([idx1, idx2]))
    return np.concatenate([f1, f2])[order]
''',
        "partC_answer": '''
def partition_gap(K, W, grad, f, idx1, scale):
    in_set2 = np.ones(len(f), dtype=bool)
    in_set2[idx1] = False
    s = np.where(in_set2, scale, 1.0)
    full = newton_update_full(K, W * s, grad * s, f)
    part = newton_update_partitioned(K, W * s, grad * s, f, idx1)
    return float(np.abs(full - part).max())
''',
    },
    "algorithm_3_1_form": {
        "partA_answer": '''
def newton_update_full(K, W, grad, f):
    # Algorithm 3.1, lines 5-8: B = I + W^1/2 K W^1/2, a = b - W^1/2 B^-1 W^1/2 K b, f = K a
    sW = np.sqrt(W)
    L = np.linalg.cholesky(np.eye(len(f)) + sW[:, None] * K * sW[None, :])
    b = W * f + grad
    a = b - sW * np.linalg.solve(L.T, np.linalg.solve(L, sW * (K @ b)))
    return K @ a
''',
        "partB_answer": '''
def newton_update_partitioned(K, W, grad, f, idx1):
    n = len(f)
    mask = np.zeros(n, dtype=bool)
    mask[idx1] = True
    i1, i2 = np.flatnonzero(mask), np.flatnonzero(~mask)
    K11 = K[np.ix_(i1, i1)]
    sW = np.sqrt(W[i1])
    L = np.linalg.cholesky(np.eye(len(i1)) + sW[:, None] * K11 * sW[None, :])
    b = W[i1] * f[i1] + grad[i1]
    a1 = b - sW * np.linalg.solve(L.T, np.linalg.solve(L, sW * (K11 @ b)))
    out = np.zeros(n)
    out[i1] = K11 @ a1
    out[i2] = K[np.ix_(i2, i1)] @ a1          # K21 K11^-1 f1 with f1 = K11 a1
    return out
''',
        "partC_answer": '''
def partition_gap(K, W, grad, f, idx1, scale):
    W2, g2 = np.array(W, dtype=float), np.array(grad, dtype=float)
    others = np.setdiff1d(np.arange(len(f)), idx1)
    W2[others] = W2[others] * scale
    g2[others] = g2[others] * scale
    return np.max(np.abs(newton_update_full(K, W2, g2, f) - newton_update_partitioned(K, W2, g2, f, idx1)))
''',
    },
}

MISTAKES = {
    # a cheat: an AST transformer that turns every assert of later cells into pass (every test would
    # pass without the grader's guard), and a wrong update
    "hooks_delete_asserts": ({"partA_newton_step", "partA_general"}, {"partA_answer": '''
import ast


class _NoAsserts(ast.NodeTransformer):
    def visit_Assert(self, node):
        return ast.Pass()


get_ipython().ast_transformers.append(_NoAsserts())


def newton_update_full(K, W, grad, f):
    return f.copy()
'''}),
    "K_W_instead_of_W_K": ({"partA_newton_step", "partA_general"}, {"partA_answer": '''
def newton_update_full(K, W, grad, f):
    n = K.shape[0]
    return K @ np.linalg.solve(np.eye(n) + W * K, W * f + grad)
'''}),
    "uses_set_2": ({"partB_ignores_set2"}, {"partB_answer": '''
def newton_update_partitioned(K, W, grad, f, idx1):
    n = K.shape[0]
    return K @ np.linalg.solve(np.eye(n) + W[:, None] * K, W * f + grad)
'''}),
    "set_1_first": ({"partB_equals_full"}, {"partB_answer": '''
def newton_update_partitioned(K, W, grad, f, idx1):
    n = K.shape[0]
    idx2 = np.setdiff1d(np.arange(n), idx1)
    K11 = K[np.ix_(idx1, idx1)]
    f1 = K11 @ np.linalg.solve(np.eye(len(idx1)) + W[idx1][:, None] * K11, W[idx1] * f[idx1] + grad[idx1])
    f2 = K[np.ix_(idx2, idx1)] @ np.linalg.solve(K11, f1)
    return np.concatenate([f1, f2])
'''}),
    "scales_every_point": ({"partC_gap"}, {"partC_answer": '''
def partition_gap(K, W, grad, f, idx1, scale):
    Ws, gs = W * scale, grad * scale
    return np.max(np.abs(newton_update_full(K, Ws, gs, f) - newton_update_partitioned(K, Ws, gs, f, idx1)))
'''}),
    "scales_in_place": ({"partC_inputs_unchanged"}, {"partC_answer": '''
def partition_gap(K, W, grad, f, idx1, scale):
    idx2 = np.setdiff1d(np.arange(K.shape[0]), idx1)
    W[idx2] *= scale
    grad[idx2] *= scale
    return np.max(np.abs(newton_update_full(K, W, grad, f) - newton_update_partitioned(K, W, grad, f, idx1)))
'''}),
    "signed_gap": ({"partC_gap"}, {"partC_answer": '''
def partition_gap(K, W, grad, f, idx1, scale):
    idx2 = np.setdiff1d(np.arange(K.shape[0]), idx1)
    Ws, gs = W.copy(), grad.copy()
    Ws[idx2] *= scale
    gs[idx2] *= scale
    return np.max(newton_update_partitioned(K, Ws, gs, f, idx1) - newton_update_full(K, Ws, gs, f))
'''}),
    # Part A unfinished; a valid Part B and Part C built on newton_update_full
    "part_a_unfinished": ({"partA_newton_step", "partA_general"}, {"partA_answer": '''
def newton_update_full(K, W, grad, f):
    # YOUR CODE HERE
    raise NotImplementedError()
''', "partB_answer": '''
def newton_update_partitioned(K, W, grad, f, idx1):
    n = K.shape[0]
    idx1 = np.asarray(idx1)
    idx2 = np.setdiff1d(np.arange(n), idx1)
    K11 = K[np.ix_(idx1, idx1)]
    f1 = newton_update_full(K11, W[idx1], grad[idx1], f[idx1])      # (3.89)'s first line is (3.18) on set 1
    out = np.empty(n)
    out[idx1] = f1
    out[idx2] = K[np.ix_(idx2, idx1)] @ np.linalg.solve(K11, f1)
    return out
'''}),
}
