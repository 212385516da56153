"""Submissions for ex3_10_1: answer cells by grade id. CORRECT: complete solutions written
differently from the instructor's; MISTAKES: one typical mistake each, with the test cells that
must lose points (every other cell keeps full marks)."""

CORRECT = {
    "density_of_yf": {
        "partA_answer": '''
def noisy_step_likelihood(y, f, noise_var=1.0):
    """Integrate the density of y*f~ ~ N(y f, sigma^2) over the positive half-line.
    (No cdf or erf here: the point is to get Phi by integrating.)"""
    sd = np.sqrt(noise_var)
    m = y * f
    dens = lambda t: norm.pdf(t, loc=m, scale=sd)
    if m > 0:   # split at the peak so that quad sees it
        return integrate.quad(dens, 0.0, m, epsabs=1e-13)[0] + integrate.quad(dens, m, np.inf, epsabs=1e-13)[0]
    return integrate.quad(dens, 0.0, np.inf, epsabs=1e-13, points=None)[0]
''',
        "partB_answer": '''
def noisy_step_likelihood_mc(y, f, noise_var, n_samples, seed):
    rng = np.random.default_rng(seed)
    ft = rng.normal(f, np.sqrt(noise_var), size=n_samples)
    p = np.count_nonzero(np.sign(ft) == np.sign(y)) / n_samples
    return p, np.sqrt(p * (1.0 - p) / n_samples)
''',
        "partC_answer": '''
def probit_evidence_orthant(K, y):
    y = np.asarray(y, dtype=float)
    S = (K + np.eye(len(y))) * np.outer(y, y)       # cov of -diag(y) f~
    return np.log(multivariate_normal(mean=np.zeros(len(y)), cov=S).cdf(np.zeros(len(y))))
''',
    },
    "standardised": {
        "partA_answer": '''
def noisy_step_likelihood(y, f, noise_var=1.0):
    # change of variables z = (f~ - f)/sigma: y f~ > 0  <=>  z > -y f / sigma
    a = -y * f / np.sqrt(noise_var)
    phi = lambda z: np.exp(-0.5 * z * z) / np.sqrt(2.0 * np.pi)
    lo, hi = a, max(a, 0.0) + 40.0
    pts = [0.0] if lo < 0.0 < hi else None
    return integrate.quad(phi, lo, hi, points=pts, epsabs=1e-14, epsrel=1e-12, limit=200)[0]
''',
        "partB_answer": '''
def noisy_step_likelihood_mc(y, f, noise_var, n_samples, seed):
    draws = f + np.random.default_rng(seed).standard_normal(n_samples) * noise_var ** 0.5
    hit = (draws > 0) if y > 0 else (draws < 0)
    return hit.mean(), hit.std() / np.sqrt(n_samples)
''',
        "partC_answer": '''
def probit_evidence_orthant(K, y):
    n = K.shape[0]
    Z = np.diag(-np.asarray(y, float))
    cov = Z @ (K + np.identity(n)) @ Z.T
    return float(np.log(multivariate_normal.cdf(np.zeros(n), mean=np.zeros(n), cov=cov)))
''',
    },
}

MISTAKES = {
    # a cheat: an object that equals everything and whose difference from anything is 0
    "always_equal": ({"partA_unit_noise", "partA_noise_variance"}, {"partA_answer": '''
class _Anything:
    def __eq__(self, other):
        return True
    __hash__ = object.__hash__
    def __sub__(self, other):
        return 0.0
    __rsub__ = __sub__


def noisy_step_likelihood(y, f, noise_var=1.0):
    return _Anything()
'''}),
    "uses_the_cdf": ({"partA_no_cdf"}, {"partA_answer": '''
def noisy_step_likelihood(y, f, noise_var=1.0):
    return norm.cdf(y * f / np.sqrt(noise_var))
'''}),
    "variance_as_sd": ({"partA_noise_variance"}, {"partA_answer": '''
def noisy_step_likelihood(y, f, noise_var=1.0):
    sd = noise_var
    dens = lambda t: np.exp(-0.5 * ((t - f) / sd) ** 2) / (sd * np.sqrt(2 * np.pi))
    if y > 0:
        return integrate.quad(dens, 0.0, f + 40 * sd if f + 40 * sd > 0 else 0.0, epsabs=1e-13)[0] if f + 40 * sd > 0 else 0.0
    return integrate.quad(dens, f - 40 * sd, 0.0, epsabs=1e-13)[0] if f - 40 * sd < 0 else 0.0
'''}),
    "se_without_root": ({"partB_standard_error"}, {"partB_answer": '''
def noisy_step_likelihood_mc(y, f, noise_var, n_samples, seed):
    rng = np.random.default_rng(seed)
    ft = f + np.sqrt(noise_var) * rng.standard_normal(n_samples)
    p = np.mean(y * ft > 0)
    return p, np.sqrt(p * (1 - p)) / n_samples
'''}),
    "forgets_the_noise": ({"partC_two_cases", "partC_more_cases"}, {"partC_answer": '''
def probit_evidence_orthant(K, y):
    D = np.diag(y)
    return np.log(multivariate_normal.cdf(np.zeros(len(y)), mean=np.zeros(len(y)), cov=D @ K @ D))
'''}),
    "library_evidence": ({"partC_two_cases", "partC_more_cases"}, {"partC_answer": '''
def probit_evidence_orthant(K, y):
    return gpclab.exact_log_evidence_probit(K, y)
'''}),
    "library_evidence_imported": ({"partC_two_cases", "partC_more_cases"}, {"partC_answer": '''
from gpclab import exact_log_evidence_probit as _evidence


def probit_evidence_orthant(K, y):
    return _evidence(np.asarray(K, float), np.asarray(y, float))
'''}),
}
