"""gpclab: Gaussian-process classification as in GPML chapter 3, line by line.

This file is the book's pseudocode as running code. Hold Rasmussen & Williams,
*Gaussian Processes for Machine Learning* (MIT Press, 2006), chapter 3, in one
hand and this file in the other: each algorithm box is one function, and each
line of a box is a line of code ending in a comment that gives the box line and
the equation, e.g. ``# line 6: b := W f + grad log p(y|f)  (3.18)``.
``gpclab.show_box("3.1")`` prints a box beside its code, with the book's errata
and the code's departures from the box beside the lines they concern.

Contents: each box, its function, and the line of the function's ``def`` in this
file (the last row: the line of BOXES, which show_box and its helpers follow;
tests/test_boxes.py keeps these numbers true):
    GPML Algorithm 3.1  binary Laplace, mode              laplace_mode                line 1238
    GPML Algorithm 3.2  binary Laplace, predictions       laplace_predict             line 1305
    GPML Algorithm 3.3  multi-class Laplace, mode         laplace_mode_multiclass     line 1525
    GPML Algorithm 3.4  multi-class Laplace, predictions  laplace_predict_multiclass  line 1789
    GPML Algorithm 3.5  expectation propagation           ep                          line 2207
    GPML Algorithm 3.6  EP predictions                    ep_predict                  line 2286
    K&R Algorithm 3     annealed importance sampling      ais                         line 2794
    the boxes as printed, errata, departures              BOXES, show_box             line 4175

Part I, the book (numba ``@njit`` functions, in the chapter's order):
    GPML 3.3   covariance functions; the likelihoods (3.15, 3.16) and their one
               table, LIKELIHOODS (see "Likelihoods" below)
    GPML 3.4   binary Laplace: Algorithms 3.1 (laplace_mode), 3.2 (laplace_predict)
    GPML 3.5   multi-class Laplace: Algorithms 3.3 (laplace_mode_multiclass),
               3.4 (laplace_predict_multiclass)
    GPML 3.6   expectation propagation: Algorithms 3.5 (ep), 3.6 (ep_predict)
    K&R 5-6    MCMC: Hybrid Monte Carlo, annealed importance sampling (ais)
    K&G 3-4    EM-EP hyperparameter learning (em_ep)
Part II, using it: GPClassifier (a scikit-learn estimator), ML-II, evidence
    grids, scores, data, the plotting helpers the lectures share.
Part III, machinery, not needed to follow the book: numba's cache, the
    checked public face, interrupts, the compile command.

References, as cited in comments:
    (3.18), Alg. 3.1   GPML chapter 3 (bare equation numbers are GPML)
    (K&R 43)           Kuss & Rasmussen, Assessing approximate inference for
                       binary Gaussian process classification, JMLR 6, 2005
    (W&B 4)            Williams & Barber, Bayesian classification with
                       Gaussian processes, IEEE PAMI 20(12), 1998
    (K&G 31)           Kim & Ghahramani, Bayesian Gaussian process
                       classification with the EM-EP algorithm, IEEE PAMI
                       28(12), 2006

Glossary (code name: book symbol):
    K        K, prior covariance of the training latents, (n, n)
    y        y, labels in {-1, +1}, (n,)
    f        f, latent values at the training inputs, (n,)
    f_hat    f^, the posterior mode
    lp, dlp, d2lp, d3lp
             log p(y|f) and its first three derivatives in f, elementwise
    W        W = -grad grad log p(y|f), a diagonal matrix stored as (n,)
    sW       W^(1/2), (n,)
    B        B = I + W^(1/2) K W^(1/2)  (3.26)
    L        cholesky(B), lower triangular, (n, n)
    a        a = K^-1 f, kept so that f^T K^-1 f = a^T f  (Alg. 3.1 line 7)
    psi      the objective of Alg. 3.1 line 9, Psi(f) (3.12) without its
             constant terms
    log_q    log q(y|X, theta), the Laplace approximate log evidence (3.32)
    K_star   k(x_*) for many test inputs, one column per test case, (n, m)
    f_bar_star, V_f_star
             latent predictive mean (3.21) and variance (3.24), (m,)
    pi_bar_star
             averaged predictive probability of class +1 (3.25), (m,)
    log_hyp  covariance hyperparameters in log space (see "covariance functions")

    multi-class (3.5): f, y, pi of shape (C, n), class-major (3.33); K of
    shape (C, n, n); E, M as in Algorithm 3.3; pf = Pi^T f (line 11), r =
    M^T\\(M\\(R^T c)) (line 13), E_sum = sum_c E_c (line 10)
    EP (3.6): nu_tilde, tau_tilde site parameters nu~, tau~ (3.66); sS = S~^1/2;
    nu_cav, tau_cav the cavity's (3.56); the tilted moments mu^_i, sigma^_i^2
    (3.58) are implied, never formed: _site_update gives the new tau~_i, nu~_i
    (tau_new, nu_new) from r = (1 - 2 eps) N(z) / Z_i (N(z)/Phi(z) for probit),
    rz = r + z and w = r (z + r), z = y_i mu_-i / sd, sd = sqrt(1 + sigma_-i^2) (probit);
    d_tau, d_nu the changes Delta tau~, Delta nu~ of site i;
    s_i column i of Sigma (Alg. 3.5 line 10; s_i[i] = sigma_i^2); line 10's
    rank-one updates wait in U, c: U[j] = s_i and c[j] = ci =
    ((Delta tau~)^-1 + Sigma_ii)^-1 of the m sites since Sigma was last updated;
    Sigma, mu the approximate posterior (3.53); log_Z = log Z_EP (3.65)
    MCMC (K&R): g = L^-1 f whitened latents; tau an inverse temperature (K&R 28)
    EM-EP (K&G): eps the labelling noise (K&G 10); t0, t1, t2, l the hyperparameters
    theta_0, theta_1, theta_2, l_m of (K&G 13); h = mu, A = Sigma of q(f) (K&G 27);
    F the bound (K&G 29), F_cov its covariance part (K&G 56); Kg the covariance
    of the multi-class difference latents g (K&G 43)

Naming (as in GPML's own code, where t means tilde): a suffix stands for the
book's accent or subscript: _tilde ~ (the sites, nu_tilde = nu~), _hat ^ (f_hat,
mu_hat), _bar a bar (f_bar_star, pi_bar_star), _star * (a test input: K_star =
k(X, x_*), k_star_star = k(x_*, x_*)), _cav the cavity's "-i" (tau_cav = tau_-i),
_init a warm start, _old the previous iterate, _new the next value. A leading s is
a square root (sW = W^1/2, sS = S~^1/2, sD = D^1/2; sd a standard deviation), but
for s_i, column i of Sigma as in Alg. 3.5 line 10 (in ep); d a derivative
(dlp, d2lp, d3lp of log p) or a change (d_tau = Delta tau~); log_ a logarithm
(log_q, log_Z, log_hyp). Mb = M\\b and bTk = b^T k_* in Algorithm 3.4. Capitals
are matrices, lower case vectors and numbers, as in the book. A comment
"# line 6: ..." labels a line of the function's box; "# 3.4 line 19: ..." a line
of box 3.4 done in a helper; "# for line 10: ..." (or "# for 3.5 line 7: ...") a
statement that computes a part of that line (ci of line 10), shown with it by
show_box; "departs from line N" says what the code does otherwise, and why.

What Part I takes from Part III (machinery, to be taken on trust while reading):
    check_interrupt()   called once per outer iteration of every long loop: raises
                        KeyboardInterrupt when Ctrl-C or Jupyter's Interrupt has
                        arrived, because numba code never looks at signals itself
    _main_thread()      True: the caller can see Ctrl-C (worker threads cannot)
    _dpotrf, _dpotri, _dtrsm, _dsyrk
                        LAPACK's Cholesky factorisation and inverse, BLAS's
                        triangular solve and rank-k update, called from numba
                        through scipy (used only by _cholesky, _potri_lower,
                        solve_lower_matrix, syrk_lower)
    _assemble_one       what @njit and @public (below) hand each function to, once
                        Part III has made every numba function and checked entry
em_ep, plain Python, also uses Part II's label and default helpers (class_labels,
one_hot, default_log_hyp, default_bounds, _warn_not_converged).

Likelihoods: LIKELIHOODS (Part I, after logistic and probit) is the one table of
them, name -> what each algorithm needs (log p for Laplace and MCMC, HMC's w_max,
the Gaussian average of the predictions, EP's site); the public specs (Parts I and
II), GPClassifier's choices, EP, HMC's step size and the compile command read it,
and a name not in it is refused everywhere. To add one: write its log p(y|f) and
three derivatives as an @njit function like logistic(y, f), add its branch to
log_likelihood and its row to LIKELIHOODS (the comment above the table says how);
tests/test_likelihoods.py adds the complementary log-log likelihood that way.
"""

import contextvars
import gc
import inspect
import math
import os
import re
import sys
import warnings
from collections import namedtuple
from contextlib import contextmanager


@contextmanager
def _gc_paused_then_frozen(freeze=True):
    """Around imports, and Part III's assembly of gpclab's functions: what they make lasts as long
    as the process, and two of its costs are spared (0.3-0.5 s of CPU in a new process's first
    cell; README, "A busy hub").
    - Python's garbage collector pauses meanwhile, and afterwards never scans those objects again
      (gc.freeze). It collects first, so no garbage is frozen; reference cycles alive at that moment
      (the import) are frozen too, and freed when the process ends. freeze=False (GPClassifier's
      first use, at any point of a session) only pauses.
    - An OpenBLAS loaded meanwhile (scipy's) lets its idle threads sleep at once, instead of each
      spinning 0.1 s of CPU first: OPENBLAS_THREAD_TIMEOUT=4 while loading, unless it is set."""
    enabled = gc.isenabled()
    if enabled:
        gc.collect()
    gc.disable()
    ours = "OPENBLAS_THREAD_TIMEOUT" not in os.environ
    if ours:
        os.environ["OPENBLAS_THREAD_TIMEOUT"] = "4"
    try:
        yield
    finally:
        if ours:
            os.environ.pop("OPENBLAS_THREAD_TIMEOUT", None)
        if freeze:
            gc.freeze()
        if enabled:
            gc.enable()


with _gc_paused_then_frozen():
    import numpy as np
    from numba import prange

__version__ = "0.1.0"

# --- How this file is assembled ----------------------------------------------
# The two decorators below only take notes. @njit(...) records numba's options for a
# function, @public(...) how the arguments of a public function are checked (a spec per
# argument, see Part III). Part III, at the end of the file, turns every recorded function
# into a numba function behind one checked entry; until then each name is the plain
# Python function written here. numba looks up the functions a body calls when it first
# compiles it, so bodies call each other by name. fn.py_func runs the box itself in
# Python, to step through in a debugger (it returns a plain tuple); the helpers it calls
# (_step_search, _site_update, log_likelihood, ...) stay compiled, and "step into" one
# lands in numba's dispatcher. To step into the helpers too, start Python with
# NUMBA_DISABLE_JIT=1 (before importing gpclab): then all of it runs as plain Python.


def njit(**options):
    """Record numba's options for the function below (compiled by Part III)."""
    def record(fn):
        fn._njit_options = options
        return _assemble_one(fn) if _ASSEMBLED else fn
    return record


def public(returns=None, together=(), **specs):
    """Record the checks of a public function: one spec per argument (see Part III)."""
    def record(fn):
        fn._public_specs = (returns, together, specs)
        return _assemble_one(fn) if _ASSEMBLED else fn
    return record


_ASSEMBLED = False


# ############################################################################
# PART I. THE BOOK
# ############################################################################


# ============================================================================
# GPML 3.3 The GP prior: covariance functions (K&R 33, W&B 4, K&G 13-14)
# ============================================================================
#
# "se":     k(x, x') = sf^2 exp(-r^2 / (2 l^2)),   log_hyp = (log l, log sf)
# "ard":    k(x, x') = v0 exp(-1/2 sum_m w_m d_m(x, x')) + v1   (W&B 4),
#           log_hyp = (log v0, log v1, log w_1, ..., log w_d)
# "kg":     k(x_i, x_j) = t0 exp(-1/2 sum_m l_m d_m(x_i, x_j)) + t1 + t2 delta(i, j)   (K&G 13),
#           log_hyp = (log t0, log t1, log t2, log l_1, ..., log l_d): one inverse
#           length-scale per input, K&G's "(m)" models
# "kg_iso": (K&G 13) with one l shared by all inputs, K&G's "(s)" models,
#           log_hyp = (log t0, log t1, log t2, log l)
#
# d_m(x, x') = (x^m - x'^m)^2 for a continuous input and 1 - delta(x^m, x'^m) for
# a discrete one (K&G 14); r^2 = sum_m d_m. The optional argument `discrete`,
# a (d,) array of flags, says which inputs are discrete (default: none).
# delta(i, j) in "kg" and "kg_iso" is the latent noise of each training case:
# it appears in k(X, X) and in k(x_*, x_*), not between different points.


@public(kernel="{se,ard,kg,kg_iso}", d="count")
@njit(cache=True)
def n_hyp(kernel, d):
    """Number of log-hyperparameters of covariance `kernel` on d inputs."""
    if kernel == "se":
        return 2
    if kernel == "ard":
        return d + 2
    if kernel == "kg":
        return d + 3
    return 4                                                  # "kg_iso"


@njit(cache=True)
def _d_m(a, b, is_discrete):
    """d_m(x^m, x'^m) of K&G eq. 14: squared difference, or 1 - delta for a discrete input."""
    t = a - b
    if is_discrete:
        return 1.0 if t != 0.0 else 0.0
    return t * t


@njit(cache=True)
def _inverse_length_scales(kernel, d, log_hyp):
    """The weights w_m (W&B 4) or l_m (K&G 13) of each input, (d,)."""
    if kernel == "ard":
        return np.exp(log_hyp[2:])
    if kernel == "kg":
        return np.exp(log_hyp[3:])
    return np.full(d, math.exp(log_hyp[3]))                   # "kg_iso": one l for all inputs


@public(kernel="{se,ard,kg,kg_iso}", X1="(n, d)", X2="(m, d)", log_hyp="(p,) loghyp", discrete="(d,) flags ?0")
@njit(cache=True)
def kernel_matrix(kernel, X1, X2, log_hyp, discrete=None):
    """Covariance matrix k(X1, X2), shape (n1, n2), for log-hyperparameters log_hyp.

    discrete : optional (d,) flags of the discrete inputs (K&G 14).
    The delta(i, j) term of "kg" and "kg_iso" is added only when X1 and X2
    are the same array, k(X, X): it is the latent noise of each training case.
    """
    n1, d = X1.shape
    n2 = X2.shape[0]
    disc = discrete != 0.0                                    # (d,) True where input m is discrete
    K = _empty(n1, n2)
    # the same array twice (K = k(X, X)): compute one triangle and mirror it
    symmetric = n1 == n2 and X1.ctypes.data == X2.ctypes.data
    if kernel == "se":
        inv_l2 = math.exp(-2.0 * log_hyp[0])
        sf2 = math.exp(2.0 * log_hyp[1])
        any_discrete = disc.any()
        for i in range(n1):
            check_interrupt()
            for j in range(i + 1 if symmetric else n2):
                r2 = 0.0
                if any_discrete:
                    for m in range(d):
                        r2 += _d_m(X1[i, m], X2[j, m], disc[m])
                else:                                         # the same sum without the flags' branch
                    for m in range(d):
                        t = X1[i, m] - X2[j, m]
                        r2 += t * t
                K[i, j] = sf2 * math.exp(-0.5 * r2 * inv_l2)
    else:                                                     # "ard", "kg", "kg_iso"
        v0 = math.exp(log_hyp[0])
        v1 = math.exp(log_hyp[1])
        w = _inverse_length_scales(kernel, d, log_hyp)
        for i in range(n1):
            check_interrupt()
            for j in range(i + 1 if symmetric else n2):
                s = 0.0
                for m in range(d):
                    s += w[m] * _d_m(X1[i, m], X2[j, m], disc[m])
                K[i, j] = v0 * math.exp(-0.5 * s) + v1
    if symmetric:
        for i in range(n1):
            for j in range(i + 1, n2):
                K[i, j] = K[j, i]
        if kernel == "kg" or kernel == "kg_iso":
            t2 = math.exp(log_hyp[2])
            for i in range(n1):
                K[i, i] += t2
    return K


@public(kernel="{se,ard,kg,kg_iso}", X="(m, d)", log_hyp="(p,) loghyp")
@njit(cache=True)
def kernel_diag(kernel, X, log_hyp):
    """k(x, x) for each row of X, shape (m,): the prior variances of test latents."""
    m = X.shape[0]
    if kernel == "se":
        return np.full(m, math.exp(2.0 * log_hyp[1]))
    if kernel == "kg" or kernel == "kg_iso":
        return np.full(m, math.exp(log_hyp[0]) + math.exp(log_hyp[1]) + math.exp(log_hyp[2]))
    return np.full(m, math.exp(log_hyp[0]) + math.exp(log_hyp[1]))


@public(kernel="{se,ard,kg,kg_iso}", X="(n, d)", log_hyp="(p,) loghyp", K="(n, n)", j="count0",
        discrete="(d,) flags ?0")
@njit(cache=True)
def kernel_grad(kernel, X, log_hyp, K, j, discrete=None):
    """dK/d log_hyp[j], shape (n, n), given K = kernel_matrix(kernel, X, X, log_hyp, discrete)."""
    n, d = X.shape
    disc = discrete != 0.0                                    # (d,) True where input m is discrete
    dK = _empty(n, n)
    if kernel == "se":
        if j == 1:  # d/d log sf of sf^2 e(.) = 2 K
            for i in range(n):
                for k in range(n):
                    dK[i, k] = 2.0 * K[i, k]
            return dK
        inv_l2 = math.exp(-2.0 * log_hyp[0])  # d/d log l = K r^2 / l^2
        any_discrete = disc.any()
        for i in range(n):
            for k in range(i + 1):
                r2 = 0.0
                if any_discrete:
                    for c in range(d):
                        r2 += _d_m(X[i, c], X[k, c], disc[c])
                else:                         # the same sum without the flags' branch (kernel_matrix)
                    for c in range(d):
                        t = X[i, c] - X[k, c]
                        r2 += t * t
                dK[i, k] = K[i, k] * r2 * inv_l2
                dK[k, i] = dK[i, k]
        return dK
    v1 = math.exp(log_hyp[1])
    kg = kernel == "kg" or kernel == "kg_iso"
    off = 3 if kg else 2
    t2 = math.exp(log_hyp[2]) if kg else 0.0
    if j == 1:  # d/d log v1 = v1
        dK[:, :] = v1
        return dK
    if kg and j == 2:  # d/d log t2 = t2 delta(i, j)
        dK[:, :] = 0.0
        for i in range(n):
            dK[i, i] = t2
        return dK
    if j == 0:  # d/d log v0 = v0 e(.) = K - v1 (- t2 delta)
        for i in range(n):
            for k in range(n):
                dK[i, k] = K[i, k] - v1
            dK[i, i] -= t2
        return dK
    # d/d log w_c = v0 e(.) (-1/2 w_c d_c(x, x')); "kg_iso": d/d log l = v0 e(.) (-1/2 l r^2)
    c = j - off
    wc = math.exp(log_hyp[j])
    any_discrete = disc.any()
    for i in range(n):
        for k in range(i + 1):
            if kernel == "kg_iso":
                dist = 0.0
                if any_discrete:
                    for m in range(d):
                        dist += _d_m(X[i, m], X[k, m], disc[m])
                else:
                    for m in range(d):
                        t = X[i, m] - X[k, m]
                        dist += t * t
            else:
                dist = _d_m(X[i, c], X[k, c], disc[c])
            dK[i, k] = (K[i, k] - v1 - (t2 if i == k else 0.0)) * (-0.5 * wc * dist)
            dK[k, i] = dK[i, k]
    return dK


# ============================================================================
# GPML 3.3 Likelihoods (3.15, 3.16), the normal cdf they need, and (3.25)
# ============================================================================

_LOG_SQRT_2PI = 0.5 * math.log(2.0 * math.pi)
_SQRT2 = math.sqrt(2.0)


@njit(cache=True)
def _mills_tail(x):
    """Remainder r of N(z)/Phi(z) = x + r for z = -x <= -5.

    Continued fraction for the Mills ratio: Phi(-x)/N(x) = 1/(x + 1/(x + 2/(x + ...))),
    evaluated bottom-up with nt terms (enough for double precision).
    """
    if x < 8.0:
        nt = 30
    elif x < 15.0:
        nt = 16
    elif x < 40.0:
        nt = 10
    else:
        nt = 6
    r = 0.0
    for k in range(nt, 0, -1):
        r = k / (x + r)
    return r


@public(z="number")
@njit(cache=True)
def log_phi(z):
    """log Phi(z), the log of the standard normal cdf, for any real z.

    Three regimes (as GPML's logphi): log1p for z > 0, the erfc form on
    (-5, 0], a continued fraction for the Mills ratio below -5 where Phi(z)
    underflows (the naive form returns -inf below z ~ -38).
    """
    if z > 0.0:
        return math.log1p(-0.5 * math.erfc(z / _SQRT2))
    if z > -5.0:
        return math.log(0.5 * math.erfc(-z / _SQRT2))
    x = -z
    return -0.5 * x * x - _LOG_SQRT_2PI - math.log(x + _mills_tail(x))


@public(z="number")
@njit(cache=True)
def n_over_phi(z):
    """N(z)/Phi(z), the inverse Mills ratio, stable for z in [-1e3, 1e3]."""
    if z > -5.0:
        return math.exp(-0.5 * z * z - _LOG_SQRT_2PI - log_phi(z))
    x = -z
    return x + _mills_tail(x)


@public(z="number")
@njit(cache=True)
def n_over_phi_and_sum(z):
    """r = N(z)/Phi(z) and r + z, the latter without cancellation for z << 0.

    In the tail r = x + t with x = -z (see _mills_tail), so r + z = t exactly,
    where subtracting two numbers near |z| would lose all digits.
    """
    if z > -5.0:
        r = n_over_phi(z)
        return r, r + z
    t = _mills_tail(-z)
    return -z + t, t


@public(z="number")
@njit(cache=True)
def std_normal_cdf(z):
    """Phi(z), the standard normal cumulative distribution function."""
    return 0.5 * math.erfc(-z / _SQRT2)


@public(z="number")
@njit(cache=True)
def sigmoid(z):
    """The logistic function lambda(z) = 1 / (1 + exp(-z)), without overflow."""
    if z >= 0.0:
        return 1.0 / (1.0 + math.exp(-z))
    e = math.exp(z)
    return e / (1.0 + e)


def _gauss_hermite(n):
    """Nodes and weights of the n-point Gauss-Hermite rule (weight exp(-x^2))."""
    return np.polynomial.hermite.hermgauss(n)


def _gauss_laguerre(n):
    """Nodes and weights of the n-point Gauss-Laguerre rule (weight exp(-x))."""
    return np.polynomial.laguerre.laggauss(n)


# Fixed rules, frozen into the compiled code as constants.
_GH_X, _GH_W = _gauss_hermite(64)
_GL_X, _GL_W = _gauss_laguerre(64)


@public(mu="real", var="nonneg")
@njit(cache=True)
def logistic_gaussian_integral(mu, var):
    """E[lambda(f)] for f ~ N(mu, var): the integral of GPML eq. (3.25).

    For sd <= 2 a 64-point Gauss-Hermite rule over f. For wider Gaussians the
    logistic is nearly a step on the scale of N(f|mu, var), which no fixed
    Hermite rule resolves, so split lambda = H + (lambda - H) with H the unit
    step: E[H(f)] = Phi(mu/sd) exactly, and the rest equals
    int_0^inf exp(-w) lambda(w) [N(w|-mu, var) - N(w|mu, var)] dw,
    a smooth integrand for a 64-point Gauss-Laguerre rule. Absolute error
    below 1e-9 against adaptive quadrature (tests/test_numerics.py).
    """
    sd = math.sqrt(var)
    if sd <= 2.0:
        s = 0.0
        for k in range(_GH_X.shape[0]):
            s += _GH_W[k] * sigmoid(mu + _SQRT2 * sd * _GH_X[k])
        return s / math.sqrt(math.pi)
    s = 0.0
    for k in range(_GL_X.shape[0]):
        w = _GL_X[k]
        zm = (w + mu) / sd
        zp = (w - mu) / sd
        dens = (math.exp(-0.5 * zm * zm) - math.exp(-0.5 * zp * zp)) / (sd * math.sqrt(2 * math.pi))
        s += _GL_W[k] * sigmoid(w) * dens
    return std_normal_cdf(mu / sd) + s


@public(y="(n,) pm1", f="(n,)")
@njit(cache=True)
def logistic(y, f):
    """Logistic likelihood p(y_i|f_i) = lambda(y_i f_i) (GPML 3.15).

    Returns log p(y|f) and its first, second and third derivatives with
    respect to f, each of shape (n,), finite for |f| up to 1e3 and beyond.
    """
    n = y.shape[0]
    lp = np.empty(n)
    dlp = np.empty(n)
    d2lp = np.empty(n)
    d3lp = np.empty(n)
    for i in range(n):
        z = y[i] * f[i]
        # log lambda(z) = -log(1 + exp(-z)), without overflow
        if z >= 0.0:
            lp[i] = -math.log1p(math.exp(-z))
        else:
            lp[i] = z - math.log1p(math.exp(z))
        pi = sigmoid(f[i])                      # pi_i = p(y_i = 1|f_i)
        # 1 - pi as sigmoid(-f), not by subtraction: for large |f| the
        # difference keeps no digits, and W sets log|B| at a large sf
        pi_c = sigmoid(-f[i])                   # 1 - pi_i
        dlp[i] = y[i] * sigmoid(-z)             # (3.15), second column: t - pi, t = (y + 1)/2
        d2lp[i] = -pi * pi_c                    # (3.15), third column
        d3lp[i] = -pi * pi_c * (pi_c - pi)
    return lp, dlp, d2lp, d3lp


@public(y="(n,) pm1", f="(n,)")
@njit(cache=True)
def probit(y, f):
    """Cumulative-Gaussian likelihood p(y_i|f_i) = Phi(y_i f_i) (GPML 3.16).

    Returns log p(y|f) and its first, second and third derivatives with
    respect to f, each of shape (n,), finite for |f| up to 1e3 and beyond.
    With z = y f and r = N(z)/Phi(z): d log p/df = y r,
    d2 = -r (r + z), d3 = y r ((r + z)(2 r + z) - 1).
    """
    n = y.shape[0]
    lp = np.empty(n)
    dlp = np.empty(n)
    d2lp = np.empty(n)
    d3lp = np.empty(n)
    for i in range(n):
        z = y[i] * f[i]
        lp[i] = log_phi(z)
        r, rz = n_over_phi_and_sum(z)
        dlp[i] = y[i] * r
        d2lp[i] = -r * rz
        d3lp[i] = y[i] * r * (rz * (2.0 * r + z) - 1.0)
    return lp, dlp, d2lp, d3lp


# ----------------------------------------------------------------------------
# The likelihoods, one table: LIKELIHOODS
# ----------------------------------------------------------------------------
# Every place that takes a likelihood's name reads it from LIKELIHOODS: the specs of the public
# functions (Parts I and II), GPClassifier's choices per method, the compile command's paths
# (Part III), and, frozen into the compiled code as tuples, HMC's step size (_w_max), EP's site
# (_ep_noise) and the Gaussian average (3.25) of the predictions (_average_rule). In Part I only
# log_likelihood and _likelihood_row compare the name, and both refuse a name they do not know,
# so no name falls through to run as another.
#
# Adding a likelihood is one edit here (tests/test_likelihoods.py adds "cloglog" this way):
#   1. its log p(y|f) and three derivatives in f, an @njit function like logistic(y, f) above;
#   2. a branch `if likelihood == "name": return name(y, f)` in log_likelihood below;
#   3. its row in LIKELIHOODS: laplace=True (Laplace, HMC, AIS and the lower bound use log p),
#      w_max, and average="gauss_hermite" (a 64-point rule over p(y=+1|f)) unless it has its own.
# EP's sites are the family eps + (1 - 2 eps) Phi(y f / sqrt(noise)) (_tilted_terms): a row with
# ep_noise joins EP; a site outside that family also needs its log Z_hat and two derivatives in
# _tilted_terms. numba compares the name inside the compiled code (a function passed as an
# argument would be compiled anew in every process), and reads the table's tuples when it compiles:
# edit the file, not the table at run time, and then run `python -m gpclab compile`.

Likelihood = namedtuple("Likelihood", "laplace w_max average ep_noise em_ep formula")
Likelihood.__doc__ = """One row of LIKELIHOODS.

laplace   log p(y|f) and three derivatives in log_likelihood: Laplace, HMC, AIS, the lower bound
w_max     the largest W = -d2 log p/df2 in the bulk of the posterior (HMC's step, hmc_step_size)
average   the Gaussian average (3.25) and MAP rule of the predictions: 'probit' (3.82),
          'logistic' (logistic_gaussian_integral; also MacKay's rule), 'gauss_hermite' (64 points)
ep_noise  EP's site: a step of f plus N(0, ep_noise) noise, with labelling noise eps; None: no EP
em_ep     K&G's EM-EP bound (K&G 29) is written for it
formula   p(y|f), as printed"""

LIKELIHOODS = {
    "logistic": Likelihood(laplace=True, w_max=0.25, average="logistic", ep_noise=None, em_ep=False,
                           formula="lambda(y f) = 1 / (1 + exp(-y f))  (3.15)"),
    "probit": Likelihood(laplace=True, w_max=1.0, average="probit", ep_noise=1.0, em_ep=False,
                         formula="Phi(y f)  (3.16)"),
    "step": Likelihood(laplace=False, w_max=None, average=None, ep_noise=0.0, em_ep=True,
                       formula="eps + (1 - 2 eps) H(y f), H the unit step  (K&G 10)"),
}


def _likelihood_names(ask=lambda row: True):
    """The names of LIKELIHOODS whose row answers ask, in the table's order."""
    return tuple(name for name, row in LIKELIHOODS.items() if ask(row))


def _choice_spec(names):
    """A public spec "{a,b}": one of these names."""
    return "{" + ",".join(names) + "}"


_LAPLACE_LIKELIHOODS = _likelihood_names(lambda row: row.laplace)
_EP_LIKELIHOODS = _likelihood_names(lambda row: row.ep_noise is not None)
_EM_EP_LIKELIHOODS = _likelihood_names(lambda row: row.em_ep)
_LIKELIHOOD_SPEC = _choice_spec(_LAPLACE_LIKELIHOODS)      # "{logistic,probit}": log p is needed
_EP_LIKELIHOOD_SPEC = _choice_spec(_EP_LIKELIHOODS)        # "{probit,step}": an EP site is needed
_ANY_LIKELIHOOD_SPEC = _choice_spec(tuple(LIKELIHOODS))    # "{logistic,probit,step}"

# The table as the compiled code sees it (numba freezes these tuples into it; nan, -1: none)
_AVERAGE_PROBIT, _AVERAGE_LOGISTIC, _AVERAGE_GAUSS_HERMITE = 0, 1, 2
_AVERAGE_RULES = ("probit", "logistic", "gauss_hermite")
_ROW_NAMES = tuple(LIKELIHOODS)
_ROW_W_MAX = tuple(math.nan if row.w_max is None else float(row.w_max) for row in LIKELIHOODS.values())
_ROW_AVERAGE = tuple(-1 if row.average is None else _AVERAGE_RULES.index(row.average)
                     for row in LIKELIHOODS.values())
_ROW_EP_NOISE = tuple(math.nan if row.ep_noise is None else float(row.ep_noise) for row in LIKELIHOODS.values())


@public(likelihood=_LIKELIHOOD_SPEC, y="(n,) pm1", f="(n,)")
@njit(cache=True)
def log_likelihood(likelihood, y, f):
    """Dispatch on the likelihood's name: 'logistic' (3.15) or 'probit' (3.16); returns
    log p(y|f) and its first three derivatives in f, elementwise (see LIKELIHOODS)."""
    if likelihood == "logistic":
        return logistic(y, f)
    if likelihood == "probit":
        return probit(y, f)
    raise ValueError("log_likelihood: likelihood has no log p here (see gpclab.LIKELIHOODS)")


@njit(cache=True)
def _likelihood_row(likelihood):
    """The row of LIKELIHOODS with this name; any other name is refused."""
    for i in range(len(_ROW_NAMES)):
        if likelihood == _ROW_NAMES[i]:
            return i
    raise ValueError("likelihood: not a name in gpclab.LIKELIHOODS")


@njit(cache=True)
def _w_max(likelihood):
    """The largest W = -d2 log p(y|f)/df2 in the bulk of the posterior: 1/4 for logistic, 1 for probit."""
    w = _ROW_W_MAX[_likelihood_row(likelihood)]
    if math.isnan(w):
        raise ValueError("likelihood: has no log p, so no HMC step (see gpclab.LIKELIHOODS)")
    return w


@njit(cache=True)
def _average_rule(likelihood):
    """How predictions average over the latent Gaussian: _AVERAGE_PROBIT, _AVERAGE_LOGISTIC or
    _AVERAGE_GAUSS_HERMITE (LIKELIHOODS' average)."""
    rule = _ROW_AVERAGE[_likelihood_row(likelihood)]
    if rule < 0:
        raise ValueError("likelihood: has no Gaussian average here (see gpclab.LIKELIHOODS)")
    return rule


@njit(cache=True)
def _ep_noise(likelihood):
    """EP's site as a step of f plus Gaussian noise of this variance: 1 for 'probit' (Phi(y f) is
    the probability that f + N(0, 1) has the sign of y), 0 for K&G's 'step'; a likelihood with no
    EP site is refused."""
    noise = _ROW_EP_NOISE[_likelihood_row(likelihood)]
    if math.isnan(noise):
        raise ValueError("likelihood: has no EP site (see gpclab.LIKELIHOODS)")
    return noise


@njit(cache=True)
def _map_probability(rule, likelihood, f_bar):
    """p(y=+1|f_bar), the MAP prediction of section 3.4.2: Phi (probit), lambda (logistic), or
    exp(log p) from log_likelihood."""
    if rule == _AVERAGE_LOGISTIC:
        return sigmoid(f_bar)
    if rule == _AVERAGE_PROBIT:
        return std_normal_cdf(f_bar)
    return math.exp(log_likelihood(likelihood, np.ones(1), np.full(1, f_bar))[0][0])


@njit(cache=True)
def _gaussian_average(rule, likelihood, f_bar, V):
    """int sigma(z) N(z|f_bar, V) dz (3.25): Phi(f_bar / sqrt(1 + V)) (3.82) for probit, by
    quadrature (logistic_gaussian_integral) for logistic, by a 64-point Gauss-Hermite rule over
    p(y=+1|f) from log_likelihood for a likelihood with average 'gauss_hermite' (absolute error
    below 1e-7 for the complementary log-log in tests/test_likelihoods.py, 4.6e-8 at its largest)."""
    if rule == _AVERAGE_LOGISTIC:
        return logistic_gaussian_integral(f_bar, V)
    if rule == _AVERAGE_PROBIT:
        return std_normal_cdf(f_bar / math.sqrt(1.0 + V))
    f = f_bar + _SQRT2 * math.sqrt(V) * _GH_X
    lp = log_likelihood(likelihood, np.ones(f.shape[0]), f)[0]
    return (_GH_W * np.exp(lp)).sum() / math.sqrt(math.pi)


@public(likelihood=_LIKELIHOOD_SPEC, f_bar_star="(m,)", V_f_star="(m,)",
        rule="{average,map,mackay}")
@njit(cache=True)
def averaged_probability(likelihood, f_bar_star, V_f_star, rule):
    """Predictive probability of class +1 from the latent mean and variance.

    rule 'average': pi_bar = int sigma(z) N(z|f_bar, V) dz (3.25), exact for
    probit, Phi(f_bar / sqrt(1 + V)) (3.82), and by quadrature for logistic
    (logistic_gaussian_integral); 'map': sigma(f_bar), the MAP prediction of
    section 3.4.2; 'mackay': lambda(kappa f_bar) with
    kappa = (1 + pi V / 8)^(-1/2) (MacKay 1992, section 3.4.2; logistic only).
    """
    m = f_bar_star.shape[0]
    p = np.empty(m)
    average = _average_rule(likelihood)
    for i in range(m):
        fb = f_bar_star[i]
        V = max(V_f_star[i], 0.0)
        if rule == "map":
            p[i] = _map_probability(average, likelihood, fb)
        elif rule == "average":
            p[i] = _gaussian_average(average, likelihood, fb, V)
        else:                                                 # "mackay"
            if average != _AVERAGE_LOGISTIC:                  # the one check no spec can make (two arguments)
                raise ValueError("rule 'mackay' is for the logistic likelihood")
            kappa = 1.0 / math.sqrt(1.0 + math.pi * V / 8.0)
            p[i] = sigmoid(kappa * fb)
    return p


# ============================================================================
# GPML 3.4 Binary Laplace: Algorithms 3.1, 3.2 and the evidence gradient (K&R app. A)
# ============================================================================

# --- the linear algebra of the boxes: L\b, L^T\b, log|B|/2, BLAS for many columns ---

@public(L="(n, n) chol")
@njit(cache=True)
def half_log_det(L):
    """sum_i log L_ii = 1/2 log|L L^T| for a Cholesky factor L."""
    s = 0.0
    for i in range(L.shape[0]):
        s += math.log(L[i, i])
    return s


@public(L="(n, n) chol", b="(n,)")
@njit(cache=True, fastmath={"reassoc", "contract"})
def solve_lower(L, b):
    """Solve L x = b for lower-triangular L (forward substitution, L \\ b)."""
    n = b.shape[0]
    x = np.empty(n)
    for i in range(n):
        s = b[i]
        for k in range(i):
            s -= L[i, k] * x[k]
        x[i] = s / L[i, i]
    return x


@public(L="(n, n) chol", b="(n,)")
@njit(cache=True, fastmath={"reassoc", "contract"})
def solve_lower_transpose(L, b):
    """Solve L^T x = b for lower-triangular L (back substitution, L^T \\ b).

    Written in column (axpy) form: walking L[k, i] down a column of a
    row-major array is several times slower.
    """
    n = b.shape[0]
    x = b.copy()
    for i in range(n - 1, -1, -1):
        x[i] /= L[i, i]
        xi = x[i]
        for k in range(i):
            x[k] -= L[i, k] * xi
    return x


@public(L="(n, n) chol", B="(n, m)")
@njit(cache=True)
def solve_lower_matrix(L, B):
    """Solve L X = B for lower-triangular L (n, n) and B (n, m), by BLAS dtrsm."""
    n, m = B.shape
    X = _copy(np.ascontiguousarray(B))
    if n == 0 or m == 0:
        return X
    Lc = np.ascontiguousarray(L)
    # In Fortran order X is X^T (m, n) and L is L^T (upper): solve X^T L^T = B^T.
    side = np.array([ord("R")], np.uint8)
    uplo = np.array([ord("U")], np.uint8)
    trans = np.array([ord("N")], np.uint8)
    diag = np.array([ord("N")], np.uint8)
    mm = np.array([m], np.int32)
    nn = np.array([n], np.int32)
    alpha = np.array([1.0])
    if n > _BLOCKED_N:                                        # large n: columns in chunks, Ctrl-C between them
        return _solve_lower_chunks(Lc, X, max(1, 2 * _BLOCK * _ROWS // n))  # ~2 n _BLOCK _ROWS flops a chunk
    _dtrsm(side.ctypes, uplo.ctypes, trans.ctypes, diag.ctypes, mm.ctypes,
           nn.ctypes, alpha.ctypes, Lc.ctypes, nn.ctypes, X.ctypes, mm.ctypes)
    return X


@public(C="(n, n) inplace", A="(k, n)", alpha="real")
@njit(cache=True)
def syrk_lower(C, A, alpha):
    """C := C + alpha A^T A on the lower triangle of C (n, n), A (k, n), by BLAS dsyrk.

    The upper triangle of C is left as it was.
    """
    k, n = A.shape
    if n == 0 or k == 0:
        return
    Ac = np.ascontiguousarray(A)
    # In Fortran order A is A^T (n, k): A^T A = F F^T with F = A^T, trans 'N';
    # the Fortran upper triangle is the C lower triangle.
    uplo = np.array([ord("U")], np.uint8)
    trans = np.array([ord("N")], np.uint8)
    nn = np.array([n], np.int32)
    kk = np.array([k], np.int32)
    al = np.array([alpha])
    beta = np.array([1.0])
    if n > _BLOCKED_N:                                        # large n: in strips, Ctrl-C between them
        _syrk_strips(C, Ac, alpha, _BLOCK, _ROWS)
        return
    _dsyrk(uplo.ctypes, trans.ctypes, nn.ctypes, kk.ctypes, al.ctypes, Ac.ctypes,
           nn.ctypes, beta.ctypes, C.ctypes, nn.ctypes)


@public(K="(n, n) sym", V="(k, n)")
@njit(cache=True)
def minus_gram(K, V):
    """K - V^T V for symmetric K (n, n) and V (k, n), by BLAS dsyrk (half a matrix product)."""
    out = _copy(np.ascontiguousarray(K))
    syrk_lower(out, V, -1.0)
    n = out.shape[0]
    for i in range(n):  # mirror the lower triangle
        for j in range(i):
            out[j, i] = out[i, j]
    return out


@njit(cache=True)
def _potri_lower(L):
    """The lower triangle of B^-1 from the Cholesky factor L of B = L L^T, by LAPACK dpotri
    (the upper triangle holds what L held there: zeros); in blocks above _BLOCKED_N."""
    return _potri_in_place(_copy(np.ascontiguousarray(L)))


@njit(cache=True)
def _potri_in_place(A):
    """_potri_lower on L's own memory: A (C-order, the factor L) becomes B^-1's lower triangle."""
    n = A.shape[0]
    if n == 0:
        return A
    if n > _BLOCKED_N:
        return _potri_blocked(A, _BLOCK)
    # C-order lower L is Fortran upper U = L^T, and B = U^T U.
    uplo = np.array([ord("U")], np.uint8)
    nn = np.array([n], np.int32)
    info = np.zeros(1, np.int32)
    _dpotri(uplo.ctypes, nn.ctypes, A.ctypes, nn.ctypes, info.ctypes)  # info = 0: L has no zero pivot
    return A


_TILE = 64        # tiles of 64 x 64 for the mirrored copies below (two tiles fit in L2)


@njit(cache=True)
def _mirror_scaled(A, s):
    """A_ij := A_ij (s_i s_j) on the lower triangle, copied to the upper one, in place: the
    same number on both sides of the diagonal as scaling the mirrored matrix, in tiles, so
    that the copy down the columns of a row-major array stays in cache (s of ones: no scaling;
    x 1.0 is exact)."""
    n = A.shape[0]
    for ib in range(0, n, _TILE):
        for jb in range(0, ib + 1, _TILE):
            for i in range(ib, min(ib + _TILE, n)):
                for j in range(jb, min(jb + _TILE, i + 1)):
                    A[i, j] *= s[i] * s[j]
                    A[j, i] = A[i, j]
    return A


@public(L="(n, n) chol")
@njit(cache=True)
def cholesky_inverse(L):
    """B^-1 from the Cholesky factor L of B = L L^T, by LAPACK dpotri."""
    return _scaled_inverse(L, np.ones(L.shape[0]))


@njit(cache=True)
def _scaled_inverse(L, s):
    """diag(s) B^-1 diag(s) from the Cholesky factor L of B: cholesky_inverse(L) * np.outer(s, s)
    in one pass over B^-1 (dpotri fills one triangle, C's lower: scaled as it is mirrored), without
    the two n x n temporaries (at n = 2,000 they took a fifth of multi-class Laplace's Newton step)."""
    return _mirror_scaled(_potri_lower(L), s)


@njit(cache=True)
def _scaled_inverse_in_place(L, s):
    """_scaled_inverse in L's own memory, which it returns."""
    return _mirror_scaled(_potri_in_place(L), s)


@njit(cache=True)
def _cholesky(A):
    """np.linalg.cholesky(A) for an A the caller does not need any more: factorised in place
    by the same LAPACK dpotrf (the same numbers) without numba's copy, and the upper triangle
    zeroed along rows (numba zeroes it down the columns of a row-major array, several times
    slower). LinAlgError if A is not positive definite."""
    n = A.shape[0]
    if n == 0:
        return A
    if n > _BLOCKED_N:
        return _cholesky_blocked(A, _BLOCK)
    uplo = np.array([ord("U")], np.uint8)                     # C-order lower = Fortran upper
    nn = np.array([n], np.int32)
    info = np.zeros(1, np.int32)
    _dpotrf(uplo.ctypes, nn.ctypes, A.ctypes, nn.ctypes, info.ctypes)
    if info[0] != 0:
        raise np.linalg.LinAlgError("Matrix is not positive definite.")
    for i in range(n):
        for j in range(i + 1, n):
            A[i, j] = 0.0
    return A


# --- large n: the same factorisations in blocks, so that Ctrl-C is seen between them ---
# One LAPACK call on n = 10,000 takes seconds to a minute, and numba code sees Ctrl-C only
# between calls (check_interrupt). Above _BLOCKED_N, _cholesky and _potri_lower run LAPACK's
# own blocked algorithms (dpotrf, dtrtri + dlauum) written out: block operations of at most
# about 2 n _BLOCK^2 or 2 n _ROWS _BLOCK flops (BLAS-3, all BLAS threads), check_interrupt
# between them. The indices below are of the Fortran view: a C-order array is its Fortran
# transpose, so C's lower triangle is Fortran's upper one, and Fortran element (r, c) sits at
# a[c * n + r] of the flat array.

_BLOCKED_N = 2048
_BLOCK = 256
_ROWS = 1024


@njit(cache=True)
def _cholesky_blocked(A, nb):
    """_cholesky for large n: the right-looking blocked Cholesky factorisation in place, blocks
    of nb, Ctrl-C seen between block operations; LinAlgError if A is not positive definite."""
    n = A.shape[0]
    a = A.reshape(n * n)
    U, L = np.array([ord("U")], np.uint8), np.array([ord("L")], np.uint8)
    T, N = np.array([ord("T")], np.uint8), np.array([ord("N")], np.uint8)
    ld, info = np.array([n], np.int32), np.zeros(1, np.int32)
    jb, m, w = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    one, minus = np.array([1.0]), np.array([-1.0])
    for j in range(0, n, nb):
        check_interrupt()
        jb[0] = min(nb, n - j)
        j1 = j + jb[0]
        _dpotrf(U.ctypes, jb.ctypes, a[j * n + j:].ctypes, ld.ctypes, info.ctypes)   # U_jj
        if info[0] != 0:
            raise np.linalg.LinAlgError("Matrix is not positive definite.")
        if j1 == n:
            break
        m[0] = n - j1
        _dtrsm(L.ctypes, U.ctypes, T.ctypes, N.ctypes, jb.ctypes, m.ctypes, one.ctypes,   # U_j,rest := U_jj^-T A_j,rest
               a[j * n + j:].ctypes, ld.ctypes, a[j1 * n + j:].ctypes, ld.ctypes)
        for c0 in range(j1, n, nb):                        # A_rest -= U_j,rest^T U_j,rest, by columns
            check_interrupt()
            w[0] = min(nb, n - c0)
            if c0 > j1:
                m[0] = c0 - j1
                _dgemm(T.ctypes, N.ctypes, m.ctypes, w.ctypes, jb.ctypes, minus.ctypes, a[j1 * n + j:].ctypes,
                       ld.ctypes, a[c0 * n + j:].ctypes, ld.ctypes, one.ctypes, a[c0 * n + j1:].ctypes, ld.ctypes)
            _dsyrk(U.ctypes, T.ctypes, w.ctypes, jb.ctypes, minus.ctypes, a[c0 * n + j:].ctypes, ld.ctypes,
                   one.ctypes, a[c0 * n + c0:].ctypes, ld.ctypes)
    for i in range(n):
        for j in range(i + 1, n):
            A[i, j] = 0.0
    return A


@njit(cache=True)
def _solve_lower_chunks(L, X, step):
    """solve_lower_matrix for large n: L X = B (X holding B, C-order (n, m)) by dtrsm on chunks
    of step columns of X (rows of its Fortran view X^T, leading dimension m), Ctrl-C between."""
    n, m = X.shape
    x = X.reshape(n * m)
    R, U, N = np.array([ord("R")], np.uint8), np.array([ord("U")], np.uint8), np.array([ord("N")], np.uint8)
    nn, ld, w = np.array([n], np.int32), np.array([m], np.int32), np.zeros(1, np.int32)
    one = np.array([1.0])
    for c0 in range(0, m, step):
        check_interrupt()
        w[0] = min(step, m - c0)
        _dtrsm(R.ctypes, U.ctypes, N.ctypes, N.ctypes, w.ctypes, nn.ctypes, one.ctypes,
               L.ctypes, nn.ctypes, x[c0:].ctypes, ld.ctypes)
    return X


@njit(cache=True)
def _syrk_strips(C, A, alpha, nb, rows):
    """syrk_lower for large n: C's lower triangle += alpha A^T A (A of shape (k, n)), by dsyrk
    on diagonal blocks of nb and dgemm on pieces of rows x nb below them, Ctrl-C between.
    Fortran view: C's upper triangle += alpha F F^T with F = A^T (n x k, leading dimension n)."""
    k, n = A.shape
    a, c = A.reshape(k * n), C.reshape(n * n)
    U, N, T = np.array([ord("U")], np.uint8), np.array([ord("N")], np.uint8), np.array([ord("T")], np.uint8)
    ld, kk = np.array([n], np.int32), np.array([k], np.int32)
    m, w = np.zeros(1, np.int32), np.zeros(1, np.int32)
    al, one = np.array([alpha]), np.array([1.0])
    for c0 in range(0, n, nb):                             # Fortran columns c0..c0+w of C
        w[0] = min(nb, n - c0)
        for r0 in range(0, c0, rows):                       # rows r0.. above the diagonal block
            check_interrupt()
            m[0] = min(rows, c0 - r0)
            _dgemm(N.ctypes, T.ctypes, m.ctypes, w.ctypes, kk.ctypes, al.ctypes, a[r0:].ctypes, ld.ctypes,
                   a[c0:].ctypes, ld.ctypes, one.ctypes, c[c0 * n + r0:].ctypes, ld.ctypes)
        check_interrupt()
        _dsyrk(U.ctypes, N.ctypes, w.ctypes, kk.ctypes, al.ctypes, a[c0:].ctypes, ld.ctypes,
               one.ctypes, c[c0 * n + c0:].ctypes, ld.ctypes)


@njit(cache=True)
def _potri_blocked(A, nb):
    """_potri_lower for large n: A holds L (C lower), in place becomes B^-1's lower triangle,
    by LAPACK's blocked dtrtri then dlauum, Ctrl-C seen between block operations."""
    n = A.shape[0]
    a = A.reshape(n * n)
    U, L, R = np.array([ord("U")], np.uint8), np.array([ord("L")], np.uint8), np.array([ord("R")], np.uint8)
    T, N = np.array([ord("T")], np.uint8), np.array([ord("N")], np.uint8)
    ld, info = np.array([n], np.int32), np.zeros(1, np.int32)
    jb, m, k = np.zeros(1, np.int32), np.zeros(1, np.int32), np.zeros(1, np.int32)
    one, minus = np.array([1.0]), np.array([-1.0])
    for j in range(0, n, nb):                              # dtrtri: U := U^-1, by block columns
        jb[0] = min(nb, n - j)
        for r0 in range(0, j, _ROWS):                       # U_0:j,j := inv(U_0:j,0:j) U_0:j,j, by rows
            check_interrupt()
            r1 = min(r0 + _ROWS, j)
            m[0] = r1 - r0
            _dtrmm(L.ctypes, U.ctypes, N.ctypes, N.ctypes, m.ctypes, jb.ctypes, one.ctypes,
                   a[r0 * n + r0:].ctypes, ld.ctypes, a[j * n + r0:].ctypes, ld.ctypes)
            if r1 < j:
                k[0] = j - r1
                _dgemm(N.ctypes, N.ctypes, m.ctypes, jb.ctypes, k.ctypes, one.ctypes, a[r1 * n + r0:].ctypes,
                       ld.ctypes, a[j * n + r1:].ctypes, ld.ctypes, one.ctypes, a[j * n + r0:].ctypes, ld.ctypes)
        if j > 0:
            m[0] = j
            _dtrsm(R.ctypes, U.ctypes, N.ctypes, N.ctypes, m.ctypes, jb.ctypes, minus.ctypes,
                   a[j * n + j:].ctypes, ld.ctypes, a[j * n:].ctypes, ld.ctypes)
        _dtrtri(U.ctypes, N.ctypes, jb.ctypes, a[j * n + j:].ctypes, ld.ctypes, info.ctypes)
    for i in range(0, n, nb):                              # dlauum: B^-1 = U^-1 U^-T, by block columns
        jb[0] = min(nb, n - i)
        i1 = i + jb[0]
        check_interrupt()
        if i > 0:
            m[0] = i
            _dtrmm(R.ctypes, U.ctypes, T.ctypes, N.ctypes, m.ctypes, jb.ctypes, one.ctypes,
                   a[i * n + i:].ctypes, ld.ctypes, a[i * n:].ctypes, ld.ctypes)
        _dlauum(U.ctypes, jb.ctypes, a[i * n + i:].ctypes, ld.ctypes, info.ctypes)
        if i1 < n:
            k[0] = n - i1
            for r0 in range(0, i, _ROWS):
                check_interrupt()
                m[0] = min(_ROWS, i - r0)
                _dgemm(N.ctypes, T.ctypes, m.ctypes, jb.ctypes, k.ctypes, one.ctypes, a[i1 * n + r0:].ctypes,
                       ld.ctypes, a[i1 * n + i:].ctypes, ld.ctypes, one.ctypes, a[i * n + r0:].ctypes, ld.ctypes)
            _dsyrk(U.ctypes, N.ctypes, jb.ctypes, k.ctypes, one.ctypes, a[i1 * n + i:].ctypes, ld.ctypes,
                   one.ctypes, a[i * n + i:].ctypes, ld.ctypes)
    return A


LaplaceMode = namedtuple(
    "LaplaceMode", ["f_hat", "log_q", "a", "sW", "L", "n_iter", "converged"])


@njit(cache=True)
def _advise_huge(address, nbytes):
    """Mark the 2 MB pages inside [address, address + nbytes) MADV_HUGEPAGE, from 4 MB (_empty)."""
    if _MADV_HUGEPAGE != 0 and nbytes >= _HUGE_MIN:
        first = (address + _HUGE_PAGE - 1) // _HUGE_PAGE * _HUGE_PAGE
        last = (address + nbytes) // _HUGE_PAGE * _HUGE_PAGE
        _madvise(first, last - first, _MADV_HUGEPAGE)         # advice only: its result is not needed


@njit(cache=True)
def _empty(n, m):
    """np.empty((n, m)) for the large arrays of a fit (n x n and up), on huge pages where the
    kernel has them: numba's arrays come from malloc, and fresh memory costs a page fault every
    4 KB when first written (0.47 ms a MB measured here: 4 ms for each 1,070 x 1,070 array, a
    third of multi-class EP's warm start). Like numpy for its own arrays of 4 MB or more, the
    2 MB pages inside the array are marked MADV_HUGEPAGE (madvise): one fault every 2 MB. Only
    this array's own pages are advised, and malloc's settings are left as they are (memory that
    malloc keeps after the array is freed stays advised, as numpy's does). One function for each
    number of dimensions (_empty_blocks: 3), so that each compiles for one type."""
    A = np.empty((n, m))
    _advise_huge(A.ctypes.data, A.size * 8)
    return A


@njit(cache=True)
def _empty_blocks(C, n, m):
    """np.empty((C, n, m)) as an _empty array: C blocks of (n, m)."""
    A = np.empty((C, n, m))
    _advise_huge(A.ctypes.data, A.size * 8)
    return A


@njit(cache=True)
def _zeros(n, m):
    """np.zeros((n, m)) as an _empty array."""
    A = _empty(n, m)
    A[:, :] = 0.0
    return A


@njit(cache=True)
def _zeros_blocks(C, n, m):
    """np.zeros((C, n, m)) as an _empty_blocks array."""
    A = _empty_blocks(C, n, m)
    A[:, :, :] = 0.0
    return A


@njit(cache=True)
def _copy(A):
    """A copy of the C-ordered 2-d A (np.ascontiguousarray(A) at the call) in an _empty array."""
    out = _empty(A.shape[0], A.shape[1])
    out[:, :] = A
    return out


@njit(cache=True)
def _scale_rows(s, A):
    """diag(s) A, row i of A times s_i: W^1/2 k(x_*) of Algorithm 3.2's line 5 (s = W^1/2), and
    S~^1/2 K, S~^1/2 k(x_*) of Algorithms 3.5 and 3.6 (s = S~^1/2). O(n m), as W and S~ are diagonal."""
    out = _empty(A.shape[0], A.shape[1])
    for i in range(A.shape[0]):
        out[i, :] = s[i] * A[i, :]
    return out


@njit(cache=True)
def _form_B(K, sW):
    """B = I + W^1/2 K W^1/2 (3.26), an O(n^2) step since W is diagonal."""
    n = sW.shape[0]
    return _form_B_in(_empty(n, n), K, sW)


@njit(cache=True)
def _form_B_in(B, K, sW):
    """_form_B written into B (n, n), which it returns."""
    n = sW.shape[0]
    for i in range(n):
        for j in range(n):
            B[i, j] = sW[i] * K[i, j] * sW[j]
        B[i, i] += 1.0
    return B


@njit(cache=True)
def _objective(a, f, y, likelihood):
    """Psi = -1/2 a^T f + log p(y|f) with a = K^-1 f, up to constants: the objective of
    Algorithm 3.1 (line 9, (3.12))."""
    return -0.5 * (a @ f) + log_likelihood(likelihood, y, f)[0].sum()


# The two safeguards of Algorithms 3.1 and 3.3, for the objective given:
# _objective or _multiclass_objective, of (a, f, y, likelihood).
# The book's Newton iteration starts at f = 0 and takes every full step. A
# warm start (the mode at nearby hyperparameters, during ML-II) saves most
# steps, and is taken only if it beats f = 0. A full Newton step can lower the
# objective far from the mode (GPML's own code searches along the Newton
# direction): _step_search halves it until the objective does not fall by
# more than rounding error, so a full step is always taken near the mode,
# where Newton converges quadratically. numba compiles both into each caller
# (inline="always"), so that every numba function of the file keeps one set
# of argument types (see the compile command in Part III).

@njit(cache=True, inline="always")
def _warm_start(objective, a_init, f_init, y, likelihood):
    """a, f and the objective at a_init (f_init = K a_init) if that beats f = 0, else at 0."""
    a = np.zeros_like(a_init)
    f = np.zeros_like(f_init)
    psi = objective(a, f, y, likelihood)
    psi_init = objective(a_init, f_init, y, likelihood)
    if psi_init > psi:
        return a_init.copy(), f_init, psi_init
    return a, f, psi


@njit(cache=True, inline="always")
def _step_search(objective, a, da, f, df, psi, y, likelihood):
    """The first of a + t da, f + t df, t = 1, 1/2, ..., 2^-30, whose objective is at
    least psi - 1e-12 (1 + |psi|): returns a, f, the objective there and t; t = 0
    (and a, f, psi unchanged) if none is."""
    slack = 1e-12 * (1.0 + abs(psi))
    step = 1.0
    for _ in range(31):
        a_t = a + step * da
        f_t = f + step * df
        psi_t = objective(a_t, f_t, y, likelihood)
        if psi_t >= psi - slack:
            return a_t, f_t, psi_t, step
        step *= 0.5
    return a, f, psi, 0.0


@public(returns=LaplaceMode, K="(n, n) psd", y="(n,) pm1 nonempty", likelihood=_LIKELIHOOD_SPEC,
        a_init="(n,) ?0", tol="nonneg", max_iter="count")
@njit(cache=True)
def laplace_mode(K, y, likelihood, a_init=None, tol=1e-10, max_iter=100):
    """Mode-finding for binary Laplace GPC (GPML Algorithm 3.1).

    Parameters
    ----------
    K, y : ndarray, shapes (n, n), (n,)
        Prior covariance matrix; targets -1 or +1.
    likelihood : {'logistic', 'probit'}
        p(y|f), (3.15) or (3.16).
    a_init : ndarray, shape (n,), optional
        Warm start a = K^-1 f, taken if it beats f = 0 (zeros when left out).
    tol, max_iter : float, int
        Stop after a full Newton step that changed Psi and log q by less than
        tol (1 + |Psi| + |log q|); at most max_iter steps.

    Returns
    -------
    LaplaceMode: f_hat (n,), log_q (3.32), a = K^-1 f_hat, sW = W^1/2, L = cholesky(B)
    at f_hat, n_iter, converged (False also when no step raised the objective).
    laplace_mode.py_func (the plain body, for a debugger) returns the same as a
    plain tuple, in this order.

    Notes
    -----
    n^3/6 per step (line 5). Departures: line 2 (warm start), line 8 (step
    halving), lines 9-10 after 4-5. Used in: lectures/sec3_04_binary_laplace.ipynb.
    """
    if a_init is None:                                       # (the face passes zeros; py_func may get None)
        a_init = np.zeros(y.shape[0])
    # departs from line 2: starts from a_init (zeros when left out) if that beats f = 0, because
    # the mode at nearby hyperparameters saves most Newton steps during ML-II
    a, f, psi = _warm_start(_objective, a_init, K @ a_init, y, likelihood)  # line 2: f := 0
    n_iter, converged, full_step = 0, False, False           # for line 9: no Newton step yet
    psi_old = log_q_old = -np.inf                            # for line 9: no previous Psi, log q
    while True:                                              # line 3: repeat
        check_interrupt()
        _, dlp, d2lp, _ = log_likelihood(likelihood, y, f)   # for line 4: grad, grad grad log p(y|f)
        W = -d2lp                                            # line 4: W := -grad grad log p(y|f)  (3.15/3.16)
        sW = np.sqrt(W)                                      # for line 5: sW := W^1/2
        L = _cholesky(_form_B(K, sW))                        # line 5: L := cholesky(I + W^1/2 K W^1/2)
        log_q = psi - half_log_det(L)                        # line 10: log q := -1/2 a^T f + log p(y|f) - sum_i log L_ii  (3.32)
        # departs from lines 9-10: both are done here, after lines 4-5, so that W and L returned
        # belong to f_hat; and line 9 asks log q as well as Psi to settle after a full step,
        # relative to their size, because at a large signal variance Psi is flat while f still
        # moves, and log|B| with it
        scale = 1.0 + abs(psi) + abs(log_q)                  # for line 9: tol relative to this
        if full_step and psi - psi_old < tol * scale and abs(log_q - log_q_old) < tol * scale:  # line 9: until convergence
            converged = True
            break
        if n_iter == max_iter:
            break
        b = W * f + dlp                                      # line 6: b := W f + grad log p(y|f)  (3.18, 3.27)
        a_new = b - sW * solve_lower_transpose(L, solve_lower(L, sW * (K @ b)))  # line 7: a := b - W^1/2 L^T\(L\(W^1/2 K b))
        psi_old, log_q_old = psi, log_q                      # for line 9: Psi, log q before the step
        # departs from line 8: the step to f := K a is halved while it lowers the objective,
        # because far from the mode a full Newton step can overshoot (see _step_search)
        a, f, psi, step = _step_search(_objective, a, a_new - a, f, K @ a_new - f, psi, y, likelihood)  # line 8: f := K a
        if step == 0.0:
            break
        full_step = step == 1.0                              # for line 9: line 9 tests only after a full step
        n_iter += 1                                          # for line 9: Newton steps taken
    return f, log_q, a, sW, L, n_iter, converged             # line 11: return f_hat, log q (LaplaceMode)


@public(f_hat="(n,) nonempty", K="(n, n) psd", y="(n,) pm1", likelihood=_LIKELIHOOD_SPEC, K_star="(n, m)",
        k_star_star="(m,) nonneg", rule="{average,map,mackay}", L="(n, n) chol ?e")
@njit(cache=True)
def laplace_predict(f_hat, K, y, likelihood, K_star, k_star_star, rule="average", L=None):
    """Predictions for binary Laplace GPC (GPML Algorithm 3.2).

    Parameters
    ----------
    f_hat : ndarray, shape (n,)
        Posterior mode, from laplace_mode (Algorithm 3.1).
    K, y, likelihood :
        As laplace_mode: k(X, X), the -1/+1 targets, 'logistic' or 'probit'.
    K_star, k_star_star : ndarray, shapes (n, m), (m,)
        k(X, x_*), one column per test input; k(x_*, x_*).
    rule : {'average', 'map', 'mackay'}
        Line 7 as in the box (3.25), or one of the rules of section 3.4.2.
    L : ndarray, shape (n, n), optional
        cholesky(B) at f_hat, from laplace_mode ("can be re-used"): skips line 3.

    Returns
    -------
    pi_bar_star, f_bar_star, V_f_star : ndarray, shape (m,)
        Probability of class +1 (line 8), latent mean (3.21) and variance (3.24).

    Notes
    -----
    n^3/6 once (line 3), n^2 per test case (line 5); lines 4-7 run for all test
    cases at once. Used in: lectures/sec3_04_binary_laplace.ipynb.
    """
    _, dlp, d2lp, _ = log_likelihood(likelihood, y, f_hat)   # for line 2: grad, grad grad log p(y|f^)
    W = -d2lp                                                # line 2: W := -grad grad log p(y|f^)
    sW = np.sqrt(W)                                          # for line 3: sW := W^1/2
    if L is None or L.shape[0] == 0:                         # departs from line 3: skipped when L is given
        L = _cholesky(_form_B(K, sW))                        # line 3: L := cholesky(I + W^1/2 K W^1/2)
    f_bar_star = K_star.T @ dlp                              # line 4: f_bar_* := k(x_*)^T grad log p(y|f^)  (3.21)
    v = solve_lower_matrix(L, _scale_rows(sW, K_star))      # line 5: v := L\(W^1/2 k(x_*))  (3.24, 3.29)
    V_f_star = k_star_star - (v * v).sum(axis=0)             # line 6: V[f_*] := k(x_*, x_*) - v^T v
    pi_bar_star = averaged_probability(likelihood, f_bar_star, V_f_star, rule)  # line 7: pi_bar_* := int sigma(z) N(z|f_bar_*, V[f_*]) dz  (3.25)
    return pi_bar_star, f_bar_star, V_f_star                 # line 8: return pi_bar_*


@public(K="(n, n) psd", X="(n, d)", kernel="{se,ard,kg,kg_iso}", log_hyp="(p,) loghyp", y="(n,) pm1 nonempty",
        likelihood=_LIKELIHOOD_SPEC, f_hat="(n,)", a="(n,)", L="(n, n) chol", discrete="(d,) flags ?0")
@njit(cache=True)
def laplace_log_q_grad(K, X, kernel, log_hyp, y, likelihood, f_hat, a, L, discrete=None):
    """Gradient of the Laplace log q(y|X, theta) (3.32) w.r.t. log_hyp (K&R eqs. 42-47).

    Parameters
    ----------
    K : ndarray, shape (n, n)
        kernel_matrix(kernel, X, X, log_hyp).
    X : ndarray, shape (n, d)
        Training inputs.
    kernel : str
        A covariance function (Part I, covariance functions).
    log_hyp : ndarray, shape (p,)
        Log-hyperparameters at which K was built.
    y : ndarray, shape (n,)
        Targets, -1 or +1.
    likelihood : str
        'logistic' or 'probit'.
    f_hat, a, L :
        The mode, a = K^-1 f_hat and cholesky(B) at f_hat, from laplace_mode.
    discrete : ndarray, shape (d,), optional
        Flags of the discrete inputs (K&G 14), as given to kernel_matrix.

    Returns
    -------
    grad : ndarray, shape (p,)
        d log q / d log_hyp: the explicit part (K&R 43, 44) plus the
        implicit part through the mode (K&R 45, 47).

    Notes
    -----
    Reuses L from the mode search; n^3/3 once (B^-1 from L), then O(n^2) per
    hyperparameter. The same computation as GPML's Algorithm 5.1, with one
    n^3 solve fewer (see the comment at s2).
    """
    n = y.shape[0]
    _, dlp, d2lp, d3lp = log_likelihood(likelihood, y, f_hat)
    W = -d2lp
    sW = np.sqrt(W)
    Binv = _potri_lower(L)                                  # B^-1 (its lower triangle), n^3/3 from L
    s2 = np.empty(n)
    for i in range(n):
        # (K&R 45): -1/2 diag((K^-1 + W)^-1) dW/df, with dW/df = -d3 log p.
        # departs from GPML Alg. 5.1, which gets diag((K^-1 + W)^-1) as
        # diag(K) - diag(C^T C), C = L\(W^1/2 K), an n^3 solve: by (3.26) and
        # (3.27), (K^-1 + W)^-1 = W^-1/2 (I - B^-1) W^-1/2, so its diagonal is
        # (1 - B^-1_ii) / W_ii. The product with d3 log p has absolute
        # error eps |d3 log p / W| (<= eps for logistic, ~ eps |f| for probit);
        # where W_ii underflows to 0 so does d3 log p, and the term is 0.
        s2[i] = 0.5 * (1.0 - Binv[i, i]) / W[i] * d3lp[i] if W[i] > 0.0 else 0.0
    # R = W^1/2 B^-1 W^1/2 = (K + W^-1)^-1: with (K&R 44), (I + K W)^-1 dK W
    # has trace tr(R dK), and (I + K W)^-1 = I - K R in (K&R 47)
    R = _mirror_scaled(Binv, sW)
    p = log_hyp.shape[0]
    grad = np.empty(p)
    for j in range(p):
        check_interrupt()
        dK = kernel_grad(kernel, X, log_hyp, K, j, discrete)
        aDa, trRdK, b = _gradient_terms(dK, R, a, dlp)       # a^T dK a, tr(R dK), dK grad log p
        explicit = 0.5 * aDa - 0.5 * trRdK                   # (K&R 43) with a = K^-1 f_hat
        dm = b - K @ (R @ b)                                 # (K&R 47): dm = (I + K W)^-1 dK grad log p
        grad[j] = explicit + s2 @ dm                         # (K&R 42)
    return grad


@njit(cache=True, fastmath={"reassoc", "contract"})
def _gradient_terms(dK, R, a, g):
    """a^T dK a, tr(R dK) (R symmetric) and dK g, in one pass over dK."""
    n = a.shape[0]
    aDa = 0.0
    tr = 0.0
    b = np.empty(n)
    for i in range(n):
        row_a = 0.0
        row_g = 0.0
        for k in range(n):
            d = dK[i, k]
            row_a += d * a[k]
            row_g += d * g[k]
            tr += R[i, k] * d
        aDa += a[i] * row_a
        b[i] = row_g
    return aDa, tr, b


# ============================================================================
# GPML 3.5 Multi-class Laplace: Algorithms 3.3, 3.4
# ============================================================================
#
# Latents are class-major, f of shape (C, n) (3.33); K holds the C blocks of
# the block-diagonal prior covariance, shape (C, n, n); y is one-hot (C, n).
# pi (C, n) is the softmax (3.34); D = diag(pi); Pi stacks diag(pi^c);
# W = D - Pi Pi^T (3.38); R stacks C identity matrices (3.46);
# E = blockdiag(E_c) = D^1/2 (I + D^1/2 K D^1/2)^-1 D^1/2 and M = cholesky(sum_c E_c) (3.47).

MultiLaplaceMode = namedtuple(
    "MultiLaplaceMode", ["f_hat", "log_q", "a", "E", "M", "n_iter", "converged"])


@public(f="(C, n)")
@njit(cache=True)
def softmax(f):
    """pi^c_i = exp(f^c_i) / sum_c' exp(f^c'_i) (3.34), for f of shape (C, n), without overflow."""
    C, n = f.shape
    pi = np.empty((C, n))
    for i in range(n):
        m = f[0, i]
        for c in range(1, C):
            m = max(m, f[c, i])
        s = 0.0
        for c in range(C):
            pi[c, i] = math.exp(f[c, i] - m)
            s += pi[c, i]
        for c in range(C):
            pi[c, i] /= s
    return pi


@njit(cache=True)
def _log_sum_exp(f):
    """sum_i log sum_c exp(f^c_i), the normaliser in (3.35)."""
    C, n = f.shape
    total = 0.0
    for i in range(n):
        m = f[0, i]
        for c in range(1, C):
            m = max(m, f[c, i])
        s = 0.0
        for c in range(C):
            s += math.exp(f[c, i] - m)
        total += m + math.log(s)
    return total


@njit(cache=True)
def _multiclass_E_M(K, pi):
    """E_c, sum_c z_c and M := cholesky(sum_c E_c): lines 5-10 of Algorithm 3.3, 3-7 of 3.4."""
    C, n = pi.shape                                           # for 3.3 line 5, 3.4 line 3: C classes, n cases
    E = _empty_blocks(C, n, n)                                # the diagonal blocks E_c of E
    E_sum = _zeros(n, n)                                      # for 3.3 line 10, 3.4 line 7: E_sum := sum_c E_c
    z = 0.0
    for c in range(C):                                        # 3.3 line 5, 3.4 line 3: for c := 1..C
        sD = np.sqrt(pi[c])                                   # for 3.3 line 6, 3.4 line 4: sD := D_c^1/2, (n,)
        # B_c, L and E_c all in E[c]'s memory: no n x n array per class but E's (three fewer
        # per class, nine a Newton step at C = 3; at n = 4,000 each is 128 MB)
        L = _cholesky(_form_B_in(E[c], K[c], sD))             # 3.3 line 6, 3.4 line 4: L := cholesky(I_n + D_c^1/2 K_c D_c^1/2)
        # departs from the order of lines 7-8: z_c from L before line 7 turns L into E_c
        z += half_log_det(L)                                  # 3.3 line 8: z_c := sum_i log L_ii (summed over c)
        # departs from E_c := D_c^1/2 L^T\(L\D_c^1/2) (3.3 line 7, 3.4 line 5): the same matrix
        # as B_c^-1 = L^-T L^-1 scaled by D_c^1/2 on both sides, because LAPACK forms B_c^-1
        # from L in one call (dpotri) instead of two triangular solves with n columns, and the
        # scaling is done as it is mirrored; in place, since L already lives in E[c]
        E_c = _scaled_inverse_in_place(L, sD)                 # 3.3 line 7, 3.4 line 5: E_c := D_c^1/2 B_c^-1 D_c^1/2
        E_sum += E_c                                          # for 3.3 line 10, 3.4 line 7: E_sum := sum_c E_c
    M = _cholesky(E_sum)                                      # 3.3 line 10, 3.4 line 7: M := cholesky(sum_c E_c)
    return E, z, M


@njit(cache=True)
def _multiclass_objective(a, f, y, likelihood):
    """-1/2 a^T f + y^T f - sum_i log sum_c exp f^c_i: Psi (3.35) without its constants, the
    objective of Algorithm 3.3 (line 15); likelihood is "softmax", as the name of (3.34)."""
    # erratum in Algorithm 3.3 lines 15-16, which print + sum_i log sum_c exp f^c_i:
    # log p(y|f) = y^T f - sum_i log sum_c exp f^c_i (3.35), the softmax's normaliser
    # enters with a minus sign; with + the objective would grow without bound in f
    return -0.5 * (a * f).sum() + (y * f).sum() - _log_sum_exp(f)


@njit(cache=True)
def _per_class(A, x):
    """A x for block-diagonal A: A_c x_c for each class, A (C, n, n), x (C, n)."""
    out = np.empty(x.shape)
    for c in range(A.shape[0]):
        out[c] = A[c] @ x[c]
    return out


@public(returns=MultiLaplaceMode, K="(C, n, n) psd", y="(C, n) onehot nonempty",
        a_init="(C, n) ?0", tol="nonneg", max_iter="count")
@njit(cache=True)
def laplace_mode_multiclass(K, y, a_init=None, tol=1e-10, max_iter=100):
    """Mode-finding for multi-class Laplace GPC (GPML Algorithm 3.3).

    Parameters
    ----------
    K : ndarray, shape (C, n, n)
        The diagonal blocks K_c of the prior covariance, one per class.
    y : ndarray, shape (C, n)
        One-hot targets: y[c, i] = 1 if case i has class c (3.33).
    a_init : ndarray, shape (C, n), optional
        Warm start a = K^-1 f, taken if it beats f = 0 (zeros when left out).
    tol, max_iter : float, int
        Stop after a full Newton step that raised the objective by less than
        tol (a halved step does not count, as in laplace_mode); at most
        max_iter steps.

    Returns
    -------
    MultiLaplaceMode: f_hat (C, n), log_q (3.44), a = K^-1 f_hat, E (C, n, n) and
    M (n, n) at f_hat (lines 7, 10), n_iter, converged. .py_func returns the same
    as a plain tuple.

    Notes
    -----
    O((C + 1) n^3) per step; no Cn x Cn matrix. Departures: lines 2, 14 and 15
    as Algorithm 3.1's (warm start, step halving, convergence only after a full
    step); line 15 after 4-10. Errata: lines 15-16 subtract the log-sum-exp term,
    and line 16 also sum_i log M_ii (show_box("3.3")).
    Used in: lectures/sec3_05_multiclass_laplace.ipynb.
    """
    C = y.shape[0]                                            # for line 5: C classes
    if a_init is None:                                        # (the face passes zeros; py_func may get None)
        a_init = np.zeros(y.shape)
    # departs from line 2 as laplace_mode does: starts from a_init (zeros when left out) if that
    # beats f = 0, because the mode at nearby hyperparameters saves most Newton steps
    a, f, psi = _warm_start(_multiclass_objective, a_init, _per_class(K, a_init), y, "softmax")  # line 2: f := 0
    n_iter, converged, full_step, psi_old = 0, False, False, -np.inf  # for line 15: no Newton step yet
    while True:                                               # line 3: repeat
        check_interrupt()
        pi = softmax(f)                                       # line 4: pi and Pi from f  (3.34, Pi under 3.38)
        E, z, M = _multiclass_E_M(K, pi)                      # lines 5-10: for each c: L, E_c, z_c; M := cholesky(sum_c E_c)
        # departs from line 15: tested here, after lines 4-10, so that E and M returned belong to f_hat;
        # converged only after a full Newton step (as Algorithm 3.1's line 9): a halved step is no sign
        # of being near the mode
        if full_step and psi - psi_old < tol:                 # line 15: until convergence
            converged = True
            break
        if n_iter == max_iter:
            break
        pf = (pi * f).sum(axis=0)                             # for line 11: pf := Pi^T f, (Pi^T f)_i = sum_c pi^c_i f^c_i
        b = pi * f - pi * pf + y - pi                         # line 11: b := (D - Pi Pi^T) f + y - pi  (3.39)
        c = _per_class(E, _per_class(K, b))                   # line 12: c := E K b  (3.39, 3.45, 3.47)
        r = solve_lower_transpose(M, solve_lower(M, c.sum(axis=0)))  # for line 13: r := M^T\(M\(R^T c)), R^T c = sum_c c_c
        a_new = b - c + _per_class(E, np.ones((C, 1)) * r)    # line 13: a := b - c + E R M^T\(M\(R^T c))
        psi_old = psi                                         # for line 15: the objective before the step
        # departs from line 14 as laplace_mode does from line 8: the step is halved while it
        # lowers the objective, because far from the mode a full Newton step can overshoot
        a, f, psi, step = _step_search(_multiclass_objective, a, a_new - a, f, _per_class(K, a_new) - f, psi, y, "softmax")  # line 14: f := K a
        if step == 0.0:
            break
        full_step = step == 1.0                               # for line 15: line 15 tests only after a full step
        n_iter += 1                                           # for line 15: Newton steps taken
    # erratum, line 16 (and 15; show_box("3.3")): the log-sum-exp term enters the objective with a
    # minus sign, as log p(y|f) (3.35) has it, and log q also subtracts sum_i log M_ii, because
    # |I + W^1/2 K W^1/2| = prod_c |B_c| |sum_c E_c| by (3.46)-(3.47) and the determinant lemma
    log_q = psi - z - half_log_det(M)                         # line 16: log q := objective - sum_c z_c  (3.44)
    return f, log_q, a, E, M, n_iter, converged               # line 17: return f_hat, log q (MultiLaplaceMode)


@njit(cache=True)
def _cholesky_psd(A):
    """Lower Cholesky factor of a small positive semidefinite matrix; a pivot
    that rounding makes negative is set to zero (its column then vanishes)."""
    C = A.shape[0]
    L = np.zeros((C, C))
    for j in range(C):
        d = A[j, j]
        for k in range(j):
            d -= L[j, k] * L[j, k]
        if d <= 0.0:
            continue
        L[j, j] = math.sqrt(d)
        for i in range(j + 1, C):
            s = A[i, j]
            for k in range(j):
                s -= L[i, k] * L[j, k]
            L[i, j] = s / L[j, j]
    return L


@njit(cache=True)
def _column_dots(A, B):
    """(A * B).sum(axis=0) for A, B (n, m), without the (n, m) temporary."""
    n, m = A.shape
    out = np.zeros(m)
    for i in range(n):
        for j in range(m):
            out[j] += A[i, j] * B[i, j]
    return out


@public(E="(C, n, n)", M="(n, n) chol")
@njit(cache=True)
def multiclass_G(E, M):
    """G_c = M \\ E_c for each class (C, n, n): what Algorithm 3.4's lines 10-11 apply to
    k_*^c, precomputed for laplace_predict_multiclass (C n^3 / 2 multiply-adds)."""
    C, n = E.shape[0], E.shape[1]
    G = _empty_blocks(C, n, n)
    for c in range(C):
        G[c] = solve_lower_matrix(M, E[c])
    return G


@njit(cache=True)
def _same_blocks(A):
    """True if every A[c] equals A[0] (classes sharing one covariance function)."""
    for c in range(1, A.shape[0]):
        for i in range(A.shape[1]):
            for j in range(A.shape[2]):
                if A[c, i, j] != A[0, i, j]:
                    return False
    return True


@njit(cache=True)
def _cross_dots(Mb):
    """Sigma (m, C, C), Sigma[j, c, c'] = Mb[c, :, j]^T Mb[c', :, j], for Mb (C, n, m): lines 12-14
    of Algorithm 3.4, Sigma_cc' := c^T k_*^c' = (M\\b_c)^T (M\\b_c'), for all test cases."""
    C, n, m = Mb.shape
    hh = np.zeros((C, C, m))
    for i in range(n):                                        # one pass over Mb, row by row
        for c in range(C):                                    # 3.4 line 12: for c' := 1..C
            for c2 in range(c + 1):
                for j in range(m):
                    hh[c, c2, j] += Mb[c, i, j] * Mb[c2, i, j]  # 3.4 line 13: Sigma_cc' := c^T k_*^c', as (M\b_c)^T (M\b_c')
    Sigma = np.empty((m, C, C))
    for c in range(C):
        for c2 in range(c + 1):
            for j in range(m):
                Sigma[j, c, c2] = hh[c, c2, j]
                Sigma[j, c2, c] = hh[c, c2, j]
    return Sigma


# Lines 8-16 of Algorithm 3.4 for many test cases, as its caption suggests: each E_c
# is used once for all m test cases, and line 11's solve with M runs on all columns
# together. With b_c = E_c k_c(x_*), line 13's Sigma_cc' = c^T k_c' equals
# (M\b_c)^T (M\b_c'), so each class needs one triangular solve. When every class
# has the same k_*, M\b_c = G_c k_* with G_c = M\E_c, and b_c^T k_* = (M^T k_*)^T (M\b_c)
# where M^T k_* = sum_c' M\b_c' (since sum_c E_c = M M^T): line 15's b^T k_* is the sum
# of row c of lines 12-14's Sigma_cc'. That leaves one product G_c k_* per class,
# C n^2 m multiply-adds instead of 3 C n^2 m / 2 (with G given, or computed here,
# C n^3 / 2 more, when m > n).

@njit(cache=True)
def _M_solves(E, M, G, K_star):
    """Mb[c] = M\\b_c and bTk[c] = b_c^T k_*^c with b_c = E_c k_*^c, for every class and test
    case, (C, n, m) and (C, m): lines 10-11 of Algorithm 3.4 and the b^T k_*^c of its line 15."""
    C, n, m = K_star.shape
    Mb = _empty_blocks(C, n, m)
    bTk = np.empty((C, m))
    shared = _same_blocks(K_star)
    if shared and G is None and m > n:
        G = multiclass_G(E, M)
    if shared and G is not None:                              # one k_* for all classes (see above)
        for c in range(C):
            np.dot(G[c], K_star[c], Mb[c])                    # 3.4 lines 10-11: M\b_c = (M\E_c) k_*
        Sigma = _cross_dots(Mb)
        for c in range(C):                                    # b_c^T k_* = sum_c' (M\b_c)^T (M\b_c')
            for j in range(m):
                t = 0.0
                for c2 in range(C):
                    t += Sigma[j, c, c2]
                bTk[c, j] = t                                 # 3.4 line 15: b^T k_*^c
        return Mb, bTk
    for c in range(C):
        b = E[c] @ K_star[c]                                  # 3.4 line 10: b := E_c k_*^c
        Mb[c] = solve_lower_matrix(M, b)                      # 3.4 line 11: c := E_c (R (M^T\(M\(R^T b)))), kept as M\b
        bTk[c] = _column_dots(b, K_star[c])                   # 3.4 line 15: b^T k_*^c
    return Mb, bTk


# Monte Carlo error of _antithetic_average: each pi_bar_*c is a mean of S/2
# independent pair means in [0, 1], so its standard error is at most
# 0.5 sqrt(2/S) (0.022 at S = 1000), and for probabilities near 0 or 1 far less,
# because the pairs cancel the part of softmax that is linear in f_*. On digits at
# S = 1000 (benchmarks/bench_multiclass.py, spread over 8 seeds) the largest
# standard error over all test cases and classes was 0.014 (0.025 with S
# independent samples per test case), the median 4.8e-3 (5.3e-3). The errors of
# different test cases are correlated (they share z): average over seeds, not over
# test cases, to judge a Monte Carlo error.

@njit(cache=True)
def _antithetic_average(mu_star, Sigma_star, S, seed):
    """(1/S) sum_s softmax(f_*^s) with f_*^s ~ N(mu_star[:, j], Sigma_star[j]) for each test
    case j, (C, m): the samples come in (S + 1) // 2 antithetic pairs mu_* +/- L z
    (L L^T = Sigma), one set of z for all test cases."""
    C, m = mu_star.shape
    pairs = (S + 1) // 2
    np.random.seed(seed)
    Z = np.empty((C, pairs))                                  # (C, S/2) standard normal
    for i in range(pairs):
        if i % 4096 == 0:
            check_interrupt()
        for c in range(C):
            Z[c, i] = np.random.standard_normal()             # 3.4 line 19: f_* ~ N(mu_*, Sigma) as mu_* +/- L z, z ~ N(0, I)
    pi_bar_star = np.zeros((C, m))                            # 3.4 line 17: pi_* := 0
    D = np.empty((C, pairs))
    w = np.empty(C)
    a = np.empty(C)
    q = np.empty(C)
    for j in range(m):
        Lj = _cholesky_psd(Sigma_star[j])                     # 3.4 line 19: L L^T = Sigma
        D[:] = 0.0
        for c in range(C):                                    # d = L z for all pairs at once
            check_interrupt()
            for k in range(c + 1):
                l_ck = Lj[c, k]
                for i in range(pairs):
                    D[c, i] += l_ck * Z[k, i]                 # 3.4 line 19: d := L z
        mx = mu_star[:, j].max()
        for c in range(C):
            w[c] = math.exp(mu_star[c, j] - mx)               # exp(mu_*) / exp(max mu_*)
        for i in range(pairs):                                # 3.4 line 18: for i := 1 : S, in pairs f_* = mu_* +/- d
            if i % 4096 == 0:
                check_interrupt()
            lo = np.inf
            hi = -np.inf
            for c in range(C):
                lo = min(lo, D[c, i])
                hi = max(hi, D[c, i])
            if hi - lo < 500.0:                               # exp(+/-(d - mid)) within e^+/-250
                mid = 0.5 * (hi + lo)
                t_plus = 0.0
                t_minus = 0.0
                for c in range(C):
                    e = math.exp(D[c, i] - mid)
                    a[c] = w[c] * e                           # exp(mu_c + d_c) / const
                    q[c] = w[c] / e                           # exp(mu_c - d_c) / const
                    t_plus += a[c]
                    t_minus += q[c]
                t_plus = 1.0 / t_plus
                t_minus = 1.0 / t_minus
                for c in range(C):                            # softmax(f_*) (3.34), for both of the pair
                    pi_bar_star[c, j] += a[c] * t_plus + q[c] * t_minus  # 3.4 line 20: pi_* := pi_* + softmax(mu_* + d) + softmax(mu_* - d)
            else:                                             # the same with one exp per sample and class
                for sign in (1.0, -1.0):
                    for c in range(C):
                        a[c] = mu_star[c, j] + sign * D[c, i]
                    top = a.max()
                    tot = 0.0
                    for c in range(C):
                        a[c] = math.exp(a[c] - top)
                        tot += a[c]
                    for c in range(C):
                        pi_bar_star[c, j] += a[c] / tot       # 3.4 line 20: pi_* := pi_* + softmax(mu_* +/- d)
    pi_bar_star /= 2 * pairs                                  # 3.4 line 22: pi_bar_* := pi_*/S
    return pi_bar_star


@public(K="(C, n, n) psd", y="(C, n) onehot nonempty", f_hat="(C, n)", K_star="(C, n, m)",
        k_star_star="(C, m) nonneg", S="count", seed="seed", E="(C, n, n) ?", M="(n, n) chol ?",
        G="(C, n, n) ?", together=(("E", "M"),))
@njit(cache=True)
def laplace_predict_multiclass(K, y, f_hat, K_star, k_star_star, S=1000, seed=0, E=None, M=None,
                               G=None):
    """Predictions for multi-class Laplace GPC (GPML Algorithm 3.4).

    Parameters
    ----------
    K, y, f_hat : ndarray, shapes (C, n, n), (C, n), (C, n)
        Prior covariance blocks, one-hot targets, mode (laplace_mode_multiclass).
    K_star, k_star_star : ndarray, shapes (C, n, m), (C, m)
        k_c(X, x_*) for m test inputs, per class; k_c(x_*, x_*).
    S, seed : int
        Monte Carlo samples per test case (lines 17-22; an odd S is rounded up)
        and their seed: the same seed gives the same numbers.
    E, M : ndarray, optional
        E and M at f_hat from laplace_mode_multiclass: skip lines 3-7.
    G : ndarray, shape (C, n, n), optional
        multiclass_G(E, M), reused when all classes share K_star.

    Returns
    -------
    pi_bar_star (C, m), mu_star (C, m), Sigma_star (m, C, C): class probabilities
    (line 23), latent means (3.41) and covariances (3.43).

    Notes
    -----
    Lines 8-16 for all test cases at once; lines 17-22 in antithetic pairs
    (_antithetic_average). Used in: lectures/sec3_05_multiclass_laplace.ipynb.
    """
    C, m = k_star_star.shape
    pi = softmax(f_hat)                                       # line 2: pi and Pi from f_hat  (3.34)
    # departs from lines 3-7: skipped when E and M are given, because laplace_mode_multiclass
    # returns them at f_hat
    if E is None:
        E, _, M = _multiclass_E_M(K, pi)                      # lines 3-7: for each c: L, E_c; M := cholesky(sum_c E_c)
    # departs from lines 8-16: each line runs for all classes and test cases at once, because
    # then E_c and M are applied to m columns together (see the comment above _M_solves)
    mu_star = np.empty((C, m))
    for c in range(C):                                        # line 8: for c := 1..C
        mu_star[c] = (y[c] - pi[c]) @ K_star[c]               # line 9: mu_*^c := (y^c - pi^c)^T k_*^c  (3.41)
    Mb, bTk = _M_solves(E, M, G, K_star)                      # lines 10-11: b := E_c k_*^c, c := E_c (R (M^T\(M\(R^T b)))) as M\b
    Sigma_star = _cross_dots(Mb)                              # lines 12-14: Sigma_cc' := c^T k_*^c' = (M\b_c)^T (M\b_c')  (3.43)
    for c in range(C):
        Sigma_star[:, c, c] += k_star_star[c] - bTk[c]        # line 15: Sigma_cc := Sigma_cc + k_c(x_*, x_*) - b^T k_*^c
    # departs from lines 17-22 in how f_* is drawn, to halve the work at the same S: the samples
    # come in antithetic pairs f_* = mu_* +/- L z (L L^T = Sigma), both N(mu_*, Sigma), whose
    # softmaxes share exp(L z) and exp(mu_*); the S/2 vectors z serve every test case
    pi_bar_star = _antithetic_average(mu_star, Sigma_star, S, seed)  # lines 17-22: pi_bar_* := (1/S) sum_i softmax(f_*^i), f_*^i ~ N(mu_*, Sigma)
    return pi_bar_star, mu_star, Sigma_star                   # line 23: return pi_bar_*


@public(K="(C, n, n) psd", X="(n, d)", kernel="{se,ard,kg,kg_iso}", log_hyp="(C, p) loghyp",
        y="(C, n) onehot nonempty", f_hat="(C, n)", a="(C, n)", E="(C, n, n)", M="(n, n) chol",
        discrete="(d,) flags ?0")
@njit(cache=True)
def laplace_log_q_grad_multiclass(K, X, kernel, log_hyp, y, f_hat, a, E, M, discrete=None):
    """Gradient of the multi-class log q (3.44) w.r.t. per-class log-hyperparameters.

    Parameters
    ----------
    K : ndarray, shape (C, n, n)
        K[c] = kernel_matrix(kernel, X, X, log_hyp[c]).
    X : ndarray, shape (n, d)
    kernel : str
    log_hyp : ndarray, shape (C, p)
        Log-hyperparameters of each class's covariance function.
    y, f_hat, a, E, M :
        Targets and the mode with E and M at f_hat (laplace_mode_multiclass).
    discrete : ndarray, shape (d,), optional
        Flags of the discrete inputs (K&G 14), as given to kernel_matrix.

    Returns
    -------
    grad : ndarray, shape (C, p)
        d log q / d log_hyp[c, j]. For hyperparameters shared by all
        classes, sum over c.

    Notes
    -----
    The multi-class form of K&R eqs. 42-47: with A = (K^-1 + W)^-1 and
    R = (K + W^-1)^-1 = E - E R M^-T M^-1 R^T E (3.47), the explicit part is
    1/2 a^T dK a - 1/2 tr(R dK) and the implicit part s2^T df_hat, with
    df_hat = (I - K R) dK (y - pi) and s2 = -1/2 tr(A dW/df). W is block
    diagonal over cases (C x C blocks), so s2 needs only the per-case
    blocks of A: s2^c_i = -1/2 pi^c_i (v^c_i - sum_c' pi^c'_i v^c'_i) with
    v^c_i = A^i_cc - 2 (A^i pi_i)_c. Cost O(C n^3) once, O(C n^2) per
    hyperparameter.
    """
    C, n = y.shape
    pi = softmax(f_hat)
    g = y - pi                                                # grad log p(y|f_hat) = y - pi  (3.36)
    # blocks of A = K - K R K on the diagonal of each case: A^i_cc' =
    # delta_cc' (K_c - K_c E_c K_c)_ii + (G_c^T G_c')_ii, G_c = M\(E_c K_c)
    G = _empty_blocks(C, n, n)
    diagA = np.empty((C, n))
    Rcc = _empty_blocks(C, n, n)                              # diagonal blocks of R: E_c - E_c P E_c
    for c in range(C):
        F = E[c] @ K[c]
        G[c] = solve_lower_matrix(M, F)
        kf = (K[c] * F.T).sum(axis=1)                         # (K_c E_c K_c)_ii
        for i in range(n):
            diagA[c, i] = K[c, i, i] - kf[i]
        Rcc[c] = minus_gram(E[c], solve_lower_matrix(M, E[c]))
    s2 = np.empty((C, n))
    Ai = np.empty((C, C))
    v = np.empty(C)
    for i in range(n):
        for c in range(C):
            for c2 in range(C):
                s = 0.0
                for k in range(n):
                    s += G[c, k, i] * G[c2, k, i]
                Ai[c, c2] = s
            Ai[c, c] += diagA[c, i]
        for c in range(C):
            Api = 0.0
            for c2 in range(C):
                Api += Ai[c, c2] * pi[c2, i]
            v[c] = Ai[c, c] - 2.0 * Api
        pv = 0.0
        for c in range(C):
            pv += pi[c, i] * v[c]
        for c in range(C):
            s2[c, i] = -0.5 * pi[c, i] * (v[c] - pv)
    p = log_hyp.shape[1]
    grad = np.empty((C, p))
    for c0 in range(C):
        for j in range(p):
            check_interrupt()
            dK = kernel_grad(kernel, X, log_hyp[c0], K[c0], j, discrete)
            aDa, trRdK, u = _gradient_terms(dK, Rcc[c0], a[c0], g[c0])
            explicit = 0.5 * aDa - 0.5 * trRdK                # (K&R 43), class block c0
            t = E[c0] @ u                                     # R u for u = dK (y - pi), nonzero in block c0:
            w = solve_lower_transpose(M, solve_lower(M, t))   #   (R u)_c = delta_c,c0 t - E_c M^-T M^-1 t
            implicit = 0.0
            for c in range(C):
                Ru = -(E[c] @ w)
                if c == c0:
                    Ru += t
                df = -(K[c] @ Ru)                             # df_hat = (I - K R) u  (K&R 47)
                if c == c0:
                    df += u
                implicit += s2[c] @ df                        # (K&R 45)
            grad[c0, j] = explicit + implicit                 # (K&R 42)
    return grad


# ============================================================================
# GPML 3.6 Expectation propagation: Algorithms 3.5, 3.6, log Z_EP, its gradient (K&R 51)
# ============================================================================
#
# Sites t_i(f_i) = Z~_i N(f_i|mu~_i, sigma~_i^2) in natural parameters (3.66):
# tau_tilde = sigma~^-2, nu_tilde = tau_tilde mu~ (S~ = diag(tau_tilde),
# sS = S~^1/2); cavities tau_cav = sigma_-i^-2, nu_cav = tau_cav mu_-i (3.56).

EPResult = namedtuple(
    "EPResult", ["nu_tilde", "tau_tilde", "log_Z", "Sigma", "mu", "L", "n_sweeps",
                 "converged", "delta", "n_skipped"])


@public(y_i="pm1", mu_cav="real", sigma2_cav="nonneg")
@njit(cache=True)
def probit_moments(y_i, mu_cav, sigma2_cav):
    """Marginal moments of the tilted distribution, probit site (GPML 3.58).

    Returns log Z_hat_i, mu_hat_i, sigma2_hat_i of N(f|mu_cav, sigma2_cav) Phi(y_i f),
    stable for |z_i| up to 1e3 and cavity variances up to 1e10 and beyond.
    """
    s = math.sqrt(1.0 + sigma2_cav)
    z = y_i * mu_cav / s                                      # z_i  (3.58)
    r, rz = n_over_phi_and_sum(z)                             # N(z)/Phi(z), z + N(z)/Phi(z)
    log_Z_hat = log_phi(z)                                    # Z_hat = Phi(z)
    mu_hat = mu_cav + y_i * sigma2_cav * r / s
    # sigma2_cav - sigma2_cav^2 r (z + r) / (1 + sigma2_cav), written so that no
    # two large numbers are subtracted when sigma2_cav is large
    sigma2_hat = sigma2_cav * (1.0 + sigma2_cav * (1.0 - r * rz)) / (1.0 + sigma2_cav)
    return log_Z_hat, mu_hat, sigma2_hat


@njit(cache=True)
def _tilted_terms(y_i, mu_cav, sd, eps):
    """log Z_i, r and rz = r + z of a site with Z_i = eps + (1 - 2 eps) Phi(z), z = y_i mu_cav / sd.

    r = (1 - 2 eps) N(z) / Z_i = sd y_i d log Z_i / d mu_cav. sd is the cavity's
    standard deviation of f_i plus the site's noise: the probit site is eps = 0,
    sd = sqrt(1 + sigma2_cav) (3.58); K&G's labelling-noise site (their eqs. 10,
    20) is sd = sqrt(sigma2_cav).
    """
    z = y_i * mu_cav / sd
    if eps == 0.0:
        r, rz = n_over_phi_and_sum(z)
        return log_phi(z), r, rz
    Z = eps + (1.0 - 2.0 * eps) * std_normal_cdf(z)
    r = (1.0 - 2.0 * eps) * math.exp(-0.5 * z * z - _LOG_SQRT_2PI) / Z
    return math.log(Z), r, r + z


@njit(cache=True)
def _site_update(y_i, tau_cav, nu_cav, noise, eps, tau_max=np.inf):
    """New site parameters (3.59) from the tilted moments, without cancellation.

    Returns (tau_new, nu_new), the site's new tau~_i and nu~_i. With
    sd^2 = noise + sigma2_cav (noise = 1 for probit, 0 for K&G's step likelihood;
    sd = sqrt(1 + sigma2_cav) for probit, see _tilted_terms) and w = r (z + r):
    sigma_hat^2 = sigma2_cav (1 - w sigma2_cav / sd^2), so
    tau_new = sigma_hat^-2 - tau_cav = w / (sd^2 - w sigma2_cav) and
    nu_new = sigma_hat^-2 mu_hat - nu_cav = tau_new mu_cav + (1 + tau_new sigma2_cav) y r / sd.
    mu_hat and sigma_hat^2 (3.58) are implied, never formed: the box's direct
    differences lose every digit for a well-classified site, where sigma_hat^2
    is within rounding of sigma2_cav.

    tau_new is kept in [0, tau_max], and nu_new computed from the kept value,
    so that the new posterior mean is still the tilted mean mu_hat (tau_new = 0
    gives nu_new = y r / sd = tau_cav (mu_hat - mu_cav)). A site likelihood that
    is not log-concave (K&G's with eps > 0) can ask for tau_new < 0; a step site
    (noise 0) whose cavity sits on the wrong side asks for a precision that grows
    without bound (sigma_hat^2 ~ sigma2_cav / z^2), see ep.
    """
    sigma2_cav = 1.0 / tau_cav                                # for 3.5 line 7: sigma_-i^2 = 1 / tau_-i
    mu_cav = nu_cav * sigma2_cav                              # for 3.5 line 7: mu_-i = nu_-i / tau_-i
    sd = math.sqrt(noise + sigma2_cav)                        # for 3.5 line 7: z = y_i mu_-i / sd
    _, r, rz = _tilted_terms(y_i, mu_cav, sd, eps)            # 3.5 line 7: r, z + r, the derivatives of log Z_hat_i
    w = r * rz                                                # for 3.5 line 8: w = r (z + r), sigma_hat^2 = sigma_-i^2 (1 - w sigma_-i^2 / sd^2)
    tau_new = min(max(w / (noise + sigma2_cav * (1.0 - w)), 0.0), tau_max)  # 3.5 line 8: tau~_i = sigma_hat^-2 - tau_-i
    nu_new = tau_new * mu_cav + (1.0 + tau_new * sigma2_cav) * y_i * r / sd  # 3.5 line 9: nu~_i = sigma_hat^-2 mu_hat - nu_-i
    return tau_new, nu_new


_EP_BLOCK = 48                                                # rank-one updates of line 10 applied together
_SQRT_U = math.sqrt(0.5 * np.finfo(np.float64).eps)           # sqrt of the unit roundoff, 1.05e-8


@njit(cache=True, fastmath={"reassoc", "contract"})
def _current_column(Sigma, U, c, m, i, s):
    """s := column i of Sigma after the m pending rank-one updates (3.70).

    Sigma holds the lower triangle as of the start of the block; pending
    update j is Sigma := Sigma - c_j u_j u_j^T with u_j = U[j].
    """
    n = s.shape[0]
    for k in range(i):
        s[k] = Sigma[i, k]
    for k in range(i, n):
        s[k] = Sigma[k, i]
    for j in range(m):
        w = c[j] * U[j, i]
        for k in range(n):
            s[k] -= w * U[j, k]


_STRIP = 192           # _apply_pending: rows of Sigma in each BLAS product


@njit(cache=True)
def _apply_pending(Sigma, U, c, m):
    """Sigma := Sigma - sum_j c_j u_j u_j^T (lower triangle): the pending rank-one updates
    (3.70) as BLAS products, rows r0:r1 of Sigma at a time, (diag(c) U)[:, r0:r1]^T U[:, :r1]
    (dgemm), down to each strip's diagonal block. One pass over the triangle for both signs
    of c_j; at n = 4,000 a fifth faster than two rank-k updates (dsyrk, one for each sign),
    at n = 1,070 a twentieth. The upper triangle inside the diagonal blocks gets the same
    update and is not read (lines 13-15 fill it)."""
    n = Sigma.shape[0]
    W = np.empty((m, n))
    for j in range(m):
        W[j, :] = c[j] * U[j, :]
    a = Sigma.reshape(n * n)
    u = U.reshape(U.shape[0] * n)
    w = W.reshape(m * n)
    # C-order arrays are Fortran transposes: Sigma_F[j, i] = Sigma[i, j], U_F = U^T (n, m),
    # W_F = W^T; rows r0:r1 of Sigma over columns :r1 are Sigma_F[:r1, r0:r1] -= U_F[:r1] W_F[r0:r1]^T
    N, T = np.array([ord("N")], np.uint8), np.array([ord("T")], np.uint8)
    rows, cols, k, ld = np.zeros(1, np.int32), np.zeros(1, np.int32), np.array([m], np.int32), np.array([n], np.int32)
    minus, one = np.array([-1.0]), np.array([1.0])
    for r0 in range(0, n, _STRIP):
        r1 = min(r0 + _STRIP, n)
        rows[0], cols[0] = r1, r1 - r0
        _dgemm(N.ctypes, T.ctypes, rows.ctypes, cols.ctypes, k.ctypes, minus.ctypes, u.ctypes, ld.ctypes,
               w[r0:].ctypes, ld.ctypes, one.ctypes, a[r0 * n:].ctypes, ld.ctypes)


@njit(cache=True)
def _rank_one_update(Sigma, U, c, m, s, ci):
    """Sigma := Sigma - ci s s^T (3.70), deferred; returns the new number m of pending updates.

    The update is stored as pending update m (U[m] = s, c[m] = ci); when U is
    full they are applied together (_apply_pending: BLAS products, one pass
    over Sigma instead of one for each rank-one update) and m starts again at
    0. Until then _current_column gives the columns of the updated Sigma. Same
    arithmetic as the plain update, which is its test oracle (tests/naive.py);
    only the lower triangle is kept up to date.
    """
    U[m, :] = s
    c[m] = ci
    m += 1
    if m == U.shape[0]:
        _apply_pending(Sigma, U, c, m)
        m = 0
        check_interrupt()                                     # Ctrl-C between blocks of site updates
    return m


@njit(cache=True)
def _ep_init(K, nu_tilde_init, tau_tilde_init):
    """Line 2 of Algorithm 3.5: sites nu~ = tau~ = 0, Sigma = K, mu = 0; or, for
    sites given as a warm start, Sigma and mu of (3.53) for them (_ep_posterior)."""
    nu_tilde = nu_tilde_init.copy()
    tau_tilde = tau_tilde_init.copy()
    if not (tau_tilde.any() or nu_tilde.any()):
        return nu_tilde, tau_tilde, _copy(np.ascontiguousarray(K)), np.zeros(K.shape[0])
    Sigma, mu, _ = _ep_posterior(K, tau_tilde, nu_tilde)
    return nu_tilde, tau_tilde, Sigma, mu


@njit(cache=True)
def _ep_posterior(K, tau_tilde, nu_tilde):
    """Sigma, mu and L from the sites (Alg. 3.5 lines 13-15; 3.53, 3.68)."""
    sS = np.sqrt(tau_tilde)                                   # for 3.5 line 13: sS := S~^1/2
    L = _cholesky(_form_B(K, sS))                             # 3.5 line 13: L := cholesky(I_n + S~^1/2 K S~^1/2)
    # The box prints V := L^T\S~^1/2 K; (3.68) needs L\ (see BOXES["3.5"]["errata"])
    V = solve_lower_matrix(L, _scale_rows(sS, K))             # 3.5 line 14: V := L\(S~^1/2 K)
    Sigma = minus_gram(K, V)                                  # 3.5 line 15: Sigma := K - V^T V  (3.68)
    mu = Sigma @ nu_tilde                                     # 3.5 line 15: mu := Sigma nu~  (3.53)
    return Sigma, mu, L


@njit(cache=True)
def _site_log_lik(y_i, f_i, noise, eps):
    """log p(y_i|f_i) of an EP site: probit log Phi(y_i f_i) (noise 1), or
    log(eps + (1 - 2 eps) H(y_i f_i)) (noise 0), with H(0) = 1/2."""
    if noise > 0.0:
        return log_phi(y_i * f_i / math.sqrt(noise))
    H = 1.0 if y_i * f_i > 0.0 else (0.5 if y_i * f_i == 0.0 else 0.0)
    return np.log(eps + (1.0 - 2.0 * eps) * H)


@njit(cache=True)
def _ep_log_Z(y, tau_tilde, nu_tilde, Sigma, mu, L, noise=1.0, eps=0.0):
    """log Z_EP (3.65) through the stable forms (3.73)-(3.75) and the existing L.

    noise, eps select the site as in _site_update (probit: 1, 0). Returns
    (log Z_EP, the number of sites with no cavity); see _ep_log_Z_det."""
    return _ep_log_Z_det(y, tau_tilde, nu_tilde, Sigma, mu, L, noise, eps, np.nan)


@njit(cache=True)
def _ep_log_Z_det(y, tau_tilde, nu_tilde, Sigma, mu, L, noise, eps, log_det_B):
    """_ep_log_Z with log det B given: log_det_B, unless nan, stands for 2 sum_i log L_ii (the
    log det B of 3.73), and L is not read (ep_multiclass's sweeps carry it along their rank-one
    updates); nan: from L, as _ep_log_Z.

    noise, eps select the site as in _site_update (probit: 1, 0). Returns
    (log Z_EP, the number of sites with no cavity). A site with Sigma_ii = 0
    and tau~_i = 0 (a zero row of K) has f_i = mu_i exactly and contributes its
    factor p(y_i|mu_i); every other term of (3.65) is 0 for it. A site whose
    cavity precision is not positive in floating point has no cavity
    distribution and (3.65) no value: then log Z_EP is nan.
    """
    n = y.shape[0]
    log_Z = 0.0
    quad = 0.0
    n_bad = 0
    given = not np.isnan(log_det_B)
    for i in range(n):
        if Sigma[i, i] == 0.0 and tau_tilde[i] == 0.0:        # f_i = mu_i, known
            log_Z += _site_log_lik(y[i], mu[i], noise, eps)
            continue
        if not (Sigma[i, i] > 0.0 and 1.0 / Sigma[i, i] > tau_tilde[i]):
            n_bad += 1
            continue
        tau_cav = 1.0 / Sigma[i, i] - tau_tilde[i]            # (3.56)
        nu_cav = mu[i] / Sigma[i, i] - nu_tilde[i]
        mu_cav = nu_cav / tau_cav
        log_Z += _tilted_terms(y[i], mu_cav, math.sqrt(noise + 1.0 / tau_cav), eps)[0]  # third term of (3.65)
        log_Z += 0.5 * math.log1p(tau_tilde[i] / tau_cav) - (0.0 if given else math.log(L[i, i]))  # (3.73)
        log_Z -= 0.5 * nu_tilde[i] ** 2 / (tau_cav + tau_tilde[i])          # (3.74), diagonal part
        log_Z += 0.5 * mu_cav * tau_cav * (tau_tilde[i] * mu_cav - 2.0 * nu_tilde[i]) / (
            tau_tilde[i] + tau_cav)                                         # (3.75)
        quad += nu_tilde[i] * mu[i]
    if n_bad > 0:
        return np.nan, n_bad
    if given:
        log_Z -= 0.5 * log_det_B                              # (3.73): -sum_i log L_ii
    return log_Z + 0.5 * quad, 0                              # (3.74): 1/2 nu~^T Sigma nu~, with Sigma nu~ = mu


# Notes on ep. Convergence: after a sweep, |change of log Z_EP| < tol and the
# largest change of any tau~_i, nu~_i during the sweep < sqrt(tol) (relative
# to 1 + |value|). The sites of lines 8-9 come from _site_update, an
# algebraically equal form that avoids cancellation, with tau~ kept in
# [0, tau_max] (GPML's infEP keeps tau~ >= 0 the same way). tau_max =
# 1 / (sqrt(u) max_i K_ii), u the unit roundoff: a site that precise pins f_i
# to 1e-8 of its prior spread, beyond what K, known to rounding, can carry:
# B = I + S~^1/2 K S~^1/2 would lose its positive definiteness to K's
# rounding. The probit site never comes near it (tau~ <= 1); a step site
# (noise 0) whose cavity mean sits on the wrong side of 0 asks for
# tau~ ~ z^2 / sigma2_cav, and on overlapping classes with a smooth kernel
# (make_three_gaussians) EP without the bound lets tau~ grow a hundredfold a
# sweep until B has no Cholesky factor. mu of line 11 is updated in O(n) by
# the rank-one identity mu_new = mu + s_i (d_nu (1 - ci Sigma_ii) - ci mu_i).
# The rank-one updates of line 10 are collected over _EP_BLOCK = 48 consecutive
# sites and applied to Sigma's lower triangle together (_rank_one_update); the
# upper triangle is filled at lines 13-15. Stepping through ep.py_func in a
# debugger, Sigma is therefore the state of the last applied block (lower
# triangle only; for n < 48 it stays K for the whole first sweep), while s_i,
# column i of the current Sigma, and mu are exact. Set gpclab._EP_BLOCK = 1
# before calling ep.py_func to see Sigma's lower triangle follow every site
# (the compiled ep read _EP_BLOCK when it was compiled and keeps 48).

@njit(cache=True)
def _ep_tau_max(K):
    """The largest site precision ep allows: 1 / (sqrt(u) max_i K_ii) (see the comment above)."""
    return 1.0 / (_SQRT_U * max(np.diag(K).max(), 1e-300))


@public(returns=EPResult, together=(("nu_tilde_init", "tau_tilde_init"),),
        K="(n, n) psd", y="(n,) pm1 nonempty", nu_tilde_init="(n,) ?0",
        tau_tilde_init="(n,) nonneg ?0", tol="nonneg", max_sweeps="count", order="{natural,random}",
        seed="seed", likelihood=_EP_LIKELIHOOD_SPEC, eps="eps")
@njit(cache=True)
def ep(K, y, nu_tilde_init=None, tau_tilde_init=None, tol=1e-9, max_sweeps=100,
       order="natural", seed=0, likelihood="probit", eps=0.0):
    """Expectation Propagation for binary classification (GPML Algorithm 3.5).

    Parameters
    ----------
    K, y : ndarray, shapes (n, n), (n,)
        Prior covariance matrix; targets -1 or +1.
    nu_tilde_init, tau_tilde_init : ndarray, shape (n,), optional
        Warm start from these sites (both or neither); zeros are line 2.
    tol, max_sweeps : float, int
        Convergence tolerance (on log Z_EP and the site changes), sweep limit.
    order, seed : str, int
        'natural' (i = 1..n) or 'random' (a seeded permutation each sweep; K&R app. B).
    likelihood, eps : str, float
        'probit' (3.16) or 'step' (K&G 10, 20-21), with labelling noise eps.

    Returns
    -------
    EPResult: nu_tilde, tau_tilde, log_Z (3.65); Sigma, mu (3.53); L = cholesky(B);
    n_sweeps; converged; delta (largest relative site change in the last sweep);
    n_skipped (sites with no cavity precision > 0: left unchanged; log_Z nan);
    ep.py_func returns them as a plain tuple.

    Notes
    -----
    Departures (see the comment above): lines 7-9 give tau~_i, nu~_i directly
    (_site_update, no cancellation), 0 <= tau~ <= tau_max; Sigma's rank-one
    updates in blocks of _EP_BLOCK; mu in O(n); a warm start; log Z_EP each sweep. Erratum: line 14 is L\\, not the printed
    L^T\\ (show_box("3.5")). Used in: lectures/sec3_06_ep.ipynb.
    """
    n = y.shape[0]                                            # for line 4: n sites
    noise = _ep_noise(likelihood)                             # for line 7: the site's noise; probit: a step site of f + N(0, 1) noise
    tau_max = _ep_tau_max(K)                                  # for line 7: the largest tau~_i allowed; see the comment above
    if nu_tilde_init is None:                                 # (the face passes zeros; py_func may get None)
        nu_tilde_init, tau_tilde_init = np.zeros(n), np.zeros(n)
    # departs from line 2: warm-started from the sites given (zeros are the box's start)
    nu_tilde, tau_tilde, Sigma, mu = _ep_init(K, nu_tilde_init, tau_tilde_init)  # line 2: nu~ := 0, tau~ := 0, Sigma := K, mu := 0
    if order == "random":
        np.random.seed(seed)
    # In a debugger Sigma is the last applied block's (lower triangle), s_i and mu exact; _EP_BLOCK = 1: each site
    U, c, s_i = np.empty((_EP_BLOCK, n)), np.empty(_EP_BLOCK), np.empty(n)  # for line 10: pending updates; s_i
    log_Z_old = np.inf                                        # for line 16: no previous log Z_EP
    converged = False                                         # for line 18
    for n_sweeps in range(1, max_sweeps + 1):                 # line 3: repeat
        perm = np.random.permutation(n) if order == "random" else np.arange(n)  # for line 4: the order of the sites
        delta, n_skipped = 0.0, 0                             # for line 16: largest site change of the sweep; skipped sites
        m = np.int64(0)                                       # for line 10: no pending update (np.int64: a literal 0 would compile the helpers twice)
        for i in perm:                                        # line 4: for i := 1 to n
            _current_column(Sigma, U, c, m, i, s_i)           # for line 5: s_i := column i of Sigma, s_i[i] = sigma_i^2
            if not (s_i[i] > 0.0 and 1.0 / s_i[i] > tau_tilde[i]):
                # departs from lines 5-11: no cavity in floating point (none needed if f_i is known): skip
                n_skipped += s_i[i] != 0.0 or tau_tilde[i] != 0.0
                continue
            tau_cav = 1.0 / s_i[i] - tau_tilde[i]             # line 5: tau_-i := sigma_i^-2 - tau~_i  (3.56)
            nu_cav = mu[i] / s_i[i] - nu_tilde[i]             # line 6: nu_-i := sigma_i^-2 mu_i - nu~_i
            # departs from lines 7-9: mu_hat, sigma_hat^2 (3.58) only implied; tau~_i, nu~_i without cancellation
            tau_new, nu_new = _site_update(y[i], tau_cav, nu_cav, noise, eps, tau_max)  # line 7: tau~_i, nu~_i from d log Z_hat_i (3.58, 3.59)
            d_tau = tau_new - tau_tilde[i]                    # line 8: d_tau := sigma_hat^-2 - tau_-i - tau~_i, tau~_i += d_tau  (3.59)
            tau_tilde[i] = tau_new                            # for line 8: tau~_i := tau~_i + d_tau
            d_nu = nu_new - nu_tilde[i]                       # for line 11: d_nu, the change of nu~_i
            nu_tilde[i] = nu_new                              # line 9: nu~_i := sigma_hat^-2 mu_hat - nu_-i
            delta = max(delta, abs(d_tau) / (1.0 + tau_new), abs(d_nu) / (1.0 + abs(nu_new)))  # for line 16: largest relative site change
            ci = d_tau / (1.0 + d_tau * s_i[i])               # for line 10: ci := ((d_tau)^-1 + Sigma_ii)^-1
            m = _rank_one_update(Sigma, U, c, m, s_i, ci)     # line 10: Sigma := Sigma - ci s_i s_i^T  (3.70), deferred
            mu += (d_nu * (1.0 - ci * s_i[i]) - ci * mu[i]) * s_i  # line 11: mu := Sigma nu~, by the rank-one identity
        Sigma, mu, L = _ep_posterior(K, tau_tilde, nu_tilde)  # lines 13-15: L := cholesky(B), V := L\S~^1/2 K, Sigma := K - V^T V, mu := Sigma nu~
        # out of the box's order (line 17 before 16): log Z_EP after every sweep, for line 16's test
        log_Z, n_bad = _ep_log_Z(y, tau_tilde, nu_tilde, Sigma, mu, L, noise, eps)  # line 17: log Z_EP (3.65, 3.73-3.75), existing L
        if abs(log_Z - log_Z_old) < tol and delta < math.sqrt(tol):  # line 16: until convergence
            converged = True
            break
        log_Z_old = log_Z                                     # for line 16: log Z_EP of this sweep
    return nu_tilde, tau_tilde, log_Z, Sigma, mu, L, n_sweeps, converged, delta, max(n_skipped, n_bad)  # line 18


@public(nu_tilde="(n,) nonempty", tau_tilde="(n,) nonneg", K="(n, n) psd", K_star="(n, m)",
        k_star_star="(m,) nonneg", L="(n, n) chol ?e", likelihood=_EP_LIKELIHOOD_SPEC, eps="eps")
@njit(cache=True)
def ep_predict(nu_tilde, tau_tilde, K, K_star, k_star_star, L=None, likelihood="probit", eps=0.0):
    """Predictions for expectation propagation (GPML Algorithm 3.6).

    Parameters
    ----------
    nu_tilde, tau_tilde : ndarray, shape (n,)
        Natural site parameters from ep (Algorithm 3.5).
    K : ndarray, shape (n, n)
        Prior covariance of the training latents.
    K_star, k_star_star : ndarray, shapes (n, m), (m,)
        k(X, x_*), one column per test case; k(x_*, x_*).
    L : ndarray, shape (n, n), optional
        cholesky(B) from ep; skips line 2, as the caption suggests.
    likelihood, eps : str, float
        'probit' (3.63), or 'step', K&G's eps + (1 - 2 eps) H(y f).

    Returns
    -------
    pi_bar_star, f_bar_star, V_f_star : ndarray, shape (m,)
        Probability of class +1 (3.63); latent mean (3.60) and variance (3.61).

    Notes
    -----
    For 'step', line 7 is eps + (1 - 2 eps) Phi(f_bar_* / sqrt(V[f_*])) (K&G 26):
    the latent noise is inside k(x_*, x_*), so no "1 +".
    """
    sS = np.sqrt(tau_tilde)                                   # for line 2: sS := S~^1/2
    if L is None or L.shape[0] == 0:                          # no L given (the face passes it empty)
        L = _cholesky(_form_B(K, sS))                         # line 2: L := cholesky(I + S~^1/2 K S~^1/2)
    z = sS * solve_lower_transpose(L, solve_lower(L, sS * (K @ nu_tilde)))  # line 3: z := S~^1/2 L^T\(L\(S~^1/2 K nu~))
    f_bar_star = K_star.T @ (nu_tilde - z)                    # line 4: f_bar_* := k(x_*)^T (nu~ - z)  (3.60, 3.71)
    v = solve_lower_matrix(L, _scale_rows(sS, K_star))        # line 5: v := L\(S~^1/2 k(x_*))
    V_f_star = k_star_star - (v * v).sum(axis=0)              # line 6: V[f_*] := k(x_*, x_*) - v^T v  (3.61, 3.72)
    noise = _ep_noise(likelihood)                             # for line 7: probit: 1, a step site of f + N(0, 1) noise; step: 0
    pi_bar_star = np.empty(f_bar_star.shape[0])               # for line 7
    for j in range(f_bar_star.shape[0]):                      # for line 7: each test input
        sd = math.sqrt(noise + max(V_f_star[j], 0.0))         # for line 7: sd := sqrt(1 + V[f_*]) (probit)
        if sd > 0.0:
            P = std_normal_cdf(f_bar_star[j] / sd)            # line 7: pi_bar_* := Phi(f_bar_* / sqrt(1 + V[f_*]))  (3.63; K&G 25)
        else:                                                 # no latent noise and V = 0: a step
            P = 1.0 if f_bar_star[j] > 0.0 else 0.0
        pi_bar_star[j] = eps + (1.0 - 2.0 * eps) * P          # for line 7: eps + (1 - 2 eps) Phi(f_bar_* / sd) (K&G 26)
    return pi_bar_star, f_bar_star, V_f_star                  # line 8: return pi_bar_*


@public(K="(n, n) psd", X="(n, d)", kernel="{se,ard,kg,kg_iso}", log_hyp="(p,) loghyp", nu_tilde="(n,)",
        tau_tilde="(n,) nonneg", L="(n, n) chol", discrete="(d,) flags ?0")
@njit(cache=True)
def ep_log_Z_grad(K, X, kernel, log_hyp, nu_tilde, tau_tilde, L, discrete=None):
    """Gradient of log Z_EP w.r.t. log_hyp at an EP fixed point (K&R eq. 51).

    d log Z_EP / d theta_j = 1/2 b^T dK b - 1/2 tr(R dK), with
    R = (K + S~^-1)^-1 = S~^1/2 B^-1 S~^1/2 (K&R 52) and b = R S~^-1 nu~ =
    nu~ - S~^1/2 L^T\\(L\\(S~^1/2 K nu~)) (as line 3 of Algorithm 3.6). The
    site parameters depend on theta too, but at a fixed point of EP those
    terms vanish (Seeger 2005), so EP must be converged tightly. discrete:
    optional flags of the discrete inputs (K&G 14), as given to kernel_matrix.
    """
    n = nu_tilde.shape[0]
    sS = np.sqrt(tau_tilde)
    b = nu_tilde - sS * solve_lower_transpose(L, solve_lower(L, sS * (K @ nu_tilde)))
    R = _mirror_scaled(_potri_lower(L), sS)                   # R = S~^1/2 B^-1 S~^1/2 (K&R 52)
    p = log_hyp.shape[0]
    grad = np.empty(p)
    for j in range(p):
        check_interrupt()
        dK = kernel_grad(kernel, X, log_hyp, K, j, discrete)
        bDb, trRdK, _ = _gradient_terms(dK, R, b, b)
        grad[j] = 0.5 * bDb - 0.5 * trRdK                     # (K&R 51)
    return grad


@njit(cache=True)
def _lower_bound(K, y, likelihood, m, A):
    """Jensen lower bound on log p(y|X) for a Gaussian q(f) = N(m, A) (K&R eq. 35).

    sum_i E_N(f_i|m_i, A_ii)[log p(y_i|f_i)] - 1/2 m^T K^-1 m - 1/2 tr(K^-1 A)
    + 1/2 log|K^-1 A| + n/2 (35c); the one-dimensional expectations by a
    64-point Gauss-Hermite rule. K and A must be positive definite; the
    Python function lower_bound checks that and says which is not.
    """
    n = y.shape[0]
    LK = np.linalg.cholesky(K)
    LA = np.linalg.cholesky(A)
    expected = 0.0
    fk = np.empty(_GH_X.shape[0])
    yk = np.empty(_GH_X.shape[0])
    for i in range(n):
        sd = math.sqrt(A[i, i])
        for k in range(_GH_X.shape[0]):
            fk[k] = m[i] + _SQRT2 * sd * _GH_X[k]
            yk[k] = y[i]
        lp = log_likelihood(likelihood, yk, fk)[0]
        expected += (_GH_W * lp).sum() / math.sqrt(math.pi)
    u = solve_lower(LK, m)                                    # m^T K^-1 m = |LK^-1 m|^2
    C = solve_lower_matrix(LK, LA)                            # tr(K^-1 A) = |LK^-1 LA|_F^2
    log_det = half_log_det(LA) - half_log_det(LK)             # 1/2 log|K^-1 A|
    return expected - 0.5 * (u @ u) - 0.5 * (C * C).sum() + log_det + 0.5 * n


# ============================================================================
# K&R 5-6 MCMC: HMC on the latents, annealed importance sampling, truncated Gaussians
# ============================================================================
#
# HMC runs on whitened latents g = L^-1 f with K = L L^T (K&R 6.1), where the
# prior is N(0, I); the tempered target of AIS is p(y|f)^tau N(f|0, K) (K&R 28).


@njit(cache=True, fastmath={"reassoc", "contract"})
def _lower_matvec(L, g, out):
    """out := L g for lower-triangular L (row dot products)."""
    n = g.shape[0]
    for i in range(n):
        s = 0.0
        for k in range(i + 1):
            s += L[i, k] * g[k]
        out[i] = s


@njit(cache=True, fastmath={"reassoc", "contract"})
def _lower_t_matvec(L, v, out):
    """out := L^T v for lower-triangular L (row axpys, contiguous in memory)."""
    n = v.shape[0]
    for k in range(n):
        out[k] = 0.0
    for i in range(n):
        vi = v[i]
        for k in range(i + 1):
            out[k] += L[i, k] * vi


@njit(cache=True)
def _potential(L, y, likelihood, tau, g, f, grad):
    """U(g) = -tau log p(y|L g) + 1/2 g^T g and its gradient -tau L^T grad log p + g.

    Fills f = L g and grad; returns (U, log p(y|f)).
    """
    _lower_matvec(L, g, f)
    lp, dlp, _, _ = log_likelihood(likelihood, y, f)
    _lower_t_matvec(L, dlp, grad)
    log_lik = lp.sum()
    U = -tau * log_lik
    for i in range(g.shape[0]):
        grad[i] = g[i] - tau * grad[i]
        U += 0.5 * g[i] * g[i]
    return U, log_lik


@public(L="(n, n) chol", y="(n,) pm1 nonempty", likelihood=_LIKELIHOOD_SPEC, tau="unit", g="(n,)",
        step="positive", n_leapfrog="count")
@njit(cache=True)
def hmc_transition(L, y, likelihood, tau, g, step, n_leapfrog):
    """One Hybrid Monte Carlo transition (Duane et al. 1987; K&R 6.1) on whitened latents.

    Target p(y|L g)^tau N(g|0, I); leapfrog with `n_leapfrog` steps of size
    `step` and unit masses, then the Metropolis correction. Returns
    (g, accepted, log p(y|L g)) for the new state (the old one if rejected).
    Ctrl-C is seen between leapfrog steps.
    """
    return _hmc_transition(L, y, likelihood, tau, g, step, n_leapfrog, _main_thread())


@njit(cache=True)
def _hmc_transition(L, y, likelihood, tau, g, step, n_leapfrog, interruptible):
    """hmc_transition; interruptible=False inside prange, whose threads cannot see Ctrl-C."""
    n = g.shape[0]
    f = np.empty(n)
    grad = np.empty(n)
    U0, ll0 = _potential(L, y, likelihood, tau, g, f, grad)
    p = np.empty(n)
    for i in range(n):
        p[i] = np.random.standard_normal()
    H0 = U0 + 0.5 * (p @ p)
    q = g.copy()
    for i in range(n):                                        # half step for the momenta
        p[i] -= 0.5 * step * grad[i]
    U = U0
    ll = ll0
    for s in range(n_leapfrog):
        if interruptible:
            check_interrupt()
        for i in range(n):                                    # full step for the positions
            q[i] += step * p[i]
        U, ll = _potential(L, y, likelihood, tau, q, f, grad)
        scale = step if s < n_leapfrog - 1 else 0.5 * step    # last momentum step is a half step
        for i in range(n):
            p[i] -= scale * grad[i]
    H1 = U + 0.5 * (p @ p)
    u = np.random.random()
    # Metropolis: accept with min(1, e^(H0 - H1)); a non-finite energy (a diverged
    # trajectory) is rejected: min(0, nan) would be 0, an acceptance
    if math.isfinite(H1) and u < math.exp(min(0.0, H0 - H1)):
        return q, True, ll
    return g.copy(), False, ll0


@njit(cache=True)
def _jittered_cholesky(K):
    """cholesky(K + 1e-8 max_i K_ii I): the module's jitter for sampling from N(0, K).

    An SE covariance of near-duplicate inputs is singular in floating point;
    1e-8 of the signal variance on the diagonal changes the model far less
    than the Monte Carlo error.
    """
    n = K.shape[0]
    J = K.copy()
    d = 0.0
    for i in range(n):
        d = max(d, K[i, i])
    for i in range(n):
        J[i, i] += 1e-8 * d
    return np.linalg.cholesky(J)


@njit(cache=True)
def _auto_step(lam_max, likelihood, tau):
    """Leapfrog step and number of steps for HMC on whitened latents (see hmc_step_size).

    The curvature of the potential is at most 1 + tau w lam_max(K), w the
    largest W of the likelihood in the bulk of the posterior (1 for probit,
    1/4 for logistic); leapfrog is stable below 2 / sqrt(curvature). Step
    1.5 / sqrt(curvature), trajectories of length about 1.5, at most 50 steps.
    """
    step = 1.5 / math.sqrt(1.0 + tau * _w_max(likelihood) * max(lam_max, 0.0))
    return step, _n_leapfrog(step)


@njit(cache=True)
def _n_leapfrog(step):
    """Leapfrog steps for a trajectory of length about 1.5, at most 50. (The bound is
    taken before the ceiling: ceil(1.5 / step) overflows int64 for step < 1.6e-19,
    a signal variance above about 1e38.)"""
    return int(math.ceil(min(1.5 / step, 50.0)))


@njit(cache=True)
def _autocorrelation_time(x):
    """1 + 2 sum_k rho_k by Geyer's initial positive sequence (as autocorrelation_time), direct sums."""
    N = x.shape[0]
    m = x.mean()
    c0 = 0.0
    for t in range(N):
        c0 += (x[t] - m) ** 2
    if N < 4 or c0 == 0.0:
        return 1.0
    tau = -1.0
    for k in range(0, N // 2 - 1):
        pair = 0.0
        for lag in (2 * k, 2 * k + 1):
            s = 0.0
            for t in range(N - lag):
                s += (x[t] - m) * (x[t + lag] - m)
            pair += s / c0
        if pair <= 0.0:
            break
        tau += 2.0 * pair
    return max(tau, 1.0)


@njit(cache=True)
def _effective_sample_size(F):
    """Samples (rows of F) over the largest autocorrelation time of any coordinate (column)."""
    tau_max = 1.0
    for i in range(F.shape[1]):
        tau_max = max(tau_max, _autocorrelation_time(np.ascontiguousarray(F[:, i])))
    return F.shape[0] / tau_max


@public(K="(n, n) psd", y="(n,) pm1 nonempty", likelihood=_LIKELIHOOD_SPEC, n_samples="count", step="positive ?",
        n_leapfrog="count ?", seed="seed", burn_in="count0", thin="count", tau="unit")
@njit(cache=True)
def hmc_latent(K, y, likelihood, n_samples, step=None, n_leapfrog=None, seed=0, burn_in=0,
               thin=1, tau=1.0):
    """Samples of f from p(f|X, y) (or the tempered p(y|f)^tau N(f|0, K)) by HMC.

    Works on g = L^-1 f (K&R 6.1), starting from g ~ N(0, I), with L the
    Cholesky factor of K + 1e-8 max_i K_ii I (the module's jitter, as
    mcmc_posterior and ais).

    Parameters
    ----------
    step, n_leapfrog : float, int, optional
        Leapfrog step and number of steps per transition. Default: from the
        largest eigenvalue of K (hmc_step_size); a fixed step that suits one
        signal variance freezes the chain at another.

    Returns
    -------
    F : ndarray, shape (n_samples, n)
        Latent samples f = L g, after `burn_in` transitions, every `thin`-th.
    acceptance : float
        Fraction of accepted transitions (burn-in included). Well tuned HMC
        accepts about 0.6 to 0.99; 0 is a frozen chain, 1.00 a step too small.
    ess : float
        Effective sample size: n_samples over the largest autocorrelation
        time (autocorrelation_time) of the n latent coordinates.
    """
    n = y.shape[0]
    L = _jittered_cholesky(K)
    if step is None:
        st, nl = _auto_step(np.linalg.eigvalsh(K)[n - 1], likelihood, tau)
    else:
        st, nl = step, _n_leapfrog(step)
    if n_leapfrog is not None:
        nl = n_leapfrog
    np.random.seed(seed)
    g = np.empty(n)
    for i in range(n):
        g[i] = np.random.standard_normal()
    F = np.empty((n_samples, n))
    f = np.empty(n)
    accepted = 0
    total = burn_in + n_samples * thin
    k = 0
    for t in range(total):
        check_interrupt()
        g, acc, _ = hmc_transition(L, y, likelihood, tau, g, st, nl)
        accepted += acc
        if t >= burn_in and (t - burn_in) % thin == thin - 1:
            _lower_matvec(L, g, f)
            F[k] = f
            k += 1
    return F, accepted / total, _effective_sample_size(F)


@public(K="(n, n) psd", y="(n,) pm1 nonempty", likelihood=_LIKELIHOOD_SPEC, n_samples="count", seed="seed",
        burn_in="count0", thin="count")
@njit(cache=True)
def elliptical_slice_latent(K, y, likelihood, n_samples, seed=0, burn_in=0, thin=1):
    """Samples of f from p(f|X, y) by elliptical slice sampling (Murray, Adams & MacKay 2010).

    A sampler with no step size: each transition draws nu ~ N(0, K) and a level
    under the likelihood, then moves along the ellipse f cos(theta) + nu sin(theta),
    which the prior N(0, K) leaves invariant, shrinking the range of theta until
    the likelihood is above the level. Because the prior is handled exactly, a
    large signal variance does not slow it down, where HMC's leapfrog step must
    shrink like 1 / sqrt(lambda_max(K)) (hmc_step_size) and a chain of a few
    thousand transitions barely moves. Works on g = L^-1 f as hmc_latent does
    (L the Cholesky factor of K + 1e-8 max_i K_ii I), starting from g ~ N(0, I).

    Returns
    -------
    F : ndarray, shape (n_samples, n)
        Latent samples after `burn_in` transitions, every `thin`-th.
    evaluations : float
        Likelihood evaluations per transition (1 means every first proposal was
        taken; each costs one product with L).
    ess : float
        Effective sample size, n_samples over the largest autocorrelation time
        of the n latent coordinates (as hmc_latent).
    """
    n = y.shape[0]
    L = _jittered_cholesky(K)
    np.random.seed(seed)
    g = np.empty(n)
    nu = np.empty(n)
    g_new = np.empty(n)
    for i in range(n):
        g[i] = np.random.standard_normal()
    f = np.empty(n)
    _lower_matvec(L, g, f)
    ll = log_likelihood(likelihood, y, f)[0].sum()
    F = np.empty((n_samples, n))
    total = burn_in + n_samples * thin
    evaluations = 0
    k = 0
    for t in range(total):
        check_interrupt()
        for i in range(n):
            nu[i] = np.random.standard_normal()              # an ellipse through g: nu ~ N(0, I)
        level = ll + math.log(np.random.random())             # the slice: log p(y|f) > level
        theta = 2.0 * math.pi * np.random.random()
        lo = theta - 2.0 * math.pi
        hi = theta
        while True:                                           # shrink the bracket until on the slice
            c = math.cos(theta)
            s = math.sin(theta)
            for i in range(n):
                g_new[i] = g[i] * c + nu[i] * s
            _lower_matvec(L, g_new, f)
            ll_new = log_likelihood(likelihood, y, f)[0].sum()
            evaluations += 1
            if ll_new > level:
                break
            if theta < 0.0:
                lo = theta
            else:
                hi = theta
            theta = lo + (hi - lo) * np.random.random()
        g, g_new = g_new, g                                   # the accepted point; f = L g already
        ll = ll_new
        if t >= burn_in and (t - burn_in) % thin == thin - 1:
            for i in range(n):
                F[k, i] = f[i]
            k += 1
    return F, evaluations / total, _effective_sample_size(F)


_AIS_BLOCK = 32                                               # temperatures between interrupt checks
_AIS_SERIAL_WORK = 1e9                                        # leapfrog work (steps x n^2) of a run's block
# above which it runs serially, seeing Ctrl-C: ~0.15 s per 2e8 here, so a parallel block answers
# Ctrl-C within about a second, and K&R's USPS problem (n = 767, up to 50 leapfrog steps, 9.4e8)
# keeps its runs in parallel


@njit(cache=True)
def _ais_run(L, y, likelihood, tau, t0, t1, g, ll, log_w, n_acc, steps, n_lf, seed, r, interruptible):
    """Temperatures t0..t1-1 of K&R Algorithm 3 for run r (lines 5-6), in place.

    Updates the run's state g[r], log p(y|f) ll[r], log weight log_w[r] and
    count of accepted transitions n_acc[r]; steps[t], n_lf[t] are the HMC step
    and number of leapfrog steps at temperature t. The random numbers are
    seeded by (seed, r, t0), so the result does not depend on the thread that
    runs the block, nor on the number of threads.
    """
    np.random.seed((seed + 7919 * r + 104729 * t0) % 2147483648)
    gr = g[r].copy()
    llr = ll[r]
    lw = log_w[r]
    acc_r = 0.0
    for t in range(t0, t1):                                   # AIS line 4: for t = t0..t1-1 (of 1..T)
        lw += (tau[t] - tau[t - 1]) * llr                     # AIS line 6: ln(Z_t/Z_t-1) (31), at f_t-1 (see ais)
        gr, acc, llr = _hmc_transition(L, y, likelihood, tau[t], gr, steps[t], n_lf[t], interruptible)  # AIS line 5: f_t by HMC at tau(t)
        acc_r += acc
    n_acc[r] += acc_r
    g[r] = gr
    ll[r] = llr
    log_w[r] = lw


@njit(cache=True, parallel=True)
def _ais_temperatures(L, y, likelihood, tau, t0, t1, g, ll, log_w, n_acc, steps, n_lf, seed, interruptible):
    """Temperatures t0..t1-1 of K&R Algorithm 3 for every run, in parallel over the runs (_ais_run);
    interruptible is False: worker threads cannot see Ctrl-C."""
    for r in prange(g.shape[0]):                              # AIS line 2: for r = 1..R, in parallel
        _ais_run(L, y, likelihood, tau, t0, t1, g, ll, log_w, n_acc, steps, n_lf, seed, np.int64(r),
                 interruptible)                               # prange's index is unsigned: one compiled type


@njit(cache=True)
def _ais_block(L, y, likelihood, tau, t0, t1, g, ll, log_w, n_acc, steps, n_lf, seed):
    """Lines 5-6 of K&R Algorithm 3 at temperatures t0..t1-1 for every run.

    In parallel over the runs (_ais_temperatures), unless one run's block is
    more leapfrog work than _AIS_SERIAL_WORK (a large n_leapfrog) or numba has
    one thread here (numba.set_num_threads(1), or a process forked after numba's
    threads started: see _start_threads): then the runs go one after the other
    in this thread, which sees Ctrl-C between leapfrog steps (worker threads
    cannot). Same random numbers either way.
    """
    n = y.shape[0]
    serial = _numba_threads() == 1 or n_lf[t0:t1].sum() * float(n * n) > _AIS_SERIAL_WORK
    if not serial:
        _ais_temperatures(L, y, likelihood, tau, t0, t1, g, ll, log_w, n_acc, steps, n_lf, seed, serial)
        return
    for r in range(g.shape[0]):                               # AIS line 2: for r = 1..R, one after the other
        _ais_run(L, y, likelihood, tau, t0, t1, g, ll, log_w, n_acc, steps, n_lf, seed, r, serial)


@njit(cache=True)
def _ais_steps(K, likelihood, tau, step, n_leapfrog):
    """HMC step and number of leapfrog steps at each temperature of ais: the given
    ones, or at each tau from the largest eigenvalue of K (_auto_step)."""
    lam = np.linalg.eigvalsh(K)[K.shape[0] - 1] if step is None else 0.0
    steps = np.empty(tau.shape[0])
    n_lf = np.empty(tau.shape[0], dtype=np.int64)
    for t in range(tau.shape[0]):
        if step is None:
            steps[t], n_lf[t] = _auto_step(lam, likelihood, tau[t])
        else:
            steps[t], n_lf[t] = step, _n_leapfrog(step)
        if n_leapfrog is not None:
            n_lf[t] = n_leapfrog
    return steps, n_lf


@njit(cache=True)
def _ais_schedule(T, schedule):
    """tau(t) = (t/T)^4, t = 0..T (K&R 6.2), or the schedule given: T + 1 increasing
    temperatures from 0 to 1 (checked here: no spec word says so yet)."""
    if schedule is None:
        tau = np.empty(T + 1)
        for t in range(T + 1):
            tau[t] = (t / T) ** 4
        return tau
    if schedule.shape[0] != T + 1 or schedule[0] != 0.0 or schedule[T] != 1.0 or np.any(np.diff(schedule) < 0.0):
        raise ValueError("ais: schedule must have T + 1 increasing temperatures from 0 to 1")
    return schedule.copy()


# Notes on ais. The return line is the box's: the log of the arithmetic mean
# of the R weights Z_r, although K&R's text speaks of combining the runs by
# their "geometric mean". The arithmetic mean is the unbiased estimate of Z
# (each Z_r is unbiased, Neal 2001), and its log what the box returns; a
# geometric mean (the mean of ln Z_r) would be biased low. Line 6 corrects
# (31) in which sample it uses (an erratum, BOXES["AIS"]): the ratio Z_t / Z_t-1
# of (30a) is an expectation under the temperature tau(t-1), so log w gains
# (tau(t) - tau(t-1)) log p(y|f_t-1) with the state from before the
# transition at tau(t) (Neal 2001); evaluating it at f_t, as (31) is written,
# biases the estimate by O(1/T). The loops run the other way round from the
# box's: temperatures outside, runs inside (_ais_block, _ais_run); run r's
# random numbers depend only on (seed, r, t), so the order does not change them. K is factorised with the module's jitter,
# cholesky(K + 1e-8 max_i K_ii I) (as hmc_latent and mcmc_posterior), so
# near-duplicate inputs do not stop it.

@public(K="(n, n) psd", y="(n,) pm1 nonempty", likelihood=_LIKELIHOOD_SPEC,
        T="count", R="count", step="positive ?", n_leapfrog="count ?", seed="seed", schedule="(*,) ?")
@njit(cache=True)
def ais(K, y, likelihood, T=8000, R=3, step=None, n_leapfrog=None, seed=0, schedule=None):
    """Annealed Importance Sampling of log p(y|X) (Kuss & Rasmussen 2005, Algorithm 3).

    Parameters
    ----------
    K, y, likelihood : ndarray (n, n), ndarray (n,), str
        Prior covariance, -1/+1 targets, 'logistic' or 'probit'.
    T, R : int
        Temperatures (schedule (t/T)^4, K&R 6.2) and independent runs (in
        parallel; run r seeded by (seed, r), so independent of the thread count).
    step, n_leapfrog : float, int, optional
        One HMC transition per temperature; default from K (hmc_step_size at tau).
    schedule : ndarray, shape (T + 1,), optional
        Any increasing schedule from 0 to 1 instead of (t/T)^4.

    Returns
    -------
    log_Z, log_w (R,), se, acceptance, ess: ln Z (the box's return line); ln Z_r
    of each run (32); the standard error of log_Z (delta method; nan for R = 1);
    accepted fraction of HMC transitions; effective runs (sum w)^2 / sum w^2.

    Notes
    -----
    Departures (see the comment above): the loop over t outside the loop over r,
    lines 4-7 for all runs at once; line 6 at f_t-1, correcting (31); the return
    line is the box's arithmetic mean.
    """
    n = y.shape[0]                                            # for line 3: n latents
    tau = _ais_schedule(T, schedule)                          # line 1: temperature schedule tau
    L = _jittered_cholesky(K)
    steps, n_lf = _ais_steps(K, likelihood, tau, step, n_leapfrog)
    g, ll, log_w, n_acc, f = np.empty((R, n)), np.empty(R), np.zeros(R), np.zeros(R), np.empty(n)
    for r in range(R):                                        # line 2: for r = 1..R (lines 4-7 below for all r)
        np.random.seed(seed + r)
        for i in range(n):                                    # for line 3
            g[r, i] = np.random.standard_normal()             # line 3: f_0 ~ N(0, K), as f = L g with g ~ N(0, I)
        _lower_matvec(L, g[r], f)
        ll[r] = log_likelihood(likelihood, y, f)[0].sum()
    # departs from lines 2 and 4: the temperatures run outside the runs, in blocks of 32 for
    # all runs in parallel, so that the runs share the work and Ctrl-C is seen between blocks
    for t0 in range(1, T + 1, _AIS_BLOCK):                    # line 4: for t = 1..T
        check_interrupt()
        # corrects (31) at line 6: ln(Z_t/Z_t-1) is taken at f_t-1, before line 5's step (unbiased)
        _ais_block(L, y, likelihood, tau, t0, min(t0 + _AIS_BLOCK, T + 1), g, ll, log_w, n_acc,
                   steps, n_lf, seed)                         # lines 5-6: f_t by HMC at tau(t); ln(Z_t/Z_t-1) (31)
    m = log_w.max()                                           # for line 8: m := max_r ln Z_r, so that exp does not overflow
    w = np.exp(log_w - m)                                     # line 8: Z_r = prod_t Z_t/Z_t-1 (32), over e^max
    mean_w = w.mean()                                         # for line 10: (1/R) sum_r Z_r, over e^m
    log_Z = m + math.log(mean_w)                              # line 10: ln Z = ln((1/R) sum_r Z_r)
    se = math.sqrt(((w - mean_w) ** 2).sum() / (R - 1) / R) / mean_w if R > 1 else np.nan
    return log_Z, log_w, se, n_acc.sum() / (R * T), w.sum() ** 2 / (w * w).sum()


@public(F="(S, n) nonempty", K="(n, n) psd", likelihood=_LIKELIHOOD_SPEC, K_star="(n, m)", k_star_star="(m,) nonneg")
@njit(cache=True)
def mcmc_predict(F, K, likelihood, K_star, k_star_star):
    """Predictive probabilities of class +1 from posterior latent samples (K&R eqs. 3-4).

    For each sample f (a row of F), f_* | f is Gaussian with mean
    k_*^T K^-1 f and variance k(x_*, x_*) - k_*^T K^-1 k_* (GPML 2.19); the
    prediction averages p(y_* = 1|f) over the samples. Instead of drawing one
    f_* per sample it uses the exact Gaussian average of the likelihood
    (3.82 for probit, logistic_gaussian_integral), which has less Monte Carlo
    variance for the same samples (Rao-Blackwellisation).

    Returns pi_bar_star (m,) and the latent predictive means per sample (S, m).
    """
    S = F.shape[0]
    m = K_star.shape[1]
    L = np.linalg.cholesky(K)
    A = solve_lower_matrix(L, np.ascontiguousarray(K_star))  # L^-1 K_*
    var = k_star_star - (A * A).sum(axis=0)                    # k_** - k_*^T K^-1 k_*
    means = np.empty((S, m))
    pi = np.zeros(m)
    average = _average_rule(likelihood)
    for s in range(S):
        check_interrupt()
        u = solve_lower(L, F[s])                               # L^-1 f
        means[s] = u @ A                                       # k_*^T K^-1 f
        for j in range(m):
            pi[j] += _gaussian_average(average, likelihood, means[s, j], max(var[j], 0.0))
    return pi / S, means


@njit(cache=True)
def _truncnorm_lower(a):
    """A draw of z ~ N(0, 1) conditioned on z >= a (exact).

    Rejection from N(0, 1) for a <= 0.5; for a > 0.5 Robert's (1995)
    exponential proposal with rate (a + sqrt(a^2 + 4)) / 2.
    """
    if a <= 0.5:
        while True:
            z = np.random.standard_normal()
            if z >= a:
                return z
    alpha = 0.5 * (a + math.sqrt(a * a + 4.0))
    while True:
        z = a - math.log(np.random.random()) / alpha
        if np.random.random() <= math.exp(-0.5 * (z - alpha) ** 2):
            return z


@njit(cache=True)
def _orthant_start(C, x0):
    """The starting state of the truncated-Gaussian samplers: x0, or sqrt(C_ii) in each coordinate."""
    n = C.shape[0]
    x = np.empty(n)
    if x0 is None:
        for i in range(n):
            x[i] = math.sqrt(C[i, i])
        return x
    return x0.copy()


@public(C="(n, n) psd nonempty", n_samples="count", seed="seed", x0="(n,) nonneg ?",
        thin="count")
@njit(cache=True)
def truncated_gaussian_gibbs(C, n_samples, seed=0, x0=None, thin=1):
    """Samples of N(0, C) truncated to the positive orthant x_i >= 0, by Gibbs sampling.

    Each sweep draws every x_i from its conditional, a univariate normal
    N(-sum_j!=i P_ij x_j / P_ii, 1 / P_ii) (P = C^-1) truncated to x_i >= 0,
    exactly. Returns (n_samples, n); one sample every `thin` sweeps.
    """
    n = C.shape[0]
    P = cholesky_inverse(np.linalg.cholesky(C))
    np.random.seed(seed)
    x = _orthant_start(C, x0)
    out = np.empty((n_samples, n))
    for s in range(n_samples * thin):
        check_interrupt()
        for i in range(n):
            r = 0.0
            for j in range(n):
                if j != i:
                    r += P[i, j] * x[j]
            sd = 1.0 / math.sqrt(P[i, i])
            mu = -r / P[i, i]
            x[i] = mu + sd * _truncnorm_lower(-mu / sd)
        if s % thin == thin - 1:
            out[s // thin] = x
    return out


@public(C="(n, n) psd nonempty", n_samples="count", step="positive", seed="seed",
        x0="(n,) nonneg ?", thin="count")
@njit(cache=True)
def truncated_gaussian_mh(C, n_samples, step, seed=0, x0=None, thin=1):
    """Samples of N(0, C) truncated to x_i >= 0 by random-walk Metropolis-Hastings (K&R section 5).

    Proposal x' = x + step z, z ~ N(0, I); a proposal outside the orthant is
    rejected. Returns (samples (n_samples, n), acceptance rate).
    """
    n = C.shape[0]
    P = cholesky_inverse(np.linalg.cholesky(C))
    np.random.seed(seed)
    x = _orthant_start(C, x0)
    Px = P @ x
    out = np.empty((n_samples, n))
    xp = np.empty(n)
    accepted = 0
    for s in range(n_samples * thin):
        check_interrupt()
        inside = True
        for i in range(n):
            xp[i] = x[i] + step * np.random.standard_normal()
            inside = inside and xp[i] >= 0.0
        if inside:
            Pxp = P @ xp
            d = -0.5 * (xp @ Pxp) + 0.5 * (x @ Px)            # log N(x'|0, C) - log N(x|0, C)
            if np.random.random() < math.exp(min(0.0, d)):
                x[:] = xp
                Px = Pxp
                accepted += 1
        if s % thin == thin - 1:
            out[s // thin] = x
    return out, accepted / (n_samples * thin)


# ============================================================================
# K&G 3-4 EM-EP: E-step, M-step (K&G 31), multi-class differences, and the EM loop
# ============================================================================
#
# Binary: the E-step is ep(..., likelihood="step", eps=eps), which gives
# q(f) = N(h, A) (K&G 27; h = mu, A = Sigma). The M-step maximises the Jensen
# bound F (K&G 29) over the covariance hyperparameters with q held fixed, by
# the gradient K&G eq. 31, and updates eps in closed form.
#
# Multi-class (K&G 4.2): with one-hot y (J, n) and y_i the class of case i, the
# latents are the differences g_i^{y_i,j} = f_i^{y_i} - f_i^j, j != y_i: n (J - 1)
# of them, ordered case by case and, within a case, by increasing j (K&G 45).
# Their prior covariance is (K&G 43); the likelihood is prod_j H(g_i^{y_i,j})
# (K&G 47), a step site of label +1 for every g, so the E-step is the binary
# ep() on (K_g, y = +1) (K&G 48-49) and the M-step is eq. 31 for K_g, taken
# back to the hyperparameters of c(x, x') through (K&G 43).
#
# Glossary: C the prior covariance c(X, X) (K&G 13) and Kg that of the
# differences (K&G 43); alpha = C^-1 h (K&G 27); Q the (n, n) weights with
# which eq. 31 is 1/2 sum_ik Q_ik dC_ik / d theta; F_cov = E_q[log p(f|X, theta)]
# (K&G 56), the part of F that depends on the covariance hyperparameters.


@njit(cache=True)
def _F_cov(quad, trace, LK):
    """F_cov = E_q[log N(f|0, C)] (K&G 56) = -1/2 h^T C^-1 h - 1/2 tr(C^-1 A) - 1/2 log|2 pi C|,
    from quad = h^T C^-1 h, trace = tr(C^-1 A) and LK = cholesky(C)."""
    return -0.5 * quad - 0.5 * trace - half_log_det(LK) - 0.5 * LK.shape[0] * math.log(2.0 * math.pi)


@public(K="(n, n) psd", y="(n,) pm1 nonempty", eps="eps", mu="(n,)", Sigma="(n, n) psd")
@njit(cache=True)
def em_ep_bound(K, y, eps, mu, Sigma):
    """The lower bound F of log p(y|X, Theta) under q(f) = N(mu, Sigma) (K&G eqs. 29, 56).

    F = F_eps + F_cov + H(q): F_eps = sum_i E_q[log(eps + (1 - 2 eps) H(y_i f_i))],
    F_cov = E_q[log N(f|0, K)] and the entropy H(q). With P_i = q(y_i f_i > 0) =
    Phi(y_i mu_i / sqrt(Sigma_ii)), F_eps = sum_i P_i log(1 - eps) + (1 - P_i) log eps,
    which is -inf for eps = 0: a Gaussian q puts mass on the wrong sign, where the
    step likelihood is 0. The M-step for the covariance needs only F_cov (em_ep_grad).
    Returns (F, F_cov).
    """
    n = y.shape[0]
    LK = np.linalg.cholesky(K)
    LS = np.linalg.cholesky(Sigma)
    u = solve_lower(LK, mu)
    M = solve_lower_matrix(LK, LS)
    F_cov = _F_cov(u @ u, (M * M).sum(), LK)                  # h^T C^-1 h = |LK^-1 h|^2, tr(C^-1 A) = |LK^-1 LS|_F^2
    entropy = half_log_det(LS) + 0.5 * n * (1.0 + math.log(2.0 * math.pi))
    F_eps = 0.0
    for i in range(n):
        P = std_normal_cdf(y[i] * mu[i] / math.sqrt(Sigma[i, i]))
        if P > 0.0:
            F_eps += P * math.log(1.0 - eps)
        if P < 1.0:
            F_eps += (1.0 - P) * (math.log(eps) if eps > 0.0 else -np.inf)
    return F_eps + F_cov + entropy, F_cov


@public(y="(n,) pm1 nonempty", mu="(n,)", Sigma="(n, n) psd")
@njit(cache=True)
def em_ep_eps(y, mu, Sigma):
    """The eps that maximises F for fixed q: the mean q-probability of a wrong sign.

    d/d eps of sum_i P_i log(1 - eps) + (1 - P_i) log eps vanishes at
    eps = (1/n) sum_i (1 - P_i), P_i = Phi(y_i mu_i / sqrt(Sigma_ii)); the
    likelihood term is concave in eps, so that is the maximum.
    """
    n = y.shape[0]
    s = 0.0
    for i in range(n):
        s += std_normal_cdf(-y[i] * mu[i] / math.sqrt(Sigma[i, i]))
    return s / n


@njit(cache=True)
def _em_ep_weights(K, mu, Sigma):
    """F_cov = E_q[log N(f|0, K)] (K&G 56) and the weights Q of eq. 31.

    With alpha = K^-1 mu (K&G 27), 1/2 alpha^T dK alpha - 1/2 tr(K^-1 dK)
    + 1/2 tr(K^-1 dK K^-1 A) = 1/2 sum_ik Q_ik dK_ik for the symmetric
    Q = alpha alpha^T - K^-1 + K^-1 A K^-1. O(n^3) once (a Cholesky, its
    inverse, two products); each hyperparameter then costs O(n^2).
    """
    n = K.shape[0]
    LK = np.linalg.cholesky(K)
    alpha = solve_lower_transpose(LK, solve_lower(LK, mu))    # alpha = C^-1 h  (K&G 27)
    Kinv = cholesky_inverse(LK)
    KiA = Kinv @ Sigma
    tr = 0.0
    for i in range(n):
        tr += KiA[i, i]                                       # tr(C^-1 A)
    F_cov = _F_cov(mu @ alpha, tr, LK)                        # (K&G 56)
    Q = KiA @ Kinv                                            # C^-1 A C^-1
    for i in range(n):
        for k in range(n):
            Q[i, k] += alpha[i] * alpha[k] - Kinv[i, k]
    return F_cov, Q


@njit(cache=True, fastmath={"reassoc", "contract"})
def _half_inner(Q, dK):
    """1/2 sum_ik Q_ik dK_ik, half the Frobenius inner product of Q and dK."""
    s = 0.0
    for i in range(Q.shape[0]):
        for k in range(Q.shape[1]):
            s += Q[i, k] * dK[i, k]
    return 0.5 * s


@njit(cache=True)
def _weighted_kernel_grad(Q, X, kernel, log_hyp, C, discrete):
    """dF/d log_hyp_j = 1/2 sum_ik Q_ik dC_ik / d log_hyp_j for each j (K&G 31). For 'ard' and
    'kg' the inputs' weights w_m are summed in one pass over the pairs (_ard_weight_grad) instead
    of forming each dC (d n x n matrices)."""
    p = log_hyp.shape[0]
    grad = np.empty(p)
    ard = kernel == "ard" or kernel == "kg"
    off = 3 if kernel == "kg" else 2
    for j in range(off if ard else p):
        check_interrupt()
        grad[j] = _half_inner(Q, kernel_grad(kernel, X, log_hyp, C, j, discrete))
    if ard:
        grad[off:] = _ard_weight_grad(Q, X, log_hyp, C, off, discrete)
    return grad


@njit(cache=True, fastmath={"reassoc", "contract"})
def _ard_weight_grad(Q, X, log_hyp, C, off, discrete):
    """1/2 sum_ik Q_ik dC_ik / d log w_m for each input m, 'ard' and 'kg' (log w_m = log_hyp[off + m]):
    with kernel_grad's dC_ik / d log w_m = (C_ik - v1 - t2 delta_ik) (-1/2 w_m d_m(x_i, x_k)), which
    is 0 on the diagonal (d_m(x, x) = 0), the sum over both triangles is
    -1/4 w_m sum_(i > k) (Q_ik + Q_ki) (C_ik - v1) d_m(x_i, x_k): one pass over the pairs, O(n^2 d)."""
    n, d = X.shape
    disc = discrete != 0.0
    any_discrete = disc.any()
    v1 = math.exp(log_hyp[1])
    acc = np.zeros(d)
    for i in range(n):
        check_interrupt()
        for k in range(i):
            e = (Q[i, k] + Q[k, i]) * (C[i, k] - v1)
            if any_discrete:
                for m in range(d):
                    acc[m] += e * _d_m(X[i, m], X[k, m], disc[m])
            else:
                for m in range(d):
                    t = X[i, m] - X[k, m]
                    acc[m] += e * (t * t)
    out = np.empty(d)
    for m in range(d):
        out[m] = -0.25 * math.exp(log_hyp[off + m]) * acc[m]
    return out


@public(K="(n, n) psd", X="(n, d)", kernel="{se,ard,kg,kg_iso}", log_hyp="(p,) loghyp", mu="(n,)",
        Sigma="(n, n) psd", discrete="(d,) flags ?0")
@njit(cache=True)
def em_ep_grad(K, X, kernel, log_hyp, mu, Sigma, discrete=None):
    """M-step of binary EM-EP: F_cov and its gradient in log_hyp, K&G eq. 31.

    Parameters
    ----------
    K : ndarray, shape (n, n)
        C = kernel_matrix(kernel, X, X, log_hyp, discrete) (K&G 13).
    X, kernel, log_hyp, discrete :
        As for kernel_matrix.
    mu, Sigma : ndarray, shapes (n,), (n, n)
        q(f) = N(h, A) from the E-step, held fixed (K&G 27).

    Returns
    -------
    F_cov : float
        E_q[log N(f|0, C)] (K&G 56), the part of F that depends on log_hyp.
    grad : ndarray, shape (p,)
        dF/d log_hyp: 1/2 alpha^T dC alpha - 1/2 tr(C^-1 dC) + 1/2 tr(C^-1 dC C^-1 A)
        (K&G 31), the log chain rule inside dC (kernel_grad).
    """
    F_cov, Q = _em_ep_weights(K, mu, Sigma)
    return F_cov, _weighted_kernel_grad(Q, X, kernel, log_hyp, K, discrete)


# --- multi-class: the difference latents of K&G section 4.2 -------------------


@public(y="(J, n) onehot nonempty")
@njit(cache=True)
def difference_index(y):
    """The class y_i of each case and, for each latent g_i^{y_i,j} in K&G's order (45),
    its case i and its class j. Returns yc (n,), case (n (J-1),), cls (n (J-1),)."""
    J, n = y.shape
    yc = np.empty(n, np.int64)
    for i in range(n):
        for c in range(J):
            if y[c, i] == 1.0:
                yc[i] = c
    N = n * (J - 1)
    case = np.empty(N, np.int64)
    cls = np.empty(N, np.int64)
    a = 0
    for i in range(n):
        for j in range(J):
            if j != yc[i]:                                     # (K&G 45): g_i^{y_i,1}, ..., g_i^{y_i,J}, j != y_i
                case[a] = i
                cls[a] = j
                a += 1
    return yc, case, cls


@njit(cache=True)
def _difference_sign(y_i, y_k, j, l):
    """delta(y_i, y_k) - delta(y_i, l) - delta(y_k, j) + delta(j, l), the factor of (K&G 43)."""
    return int(y_i == y_k) - int(y_i == l) - int(y_k == j) + int(j == l)


@public(C="(n, n) sym", y="(J, n) onehot nonempty")
@njit(cache=True)
def difference_covariance(C, y):
    """Prior covariance of K&G's difference latents g (K&G 41-43), shape (n (J-1), n (J-1)).

    Cov(g_i^{y_i,j}, g_k^{y_k,l}) = (delta(y_i, y_k) - delta(y_i, l) - delta(y_k, j)
    + delta(j, l)) c(x_i, x_k), with C = c(X, X) (n, n) and y one-hot (J, n).
    """
    yc, case, cls = difference_index(y)
    N = case.shape[0]
    Kg = _empty(N, N)
    for a in range(N):
        i = case[a]
        j = cls[a]
        for b in range(N):
            k = case[b]
            l = cls[b]
            Kg[a, b] = _difference_sign(yc[i], yc[k], j, l) * C[i, k]     # (K&G 43)
    return Kg


_MC_REFRESH = 10       # ep_multiclass: Sigma formed afresh from the sites at least every 10th sweep
_MC_LARGE = 1.0        # multiclass_ep_evidence: Sigma checked at convergence after a sweep whose site changes are above 1


@njit(cache=True)
def _ep_multiclass_sweeps(Kg, nu_tilde_init, tau_tilde_init, tol, max_sweeps, lean=False):
    """ep (likelihood 'step', eps 0, natural order) on the N difference latents, with
    Sigma formed afresh only where it is needed and log det B carried along the rank-one
    updates (see ep_multiclass's Notes). Returns ep's tuple.

    lean (for the evidence, multiclass_ep_evidence): at convergence log Z_EP from line 13's L of
    the final sites, with Sigma's diagonal and mu as updated, is returned, without lines 14-15
    (2 N^3, twice a sweep's updates); Sigma is returned empty, (0, 0). Only if a sweep since Sigma
    was last formed afresh changed a site by more than _MC_LARGE (relative; the rank-one updates'
    rounding grows with the changes) are Sigma's diagonal and mu first checked against line 14's
    V of the final sites (N^3), as ep_multiclass checks them always, and the sweeps go on from
    Sigma formed afresh if they drifted."""
    N = Kg.shape[0]
    tau_max = _ep_tau_max(Kg)
    nu_tilde, tau_tilde = nu_tilde_init.copy(), tau_tilde_init.copy()
    if tau_tilde.any() or nu_tilde.any():                     # line 2, warm start: (3.53) for the sites given
        Sigma, mu, L = _ep_posterior(Kg, tau_tilde, nu_tilde)
        log_det_B = 2.0 * half_log_det(L)
    else:                                                     # line 2: Sigma := Kg, mu := 0; B = I
        Sigma, mu, L = _copy(np.ascontiguousarray(Kg)), np.zeros(N), np.empty((0, 0))
        log_det_B = 0.0
    U, c, s_i = np.empty((_EP_BLOCK, N)), np.empty(_EP_BLOCK), np.empty(N)
    log_Z, n_bad = np.nan, 0
    log_Z_old, tested = np.inf, -1                            # log Z_EP of sweep `tested`
    converged, exact, large = False, True, False
    V, mu_e = np.empty((0, 0)), np.empty(0)
    delta, n_skipped, n_sweeps = 0.0, 0, 0
    for n_sweeps in range(1, max_sweeps + 1):
        delta, n_skipped = 0.0, 0
        m = np.int64(0)
        for i in range(N):                                    # Alg. 3.5 lines 4-11 as in ep
            _current_column(Sigma, U, c, m, i, s_i)
            if not (s_i[i] > 0.0 and 1.0 / s_i[i] > tau_tilde[i]):
                n_skipped += s_i[i] != 0.0 or tau_tilde[i] != 0.0
                continue
            tau_cav = 1.0 / s_i[i] - tau_tilde[i]
            nu_cav = mu[i] / s_i[i] - nu_tilde[i]
            tau_new, nu_new = _site_update(1.0, tau_cav, nu_cav, 0.0, 0.0, tau_max)
            d_tau = tau_new - tau_tilde[i]
            tau_tilde[i] = tau_new
            d_nu = nu_new - nu_tilde[i]
            nu_tilde[i] = nu_new
            delta = max(delta, abs(d_tau) / (1.0 + tau_new), abs(d_nu) / (1.0 + abs(nu_new)))
            ci = d_tau / (1.0 + d_tau * s_i[i])
            # det B = det Kg det(Kg^-1 + S~), and tau~_i += d_tau multiplies the second by
            # 1 + d_tau Sigma_ii (the determinant lemma of line 10's rank-one update)
            log_det_B += math.log1p(d_tau * s_i[i])
            m = _rank_one_update(Sigma, U, c, m, s_i, ci)
            mu += (d_nu * (1.0 - ci * s_i[i]) - ci * mu[i]) * s_i
        if m > 0:
            _apply_pending(Sigma, U, c, m)                    # Sigma's lower triangle up to date
        near = delta < math.sqrt(tol)                         # line 16's test of the site changes
        exact = False                                         # Sigma, mu, L, log det B formed afresh from these sites
        large = large or delta > _MC_LARGE                    # lean: check Sigma for drift at convergence
        if n_skipped > 0 or n_sweeps % _MC_REFRESH == 0 or n_sweeps == max_sweeps:
            Sigma, mu, L = _ep_posterior(Kg, tau_tilde, nu_tilde)        # lines 13-15
            log_det_B, exact, large = 2.0 * half_log_det(L), True, False
        # line 17, from Sigma's diagonal, mu and log det B as updated (no line 13 between sweeps)
        log_Z, n_bad = _ep_log_Z_det(np.ones(N), tau_tilde, nu_tilde, Sigma, mu, L, 0.0, 0.0, log_det_B)
        if near and tested == n_sweeps - 1 and abs(log_Z - log_Z_old) < tol:   # line 16
            if exact:
                converged = True
                break
            L = _cholesky(_form_B(Kg, np.sqrt(tau_tilde)))    # line 13 from the final sites
            log_det_B = 2.0 * half_log_det(L)
            if lean and not large:
                converged = True
                break
            # line 14's V = L \ S~^1/2 Kg from these sites: Sigma's diagonal and mu (line 15) against
            # the rank-one updates' (which drift after site changes of 1e2, by 0.4 nats of log Z_EP
            # in a test: then the sweeps' fixed point is not EP's, and they go on from Sigma anew)
            V = solve_lower_matrix(L, _scale_rows(np.sqrt(tau_tilde), Kg))
            mu_e = Kg @ nu_tilde - V.T @ (V @ nu_tilde)
            drift = 0.0
            for a in range(N):
                d = Kg[a, a]
                for b in range(N):
                    d -= V[b, a] * V[b, a]
                if d > 0.0:
                    drift = max(drift, abs(d - Sigma[a, a]) / d, abs(mu_e[a] - mu[a]) / math.sqrt(d))
            if drift < math.sqrt(tol):
                converged = True
                break
            Sigma, mu, exact, large = minus_gram(Kg, V), mu_e, True, False
            tested = -1
            continue
        log_Z_old, tested = log_Z, n_sweeps
    if converged and not exact:
        if not lean:
            # lines 14-15 from the final sites, with line 13's L and line 14's V of the test above
            Sigma, mu = minus_gram(Kg, V), mu_e
        # line 17 with line 13's L of the final sites (lean: Sigma's diagonal and mu as updated)
        log_Z, n_bad = _ep_log_Z_det(np.ones(N), tau_tilde, nu_tilde, Sigma, mu, L, 0.0, 0.0, np.nan)
    elif not (exact or converged):
        Sigma, mu, L = _ep_posterior(Kg, tau_tilde, nu_tilde)         # lines 13-15 from the final sites
        log_Z, n_bad = _ep_log_Z_det(np.ones(N), tau_tilde, nu_tilde, Sigma, mu, L, 0.0, 0.0, np.nan)
    if lean:
        Sigma = np.empty((0, 0))
    return nu_tilde, tau_tilde, log_Z, Sigma, mu, L, n_sweeps, converged, delta, max(n_skipped, n_bad)


@public(returns=EPResult, together=(("nu_tilde_init", "tau_tilde_init"),),
        C="(n, n) psd", y="(J, n) onehot nonempty", nu_tilde_init="(n*(J-1),) ?0",
        tau_tilde_init="(n*(J-1),) nonneg ?0", tol="nonneg", max_sweeps="count")
@njit(cache=True)
def ep_multiclass(C, y, nu_tilde_init=None, tau_tilde_init=None, tol=1e-9, max_sweeps=100):
    """EP for multi-class GPC on K&G's difference latents (K&G eqs. 43, 47-49).

    Parameters
    ----------
    C : ndarray, shape (n, n)
        c(X, X), the covariance of each class's latent function (K&G 13, 38).
    y : ndarray, shape (J, n)
        One-hot targets.
    nu_tilde_init, tau_tilde_init, tol, max_sweeps :
        As for ep, with n (J - 1) sites.

    Returns
    -------
    EPResult of ep on the latents g (K&G 45): sites, log Z_EP, Sigma and mu of
    q(g), L = cholesky(I + S~^1/2 Kg S~^1/2).

    Notes
    -----
    Each t_(i,j)(g) = H(g_i^{y_i,j}) is a step site of label +1 (K&G 49), so
    this is Algorithm 3.5 (ep, likelihood 'step', eps = 0, natural order) on
    Kg = (K&G 43): O((n (J - 1))^3) per sweep, the rank-one updates of line 10
    (N^3 for N = n (J - 1) sites, in blocks as in ep). Departure from ep, for
    speed: lines 13-15 (Sigma and mu formed afresh from the sites, about 2 N^3,
    twice the updates) run only every 10th sweep (_MC_REFRESH, against the
    rounding of the updates: on fgl, 12 sweeps with none left the sites within
    1e-9, relative, of ep's) and after a sweep with a skipped site, not after
    every sweep; log Z_EP (line 17) is computed after every sweep from Sigma's
    diagonal and mu as updated and log det B carried along the updates (each
    tau~_i += d multiplies det B by 1 + d Sigma_ii, the determinant lemma), so
    that line 13's L (N^3 / 3) is formed only once the test below is passed (on
    fgl's ML-II, 34 runs: 33 factorisations for the test instead of 139, with
    the same sweeps, sites and log Z_EP to 5e-12). The convergence test is
    ep's (the largest relative site change < sqrt(tol) and |change of log Z_EP|
    < tol between consecutive sweeps), and Sigma, mu, L
    and log_Z returned are formed from the final sites, as ep returns them; if
    Sigma's diagonal or mu so formed differ from the updated ones by sqrt(tol)
    (relative; the updates' rounding after site changes of 1e2 moved the sweeps'
    fixed point by 9e-4 nats of log Z_EP in a test), the sweeps go on from them. On
    fgl (N = 1,070, GPClassifier's ML-II) the fit took 0.056 s of CPU per sweep
    instead of 0.12 s, with the same sweeps (benchmarks/bench_multiclass_ep.py).

    For J = 2, g_i = y_i (f_i^1 - f_i^2) with
    covariance 2 y_i y_k c(x_i, x_k): the binary model (scaled by sqrt 2). A
    case with c(x_i, x_i) = 0 has f_i^c = 0 for every class: its J classes tie
    and its factor is 1/J (the limit of every class's latent shrinking to 0
    together; Laplace's softmax gives the same), where ep's step sites give
    H(0)^(J-1) = (1/2)^(J-1).
    """
    return _ep_multiclass_run(C, y, nu_tilde_init, tau_tilde_init, tol, max_sweeps, False)


@njit(cache=True)
def _ep_multiclass_run(C, y, nu_tilde_init, tau_tilde_init, tol, max_sweeps, lean):
    """ep_multiclass's body; lean: _ep_multiclass_sweeps's evidence mode (multiclass_ep_evidence)."""
    J = y.shape[0]
    Kg = difference_covariance(C, y)
    N = Kg.shape[0]
    if nu_tilde_init is None:                                 # (the face passes zeros; py_func may get None)
        nu_tilde_init, tau_tilde_init = np.zeros(N), np.zeros(N)
    out = _ep_multiclass_sweeps(Kg, nu_tilde_init, tau_tilde_init, tol, max_sweeps, lean)
    n_tied = (np.diag(C) == 0.0).sum()                        # cases with no prior variance: J-way ties
    log_Z = out[2] + n_tied * ((J - 1) * math.log(2.0) - math.log(J))
    return out[0], out[1], log_Z, out[3], out[4], out[5], out[6], out[7], out[8], out[9]


@njit(cache=True)
def _fold_differences(Qg, y):
    """(n, n) Q with sum_ab Qg_ab dKg_ab = sum_ik Q_ik dC_ik, by (K&G 43):
    Q_ik = sum over the latents a of case i and b of case k of sign(a, b) Qg_ab."""
    yc, case, cls = difference_index(y)
    n = yc.shape[0]
    Q = np.zeros((n, n))
    N = case.shape[0]
    for a in range(N):
        i = case[a]
        j = cls[a]
        for b in range(N):
            k = case[b]
            l = cls[b]
            Q[i, k] += _difference_sign(yc[i], yc[k], j, l) * Qg[a, b]
    return Q


@public(C="(n, n) psd", y="(J, n) onehot nonempty", X="(n, d)", kernel="{se,ard,kg,kg_iso}",
        log_hyp="(p,) loghyp", mu="(N,)", Sigma="(N, N) psd", discrete="(d,) flags ?0")
@njit(cache=True)
def em_ep_grad_multiclass(C, y, X, kernel, log_hyp, mu, Sigma, discrete=None):
    """M-step of multi-class EM-EP: F_cov of q(g) and its gradient in log_hyp (K&G 31, 43).

    C = kernel_matrix(kernel, X, X, log_hyp, discrete); y one-hot (J, n); mu,
    Sigma the E-step's q(g) = N(h, A) on the n (J - 1) difference latents.
    Eq. 31 holds for Kg = (K&G 43); since dKg = sign(a, b) dC_ik, the sums
    over latents fold onto cases (_fold_differences): O((n (J-1))^3) once,
    O(n^2) per hyperparameter.
    """
    F_cov, Qg = _em_ep_weights(difference_covariance(C, y), mu, Sigma)
    return F_cov, _weighted_kernel_grad(_fold_differences(Qg, y), X, kernel, log_hyp, C, discrete)


@njit(cache=True)
def _ep_log_Z_grad_multiclass(C, y, X, kernel, log_hyp, nu_tilde, tau_tilde, L, discrete):
    """d log Z_EP / d log_hyp of multi-class EP (K&G 31 for Kg = K&G 43), as em_ep_grad_multiclass
    at mu = Sigma nu~, Sigma = (Kg^-1 + S~)^-1, from the sites and L = cholesky(B) alone: the weights
    alpha alpha^T - Kg^-1 + Kg^-1 Sigma Kg^-1 of eq. 31 are b b^T - R (Woodbury), with
    R = (Kg + S~^-1)^-1 = S~^1/2 B^-1 S~^1/2 and b = R S~^-1 nu~ (K&R 51-52): one inverse
    from L instead of a factorisation of Kg, its inverse and two products."""
    Kg = difference_covariance(C, y)
    sS = np.sqrt(tau_tilde)
    b = nu_tilde - sS * solve_lower_transpose(L, solve_lower(L, sS * (Kg @ nu_tilde)))
    Q = _mirror_scaled(_potri_lower(L), sS)                   # R
    N = Q.shape[0]
    for a in range(N):
        for e in range(N):
            Q[a, e] = b[a] * b[e] - Q[a, e]
    return _weighted_kernel_grad(_fold_differences(Q, y), X, kernel, log_hyp, C, discrete)


@njit(cache=True)
def _ndtri(p):
    """Phi^-1(p) for 0 < p < 1: Acklam's rational approximation (relative error
    1.2e-9) refined by one Halley step on Phi(x) - p (to rounding level)."""
    x = _ndtri_acklam(p)
    if p <= 0.5:                                              # Halley step on Phi(x) - p,
        e = std_normal_cdf(x) - p
    else:                                                     # from the upper tail above 1/2
        e = (1.0 - p) - 0.5 * math.erfc(x / _SQRT2)
    u = e * math.sqrt(2.0 * math.pi) * math.exp(0.5 * x * x)
    return x - u / (1.0 + 0.5 * x * u)


@njit(cache=True)
def _ndtri_acklam(p):
    """Acklam's rational approximation of Phi^-1(p), 0 < p < 1 (relative error 1.2e-9)."""
    a0, a1, a2 = -3.969683028665376e01, 2.209460984245205e02, -2.759285104469687e02
    a3, a4, a5 = 1.383577518672690e02, -3.066479806614716e01, 2.506628277459239e00
    b0, b1, b2 = -5.447609879822406e01, 1.615858368580409e02, -1.556989798598866e02
    b3, b4 = 6.680131188771972e01, -1.328068155288572e01
    c0, c1, c2 = -7.784894002430293e-03, -3.223964580411365e-01, -2.400758277161838e00
    c3, c4, c5 = -2.549732539343734e00, 4.374664141464968e00, 2.938163982698783e00
    d0, d1, d2, d3 = 7.784695709041462e-03, 3.224671290700398e-01, 2.445134137142996e00, 3.754408661907416e00
    if p < 0.02425:
        q = math.sqrt(-2.0 * math.log(p))
        x = (((((c0 * q + c1) * q + c2) * q + c3) * q + c4) * q + c5) / ((((d0 * q + d1) * q + d2) * q + d3) * q + 1.0)
    elif p <= 1.0 - 0.02425:
        q = p - 0.5
        r = q * q
        x = (((((a0 * r + a1) * r + a2) * r + a3) * r + a4) * r + a5) * q / (
            ((((b0 * r + b1) * r + b2) * r + b3) * r + b4) * r + 1.0)
    else:
        q = math.sqrt(-2.0 * math.log1p(-p))
        x = -(((((c0 * q + c1) * q + c2) * q + c3) * q + c4) * q + c5) / ((((d0 * q + d1) * q + d2) * q + d3) * q + 1.0)
    return x


_SQRT_PRIMES = np.sqrt(np.array([2.0, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41, 43, 47, 53, 59, 61,
                                 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109, 113, 127]))


_GL24_X, _GL24_W = np.polynomial.legendre.leggauss(24)


@njit(cache=True)
def _bivariate_normal_cdf(h, k, rho):
    """Phi_2(h, k; rho) = P(x_1 < h, x_2 < k) for standard normals of correlation |rho| <= 0.925.

    Drezner & Wesolowsky (1990): Phi(h) Phi(k) + 1/(2 pi) int_0^asin(rho)
    exp(-(h^2 + k^2 - 2 h k sin t) / (2 cos^2 t)) dt, a smooth integrand on
    that range, by a 24-point Gauss-Legendre rule.
    """
    top = math.asin(rho)
    s = 0.0
    for q in range(_GL24_X.shape[0]):
        t = 0.5 * top * (_GL24_X[q] + 1.0)
        st = math.sin(t)
        ct2 = 1.0 - st * st
        s += _GL24_W[q] * math.exp(-(h * h + k * k - 2.0 * h * k * st) / (2.0 * ct2))
    return std_normal_cdf(h) * std_normal_cdf(k) + 0.5 * top * s / (2.0 * math.pi)


@njit(cache=True)
def _genz_bretz_order(mean, cov):
    """Genz & Bretz's (2002) variable order for orthant_probability: the variables of
    x ~ N(0, cov), x < mean, reordered so that each next one has the smallest conditional
    probability given the earlier ones at their truncated means, with the Cholesky factor
    built along the way. Returns (mean, L) in the new order."""
    k = mean.shape[0]
    m = mean.copy()
    S = cov.copy()
    L = np.zeros((k, k))
    ybar = np.zeros(k)
    for i in range(k):
        best, best_p = i, np.inf
        for j in range(i, k):
            v, num = S[j, j], m[j]
            for q in range(i):
                v -= L[j, q] * L[j, q]
                num -= L[j, q] * ybar[q]
            pj = std_normal_cdf(num / math.sqrt(v)) if v > 0.0 else (1.0 if num > 0.0 else 0.0)
            if pj < best_p:
                best, best_p = j, pj
        if best != i:                                         # swap variables i and best
            m[i], m[best] = m[best], m[i]
            for q in range(k):
                S[i, q], S[best, q] = S[best, q], S[i, q]
            for q in range(k):
                S[q, i], S[q, best] = S[q, best], S[q, i]
            for q in range(i):
                L[i, q], L[best, q] = L[best, q], L[i, q]
        v, num = S[i, i], m[i]
        for q in range(i):
            v -= L[i, q] * L[i, q]
            num -= L[i, q] * ybar[q]
        if v > 1e-14 * S[i, i] and v > 0.0:
            L[i, i] = math.sqrt(v)
            for j in range(i + 1, k):
                s = S[j, i]
                for q in range(i):
                    s -= L[j, q] * L[i, q]
                L[j, i] = s / L[i, i]
            b = num / L[i, i]                                 # E[y | y < b], y ~ N(0, 1)
            Pb = std_normal_cdf(b)
            ybar[i] = b if Pb < 1e-300 else -math.exp(-0.5 * b * b) / (math.sqrt(2.0 * math.pi) * Pb)
    return m, L


@public(mean="(k,) nonempty", cov="(k, k) psd", n_points="count", n_shifts="count", seed="seed",
        abseps="nonneg")
@njit(cache=True)
def orthant_probability(mean, cov, n_points=4000, n_shifts=8, seed=0, abseps=0.0):
    """P(z > 0 in every coordinate) for z ~ N(mean, cov) of dimension k (K&G eq. 50).

    k = 1: Phi(mean / sd). k = 2 with |correlation| <= 0.925 (J = 3 classes):
    the bivariate normal cdf (_bivariate_normal_cdf), standard error 0.
    Otherwise Genz's (1992) separation of variables with
    cov = L L^T: P = E_w[e_1 e_2(w_1) ... e_k(w_1..w_k-1)], e_i = Phi((mean_i -
    sum_j<i L_ij y_j) / L_ii), y_i = Phi^-1(w_i e_i), integrated over the unit cube
    (k - 1 dimensions) by randomly shifted quasi-Monte Carlo points with the
    baker's transform: s / n_points in the first coordinate (for k = 2, J = 3
    classes, a midpoint rule of error O(n_points^-2)) and s sqrt(prime) in the
    others (Richtmyer), n_shifts seeded shifts. The variables are taken in Genz &
    Bretz's (2002) order (_genz_bretz_order: each next one the least probable given
    the earlier ones at their truncated means), which makes the integrand flatter
    (on fgl's 5-dimensional class probabilities, 128 points per shift now err less
    than 1000 did in the given order), and y_i by Acklam's Phi^-1 (relative error
    1.2e-9) without _ndtri's refinement. abseps > 0: as Genz's MVNDST, the
    points per shift are doubled from 32 until the standard error over the shifts
    is at most abseps or n_points is reached (each pass with new points, the same
    shifts; at most twice the work of the final pass). abseps = 0: n_points per
    shift at once. Returns (P, its standard error over the shifts).
    """
    k = mean.shape[0]
    if k == 1:
        return std_normal_cdf(mean[0] / math.sqrt(cov[0, 0])), 0.0
    if k == 2:
        s1 = math.sqrt(cov[0, 0])
        s2 = math.sqrt(cov[1, 1])
        rho = cov[0, 1] / (s1 * s2)
        if abs(rho) <= 0.925:
            return _bivariate_normal_cdf(mean[0] / s1, mean[1] / s2, rho), 0.0
    if k - 2 > _SQRT_PRIMES.shape[0]:
        raise ValueError("orthant_probability is for dimensions up to 32")
    # P(z > 0) = P(x < mean) with x = mean - z ~ N(0, cov), x = L w, w ~ N(0, I)
    mean, L = _genz_bretz_order(mean, cov)
    n = n_points if abseps <= 0.0 else min(n_points, _ORTHANT_FIRST)
    while True:
        P, se = _orthant_qmc(mean, L, n, n_shifts, seed)
        if n >= n_points or se <= abseps:
            return P, se
        n = min(2 * n, n_points)


_ORTHANT_FIRST = 32    # orthant_probability with abseps > 0: points per shift of the first pass


@njit(cache=True)
def _orthant_qmc(mean, L, n_points, n_shifts, seed):
    """orthant_probability's lattice estimate for mean and L from _genz_bretz_order: (P, se)."""
    k = mean.shape[0]
    np.random.seed(seed)
    yc = np.empty(k)
    est = np.empty(n_shifts)
    for r in range(n_shifts):
        shift = np.random.random(k - 1)
        total = 0.0
        for s in range(n_points):
            if s % 4096 == 0:
                check_interrupt()
            f = 1.0
            for i in range(k):
                t = 0.0
                for j in range(i):
                    t += L[i, j] * yc[j]
                if L[i, i] > 0.0:
                    e = std_normal_cdf((mean[i] - t) / L[i, i])
                else:                                         # degenerate direction: a step
                    e = 1.0 if mean[i] - t > 0.0 else 0.0
                f *= e
                if f == 0.0 or i == k - 1:
                    break
                u = (s / n_points if i == 0 else s * _SQRT_PRIMES[i - 1]) + shift[i]
                u = abs(2.0 * (u - math.floor(u)) - 1.0)      # baker's transform of the lattice point
                w = min(max(u * e, 1e-300), 1.0 - 1e-16)
                yc[i] = _ndtri_acklam(w) if L[i, i] > 0.0 else 0.0   # 1.2e-9: far below the lattice's error
            total += f
        est[r] = total / n_points
    return est.mean(), est.std() / math.sqrt(max(n_shifts - 1, 1))



@njit(cache=True)
def _ep_predict_fold(nu_tilde, tau_tilde, C, y, L):
    """What ep_predict_multiclass needs of the training data, for any test inputs: bc (n, J),
    with f_bar_* = bc^T K_star, and T (J (J + 1) / 2, n, n), with V_*cd = c(x_*, x_*) delta_cd
    - k_*^T T[c (c + 1) / 2 + d] k_* for c >= d (lines 2-3 and the fold of lines 5-6 below; one
    inverse of B, O((n (J-1))^3))."""
    yc, case, cls = difference_index(y)
    J = y.shape[0]
    n = C.shape[0]
    N = case.shape[0]
    Kg = difference_covariance(C, y)
    sS = np.sqrt(tau_tilde)
    if L is None or L.shape[0] == 0:                          # no L given (the face passes it empty)
        L = _cholesky(_form_B(Kg, sS))                        # line 2: L := cholesky(I + S~^1/2 Kg S~^1/2)
    z = sS * solve_lower_transpose(L, solve_lower(L, sS * (Kg @ nu_tilde)))  # line 3
    b = nu_tilde - z                                          # alpha of (K&G 52)
    # Cov(f_*^c, g_a) = s_ac c(x_*, x_i), s_ac = delta(c, y_i) - delta(c, j) for g_a = g_i^{y_i,j}:
    # the sums over latents fold onto cases and classes
    bc = np.zeros((n, J))
    for a in range(N):
        bc[case[a], yc[case[a]]] += b[a]
        bc[case[a], cls[a]] -= b[a]
    # lines 5-6 for all test cases at once: A^T (Kg + S~^-1)^-1 A with R = (Kg + S~^-1)^-1
    # = S~^1/2 B^-1 S~^1/2 (K&R 52), folded to T[c, d, i, k] = sum s_ac R_ab s_bd over the
    # latents a of case i and b of case k
    # latents a of case i and b of case k; T[d, c] = T[c, d]^T, so only c >= d is formed, at
    # T[c (c + 1) / 2 + d] (_fold_add)
    R = _mirror_scaled(_potri_lower(L), sS)
    T = _zeros_blocks(J * (J + 1) // 2, n, n)
    for a in range(N):
        i, yi, j = case[a], yc[case[a]], cls[a]
        for e in range(N):
            k, yk, l = case[e], yc[case[e]], cls[e]
            r = R[a, e]
            _fold_add(T, yi, yk, i, k, r)
            _fold_add(T, yi, l, i, k, -r)
            _fold_add(T, j, yk, i, k, -r)
            _fold_add(T, j, l, i, k, r)
    return bc, T


@njit(cache=True, inline="always")
def _fold_add(T, c, d, i, k, r):
    """T[c, d][i, k] += r in _ep_predict_fold's packed storage of the blocks c >= d (the blocks
    c < d, transposes of those, are not formed)."""
    if c >= d:
        T[c * (c + 1) // 2 + d, i, k] += r


@njit(cache=True)
def _class_orthant(f_bar, V, c, n_points, seed, abseps):
    """p(y_* = c) of K&G 50-51: the orthant probability of the J - 1 differences
    g_*^{c,l} = f_*^c - f_*^l > 0, l != c, for f_* ~ N(f_bar, V). Returns (P, se)."""
    J = f_bar.shape[0]
    D = np.zeros((J - 1, J))
    r = 0
    for l in range(J):
        if l != c:
            D[r, c] = 1.0                                     # g_*^{c,l} = f_*^c - f_*^l
            D[r, l] = -1.0
            r += 1
    return orthant_probability(D @ f_bar, D @ V @ D.T, n_points, 8, seed, abseps)


@njit(cache=True)
def _ep_predict_folded(bc, T, K_star, k_star_star, n_points, seed, abseps):
    """ep_predict_multiclass from _ep_predict_fold's bc and T: (p, f_bar_star, V_star, label, se),
    se (J, m) the standard errors of the estimates over the shifts; for the class of the largest
    mean, 1 - the others, the sum of theirs."""
    J = bc.shape[1]
    m = K_star.shape[1]
    f_bar_star = bc.T @ K_star                                # line 4: f_bar_* := A^T (nu~ - z)  (3.60)
    V_star = np.empty((m, J, J))
    for c in range(J):
        check_interrupt()
        for d in range(c + 1):
            q = (K_star * (T[c * (c + 1) // 2 + d] @ K_star)).sum(axis=0)
            for t in range(m):
                V_star[t, c, d] = -q[t]
                V_star[t, d, c] = -q[t]
    for t in range(m):
        for c in range(J):
            V_star[t, c, c] += k_star_star[t]                 # line 6: V := c(x_*, x_*) I - v^T v  (3.61)
    p = np.empty((J, m))
    se = np.empty((J, m))
    label = np.empty(m, np.int64)
    for t in range(m):
        check_interrupt()
        fb = f_bar_star[:, t].copy()
        big = np.argmax(fb)                                   # the class of the largest mean: by difference
        rest = 0.0
        rest_se = 0.0
        for c in range(J):                                    # line 7: p(y_* = c) (K&G 50-51)
            if c != big:
                p[c, t], se[c, t] = _class_orthant(fb, V_star[t], c, n_points, seed, abseps)
                rest += p[c, t]
                rest_se += se[c, t]
        # the J events partition the space: p of the largest mean's class is 1 - the others
        if rest <= 1.0:
            p[big, t], se[big, t] = 1.0 - rest, rest_se
        else:                                                 # (the others' errors above 1): estimate, divide by the sum
            p[big, t], se[big, t] = _class_orthant(fb, V_star[t], big, n_points, seed, abseps)
            total = rest + p[big, t]
            for c in range(J):
                p[c, t] /= total
        # (K&G 52) for m = the first class: g_*^{1,l} = f_bar_*^1 - f_bar_*^l; then (K&G 54)
        best = 0
        all_positive = True
        lowest = np.inf
        for l in range(1, J):
            g = f_bar_star[0, t] - f_bar_star[l, t]
            if g <= 0.0:
                all_positive = False
            if g < lowest:
                lowest = g
                best = l
        label[t] = 0 if all_positive else best
    return p, f_bar_star, V_star, label, se


@njit(cache=True)
def _ep_predict_multiclass(nu_tilde, tau_tilde, C, y, K_star, k_star_star, L, n_points, seed, abseps):
    """ep_predict_multiclass, also returning the standard errors of p (J, m) over the shifts."""
    bc, T = _ep_predict_fold(nu_tilde, tau_tilde, C, y, L)
    return _ep_predict_folded(bc, T, K_star, k_star_star, n_points, seed, abseps)


@public(nu_tilde="(N,) nonempty", tau_tilde="(N,) nonneg", C="(n, n) psd",
        y="(J, n) onehot", K_star="(n, m)", k_star_star="(m,) nonneg", L="(N, N) chol ?e", n_points="count",
        seed="seed", abseps="nonneg")
@njit(cache=True)
def ep_predict_multiclass(nu_tilde, tau_tilde, C, y, K_star, k_star_star, L=None, n_points=128,
                          seed=0, abseps=1e-5):
    """Predictions of multi-class EP on difference latents (K&G eqs. 50-54; lines as Alg. 3.6).

    Parameters
    ----------
    nu_tilde, tau_tilde : ndarray, shape (n (J-1),)
        Sites from ep_multiclass.
    C : ndarray, shape (n, n)
        c(X, X).
    y : ndarray, shape (J, n)
        One-hot training targets.
    K_star : ndarray, shape (n, m)
        c(X, x_*) for m test inputs.
    k_star_star : ndarray, shape (m,)
        c(x_*, x_*).
    L : ndarray, optional
        cholesky(I + S~^1/2 Kg S~^1/2) from ep_multiclass.
    n_points, seed, abseps :
        The most lattice points per shift (8 seeded shifts), the seed, and the
        standard error at which each class's orthant probability stops
        (orthant_probability: points per shift doubled from 32 until its standard
        error is at most abseps or n_points is reached; abseps = 0: n_points at once).

    Returns
    -------
    p : ndarray, shape (J, m)
        p(y_* = c|x_*), the (J-1)-dimensional orthant probability of
        g_*^{c,l} = f_*^c - f_*^l > 0 for all l != c (K&G 50-51), to a standard
        error of about abseps (see Notes). Each column sums to 1 up to rounding
        (below 1e-12): one class's entry is 1 - the others.
    f_bar_star : ndarray, shape (J, m)
        Predictive means of the J test latents f_*^c.
    V_star : ndarray, shape (m, J, J)
        Their predictive covariance.
    label : ndarray, shape (m,)
        The strict label of K&G eq. 54 (j* = the first class), from the
        g_*^{1,l} of eq. 52.

    Notes
    -----
    The test latents f_*^c are jointly Gaussian with g: Cov(f_*^c, g_k^{y_k,l}) =
    (delta(c, y_k) - delta(c, l)) c(x_*, x_k). With b = (Kg + S~^-1)^-1 mu~ (the
    alpha of K&G 27 and 52), their mean is A^T b and covariance
    c(x_*, x_*) I - A^T (Kg + S~^-1)^-1 A (3.60-3.61 for J outputs); the sums over
    the latents fold onto cases, so lines 5-6 take one inverse of B and J (J + 1) / 2
    products of (n, n) and (n, m) matrices for all test cases, not a solve per case
    (_ep_predict_fold computes the folded matrices once; GPClassifier forms them at
    fit, ep_fold_, for all its predictions). Departures from K&G 50, for speed: the orthant
    probability of each class but one is estimated on its own (orthant_probability,
    8 seeded shifts of lattice points, the variables in Genz & Bretz's order, the
    points per shift doubled from 32 until the standard error is at most abseps, up
    to n_points), and since the J orthant events partition the space, the class of
    the largest predictive mean gets 1 - the sum of the others (the hardest integral
    and the largest error when estimated; its standard error is taken as the sum of
    the others'). So each column of p sums to 1 to rounding (if the others' estimates
    ever summed above 1, that class is estimated too and the J estimates are divided
    by their sum). On fgl's 214 training rows (6 classes) the orthant integrals
    measured about 3x faster than 128 points per shift for every class, with errors
    against a 20,000-point run of at most 3.7e-5, within 2.3 of the standard errors
    stated. (One shared set of points for all classes partitions exactly but
    measured 20-40x less accurate.) Eq. 54 picks the class with the largest f_bar_star.
    """
    out = _ep_predict_multiclass(nu_tilde, tau_tilde, C, y, K_star, k_star_star, L, n_points, seed, abseps)
    return out[0], out[1], out[2], out[3]


# --- EM-EP (Kim & Ghahramani sections 3.3 and 4.2) -------------------------------

EMEPResult = namedtuple(
    "EMEPResult", ["log_hyp", "eps", "log_Z", "F", "F_cov", "eps_history", "result", "n_iter",
                   "converged", "classes"])
# GPClassifier.fit's _FitMonitor while it runs em_ep (None otherwise): monitor(log_hyp, log_Z_EP, k)
# after the E-step that ends round k (k = 0: the E-step at the start). A context variable, so that
# fits in several threads each see their own.
_emep_monitor = contextvars.ContextVar("gpclab_emep_monitor", default=None)


@public(kernel="{se,ard,kg,kg_iso}", X="X", log_hyp0="(p,) loghyp ?", eps0="eps", learn_eps="bool", max_iter="count0",
        tol="nonneg", bounds="(p, 2) bounds ?", m_step_iter="count", accelerate="bool",
        classic_rounds="count0")
def em_ep(X, y, log_hyp0=None, kernel="kg", eps0=0.0, learn_eps=False, max_iter=200, tol=1e-4,
          bounds=None, m_step_iter=5, discrete=None, accelerate=True, classic_rounds=0):
    """EM-EP hyperparameter learning for GPC (Kim & Ghahramani 2006, sections 3.3 and 4.2).

    Parameters
    ----------
    X : array-like, shape (n, d)
    y : array-like, shape (n,)
        Labels of two classes (binary model, K&G 3) or more (K&G 4.2).
    log_hyp0 : array-like, optional
        Starting log-hyperparameters (default_log_hyp: K&G's footnote 11).
    kernel : str
        'kg' (one inverse length-scale per input, K&G's "(m)") or 'kg_iso'
        (one for all, "(s)"); any covariance function of Part I is accepted.
    eps0, learn_eps :
        The labelling noise eps of K&G eq. 10, and whether the M-step updates it
        (em_ep_eps). K&G's experiments hold eps = 0, the default. Multi-class:
        eps = 0 only (the product of step sites, K&G 47).
    max_iter : int
        Largest number of EM rounds (M-steps).
    tol : float
        Convergence, in nats: EM-EP stops when a round changes log Z_EP by
        less (see Convergence below).
    bounds : list of (low, high), optional
        Box bounds in log space for the M-step (default_bounds).
    m_step_iter : int
        Classic M-step: L-BFGS-B iterations on F per M-step, with q held
        fixed (generalised EM).
    discrete : optional
        The discrete inputs (K&G 14): a boolean mask or column indices.
    accelerate : bool
        With eps fixed (learn_eps=False, the default): after classic_rounds
        classic rounds, each M-step is one quasi-Newton step whose curvature
        is carried from round to round (see Notes). False, or learn_eps: every
        M-step is the classic one, m_step_iter L-BFGS-B iterations on F with
        q held fixed, started afresh each round.
    classic_rounds : int
        Classic rounds before the accelerated ones (default 0). The evidence
        has many local maxima over many length-scales, and the path decides
        which one a fit reaches: measured with 10 classic rounds first, UCI
        sonar's 5 folds ended 0.2 nats higher in total, Ionosphere's 2-3 nats
        lower on 4 of 5 folds (at ML-II's maxima with none). From a start far
        from the scale of X (K&G's start on K&G Table 1's inputs in
        (-10, 10)^2, not standardised) the first quasi-Newton steps can land
        on the evidence's plateau (every length-scale near 0); 3 classic
        rounds first avoid that there. GPClassifier starts in X's unit.

    Returns
    -------
    EMEPResult, a namedtuple of
        log_hyp, eps: the learned values; log_Z: log Z_EP after each E-step;
        F, F_cov: the bound F (K&G 29) and its covariance part E_q[log p(f|X)]
        (K&G 56), alternating after each E-step and after each M-step (F is
        -inf for eps = 0, see em_ep_bound); eps_history: eps at each E-step;
        result: the EPResult of the last E-step, at log_hyp; n_iter: M-steps
        taken; converged; classes.

    Notes
    -----
    E-step: ep(..., likelihood='step', eps) (binary) or ep_multiclass,
    warm-started from the previous sites (in the accelerated rounds from no
    sites if the warm start fails, as ml2). By K&G's Theorem 1, with eps fixed the M-step's gradient
    eq. 31 at the E-step's q is the gradient of log Z_EP, and a converged
    EM-EP sits at a stationary point of log Z_EP: the point ML-II on log Z_EP
    finds (ml2(..., method='ep', likelihood='step')).

    Why the classic M-step is slow: F with q held fixed is far more curved
    than log Z_EP along the directions EM-EP must travel (the length-scales),
    so the M-step, however precise, stops a short way along (EM's linear
    convergence: on UCI sonar, 60 inputs, a step along the quasi-Newton
    direction for log Z_EP had to be cut to 1/16-1/64 before F rose), and its
    L-BFGS-B (5 iterations, 7.5 evaluations) started afresh each round,
    without the curvature it had learned. Measured there (one fold, 200
    rounds, not converged): the M-steps took 4.4 s, the E-steps 0.6 s (EP
    was already warm-started: 4-5 sweeps a round). log Z_EP is not noisy (EP
    runs to 1e-9): the rule of a change below tol (1e-4 nats) in one round
    was met late or never because the rounds crept (1e-4 to 7e-4 nats a round
    at the end, 0.17 nats in the last 100 rounds, on that fold).

    Accelerated M-step (accelerate=True, eps fixed, after classic_rounds classic
    rounds): the M-step is a step
    of L-BFGS-B along eq. 31 (K&G's M-step direction) whose curvature pairs
    are gathered across rounds, where the gradient at each E-step is that of
    log Z_EP (Theorem 1); its step length is accepted on the next E-step's
    log Z_EP (the E-step is the line search's evaluation), not on F, whose
    sharper curvature is what made EM slow: F may fall in an M-step while
    log Z_EP rises. This is the quasi-Newton acceleration of EM (Lange 1995;
    Jamshidian & Jennrich 1997); it reaches the same fixed point. The scale
    of K (log t0 of 'kg', 'kg_iso'; log v0 of 'ard', log sf of 'se') is held
    at its start, as in ml2: the step likelihood sees only the sign of f, so
    log Z_EP is flat along it. With learn_eps the eps update maximises F,
    not log Z_EP (K&G 3.4), Theorem 1 does not cover it, and the classic
    M-step is used; EP's E-step need not raise F: with eps learned, EM-EP can
    end below the evidence it passed on the way (see the lecture).

    Convergence: K&G alternate the two steps "until convergence" (section
    3.3) and run EP until all site parameters converge; they give no number.
    Accelerated rounds: L-BFGS-B's own tests, scale-aware: a round that
    raises log Z_EP by less than tol nats at the evidence where they start
    (ftol = tol / max(|log Z_EP|, 1) of that E-step, relative to |log Z_EP|
    from there on), or a projected gradient (eq. 31) below 1e-5 in every
    log-hyperparameter. Classic rounds: the change of log Z_EP between
    E-steps and the rise of F in the M-step both below tol. The old rule
    could not be met because each classic round moved so little, not
    because log Z_EP was noisy: EP runs to 1e-9.

    Measured by benchmarks/bench_emep.py --part speed (GPClassifier's
    defaults, 5-fold CV on UCI sonar and Ionosphere, Pima): see the README's
    performance section.

    Used in: lectures/sec3_06b_em_ep.ipynb.
    """
    from scipy.optimize import minimize

    monitor = _emep_monitor.get()        # GPClassifier.fit's progress, called after each round's E-step

    idx, classes = class_labels(y, "y")
    if idx.shape[0] != X.shape[0]:
        raise ValueError(f"em_ep: X and y must have the same number of samples, got {X.shape[0]} and "
                         f"{idx.shape[0]}")
    d = X.shape[1]
    h = default_log_hyp(kernel, X) if log_hyp0 is None else log_hyp0
    J = classes.shape[0]
    if J > 2 and (eps0 != 0.0 or learn_eps):
        raise ValueError(f"em_ep: y has {J} classes: multi-class EM-EP has eps = 0 (K&G 47); "
                         f"got eps0={eps0}, learn_eps={learn_eps}")
    disc = discrete_flags(discrete, d)
    if bounds is None:
        bounds = np.array(default_bounds(kernel, d), dtype=float)
    if bounds.shape[0] != h.shape[0]:     # (the spec ties bounds to log_hyp0, which may be None)
        raise ValueError(f"em_ep: bounds must have one (low, high) pair per log-hyperparameter "
                         f"({h.shape[0]} for kernel {kernel!r}), got {bounds.shape[0]}")
    lo, hi = bounds[:, 0], bounds[:, 1]
    h = np.clip(h, lo, hi)
    if J == 2:
        y_t = np.where(idx == 1, 1.0, -1.0)
        Y = None
    else:
        Y = one_hot(idx, J)
        y_t = None
    eps = float(eps0)

    def e_step(h, sites):
        """The accelerated rounds' E-step: EP at log_hyp h from the sites given (from none if that
        fails, as ml2). Returns (EPResult, C, K of the latents, the labels of F)."""
        C = kernel_matrix(kernel, X, X, h, disc)
        for nu0, tau0 in ((None, None),) if sites is None else (sites, (None, None)):
            if J == 2:
                res = ep.unchecked(C, y_t, nu0, tau0, likelihood="step", eps=eps)
            else:
                res = ep_multiclass.unchecked(C, Y, nu0, tau0)
            if res.converged and np.isfinite(res.log_Z):
                break                      # a failed warm start is done again from no sites (as ml2)
        if J == 2:
            return res, C, C, y_t
        return res, C, difference_covariance(C, Y), np.ones(res.mu.shape[0])

    def m_grad(C, x, res):
        """The accelerated M-step's gradient: F_cov at log_hyp x with q of res held fixed, eq. 31."""
        if J == 2:
            return em_ep_grad.unchecked(C, X, kernel, x, res.mu, res.Sigma, disc)           # (K&G 56, 31)
        return em_ep_grad_multiclass.unchecked(C, Y, X, kernel, x, res.mu, res.Sigma, disc)

    log_Zs, Fs, F_covs, epss = [], [], [], []
    fast = accelerate and not learn_eps
    limit = min(classic_rounds, max_iter) if fast else max_iter
    sites = None
    converged = False
    res = None
    gain = np.inf
    n_iter = 0
    while True:
        C = kernel_matrix(kernel, X, X, h, disc)
        nu0, tau0 = (None, None) if sites is None else sites
        if J == 2:                                                                 # E-step
            res = ep.unchecked(C, y_t, nu0, tau0, likelihood="step", eps=eps)
            K, y_g = C, y_t
        else:
            res = ep_multiclass.unchecked(C, Y, nu0, tau0)
            K, y_g = difference_covariance(C, Y), np.ones(res.mu.shape[0])
        _warn_not_converged(res, "em_ep")
        sites = (res.nu_tilde, res.tau_tilde)
        mu, Sigma = res.mu, res.Sigma
        log_Zs.append(float(res.log_Z))
        epss.append(eps)
        if monitor is not None:
            monitor(h, log_Zs[-1], n_iter)
        F, F_cov = em_ep_bound.unchecked(K, y_g, eps, mu, Sigma)
        Fs.append(float(F))
        F_covs.append(float(F_cov))
        if n_iter > 0 and abs(log_Zs[-1] - log_Zs[-2]) < tol and gain < tol:
            converged = True
            break
        if n_iter == limit:
            if fast and n_iter < max_iter:                   # the accelerated rounds from here
                return _em_ep_accelerated(h, bounds, kernel, eps, max_iter - n_iter, tol, e_step, m_grad,
                                          classes, minimize, sites, (log_Zs, Fs, F_covs, epss), n_iter,
                                          monitor)
            break

        def neg(x):
            x = np.ascontiguousarray(x)
            Cx = kernel_matrix(kernel, X, X, x, disc)
            try:
                if J == 2:
                    Fc, g = em_ep_grad.unchecked(Cx, X, kernel, x, mu, Sigma, disc)  # (K&G 56, 31)
                else:
                    Fc, g = em_ep_grad_multiclass.unchecked(Cx, Y, X, kernel, x, mu, Sigma, disc)
            except np.linalg.LinAlgError:
                return np.inf, np.zeros_like(x)
            return -Fc, -g

        opt = minimize(neg, h, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": m_step_iter})                           # M-step, covariance
        if -opt.fun >= F_covs[-1]:             # L-BFGS-B returns its last iterate: keep it if F rose
            h = np.asarray(opt.x)
        eps_old = eps
        if learn_eps:
            eps = float(em_ep_eps(y_t, mu, Sigma))                                # M-step, eps
        C = kernel_matrix(kernel, X, X, h, disc)
        K = C if J == 2 else difference_covariance(C, Y)
        F_M, F_cov = em_ep_bound.unchecked(K, y_g, eps, mu, Sigma)
        F_M = float(F_M)
        F_covs.append(float(F_cov))
        # the rise of F in this M-step (of F_cov alone while F is -inf, eps = 0)
        gain = F_M - Fs[-1] if np.isfinite(F_M) and eps_old > 0 else F_covs[-1] - F_covs[-2]
        Fs.append(F_M)
        n_iter += 1
    return EMEPResult(h, eps, np.array(log_Zs), np.array(Fs), np.array(F_covs), np.array(epss), res,
                      n_iter, converged, classes)


def _em_ep_accelerated(h, bounds, kernel, eps, max_iter, tol, e_step, m_grad, classes, minimize, sites,
                       histories, rounds, monitor=None):
    """em_ep's rounds with the accelerated M-step (eps fixed), after `rounds` classic ones whose
    histories and last sites are given: L-BFGS-B on log Z_EP, each of whose evaluations is an
    E-step (warm-started EP) and the M-step's gradient eq. 31 at its q (K&G's Theorem 1: the
    gradient of log Z_EP), its curvature kept across rounds; one round per L-BFGS-B iteration. The
    histories go on with the accepted rounds, as em_ep's; monitor(log_hyp, log_Z_EP, round) after
    each accepted round, as _em_ep's."""
    bounds = np.array(bounds, dtype=float)
    k = 1 if kernel == "se" else 0                 # the scale of K: log Z_EP of the step is flat along it
    bounds[k] = (h[k], h[k])
    state = {"sites": sites, "last": None}

    def evaluate(x):
        x = np.ascontiguousarray(x, dtype=float)
        last = state["last"]
        if last is not None and np.array_equal(last["x"], x):
            return last
        res, C, K, y_g = e_step(x, state["sites"])                               # E-step
        entry = {"x": x.copy(), "res": res, "K": K, "y_g": y_g, "v": -np.inf, "g": np.zeros_like(x)}
        if np.isfinite(res.log_Z):
            state["sites"] = (res.nu_tilde, res.tau_tilde)
            try:
                _, g = m_grad(C, x, res)                                           # (K&G 31)
                entry["v"], entry["g"] = float(res.log_Z), g
            except np.linalg.LinAlgError:
                pass
        state["last"] = entry
        return entry

    def neg(x):
        e = evaluate(x)
        if not np.isfinite(e["v"]):
            return np.inf, np.zeros_like(x)
        return -e["v"], -e["g"]

    log_Zs, Fs, F_covs, epss = histories

    def record_e(e):
        F, F_cov = em_ep_bound.unchecked(e["K"], e["y_g"], eps, e["res"].mu, e["res"].Sigma)
        log_Zs.append(float(e["res"].log_Z))
        Fs.append(float(F))
        F_covs.append(float(F_cov))
        epss.append(eps)

    accepted = evaluate(h)          # the E-step at h again (warm, a sweep or two): its q and eq. 31
    if not log_Zs:
        record_e(accepted)
        if monitor is not None:
            monitor(accepted["x"], accepted["v"], rounds)
    state["accepted"] = accepted
    state["rounds"] = rounds

    def callback(xk):                                   # a round: the M-step's point, then its E-step
        e = evaluate(xk)
        q = state["accepted"]["res"]
        F_M, F_cov_M = em_ep_bound.unchecked(e["K"], e["y_g"], eps, q.mu, q.Sigma)   # F at the new
        Fs.append(float(F_M))                                                        # log_hyp, q held
        F_covs.append(float(F_cov_M))
        record_e(e)
        state["accepted"] = e
        state["rounds"] += 1
        if monitor is not None:
            monitor(e["x"], e["v"], state["rounds"])

    n_iter, converged = 0, False
    if max_iter > 0 and np.any(bounds[:, 0] < bounds[:, 1]):
        ftol = tol / max(abs(accepted["v"]), 1.0) if np.isfinite(accepted["v"]) else tol
        opt = minimize(neg, h, jac=True, method="L-BFGS-B", bounds=bounds, callback=callback,
                       options={"maxiter": max_iter, "ftol": ftol})
        n_iter, converged = int(opt.nit), bool(opt.success)
        h = np.asarray(opt.x, dtype=float)
    elif max_iter > 0:
        converged = True                               # every hyperparameter fixed by its bounds
    final = state["accepted"]
    if not np.array_equal(final["x"], h):             # (L-BFGS-B returns its last accepted round)
        h = final["x"]
    _warn_not_converged(final["res"], "em_ep")
    return EMEPResult(h, eps, np.array(log_Zs), np.array(Fs), np.array(F_covs), np.array(epss),
                      final["res"], rounds + n_iter, converged, classes)


# ############################################################################
# PART II. USING IT: GPClassifier, ML-II, grids, scores, data (no numba)
# ############################################################################

# ============================================================================
# The algorithm boxes beside their code: BOXES, box_labels, show_box
# ============================================================================
#
# The pseudocode of each box, transcribed from GPML chapter 3 and K&R (2005) line by line
# with its line numbers (the book prints them on even lines only), as printed. Per line:
# "errata", where the book is wrong (what it prints, what is right and why, how that was
# checked); "departs", where the code does something else than the line, and why; "moved",
# the lines that the code does elsewhere than the box's order, and why. "helpers" are the
# functions whose own lines carry the box's labels, written "# 3.4 line 19: ...".
# tests/test_boxes.py checks that every line has exactly one labelled code line in the box's
# function, in the book's order (but for "moved"), and that each label sits on a statement
# that does what the line says; tests/test_transcriptions.py runs each box, transcribed as
# printed (errata corrected), beside its function.

BOXES = {
    "3.1": {
        "title": "Mode-finding for binary Laplace GPC",
        "source": "GPML Algorithm 3.1",
        "function": "laplace_mode",
        "lines": (
            (1, "input: K (covariance matrix), y (±1 targets), p(y|f) (likelihood function)"),
            (2, "f := 0                                  initialization"),
            (3, "repeat                                  Newton iteration"),
            (4, "  W := −∇∇ log p(y|f)                   eval. W e.g. using eq. (3.15) or (3.16)"),
            (5, "  L := cholesky(I + W^½ K W^½)          B = I + W^½ K W^½"),
            (6, "  b := W f + ∇ log p(y|f)               eq. (3.18) using eq. (3.27)"),
            (7, "  a := b − W^½ L^T\\(L\\(W^½ K b))"),
            (8, "  f := K a"),
            (9, "until convergence                       objective: −½ a^T f + log p(y|f)"),
            (10, "log q(y|X, θ) := −½ a^T f + log p(y|f) − ∑_i log L_ii  eq. (3.32)"),
            (11, "return: f̂ := f (post. mode), log q(y|X, θ) (approx. log marg. likelihood)"),
        ),
        "moved": {
            9: "tested right after lines 4-5, so that the W and L returned belong to f̂ itself",
            10: "log q at each f, after line 5: line 9 asks it to settle as well as Ψ",
        },
        "errata": {},
        "departs": {
            2: "starts from a_init (zeros when left out) if that beats f = 0: the mode at nearby "
               "hyperparameters saves most Newton steps during ML-II",
            8: "the step to f := K a is halved while it lowers the objective (_step_search): far from "
               "the mode a full Newton step can overshoot; near it the full step is always taken",
            9: "converged only after a full step that changed Ψ and log q by less than "
               "tol (1 + |Ψ| + |log q|): at a large signal variance Ψ is flat while f still moves",
        },
        "helpers": (),
    },
    "3.2": {
        "title": "Predictions for binary Laplace GPC",
        "source": "GPML Algorithm 3.2",
        "function": "laplace_predict",
        "lines": (
            (1, "input: f̂ (mode), X (inputs), y (±1 targets), k (covariance function), p(y|f) (likelihood function), x∗ test input"),
            (2, "W := −∇∇ log p(y|f̂)"),
            (3, "L := cholesky(I + W^½ K W^½)            B = I + W^½ K W^½"),
            (4, "f̄∗ := k(x∗)^T ∇ log p(y|f̂)              eq. (3.21)"),
            (5, "v := L\\(W^½ k(x∗))                      eq. (3.24) using eq. (3.29)"),
            (6, "V[f∗] := k(x∗, x∗) − v^T v"),
            (7, "π̄∗ := ∫ σ(z) N(z|f̄∗, V[f∗]) dz          eq. (3.25)"),
            (8, "return: π̄∗ (predictive class probability (for class 1))"),
        ),
        "errata": {},
        "departs": {
            3: "skipped when laplace_mode's L is passed (the caption: L can be re-used)",
            4: "lines 4-7 run for all m test inputs at once, K_star holding one column per test input",
            7: "probit: Φ(f̄∗/√(1 + V[f∗])) (3.82); logistic: a 64-point quadrature "
               "(logistic_gaussian_integral); rule='map' or 'mackay' give the other rules of section 3.4.2",
        },
        "helpers": (),
    },
    "3.3": {
        "title": "Mode-finding for multi-class Laplace GPC",
        "source": "GPML Algorithm 3.3",
        "function": "laplace_mode_multiclass",
        "lines": (
            (1, "input: K (covariance matrix), y (0/1 targets)"),
            (2, "f := 0                                  initialization"),
            (3, "repeat                                  Newton iteration"),
            (4, "  compute π and Π from f with eq. (3.34) and defn. of Π under eq. (3.38)"),
            (5, "  for c := 1 . . . C do"),
            (6, "    L := cholesky(I_n + D_c^½ K_c D_c^½)"),
            (7, "    E_c := D_c^½ L^T\\(L\\D_c^½)          E is block diag. D^½ (I_Cn + D^½ K D^½)^−1 D^½"),
            (8, "    z_c := ∑_i log L_ii                 compute ½ log determinant"),
            (9, "  end for"),
            (10, "  M := cholesky(∑_c E_c)"),
            (11, "  b := (D − Π Π^T) f + y − π            b = W f + y − π from eq. (3.39)"),
            (12, "  c := E K b                            eq. (3.39) using eq. (3.45) and (3.47)"),
            (13, "  a := b − c + E R M^T\\(M\\(R^T c))"),
            (14, "  f := K a"),
            (15, "until convergence                       objective: −½ a^T f + y^T f + ∑_i log(∑_c exp(f_c^i))"),
            (16, "log q(y|X, θ) := −½ a^T f + y^T f + ∑_i log(∑_c exp(f_c^i)) − ∑_c z_c  eq. (3.44)"),
            (17, "return: f̂ := f (post. mode), log q(y|X, θ) (approx. log marg. likelihood)"),
        ),
        "moved": {
            15: "tested right after lines 4-10, so that the E and M returned belong to f̂ itself",
        },
        "errata": {
            15: {"printed": "objective: −½ a^T f + y^T f + ∑_i log(∑_c exp(f_c^i))",
                 "right": "objective: −½ a^T f + y^T f − ∑_i log(∑_c exp(f_c^i))",
                 "why": "log p(y|f) = y^T f − ∑_i log ∑_c exp f_c^i (3.35); with + the objective "
                        "grows without bound in f, and lines 11-14 do not find its maximum",
                 "checked": "tests/test_transcriptions.py: where the transcribed box converges, the "
                            "gradient of the corrected objective, −a + y − π, is 0 to 1e-10; that of "
                            "the printed one is 2π"},
            16: {"printed": "log q := −½ a^T f + y^T f + ∑_i log(∑_c exp(f_c^i)) − ∑_c z_c",
                 "right": "log q := −½ a^T f + y^T f − ∑_i log(∑_c exp(f_c^i)) − ∑_c z_c − ∑_i log M_ii",
                 "why": "the sign as in line 15, and ½ log|I_Cn + W^½ K W^½| = ∑_c z_c + ∑_i log M_ii "
                        "by (3.46)-(3.47) and the determinant lemma",
                 "checked": "tests/test_transcriptions.py, n = 40, C = 4: as printed log q = +92.41, "
                            "corrected −46.736, equal to (3.44) with full Cn × Cn matrices to 1e-10"},
        },
        "departs": {
            2: "starts from a_init if that beats f = 0, as Algorithm 3.1's line 2",
            7: "E_c = D_c^½ B_c^−1 D_c^½ with B_c^−1 from L by one LAPACK call (dpotri) instead of "
               "two triangular solves with n columns, scaled by D_c^½ on both sides as its triangle is "
               "mirrored (_scaled_inverse_in_place), in place: L already lives in E_c's memory; "
               "the same matrix",
            8: "z_c is taken from L before line 7, which forms E_c in L's memory (no n × n copy)",
            14: "the step is halved while it lowers the objective, as Algorithm 3.1's line 8",
            15: "converged only after a full Newton step that raised the objective by less than tol, "
                "as Algorithm 3.1's line 9",
        },
        "helpers": ("_multiclass_E_M",),
    },
    "3.4": {
        "title": "Predictions for multi-class Laplace GPC",
        "source": "GPML Algorithm 3.4",
        "function": "laplace_predict_multiclass",
        "lines": (
            (1, "input: K (covariance matrix), f̂ (posterior mode), x∗ (test input)"),
            (2, "compute π and Π from f̂ using eq. (3.34) and defn. of Π under eq. (3.38)"),
            (3, "for c := 1 . . . C do"),
            (4, "  L := cholesky(I_n + D_c^½ K_c D_c^½)"),
            (5, "  E_c := D_c^½ L^T\\(L\\D_c^½)            E is block diag. D^½ (I_Cn + D^½ K D^½)^−1 D^½"),
            (6, "end for"),
            (7, "M := cholesky(∑_c E_c)"),
            (8, "for c := 1 . . . C do"),
            (9, "  μ_∗^c := (y^c − π^c)^T k_∗^c          latent test mean from eq. (3.41)"),
            (10, "  b := E_c k_∗^c"),
            (11, "  c := E_c (R (M^T\\(M\\(R^T b))))"),
            (12, "  for c′ := 1 . . . C do                latent test covariance from eq. (3.43)"),
            (13, "    Σ_cc′ := c^T k_∗^c′"),
            (14, "  end for"),
            (15, "  Σ_cc := Σ_cc + k_c(x∗, x∗) − b^T k_∗^c"),
            (16, "end for"),
            (17, "π∗ := 0                                 initialize Monte Carlo loop to estimate"),
            (18, "for i := 1 : S do                       predictive class probabilities using S samples"),
            (19, "  f∗ ∼ N(μ∗, Σ)                         sample latent values from joint Gaussian posterior"),
            (20, "  π∗ := π∗ + exp(f_∗^c)/∑_c′ exp(f_∗^c′)  accumulate probability eq. (3.34)"),
            (21, "end for"),
            (22, "π̄∗ := π∗/S                              normalize MC estimate of prediction vector"),
            (23, "return: E_q(f)[π(f(x∗))|x∗, X, y] := π̄∗ (predicted class probability vector)"),
        ),
        "errata": {},
        "departs": {
            3: "lines 3-7 are skipped when laplace_mode_multiclass's E and M are passed",
            5: "E_c from B_c^−1 by one LAPACK call, as Algorithm 3.3's line 7",
            8: "lines 8-16 run for all m test inputs at once, so that E_c and M are applied to m "
               "columns together (_M_solves, _cross_dots)",
            11: "c is kept as M\\b: then Σ_cc′ = c^T k_∗^c′ = (M\\b_c)^T (M\\b_c′), one triangular "
                "solve per class; with one k_∗ for all classes M\\b_c = (M\\E_c) k_∗",
            19: "f∗ in antithetic pairs μ∗ ± L z (L L^T = Σ), both N(μ∗, Σ), the same S/2 vectors z "
                "for every test input: half the work at the same S (_antithetic_average)",
        },
        "helpers": ("_multiclass_E_M", "_M_solves", "_cross_dots", "_antithetic_average"),
    },
    "3.5": {
        "title": "Expectation Propagation for binary classification",
        "source": "GPML Algorithm 3.5",
        "function": "ep",
        "lines": (
            (1, "input: K (covariance matrix), y (±1 targets)"),
            (2, "ν̃ := 0, τ̃ := 0, Σ := K, μ := 0          initialization and eq. (3.53)"),
            (3, "repeat"),
            (4, "  for i := 1 to n do"),
            (5, "    τ_−i := σ_i^−2 − τ̃_i                compute approximate cavity parameters ν_−i and τ_−i using eq. (3.56)"),
            (6, "    ν_−i := σ_i^−2 μ_i − ν̃_i"),
            (7, "    compute the marginal moments μ̂_i and σ̂_i^2 using eq. (3.58)"),
            (8, "    Δτ̃ := σ̂_i^−2 − τ_−i − τ̃_i and τ̃_i := τ̃_i + Δτ̃  update site parameters τ̃_i and ν̃_i using eq. (3.59)"),
            (9, "    ν̃_i := σ̂_i^−2 μ̂_i − ν_−i"),
            (10, "    Σ := Σ − ((Δτ̃)^−1 + Σ_ii)^−1 s_i s_i^T  update Σ and μ by eq. (3.70) and eq. (3.53). s_i is column i of Σ"),
            (11, "    μ := Σ ν̃"),
            (12, "  end for"),
            (13, "  L := cholesky(I_n + S̃^½ K S̃^½)        re-compute the approximate posterior parameters Σ and μ using eq. (3.53) and eq. (3.68)"),
            (14, "  V := L^T\\S̃^½ K"),
            (15, "  Σ := K − V^T V and μ := Σ ν̃"),
            (16, "until convergence"),
            (17, "compute log Z_EP using eq. (3.65), (3.73) and (3.74) and the existing L"),
            (18, "return: ν̃, τ̃ (natural site param.), log Z_EP (approx. log marg. likelihood)"),
        ),
        "errata": {
            14: {"printed": "V := L^T\\S̃^½ K",
                 "right": "V := L\\S̃^½ K",
                 "why": "Σ = K − K S̃^½ B^−1 S̃^½ K (3.68) = K − V^T V needs V = L^−1 S̃^½ K",
                 "checked": "tests/test_transcriptions.py, n = 60: after one sweep the printed line "
                            "leaves Σ off (3.53) by 13.4, the corrected one by 1.7e-15"},
        },
        "departs": {
            2: "warm start: from the sites given, with Σ and μ of (3.53) for them (_ep_init)",
            5: "a site with no cavity precision > 0 in floating point is skipped and counted (n_skipped)",
            7: "μ̂_i and σ̂_i^2 (3.58) are not formed: _site_update computes the new τ̃_i, ν̃_i of "
               "lines 8-9 directly from the derivatives of log Ẑ_i (r = N(z)/Φ(z) and z + r), because "
               "σ̂_i^−2 − τ_−i loses every digit for a well-classified site; τ̃_i is kept in "
               "[0, τ_max]. likelihood='step' uses K&G's site (K&G 20-21)",
            10: "the rank-one updates wait in U, c (m of them) and are applied together every 48 sites "
                "(_EP_BLOCK) as BLAS products (_rank_one_update), to Σ's lower triangle in strips of 192 "
                "rows (the upper triangle inside each strip's diagonal block gets them too; the rest of it "
                "is filled at lines 13-15); s_i is read through the pending ones. So while "
                "stepping through ep.py_func, Σ holds the state of the last applied block (lower triangle "
                "only; with n < 48, K for the whole first sweep), while s_i (column i) and μ are exact. "
                "gpclab._EP_BLOCK = 1 before calling ep.py_func makes Σ's lower triangle follow every site "
                "(the compiled ep keeps 48)",
            11: "μ := Σ ν̃ in O(n) by the rank-one identity μ + s_i (Δν̃ (1 − c Σ_ii) − c μ_i), "
                "c = ((Δτ̃)^−1 + Σ_ii)^−1, instead of an n × n product",
            16: "converged when log Z_EP changed by less than tol and no site by more than √tol "
                "(relative) over the sweep",
        },
        "moved": {
            17: "computed after each sweep's lines 13-15, for line 16's test (and the last one returned)",
        },
        "helpers": ("_site_update", "_ep_posterior"),
    },
    "3.6": {
        "title": "Predictions for expectation propagation",
        "source": "GPML Algorithm 3.6",
        "function": "ep_predict",
        "lines": (
            (1, "input: ν̃, τ̃ (natural site param.), X (inputs), y (±1 targets), k (covariance function), x∗ test input"),
            (2, "L := cholesky(I_n + S̃^½ K S̃^½)          B = I_n + S̃^½ K S̃^½"),
            (3, "z := S̃^½ L^T\\(L\\(S̃^½ K ν̃))              eq. (3.60) using eq. (3.71)"),
            (4, "f̄∗ := k(x∗)^T (ν̃ − z)"),
            (5, "v := L\\(S̃^½ k(x∗))                      eq. (3.61) using eq. (3.72)"),
            (6, "V[f∗] := k(x∗, x∗) − v^T v"),
            (7, "π̄∗ := Φ(f̄∗/√(1 + V[f∗]))                eq. (3.63)"),
            (8, "return: π̄∗ (predictive class probability (for class 1))"),
        ),
        "errata": {},
        "departs": {
            2: "skipped when ep's L is passed (as the caption suggests)",
            4: "lines 4-7 run for all m test inputs at once",
            7: "likelihood='step': ε + (1 − 2ε) Φ(f̄∗/√V[f∗]) (K&G 25-26), the latent noise being "
               "inside k(x∗, x∗)",
        },
        "helpers": (),
    },
    "AIS": {
        "title": "Annealed Importance Sampling",
        "source": "Kuss & Rasmussen (2005), Algorithm 3",
        "function": "ais",
        "lines": (
            (1, "Given: Temperature schedule τ"),
            (2, "for r = 1, . . . , R do"),
            (3, "  Sample f_0 from the prior N(f|0, K)"),
            (4, "  for t = 1, . . . , T do"),
            (5, "    Sample f_t from q(f|D, τ(t), θ) by HMC"),
            (6, "    Compute ln(Z_t/Z_{t−1}) using (31)"),
            (7, "  end for"),
            (8, "  Compute Z_r using (32)"),
            (9, "end for"),
            (10, "Return ln Z = ln((1/R) ∑_{r=1}^R Z_r)"),
        ),
        "errata": {
            6: {"printed": "ln(Z_t/Z_{t−1}) ≃ (τ(t) − τ(t−1)) ln p(y|f_t) (31), f_t the sample of line 5",
                "right": "ln(Z_t/Z_{t−1}) ≃ (τ(t) − τ(t−1)) ln p(y|f_{t−1}), before line 5's step",
                "why": "(30a) is an expectation under q(f|D, θ, τ(t−1)), the state before the "
                       "transition at τ(t) (Neal 2001); at f_t the estimate is biased by O(1/T)",
                "checked": "tests/test_transcriptions.py::test_ais_line_6_erratum_against_the_exact_"
                           "evidence: probit, n = 8, R = 20000 runs, ln Z − exact ln Z "
                           "(exact_log_evidence_probit): at f_t, as printed, +0.996 (T = 4) and +0.304 "
                           "(T = 16), over 10 standard errors; at f_{t−1}, corrected, +0.002 (T = 4, "
                           "standard error 0.009) and +0.000 (T = 16, standard error 0.004)"},
        },
        "departs": {
            2: "the loops are nested the other way: the temperatures (line 4) run outside the runs, "
               "in blocks of 32, each block for all R runs in parallel (_ais_block); run r's random "
               "numbers depend only on (seed, r, t), so the numbers are those of the box's order",
            3: "f_0 = L g with g ∼ N(0, I), L = cholesky(K + 1e-8 max_i K_ii I) (the module's jitter)",
            5: "one HMC transition per temperature on whitened latents g = L^−1 f, its step and "
               "leapfrog count from K (hmc_step_size) unless given",
            10: "also returns each run's ln Z_r, the standard error, the acceptance rate and the "
                "effective number of runs",
        },
        "helpers": ("_ais_block", "_ais_temperatures", "_ais_run"),
    },
}

_LABEL = re.compile(r"#\s*lines?\s+(\d+)(?:\s*-\s*(\d+))?\s*(?::\s*(.*))?$")
_PART_LABEL = re.compile(r"#\s*for\s+lines?\s+(\d+)(?:\s*-\s*(\d+))?\s*(?::\s*(.*))?$")
_HELPER_LABEL = re.compile(r"#\s*(?:for\s+)?((?:(?:3\.\d|AIS)\s+lines?\s+\d+(?:\s*-\s*\d+)?\s*,\s*)*"
                           r"(?:3\.\d|AIS)\s+lines?\s+\d+(?:\s*-\s*\d+)?)\s*(?::\s*(.*))?$")


def _box(name):
    key = str(name).replace("Algorithm", "").replace("Alg.", "").strip()
    if key.lower() in ("ais", "k&r 3", "kr3"):
        key = "AIS"
    if key not in BOXES:
        raise ValueError(f"show_box: no box {_brief(name)}; choose one of {', '.join(map(repr, BOXES))}")
    return key, BOXES[key]


def _labelled_statements(fn, match):
    """(label match, statement) for each code line of fn whose trailing comment `match` accepts;
    the statement is its code from its first physical line to the labelled one."""
    import io
    import tokenize
    source = inspect.getsource(getattr(fn, "py_func", fn))
    lines = source.splitlines()
    start = {}                                   # physical line -> first line of its statement
    first_line = None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type in (tokenize.NL, tokenize.COMMENT, tokenize.INDENT, tokenize.DEDENT):
            continue
        if first_line is None:
            first_line = tok.start[0]
        for k in range(tok.start[0], tok.end[0] + 1):
            start.setdefault(k, first_line)
        if tok.type == tokenize.NEWLINE:
            first_line = None
    out = []
    for k, line in enumerate(lines, 1):
        code, hash_, comment = line.partition("#")
        found = match(hash_ + comment) if code.strip() else None
        if found:
            out.append((found, " ".join(l.partition("#")[0].strip() for l in lines[start.get(k, k) - 1:k])))
    return out


def box_labels(name):
    """The labelled code lines of a box's function: a list of (first, last, code, label text),
    in the order of the source, for each trailing comment `# line N: ...` or `# lines N-M: ...`."""
    _, box = _box(name)
    return [(int(m.group(1)), int(m.group(2) or m.group(1)), code, (m.group(3) or "").strip())
            for m, code in _labelled_statements(globals()[box["function"]], _LABEL.match)]


def box_parts(name):
    """The code lines of a box's function that compute a part of a box line, labelled
    `# for line N: ...` (e.g. ci of line 10 in ep): (first, last, code, label text) in the
    order of the source. show_box shows them under line N, with the line's own label."""
    _, box = _box(name)
    return [(int(m.group(1)), int(m.group(2) or m.group(1)), code, (m.group(3) or "").strip())
            for m, code in _labelled_statements(globals()[box["function"]], _PART_LABEL.match)]


def helper_labels(name):
    """The labelled code lines of a box's helpers (BOXES[name]["helpers"]): a list of
    (first, last, code, label text, helper), for each trailing comment naming the box, as
    `# 3.4 line 19: ...` or `# 3.3 line 6, 3.4 line 4: ...`, or a part of a line, as
    `# for 3.5 line 7: ...`."""
    key, box = _box(name)
    out = []
    for helper in box.get("helpers", ()):
        for m, code in _labelled_statements(globals()[helper], _HELPER_LABEL.match):
            for part in m.group(1).split(","):
                which, _, numbers = part.strip().partition(" ")
                if which == key:
                    first, _, last = numbers.split(None, 1)[1].replace(" ", "").partition("-")
                    out.append((int(first), int(last or first), code, (m.group(2) or "").strip(), helper))
    return out


def _display_width(text):
    """Columns that text takes on a terminal: combining marks (the hat of f̂, the tilde of τ̃) none,
    wide characters two."""
    import unicodedata
    return sum(0 if unicodedata.combining(ch) else 2 if unicodedata.east_asian_width(ch) in "WF" else 1
               for ch in text)


def _wrap(prefix, text, width, indent):
    """prefix + text in lines of at most `width` display columns (a longer word stays whole),
    the continuation lines starting with `indent`."""
    lines, line, fresh = [], prefix, True
    for word in text.split():
        trial = line + word if fresh else f"{line} {word}"
        if not fresh and _display_width(trial) > width:
            lines.append(line)
            line, fresh = indent + word, False
        else:
            line, fresh = trial, False
    return lines + [line]


class _BoxView:
    """A box beside its code: printed as text, shown as a table in a notebook. Each row is a
    line of the box (its number, marked "!" where the book has an erratum; the line as printed,
    its side comment, the correction) and beside it the code that carries its label, the helpers'
    labelled lines, and the notes: erratum, departure, out of the box's order."""

    LEFT = 56                                    # display columns of the box's column, at most
    WIDTH = 100                                  # of the whole, when the terminal's is not known

    def __init__(self, key, box):
        self.key, self.box = key, box
        labels = box_labels(key)
        fn = globals()[box["function"]]
        own = [(int(m.group(1)), c) for m, c in               # labels and parts, in the source's order
               _labelled_statements(fn, lambda text: _LABEL.match(text) or _PART_LABEL.match(text))]
        helpers = helper_labels(key)
        self.rows = []
        for number, text in box["lines"]:
            indent = text[:len(text) - len(text.lstrip())]
            statement, *comment = re.split(r"\s{2,}", text.strip(), maxsplit=1)
            erratum = box.get("errata", {}).get(number)
            code = [c for first, c in own if first == number]
            inside = [first for first, last, c, _ in labels if first < number <= last]
            code += [f"{h}: {c}" for first, last, c, _, h in helpers if first <= number <= last]
            if not code and inside:
                code = [f"(in the call at line {inside[0]})"]
            notes = []
            if erratum:
                notes.append(("erratum", f"the book prints {erratum['printed']}; {erratum['why']}. "
                                         f"Checked: {erratum['checked']}"))
            if number in box.get("departs", {}):
                notes.append(("departs", box["departs"][number]))
            if number in box.get("moved", {}):
                notes.append(("out of the box's order", box["moved"][number]))
            self.rows.append({"number": number, "statement": indent + statement,
                              "comment": comment[0] if comment else "",
                              "right": erratum["right"] if erratum else "", "code": code, "notes": notes})

    def _header(self):
        helpers = ", ".join(self.box.get("helpers", ()))
        return (f"{self.box['source']}: {self.box['title']}  ->  gpclab.{self.box['function']}"
                + (f" (helpers: {helpers})" if helpers else ""))

    def _left(self, row):
        """The box's column of a row: its lines, wrapped to LEFT columns."""
        statement = row["statement"]
        indent = statement[:len(statement) - len(statement.lstrip())]
        head = f"{row['number']:>3}{'!' if row['right'] else ' '} {indent}"
        out = _wrap(head, statement, self.LEFT, " " * (len(head) + 4))
        if row["comment"]:
            out += _wrap(" " * len(head) + "[", row["comment"] + "]", self.LEFT, " " * (len(head) + 1))
        if row["right"]:
            out += _wrap(" " * len(head) + "correct: ", row["right"], self.LEFT, " " * (len(head) + 4))
        return out

    def _right(self, row):
        """The code's column of a row: the code lines and the notes wrapped to RIGHT columns,
        a wrapped line's continuation indented."""
        out = []
        for code in row["code"]:
            out += _wrap("", code, self.RIGHT, "    ")
        for kind, text in row["notes"]:
            out += _wrap(f"  {kind}: ", text, self.RIGHT, "    ")
        return out

    def _widths(self):
        """(LEFT, RIGHT): the columns' widths for the terminal's width (shutil.get_terminal_size,
        WIDTH when it is not known): the box's column 45 % of it, at most LEFT = 56."""
        import shutil
        total = shutil.get_terminal_size((self.WIDTH, 24)).columns
        left = min(type(self).LEFT, max(28, (total - 3) * 9 // 20))
        return left, max(total - left - 3, 24)

    def __str__(self):
        self.LEFT, self.RIGHT = self._widths()
        head = _wrap("", self._header(), self.LEFT + 3 + self.RIGHT, "    ")
        out = head + ["=" * min(max(map(_display_width, head)), self.LEFT + 3 + self.RIGHT),
                      f"{'the box (! marks an erratum)':<{self.LEFT}} | gpclab.{self.box['function']}",
                      "-" * self.LEFT + "-+-" + "-" * self.RIGHT]
        for row in self.rows:
            left, right = self._left(row), self._right(row)
            for k in range(max(len(left), len(right))):
                cell = left[k] if k < len(left) else ""
                pad = " " * max(self.LEFT - _display_width(cell), 0)
                text = f"{cell}{pad} | {right[k] if k < len(right) else ''}"
                out.append(text.rstrip())
        return "\n".join(out)

    __repr__ = __str__

    def _repr_html_(self):
        """The same as a two-column table. Each line of a cell wraps under its own indent (a
        hanging indent in ch), in a monospace font that has the combining tilde and hat."""
        import html
        font = "font-family:'DejaVu Sans Mono','Menlo','Consolas','Liberation Mono',monospace"
        cell = f'style="text-align:left; vertical-align:top; {font}; white-space:pre-wrap"'
        left_cell = f'style="text-align:left; vertical-align:top; {font}; white-space:pre-wrap; min-width:48ch"'

        def line(text, hang, tag=None):
            body = _html_accents(html.escape(text))
            if tag:
                body = f"<{tag}>{body}</{tag}>"
            return f'<div style="padding-left:{hang}ch; text-indent:-{hang}ch">{body}</div>'
        rows = [f"<tr><th {cell} colspan=\"2\">{html.escape(self._header())}</th></tr>"]
        for row in self.rows:
            statement = row["statement"]
            indent = len(statement) - len(statement.lstrip())
            left = line(f"{row['number']:>3}{'!' if row['right'] else ' '} {statement}", 5 + indent + 4)
            if row["comment"]:
                left += line(f"     [{row['comment']}]", 6, "small")
            if row["right"]:
                left += line(f"     correct: {row['right']}", 14, "b")
            right = "".join(line(c, 4) for c in row["code"])
            right += "".join(line(f"{kind}: {text}", 4, "i") for kind, text in row["notes"])
            rows.append(f"<tr><td {left_cell}>{left}</td><td {cell}>{right}</td></tr>")
        return '<table style="width:100%">' + "".join(rows) + "</table>"


def _html_accents(text):
    """Letters with a combining hat, tilde or bar (f̂, τ̃, π̄; there are no precomposed forms) set in
    a font that puts the mark over the letter: DejaVu Sans Mono, the table's font, sets the marks
    of Greek letters beside them; Liberation Mono and DejaVu Sans place them."""
    return re.sub("(.[\u0302\u0303\u0304]+)", "<span style=\"font-family:'Liberation Mono','DejaVu Sans',"
                  "'Segoe UI','Helvetica Neue',sans-serif\">\\1</span>", text)


def show_box(name):
    """An algorithm box beside the code lines that carry its line labels, with the book's errata
    and the code's departures from the box beside the lines they concern.

    name: "3.1" ... "3.6" (GPML Algorithms 3.1-3.6) or "AIS" (Kuss & Rasmussen's Algorithm 3).
    In a notebook the result shows as a two-column table; print() gives the same as text.

    Used in: lectures/sec3_04_binary_laplace.ipynb, sec3_05, sec3_06, sec3_08.
    """
    return _BoxView(*_box(name))


_KERNELS = ("se", "ard", "kg", "kg_iso")
_LIKELIHOODS = tuple(LIKELIHOODS)        # every likelihood (Part I)
_METHODS = ("laplace", "ep", "emep")


def discrete_flags(discrete, d, name="discrete"):
    """The discrete inputs (K&G 14) as a boolean (d,) array, or None if there are none.

    discrete: None, a boolean mask of length d, or the indices of the
    discrete columns.
    """
    if discrete is None:
        return None
    a = np.asarray(discrete)
    if a.dtype == bool:
        if a.shape != (d,):
            raise ValueError(f"{name} as a boolean mask must have one entry per input column ({d}), "
                             f"got shape {a.shape}")
        mask = a.copy()
    else:
        if a.ndim != 1 or (a.size and a.dtype.kind not in "iu"):
            raise ValueError(f"{name} must be a boolean mask or a list of column indices, got {discrete!r}")
        if a.size and (a.min() < -d or a.max() >= d):
            raise ValueError(f"{name} has a column index out of range for {d} inputs: {a.tolist()}")
        mask = np.zeros(d, bool)
        mask[a] = True
    return np.ascontiguousarray(mask) if mask.any() else None


def class_labels(y, name="y", where=None):
    """Validate labels of any type: returns (index of each label in classes, classes)."""
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{where + ': ' if where else ''}{name} must be 1-D, got shape {y.shape}")
    if y.shape[0] == 0:
        raise ValueError(f"{where + ': ' if where else ''}{name} must not be empty")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise ValueError(f"{where + ': ' if where else ''}{name} must be finite, got {y[~np.isfinite(y)][0]}")
    classes, idx = np.unique(y, return_inverse=True)
    if classes.shape[0] < 2:
        raise ValueError(f"{where + ': ' if where else ''}{name} must contain at least two classes, got {classes.tolist()}")
    return idx.ravel(), classes


def one_hot(idx, C):
    """One-hot targets, shape (C, n), class-major as in (3.33)."""
    Y = np.zeros((C, idx.shape[0]))
    Y[idx, np.arange(idx.shape[0])] = 1.0
    return Y


def binary_labels(y, name="y", where=None):
    """Map any two-class labels to -1/+1 (GPML section 3.2).

    Returns (y_pm, classes): classes are the sorted distinct labels; the
    second is class +1.
    """
    y = np.asarray(y)
    if y.ndim != 1:
        raise ValueError(f"{where + ': ' if where else ''}{name} must be 1-D, got shape {y.shape}")
    if y.shape[0] == 0:
        raise ValueError(f"{where + ': ' if where else ''}{name} must not be empty")
    if y.dtype.kind == "f" and not np.all(np.isfinite(y)):
        raise ValueError(f"{where + ': ' if where else ''}{name} must be finite, got {y[~np.isfinite(y)][0]}")
    classes = np.unique(y)
    if classes.shape[0] != 2:
        raise ValueError(f"{where + ': ' if where else ''}{name} must contain exactly two classes for binary "
                         f"classification, got {classes.shape[0]}: {classes[:10].tolist()}")
    return np.where(y == classes[1], 1.0, -1.0), classes


def default_log_hyp(kernel, X):
    """A neutral starting point: unit length-scale and signal variance.

    For K&G's covariance ("kg", "kg_iso") their starting point (K&G footnote
    11): t0 = 1, t1 = 1e-4, t2 = 1e-3, l_m = 0.05.
    """
    d = X.shape[1]
    if kernel == "se":
        return np.zeros(2)
    if kernel in ("kg", "kg_iso"):
        return np.log(np.concatenate([[1.0, 1e-4, 1e-3], np.full(d if kernel == "kg" else 1, 0.05)]))
    return np.concatenate([[0.0, np.log(0.1)], np.zeros(d)])


def _input_spread(X):
    """The median distance r between inputs (at most 500 of them): the unit of the length-scales.

    1.0 if all inputs coincide. Scaling X by c scales r by c, and with it
    data_log_hyp's start and default_bounds' length-scale bounds, so that
    ML-II does not depend on the unit of X.
    """
    from scipy.spatial.distance import pdist

    X = np.asarray(X, dtype=float)
    sub = X[np.linspace(0, X.shape[0] - 1, min(X.shape[0], 500)).astype(int)]
    dist = pdist(sub) if sub.shape[0] > 1 else np.zeros(0)
    dist = dist[dist > 0]
    return float(np.median(dist)) if dist.size else 1.0


def _column_spread(X, rows=200):
    """The median distance |x_m - x'_m| between the values of each input m (at most `rows` rows,
    the pairs of distinct values): the unit of input m, 0 for a constant input. Scaling column m
    by c scales its spread by c, and with it the start (data_log_hyp) and bounds (default_bounds)
    of its ARD weight, so that ML-II does not depend on the unit of each input. (256 inputs:
    8 ms over 200 rows, 3 ms over 64; the warning of mixed units, which needs only a factor of 100,
    looks at 64 rows: a tenth of the pairs.)"""
    X = np.asarray(X, dtype=float)
    sub = X[np.linspace(0, X.shape[0] - 1, min(X.shape[0], rows)).astype(int)]
    # the result is a function of these rows alone: kept for the next call on the same rows (a fit
    # checks X's range, then starts ML-II from the spreads: sonar's 60 inputs, 1.8 ms each time)
    key = (sub.shape, sub.tobytes())
    if key in _spread_cache:
        return _spread_cache[key].copy()
    out = np.zeros(X.shape[1])
    if sub.shape[0] < 2:
        return out
    cols = np.ascontiguousarray(sub.T)                          # (d, rows): each input's values in a row
    if np.all(np.isfinite(cols)):
        out = _pair_distance_medians(cols)                      # O(rows log rows) a column
    else:                                                       # (NaN, inf: every pair, as numpy orders them)
        i, j = np.triu_indices(sub.shape[0], 1)
        for m0 in range(0, X.shape[1], 64):                    # 64 inputs at a time: 10 MB
            part = cols[m0:m0 + 64]                              # not pdist's sqrt of a square: 1e-300 stays
            dist = np.abs(np.take(part, i, axis=1) - np.take(part, j, axis=1))
            out[m0:m0 + 64] = _median_of_positive(dist)        # pairs of distinct values only
    if len(_spread_cache) >= 4:
        _spread_cache.pop(next(iter(_spread_cache)))
    _spread_cache[key] = out.copy()
    return out


_spread_cache = {}    # _column_spread: the spreads of the last few row samples, by their bytes


def _median_of_positive(D):
    """The median of each row's positive entries of D (k, p), 0 for a row with none: numpy's
    median of them (the mean of the middle two for an even count), from one sort of all rows
    (np.nanmedian by columns runs a Python loop over them: sonar's 60, 3 ms)."""
    positive = D > 0
    S = np.sort(np.where(positive, D, np.inf), axis=1)        # the positive entries first, ascending
    count = positive.sum(axis=1)
    rows = np.arange(D.shape[0])
    lo = S[rows, np.maximum(count - 1, 0) // 2]               # the middle one, or the lower of two
    hi = S[rows, np.minimum(count // 2, S.shape[1] - 1)]
    return np.where(count == 0, 0.0, np.where(count % 2 == 1, lo, (lo + hi) / 2.0))


@njit(cache=True)
def _pair_distance_medians(cols):
    """For each row of cols (d, r), finite: the median of its positive pair distances x_j - x_i
    (x sorted, j > i; 0 if the row is constant), exactly _median_of_positive's of the r (r - 1) / 2
    distances (the same floating-point differences, the mean of the middle two for an even count),
    in about O(r log r) instead of a sort of r^2 / 2 (_kth_pair_distance)."""
    d, r = cols.shape
    out = np.zeros(d)
    first = np.empty(r, np.int64)
    work = np.empty((4, r), np.int64)
    for m in range(d):
        s = np.sort(cols[m])
        count = 0                                   # positive distances: pairs of distinct values
        i = 0
        while i < r:
            e = i
            while e < r and s[e] == s[i]:
                e += 1
            for t in range(i, e):
                first[t] = e                        # the first value above s[t]
            count += (e - i) * (r - e)
            i = e
        if count == 0:
            continue
        k = (count - 1) // 2
        lo = _kth_pair_distance(s, first, k, work)
        if count % 2 == 1:
            out[m] = lo
            continue
        # the next one: lo again if more than k + 1 distances are <= lo, else the least above lo
        n_le, above = 0, np.inf
        j = 0
        for i in range(r):
            j = max(j, i + 1)
            while j < r and s[j] - s[i] <= lo:
                j += 1
            n_le += j - first[i]                  # (j >= first[i]: the ties, at 0, are <= lo)
            if j < r:
                above = min(above, s[j] - s[i])
        out[m] = (lo + (lo if n_le > k + 1 else above)) / 2.0
    return out


@njit(cache=True)
def _kth_pair_distance(s, first, k, work):
    """The k-th smallest (from 0) positive s[j] - s[i], s sorted, first[i] the first j with
    s[j] > s[i]. Row i's distances rise with j and fall with i, so the candidates left are a
    window [lo_w[i], hi_w[i]) of each row, and the count below a value is one pass of two
    pointers (O(r)). Each pass takes two values a <= b from a sorted sample of 32 candidates,
    either side of the k-th's rank, and keeps the window between them (Floyd and Rivest's
    selection): a few passes leave 64 candidates or fewer, which are partitioned."""
    r = s.shape[0]
    lo_w, hi_w, ja, jb = work[0], work[1], work[2], work[3]
    for i in range(r):
        lo_w[i], hi_w[i] = first[i], r
    n_sample = 32
    pos = np.empty(n_sample, np.int64)
    sample = np.empty(n_sample)
    below = 0                                       # distances known to lie below the candidates
    state = 12345 + k % 1000003
    while True:
        total = 0
        for i in range(r):
            total += hi_w[i] - lo_w[i]
        if total <= 64:                             # few left: select among them
            buf = np.empty(total)
            t = 0
            for i in range(r):
                for j in range(lo_w[i], hi_w[i]):
                    buf[t] = s[j] - s[i]
                    t += 1
            return np.partition(buf, k - below)[k - below]
        for t in range(n_sample):                   # a sample of the candidates, by position
            state = (state * 1103515245 + 12345) & 2147483647
            pos[t] = (state * total) >> 31          # uniform in [0, total)
        pos.sort()
        i, acc = 0, 0
        for t in range(n_sample):
            while pos[t] >= acc + hi_w[i] - lo_w[i]:
                acc += hi_w[i] - lo_w[i]
                i += 1
            sample[t] = s[lo_w[i] + pos[t] - acc] - s[i]
        sample.sort()
        f = (k - below + 0.5) / total * n_sample
        a = sample[max(int(f) - 4, 0)]
        b = sample[min(int(f) + 4, n_sample - 1)]
        n_lt, n_le = 0, 0
        j_lt, j_le = 0, 0                           # the first j with s[j] - s[i] >= a, > b
        for i in range(r):
            j_lt, j_le = max(j_lt, i + 1), max(j_le, i + 1)
            while j_lt < r and s[j_lt] - s[i] < a:
                j_lt += 1
            while j_le < r and s[j_le] - s[i] <= b:
                j_le += 1
            ja[i] = min(max(j_lt, lo_w[i]), hi_w[i])
            jb[i] = min(max(j_le, lo_w[i]), hi_w[i])
            n_lt += ja[i] - lo_w[i]
            n_le += jb[i] - lo_w[i]
        if k < below + n_lt:                        # below a
            hi_w[:] = ja
        elif k >= below + n_le:                     # above b
            below += n_le
            lo_w[:] = jb
        elif a == b:
            return a
        elif n_le - n_lt < total:                   # between a and b
            below += n_lt
            lo_w[:] = ja
            hi_w[:] = jb
        else:                                       # a and b the least and the largest left: drop them
            n_a, n_rest = 0, 0
            for i in range(r):
                while lo_w[i] < hi_w[i] and s[lo_w[i]] - s[i] == a:
                    lo_w[i] += 1
                    n_a += 1
            if k < below + n_a:
                return a
            below += n_a
            for i in range(r):
                while hi_w[i] > lo_w[i] and s[hi_w[i] - 1] - s[i] == b:
                    hi_w[i] -= 1
                n_rest += hi_w[i] - lo_w[i]
            if k >= below + n_rest:
                return b


def _ard_log_w(X, r):
    """Each input's log w_m = -log(d' r_m^2) for data_log_hyp and default_bounds: r_m its median
    distance (_column_spread), d' the number of inputs that vary, so that sum_m w_m (x_m - x'_m)^2
    is about 1 at a typical pair, as r^2 / l^2 is at 'se''s start l = r. A constant input (r_m = 0)
    takes the median distance r between whole inputs instead."""
    rm = _column_spread(X)
    varying = rm > 0
    dv = max(int(varying.sum()), 1)
    return np.where(varying, -np.log(dv * np.where(varying, rm, 1.0) ** 2), -2.0 * np.log(r))


def data_log_hyp(kernel, X, y):
    """A starting point for ML-II from the data: GPClassifier's default.

    Length-scale: the median distance r between inputs (at most 500 of them),
    so that K is neither ~ sf^2 I (a tiny length-scale) nor constant. Signal
    variance: sf^2 = 4 (1 + b^2) with b = |Phi^-1(p)| and p the fraction of
    the most frequent class, so that the prior spans the latent offset that
    the label balance needs (b = 0 for balanced classes). For 'ard': v0 =
    sf^2, bias v1 = 1 + b^2, w_m = 1 / (d' r_m^2) with r_m the median distance
    between the values of input m alone and d' the number of inputs that vary
    (_ard_log_w): each input in its own unit, so that a column in millimetres
    beside one in kilometres starts where both matter; for 'kg': t0 = sf^2,
    t1 = 1 + b^2, t2 = 1e-3 (K&G's footnote 11), l_m as 'ard''s w_m; 'kg_iso':
    l = 1 / r^2. From such a start ML-II does not begin on the flat evidence
    n log(1/C) of K ~ 0 or a tiny length-scale.
    """
    from scipy.special import ndtri

    X = np.asarray(X, dtype=float)
    if np.ndim(y) == 2:                                   # one-hot (C, n)
        counts = np.asarray(y).sum(axis=1)
    else:
        _, counts = np.unique(np.asarray(y), return_counts=True)
    p = min(counts.max() / counts.sum(), 0.99)
    b2 = float(ndtri(p)) ** 2 if len(counts) == 2 else 0.0
    r = _input_spread(X)
    sf2 = 4.0 * (1.0 + b2)
    d = X.shape[1]
    if kernel == "se":
        return np.array([np.log(r), 0.5 * np.log(sf2)])
    if kernel == "ard":
        return np.concatenate([[np.log(sf2), np.log(1.0 + b2)], _ard_log_w(X, r)])
    w = _ard_log_w(X, r) if kernel == "kg" else np.full(1, -2.0 * np.log(r))
    return np.concatenate([[np.log(sf2), np.log(1.0 + b2), np.log(1e-3)], w])


_MIXED_UNITS_ROWS = 64   # rows whose pairs _warn_mixed_units and _check_X_range compare (orders of magnitude)


def _warn_mixed_units(X, kernel, discrete, where):
    """Warn when an isotropic kernel ('se', 'kg_iso') meets inputs whose spreads differ by more than
    100 times: one length-scale then measures distance in the largest unit and the other inputs
    barely count (ML-II cannot fix that; 'ard' gives each input its own length-scale)."""
    if kernel not in ("se", "kg_iso") or X.shape[1] < 2:
        return
    keep = ~np.asarray(discrete, dtype=bool) if discrete is not None else np.ones(X.shape[1], bool)
    r = _column_spread(X, _MIXED_UNITS_ROWS)[keep]
    r = r[r > 0]
    if r.size >= 2 and r.max() > 100.0 * r.min():
        warnings.warn(f"{where}: the inputs' spreads differ by {r.max() / r.min():.3g} times (median "
                      f"distances {r.min():.3g} to {r.max():.3g}), and kernel {kernel!r} has one "
                      f"length-scale for all of them, so the inputs of small spread barely count: "
                      f"standardise X (sklearn.preprocessing.StandardScaler, e.g. in a Pipeline) or use "
                      f"kernel='ard' (one length-scale per input)", RuntimeWarning, stacklevel=4)


def _trivial_plateau(value, y):
    """True if an approximate log evidence is the flat n log(1/C) of K ~ 0 or a tiny length-scale."""
    C, n = (y.shape[0], y.shape[1]) if np.ndim(y) == 2 else (2, len(y))
    v0 = n * np.log(1.0 / C)
    return bool(np.isfinite(value) and abs(value - v0) < 1e-4 * abs(v0))


_PLATEAU_MSG = ("ended on the trivial plateau of the evidence, n log(1/C) = {v0:.4f}, where K is ~ 0 or "
                "diagonal (a tiny length-scale) and the gradient vanishes: the fit ignores the inputs. "
                "Check that the inputs vary and carry the classes (a constant X, a handful of points, "
                "or a continuous input declared discrete end here), then try restarts (n_restarts) or "
                "another start (log_hyp); data_log_hyp(kernel, X, y) is GPClassifier's default start")


def default_bounds(kernel, d, X=None):
    """Box bounds for ML-II in log space.

    The signal variance is capped at sf^2 = 1e5, as Kuss & Rasmussen
    (appendix B) recommend: beyond it the evidence is flat in sf.
    Length-scales: l from e^-10 r to e^10 r ('se'; for 'kg_iso' the inverse
    squared length-scale w = 1 / l^2 from e^-20 / r^2 to e^10 / r^2), with r
    the median distance between the inputs of X (_input_spread), or r = 1
    without X. For 'ard' and 'kg', each input's own: w_m from e^-20 to e^10
    times 1 / (d' r_m^2), the start of data_log_hyp (_ard_log_w: r_m the median
    distance between the values of input m). Relative to the spread, the bounds
    follow X into any unit, of all inputs or of each: x in metres or in
    micrometres gives the same fit.
    """
    cap = 0.5 * np.log(1e5)
    log_r = 0.0 if X is None else np.log(_input_spread(X))
    if kernel == "se":
        return [(log_r - 10.0, log_r + 10.0), (-10.0, cap)]
    if X is None or kernel == "kg_iso":
        ws = [(-20.0 - 2.0 * log_r, 10.0 - 2.0 * log_r)] * (1 if kernel == "kg_iso" else d)
    else:
        ws = [(w - 20.0, w + 10.0) for w in _ard_log_w(X, np.exp(log_r))]
    if kernel in ("kg", "kg_iso"):
        return [(-10.0, np.log(1e5)), (-15.0, np.log(1e5)), (-15.0, np.log(1e5))] + ws
    return [(-10.0, np.log(1e5)), (-15.0, np.log(1e5))] + ws


def _emep_unit_shift(kernel, X, discrete=None):
    """What to add to K&G's log_hyp for standardised inputs (default_log_hyp, default_bounds) to
    put it in the unit of X: -log var_m on the inverse squared length-scale w_m of each
    continuous input ('kg'; 'kg_iso': -log of their mean variance), 0 elsewhere. On standardised
    inputs it is 0; with x_m scaled by c, w_m scales by 1/c^2 and K, hence the fit, is unchanged.
    Discrete inputs (K&G 14) and constant ones keep K&G's value."""
    d = X.shape[1]
    cont = np.ones(d, bool) if discrete is None else ~np.asarray(discrete, bool)
    var = np.var(X, axis=0)
    ok = cont & (var > 0)
    p = len(default_log_hyp(kernel, X))
    shift = np.zeros(p)
    if kernel == "kg":
        shift[3:][ok] = -np.log(var[ok])
    elif kernel == "kg_iso" and np.any(ok):
        shift[3] = -np.log(np.mean(var[ok]))
    return shift


def _length_scale_index(kernel, d):
    """Positions of the length-scale parameters in a log_hyp of `kernel` on d inputs."""
    return {"se": [0], "ard": list(range(2, 2 + d)), "kg": list(range(3, 3 + d)),
            "kg_iso": [3]}[kernel]


def _mode_or_raise(K, y, likelihood, a_init=None, where="laplace_evidence"):
    """laplace_mode on a K built here (unchecked), a failed Cholesky factor named by
    _factorisation_failed."""
    try:
        return laplace_mode.unchecked(K, y, likelihood, a_init)
    except np.linalg.LinAlgError as e:
        raise _factorisation_failed(where, "laplace_mode", e, [("K", K)]) from None


@public(kernel="{se,ard,kg,kg_iso}", likelihood=_LIKELIHOOD_SPEC, X="X", y="(n,) pm1 nonempty", log_hyp="(p,) loghyp",
        a_init="(n,) ?", eval_gradient="bool", discrete="(d,) flags ?")
def laplace_evidence(X, y, log_hyp, kernel="se", likelihood="logistic", a_init=None,
                     eval_gradient=True, discrete=None):
    """Laplace log q(y|X, theta) (3.32) and its gradient in log_hyp (K&R 42-47).

    y must be -1/+1; discrete: flags of the discrete inputs (K&G 14) or None.
    Returns (log_q, grad, mode) with mode the LaplaceMode of laplace_mode
    (grad is None unless eval_gradient).
    """
    K = kernel_matrix.unchecked(kernel, X, X, log_hyp, discrete)
    mode = _mode_or_raise(K, y, likelihood, a_init)
    grad = None
    if eval_gradient:
        grad = laplace_log_q_grad.unchecked(K, X, kernel, log_hyp, y, likelihood,
                                            mode.f_hat, mode.a, mode.L, discrete)
    return mode.log_q, grad, mode


def _class_kernels(kernel, X, log_hyp, discrete):
    """The C kernel matrices K_c = k(X, X) of log_hyp's rows (C, p), (C, n, n): computed once for
    rows that repeat an earlier one (shared_hyp: one matrix, copied C times)."""
    K = np.empty((log_hyp.shape[0], X.shape[0], X.shape[0]))
    for c, h in enumerate(log_hyp):
        same = [e for e in range(c) if np.array_equal(log_hyp[e], h)]
        K[c] = K[same[0]] if same else kernel_matrix.unchecked(kernel, X, X, h, discrete)
    return K


@public(kernel="{se,ard,kg,kg_iso}", X="X", Y="(C, n) onehot nonempty", log_hyp="(C, p) loghyp", a_init="(C, n) ?",
        eval_gradient="bool", discrete="(d,) flags ?")
def multiclass_evidence(X, Y, log_hyp, kernel="se", a_init=None, eval_gradient=True, discrete=None):
    """Multi-class Laplace log q (3.44) and its gradient, log_hyp of shape (C, p).

    Y is one-hot (C, n). Returns (log_q, grad (C, p) or None, MultiLaplaceMode).
    """
    K = _class_kernels(kernel, X, log_hyp, discrete)
    try:
        mode = laplace_mode_multiclass.unchecked(K, Y, a_init)
    except np.linalg.LinAlgError as e:
        raise _factorisation_failed("multiclass_evidence", "laplace_mode_multiclass", e, [("K", K)]) from None
    grad = None
    if eval_gradient:
        grad = laplace_log_q_grad_multiclass.unchecked(K, X, kernel, log_hyp, Y, mode.f_hat, mode.a,
                                                       mode.E, mode.M, discrete)
    return mode.log_q, grad, mode


def _warn_skipped(result, where, stacklevel=3):
    """Warn if ep left sites unchanged because their cavity precision was not positive."""
    k = getattr(result, "n_skipped", 0)
    if k:
        warnings.warn(f"{where}: EP skipped {k} site(s) whose cavity precision (3.56) was not "
                      "positive in floating point" + ("; log Z_EP is undefined (nan)"
                                                      if np.isnan(result.log_Z) else ""),
                      RuntimeWarning, stacklevel=stacklevel)


def _warn_not_converged(result, where, K=None, likelihood=None, stacklevel=3):
    """Turn a convergence flag of laplace_mode or ep into a RuntimeWarning (and skipped EP sites).

    For binary EP given its K and likelihood, the message says what failed: the
    damped sweeps that followed (_ep_damped), and the sites held at ep's precision
    cap tau_max, where a step likelihood without noise leaves EP without a fixed point.
    """
    _warn_skipped(result, where, stacklevel + 1)
    if result.converged:
        return
    if isinstance(result, EPResult):
        damped = (f", the last {result.n_sweeps - _EP_SWEEPS} damped by {_EP_DAMPING}"
                  if result.n_sweeps > _EP_SWEEPS else "")
        msg = (f"{where}: EP did not converge in {result.n_sweeps} sweeps{damped} (last relative "
               f"change of a site parameter {result.delta:.2e}); the last sites are used")
        if K is not None and np.ndim(result.tau_tilde) == 1:
            tau_max = _ep_tau_max(K)
            n_cap = int(np.sum(result.tau_tilde >= tau_max * (1.0 - 1e-9)))
            if n_cap and likelihood == "step":
                msg += (f". {n_cap} site(s) sit at the largest precision EP allows (tau~ = {tau_max:.3g}, "
                        "f_i pinned at 0): the step likelihood without noise demands f of opposite signs at "
                        "inputs of different classes that the covariance ties together, and EP has no fixed "
                        "point. Use kernel 'kg' (K&G's covariance, whose latent noise t2 is the step's noise; "
                        "the default for the step), eps > 0, or likelihood 'probit'")
            elif n_cap:
                msg += f". {n_cap} site(s) sit at the largest precision EP allows (tau~ = {tau_max:.3g})"
    else:
        msg = (f"{where}: Newton's method did not converge in {result.n_iter} steps; "
               "the last iterate is used")
    warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)


_EP_SWEEPS = 100           # ep's sweeps in ep_evidence
_EP_DAMPING = 0.5          # the share of a sweep's new sites kept in a damped sweep (GPy's default)
_EP_DAMPED_SWEEPS = 300    # damped sweeps after an EP run that did not converge


def _ep_damped(K, y, result, likelihood, eps, tol):
    """Binary EP continued by damped sweeps from the sites of a run that did not converge.

    Sequential EP (Algorithm 3.5) can cycle, above all with a likelihood that is not
    log-concave (the step with eps > 0 asks for negative site precisions, held at 0).
    Each sweep here is one sweep of ep from the current sites, of which only the share
    _EP_DAMPING of the change is kept (natural parameters, as GPy's and GPstuff's
    damped EP); converged as ep: the change of log Z_EP below tol and of every site
    below sqrt(tol). Returns the EPResult of the last sweep, with n_sweeps counting the
    first run's, or the first run's result if no sweep could be taken.
    """
    nu, tau = result.nu_tilde, result.tau_tilde
    last, log_Z_old = None, np.inf
    for k in range(_EP_DAMPED_SWEEPS):
        try:
            new = ep.unchecked(K, y, nu, tau, tol=tol, max_sweeps=1, likelihood=likelihood, eps=eps)
        except np.linalg.LinAlgError:
            break
        last = new._replace(n_sweeps=result.n_sweeps + k + 1)
        if new.n_skipped == 0 and abs(new.log_Z - log_Z_old) < tol and new.delta < math.sqrt(tol):
            return last._replace(converged=True)
        log_Z_old = new.log_Z
        nu = nu + _EP_DAMPING * (new.nu_tilde - nu)
        tau = tau + _EP_DAMPING * (new.tau_tilde - tau)
    return result if last is None else last._replace(converged=False)


def _ep_or_raise(K, y, sites, tol, likelihood, eps):
    """ep on a K built here (unchecked), from sites (nu~, tau~) or None: a failed Cholesky factor
    named by _factorisation_failed, skipped sites warned of (for ep_evidence's caller), as
    _mode_or_raise for laplace_mode."""
    nu0, tau0 = (None, None) if sites is None else sites
    try:
        res = ep.unchecked(K, y, nu0, tau0, tol=tol, likelihood=likelihood, eps=eps)
    except np.linalg.LinAlgError as e:
        raise _factorisation_failed("ep_evidence", "ep", e, [("K", K)]) from None
    _warn_skipped(res, "ep_evidence", stacklevel=4)
    return res


def _binary_approximation(K, y, likelihood, method, warm, eps, tol=1e-9):
    """evidence's binary result (no gradient) on K = kernel_matrix(kernel, X, X, log_hyp, discrete)
    formed by the caller (GPClassifier.fit keeps it for the predictions): laplace_evidence's mode,
    or ep_evidence's EP result with evidence's damped sweeps after 100 that did not converge."""
    if method == "laplace":
        return _mode_or_raise(K, y, likelihood, warm)
    res = _ep_or_raise(K, y, warm, tol, likelihood, eps)
    if not res.converged:
        damped = _ep_damped(K, y, res, likelihood, eps, tol)
        if damped is not res and (not np.isnan(damped.log_Z) or np.isnan(res.log_Z)):
            res = damped
    return res


def evidence(X, y, log_hyp, kernel="se", likelihood="logistic", method="laplace", warm=None,
             eval_gradient=True, discrete=None, eps=0.0, tol=1e-9):
    """Approximate log evidence and gradient by `method`: laplace_evidence or ep_evidence.

    warm is the warm start returned by the previous call (or None).
    For y of shape (C, n) (one-hot): the multi-class Laplace evidence, with
    log_hyp of shape (C, p), or for method 'ep' or 'emep' the multi-class EP
    evidence on K&G's difference latents (multiclass_ep_evidence). 'emep'
    evaluates the same EP evidence as 'ep' (EM-EP's fixed point is a
    stationary point of it, K&G Theorem 1). tol: binary EP's convergence
    tolerance; a binary EP run that does not converge in its 100 sweeps goes
    on with up to 300 damped ones (_ep_damped), so that a run that converges
    is left as it is. Returns (value, grad, result, warm).
    """
    if np.ndim(y) == 2:
        if method in ("ep", "emep"):
            v, g, res = multiclass_ep_evidence(X, y, log_hyp, kernel, warm, eval_gradient, discrete, tol)
            return v, g, res, (res.nu_tilde, res.tau_tilde)
        v, g, res = multiclass_evidence(X, y, log_hyp, kernel, warm, eval_gradient, discrete)
        return v, g, res, res.a
    if method == "laplace":
        v, g, res = laplace_evidence(X, y, log_hyp, kernel, likelihood, warm, eval_gradient, discrete)
        return v, g, res, res.a
    v, g, res = ep_evidence(X, y, log_hyp, kernel, warm, eval_gradient, discrete, likelihood, eps, tol)
    if not res.converged:
        K = kernel_matrix.unchecked(kernel, X, X, log_hyp, discrete)
        damped = _ep_damped(K, y, res, likelihood, eps, tol)
        if damped is not res and (not np.isnan(damped.log_Z) or np.isnan(v)):
            res, v = damped, float(damped.log_Z)
            if eval_gradient:
                g = ep_log_Z_grad.unchecked(K, X, kernel, log_hyp, res.nu_tilde, res.tau_tilde, res.L,
                                            discrete)
    return v, g, res, (res.nu_tilde, res.tau_tilde)


@public(kernel="{se,ard,kg,kg_iso}", likelihood=_ANY_LIKELIHOOD_SPEC, method="{laplace,ep,emep}", X="X",
        y="targets", log_hyp0="loghyp_any", bounds="(p, 2) bounds ?", max_iter="count", eps="eps")
def ml2(X, y, log_hyp0, kernel="se", likelihood="logistic", bounds=None, max_iter=200,
        method="laplace", hyp_prior=None, discrete=None, eps=0.0, ftol=None):
    """ML-II: maximise the approximate log evidence over log_hyp by L-BFGS-B.

    Uses the analytic gradient (K&R 42-47 for Laplace, K&R 51 for EP); each
    evaluation warm-starts from the previous mode or sites; binary EP runs to
    a looser tolerance (1e-5) while the gradient at the best point so far is
    steep (an entry above 1), to 1e-9 near the optimum. For multi-class y
    (one-hot, shape (C, n)) log_hyp0 is either (p,), shared by all classes,
    or (C, p), one set per class; bounds are given for one set of p.
    hyp_prior = (mean, sd) adds an independent Gaussian prior on every
    log-hyperparameter: maximum penalised likelihood (Williams & Barber use
    N(-3, 3^2)). discrete: flags of the discrete inputs (K&G 14); eps: the
    labelling noise of likelihood 'step' (K&G 10), held fixed. With
    likelihood 'step' the evidence does not change when K is scaled (t0, t1
    and t2 of 'kg' together; the step sees only the sign of f): without
    hyp_prior, the scale (log t0 for 'kg', 'kg_iso', log v0 for 'ard', log sf
    for 'se') is held at its start value, which removes that flat direction
    (L-BFGS otherwise spends its steps along it). Multi-class EP (sweeps of
    O((n (J - 1))^3)) runs to tol = (0.03 max |gradient|)^2 within [1e-9, 1e-5]
    and below 0.03 ftol |log Z_EP| (EP's error must not fake L-BFGS-B's stopping
    test): the sites to a last relative change below 3% of the gradient's largest
    entry, which on fgl (where the sweeps contracted the changes about fourfold)
    leaves them about 1% of it from EP's fixed point (174 sweeps in 34 evaluations
    instead of 301 at tol 1e-9, log Z_EP at the optimum within 3e-4 nats). An evaluation whose warm
    start fails (not finite, or EP or Newton not converged) is done again
    from no sites or a zero mode, as GPML's infEP restarts.
    ftol: L-BFGS-B stops when a step raises the log evidence by less than
    ftol max(|log evidence|, 1). Default: scipy's 2.2e-9 for Laplace; 1e-6 for EP and EM-EP, about
    1e-4 nats at a log evidence of -100, where each evaluation runs EP (2.2e-9 polishes
    digits that no comparison of models uses: on Boston, n = 500, kg + step, the last 4 s
    of 8 s raised log Z_EP by 2e-3 nats).
    bounds: default default_bounds(kernel, d, X), length-scale bounds
    relative to the spread of X.
    Returns (log_hyp, log evidence (plus log prior), result), result
    scipy's OptimizeResult (result.success: whether L-BFGS-B converged).
    Warns if L-BFGS-B stopped without converging (its message, e.g. the
    iteration limit max_iter), if a length-scale ends on its bound (the
    evidence rises beyond it: bounds too narrow for the unit of X; not for
    an ARD weight w_m at its lower bound, an input found irrelevant, nor at
    K&R's signal-variance cap), and if it ends
    on the trivial plateau n log(1/C) (K ~ 0 or a tiny length-scale, where
    the gradient vanishes and L-BFGS-B stops at once).
    """
    ctx = _Context("ml2")
    if ftol is not None:
        ftol = _SCALARS["nonneg"](ftol, "ftol", ctx)
    hyp_prior = _check_hyp_prior(hyp_prior, "ml2")
    _check_X_range(X, "ml2", spread=bounds is None)      # default bounds follow the spread of X
    counts = np.sum(y, axis=1) if np.ndim(y) == 2 else np.array([np.sum(y < 0), np.sum(y > 0)])
    if np.count_nonzero(counts) < 2:
        raise ValueError(f"ml2: y must hold at least two classes, got {np.count_nonzero(counts)} "
                         f"(class counts {counts.astype(int).tolist()} over n = {int(np.sum(counts))})")
    h, v, res, notes = _ml2_run(X, y, log_hyp0, kernel, likelihood, bounds, max_iter, method, hyp_prior,
                                discrete, eps, ftol)
    for note in notes.values():
        warnings.warn("ml2: " + note, RuntimeWarning, stacklevel=2)
    return h, v, res


# ML-II on multi-class EP: EP's tolerance from the gradient and from L-BFGS-B's stopping rise. EP's test
# bounds the last sweep's changes, not the error left. On fgl the sweeps contracted the relative site
# changes about fourfold a sweep and the changes of log Z_EP about tenfold, so the error left is about
# a third (r / (1 - r) for r = 1/4) and a ninth of the last change: a last relative site change below 3%
# of the gradient's largest entry leaves the sites about 1% of it from EP's fixed point, and a tol of 3%
# of the rise leaves log Z_EP about 0.3% of it (estimates: EP has no guaranteed rate).
_MC_TOL_PER_GRAD = 0.03   # EP's relative site changes below 3% of the gradient's largest entry
_MC_TOL_PER_FTOL = 0.03   # ... and EP's tol below 3% of the rise in log Z_EP that ends L-BFGS-B


def _ml2_run(X, y, log_hyp0, kernel, likelihood, bounds, max_iter, method, hyp_prior, discrete, eps,
             ftol, monitor=None):
    """ml2 on checked arguments. Returns (log_hyp, value, OptimizeResult, notes): notes maps
    'approximation', 'failed', 'bound', 'plateau' to the warnings ml2 gives; the caller decides which to give
    (GPClassifier's restarts drop the plateau of a start), and no global warnings state is
    touched, so that fits in several threads do not disturb each other. monitor(x, value), if
    given, is called after each evaluation (GPClassifier.fit's progress, _FitMonitor)."""
    from scipy.optimize import minimize

    multi = np.ndim(y) == 2 and method == "laplace"   # per-class hyperparameters (C, p) possible
    shape = np.shape(log_hyp0)
    if bounds is None:
        bounds = default_bounds(kernel, X.shape[1], X)
    C = y.shape[0] if multi else 1

    def unpack(x):
        x = np.ascontiguousarray(x, dtype=float)
        if not multi:
            return x
        return np.tile(x, (C, 1)) if len(shape) == 1 else x.reshape(shape)

    def pack_grad(g):
        if not multi:
            return g
        return g.sum(axis=0) if len(shape) == 1 else g.ravel()

    if ftol is None:
        ftol = 1e-6 if method in ("ep", "emep") else 2.2e-9
    state = {"warm": None, "tol": 1e-9, "converged": {}, "ftol": ftol, "best": -np.inf}

    def neg(x):
        v, g, res, warm = evidence(X, y, unpack(x), kernel, likelihood, method, state["warm"],
                                   True, discrete, eps, state["tol"])
        if state["warm"] is not None and not (np.isfinite(v) and res.converged):
            # the warm start failed (sites far too precise for the new K, a mode far away):
            # start afresh, as GPML's infEP does when its warm start is worse than no sites
            cold = evidence(X, y, unpack(x), kernel, likelihood, method, None, True, discrete, eps,
                            state["tol"])
            if np.isfinite(cold[0]) and (cold[2].converged or not np.isfinite(v)):
                v, g, res, warm = cold
        state["warm"] = warm
        state["converged"][np.asarray(x, dtype=float).tobytes()] = bool(res.converged)
        state["warm_at"] = (np.asarray(x, dtype=float).tobytes(), warm if res.converged else None)
        if not np.isfinite(v):
            if monitor is not None:
                monitor(x, -np.inf)
            return np.inf, np.zeros_like(x)
        g = pack_grad(g)
        if hyp_prior is not None:
            m, sd = hyp_prior
            v = v - 0.5 * np.sum(((x - m) / sd) ** 2) - x.size * np.log(sd * np.sqrt(2 * np.pi))
            g = g - (x - m) / sd ** 2
        # EP converged to 1e-5 (sites to 0.3%) while the gradient is steep, to 1e-9 near the optimum.
        # The gradient that decides is L-BFGS-B's (with the prior's term) at the best point so far,
        # from which it takes its next step, not that of the last point evaluated: a line search's
        # rejected trial (steep) would otherwise have EP run loosely at the next point, near the
        # optimum, where the gradient is small (on sonar 3% of it wrong, and 24 evaluations instead
        # of 21). A gradient that is not finite counts as steep.
        if v > state["best"]:
            state["best"] = v
            g_abs = np.max(np.abs(g))
            g_abs = g_abs if np.isfinite(g_abs) else np.inf
            if np.ndim(y) == 2 and method in ("ep", "emep"):
                # multi-class EP (a sweep is N^3 for N = n (J - 1)): sites to a relative change below 3%
                # of the gradient's largest entry, tol = (0.03 max |g|)^2, within [1e-9, 1e-5] and below
                # 3% of the rise in log Z_EP that ends L-BFGS-B (ftol |log Z_EP|), which EP's error
                # must not fake (the error left is about a third and a ninth of these: see _MC_TOL_PER_GRAD)
                cap = min(1e-5, _MC_TOL_PER_FTOL * state["ftol"] * max(abs(v), 1.0))
                state["tol"] = min(max((_MC_TOL_PER_GRAD * g_abs) ** 2, 1e-9), max(cap, 1e-9))
            else:
                state["tol"] = 1e-5 if g_abs > 1.0 else 1e-9
        if monitor is not None:
            monitor(x, v)
        return -v, -g

    x0 = np.ravel(log_hyp0)
    if multi and len(shape) == 2:
        bounds = list(bounds) * C
    x0 = np.clip(x0, [b[0] for b in bounds], [b[1] for b in bounds])
    if likelihood == "step" and not multi and hyp_prior is None:
        k = 1 if kernel == "se" else 0                       # the scale of K: see the docstring
        bounds = list(bounds)
        bounds[k] = (x0[k], x0[k])
    if all(lo == hi for lo, hi in bounds):
        # every hyperparameter fixed by its bounds: nothing to optimise (scipy's L-BFGS-B would
        # return a result without nit); the evidence at the one point allowed
        from scipy.optimize import OptimizeResult
        f, g = neg(x0)
        res = OptimizeResult(x=x0, fun=f, jac=g, nit=0, nfev=1, success=bool(np.isfinite(f)),
                             message="every hyperparameter is fixed by its bounds")
    else:
        res = minimize(neg, x0, jac=True, method="L-BFGS-B", bounds=bounds,
                       options={"maxiter": max_iter, "ftol": ftol})
    # the sites (or mode) of the last evaluation, if it was at the log_hyp returned: a warm start
    # for the caller's approximation there (GPClassifier.fit's final one)
    at, warm = state.get("warm_at", (None, None))
    res.warm = warm if at == np.asarray(res.x, dtype=float).tobytes() else None
    notes = {}
    if not state["converged"].get(np.asarray(res.x, dtype=float).tobytes(), True):
        what = "EP" if method in ("ep", "emep") else "Newton's method"
        notes["approximation"] = (f"{what} did not converge at the log_hyp found: the log evidence and its "
                                  "gradient there are those of the last iterate, and L-BFGS-B may have stopped "
                                  "short of an optimum")
    if not res.success:
        notes["failed"] = (f"L-BFGS-B stopped without converging after {res.nit} iterations "
                           f"({res.message}); the last log_hyp is used")
    x = np.asarray(res.x)
    p = x.size // (C if multi and len(shape) == 2 else 1)
    on_bound = []
    for k in range(x.size):
        lo, hi = bounds[k]
        if k % p not in _length_scale_index(kernel, X.shape[1]) or not lo < hi:
            continue
        # the smallest length-scale allowed: l at its lower bound ('se'), w = 1/l^2 at its upper;
        # the largest only for 'se' (every input ignored): an ARD weight w at its lower bound
        # is an input ARD found irrelevant (W&B), no cause for a warning
        tiny = x[k] <= lo if kernel == "se" else x[k] >= hi
        if tiny or (kernel == "se" and x[k] >= hi):
            on_bound.append(f"log_hyp[{k}] = {x[k]:.4g} on its {'lower' if x[k] <= lo else 'upper'} "
                            f"bound {lo if x[k] <= lo else hi:.4g}")
    if on_bound:
        notes["bound"] = ("a length-scale ended on its bound: " + "; ".join(on_bound) + ". The evidence "
                          "rises beyond it: widen bounds (default_bounds(kernel, d, X) follows the spread "
                          "of X) or check the units of X")
    if hyp_prior is None and _trivial_plateau(-float(res.fun), y):
        C_, n = (y.shape[0], y.shape[1]) if np.ndim(y) == 2 else (2, len(y))
        notes["plateau"] = f"{_PLATEAU_MSG.format(v0=n * np.log(1.0 / C_))} ({res.nit} iterations)"
    return x.reshape(shape), -float(res.fun), res, notes



def _named_errors(where, call, *args, **kwargs):
    """call(*args, **kwargs), with its ValueError or TypeError (scikit-learn's checks of X and y)
    prefixed by the method called: scikit-learn's text is kept, which its own checks match."""
    try:
        return call(*args, **kwargs)
    except (ValueError, TypeError) as e:
        if type(e) not in (ValueError, TypeError) or str(e).startswith(where):
            raise
        raise type(e)(f"{where}: {e}") from None


def _check_frame(X, where):
    """A DataFrame X: column names unique, columns of numbers (scikit-learn's checks give a raw
    pandas DuplicateError, or numpy's DTypePromotionError for a datetime column)."""
    columns, dtypes = getattr(X, "columns", None), getattr(X, "dtypes", None)
    if columns is None or dtypes is None:
        return
    names = list(columns)
    dup = sorted({str(c) for c in names if names.count(c) > 1})
    if dup:
        raise ValueError(_bounded(f"{where}: X has duplicate column names {', '.join(map(_brief, dup))}: give "
                                  "each column its own name (a model checks the names at prediction)"))
    for name, dt in zip(names, dtypes):
        kind = getattr(dt, "kind", "O")
        if kind in "mM":
            raise TypeError(_bounded(f"{where}: X column {_brief(name)} holds {dt} values, not numbers: convert "
                                     "it first, e.g. to days since its first date, "
                                     "(X[c] - X[c].min()).dt.days"))


def _check_X_range(X, where, spread=True):
    """X, whose squared distances float64 can hold: every |x| below 1e150 (else (x - x')^2
    overflows to inf). With spread, each varying column's spread (its median distance,
    _column_spread, over 64 rows; 200 for a column constant in those) within 1e-50 to 1e50,
    so that the start and bounds of ML-II, which follow it (log w_m = -2 log r_m, bounds +-20
    about it), stay inside the +-300 that log_hyp allows
    (exp(600) is near float64's end). Raises a ValueError naming X otherwise."""
    big = np.abs(X) >= _X_ENTRY_LIMIT
    if np.any(big):
        i, j = np.argwhere(big)[0]
        raise ValueError(f"{where}: X holds {X[i, j]:.4g} at row {i}, column {j}: entries beyond +-1e150 "
                         "overflow the squared distances of the covariance (float64 ends at 1.8e308); "
                         "rescale X, e.g. with sklearn.preprocessing.StandardScaler")
    if not spread:
        return
    r = _column_spread(X, _MIXED_UNITS_ROWS)       # orders of magnitude: 64 rows (a tenth of the pairs)
    rare = (r == 0) & (np.ptp(X, axis=0) > 0)        # constant in those rows only: ML-II's 200
    if np.any(rare):
        r = np.where(rare, _column_spread(X), r)
    out = (r > 0) & ((r < 1.0 / _X_SPREAD_LIMIT) | (r > _X_SPREAD_LIMIT))
    if np.any(out):
        j = int(np.argmax(out))
        raise ValueError(f"{where}: X column {j} spreads over {r[j]:.3g} (the median distance between its "
                         "values), outside 1e-50 to 1e50: the length-scales that fit it lie beyond "
                         "the range of log_hyp (+-300); rescale X, e.g. with "
                         "sklearn.preprocessing.StandardScaler")


_X_ENTRY_LIMIT = 1e150
_X_SPREAD_LIMIT = 1e50


def _check_hyp_prior(hyp_prior, where):
    """hyp_prior: None, or (mean, sd) of the Gaussian prior on each log-hyperparameter, two
    finite numbers with sd > 0. Returns (mean, sd) as floats, or None."""
    if hyp_prior is None:
        return None
    ok = (isinstance(hyp_prior, (tuple, list, np.ndarray)) and len(hyp_prior) == 2
          and all(isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))
                  for v in hyp_prior))
    if not ok or not all(math.isfinite(v) for v in hyp_prior) or not hyp_prior[1] > 0:
        raise ValueError(f"{where}: hyp_prior must be (mean, sd), two finite numbers with sd > 0 (the "
                         f"Gaussian prior on each log-hyperparameter, e.g. (-3, 3)), got {_brief(hyp_prior)}")
    return float(hyp_prior[0]), float(hyp_prior[1])


# --- large n: a fit's cost stated before it starts, its progress, and Ctrl-C ---
#
# A fit at n = 2,000-10,000 runs for minutes to hours, its time set by Cholesky factorisations
# (n^3/3 flops each) and passes over n x n matrices. GPClassifier.fit states up front what it
# expects, from a model of this machine's speed measured once per process (_machine_speed): the
# time of one Cholesky factorisation and of one O(n^2) pass at _SPEED_N, scaled by n^3 and n^2,
# times the work of one evaluation of the evidence (_EVAL_WORK) and the evaluations a typical
# ML-II takes (_TYPICAL_EVALS). Measured by benchmarks/bench_large_n.py; the estimate is good to
# about a factor of two (the number of evaluations varies, and a machine whose other core is
# busy slows OpenBLAS's two threads).

_SPEED_N = 1000            # the size of the factorisation and the pass timed once per process
_ESTIMATE_FROM_N = 1500    # fits of fewer points (on every latent) are not estimated: seconds at most
_SLOW_FIT_SECONDS = 30.0   # a fit expected to take longer states its estimate and shows progress
_LONG_FIT_SECONDS = 600.0  # ... and an ML-II expected to take longer warns, naming max_ml2_n
_REFUSE_ML2_SECONDS = 600.0  # ML-II on all n expected to take longer is not started unless asked
_MC_EP_THREADS_FROM = 800  # multi-class EP on this many difference latents or more: BLAS threads as measured
_PROGRESS_EVERY = 5.0      # seconds between progress lines
_SPEED_FOR = 300.0         # seconds for which a measured speed is used
_machine_speed_cache = []  # [(t_chol, t_pass, BLAS threads), when measured]
# a fast machine of today (a third of this project's two-core test machine's times): a fit expected
# at this speed to take under _SLOW_FIT_SECONDS / _ROUGH_MARGIN is short on any machine up to
# _ROUGH_MARGIN times slower, and does not spend _machine_speed's 0.05-0.3 s to say so
_ROUGH_SPEED = (0.0015, 0.0001, None)
_ROUGH_MARGIN = 10.0
# the work of one evaluation of the evidence with its gradient during ML-II (warm-started), in
# Cholesky factorisations of the n x n matrix and passes over an n x n matrix, and of the final
# approximation at all n (started cold, no gradient). Laplace measured at n = 1,000-4,000 (ML-II at
# n = 4,000: 35 s where 33 s was estimated); binary EP since its blocked rank-one updates: ML-II at
# n = 2,000 and 4,000 took 1.4 s and 10 s an evaluation where the 60 factorisations counted before
# predicted 2.3 s and 18 s (bench_floor.py; at first, 93 s at n = 2,000 where 45 predicted 71 s)
_EVAL_WORK = {"laplace": (6.0, 40.0), "ep": (40.0, 40.0)}
_FINAL_WORK = {"laplace": (10.0, 40.0), "ep": (60.0, 40.0)}
_TYPICAL_EVALS = 15        # L-BFGS-B's evaluations on the data sets measured (12-14), rounded up
# EM-EP's typical rounds, and the work of each (an EP run and a few M-step gradients) in evaluations of
# _EVAL_WORK. Measured at n = 2,000: 38 rounds (46 EP runs), 3.9 s a round against 1.5 s an evaluation;
# 23-111 EP runs on the sets of bench_floor.py
_EMEP_ROUNDS = 40
_EMEP_ROUND_WORK = 2.5
# n x n float64 arrays alive at the peak of one evaluation with its gradient (and without):
# Laplace K, L (B factorised in place), B^-1 (then R), dK; EP K, Sigma and, while Sigma is
# formed anew (_ep_posterior), L, S~^1/2 K, V and the new Sigma
_PEAK_ARRAYS = {"laplace": (4, 3), "ep": (6, 6)}


def _machine_speed(every=None):
    """(seconds of one Cholesky factorisation, seconds of one pass over the matrix, BLAS threads)
    at _SPEED_N, the best of three, with all BLAS threads and with one: the threads of the
    faster. Measured once per process (again after _SPEED_FOR seconds: the load of a shared
    machine changes). every: the count of "all" (inside a fit that held one thread: the count
    before it); None, the count set now. Two OpenBLAS threads are about twice as fast as one
    on an idle machine of two cores, and several times slower when other processes hold the
    cores (NUMBA.md). When one thread measures faster, all of them are measured again after
    _SPEED_SETTLE seconds, and one is chosen only if it is still faster: another BLAS's threads
    that have just worked spin for about a tenth of a second (numpy and scipy each load their own
    OpenBLAS): right after a numpy product one thread measured faster at first in 12 of 12 probes
    here, and a fit that kept it took twice as long. The probe takes 0.05-0.3 s, 0.3-0.9 s when it
    measures again."""
    import time

    if _machine_speed_cache and time.monotonic() - _machine_speed_cache[-1] < _SPEED_FOR:
        return _machine_speed_cache[0]
    r = np.random.default_rng(0)
    X = r.standard_normal((_SPEED_N, 2))
    K = kernel_matrix.unchecked("se", X, X, np.zeros(2), np.zeros(2))
    sW = np.full(_SPEED_N, 0.5)
    t_all = _speed_round(K, sW, every)                          # all BLAS threads
    t_one = _speed_round(K, sW, 1)                              # one
    if t_one[0] < t_all[0]:                                     # again, once the other pools are idle
        time.sleep(_SPEED_SETTLE)
        again = _speed_round(K, sW, every)
        t_all = again if again[0] < t_all[0] else t_all
    best = (t_one[0], t_one[1], 1) if t_one[0] < t_all[0] else (t_all[0], t_all[1], None)
    _machine_speed_cache[:] = [best, time.monotonic()]
    return best


_SPEED_SETTLE = 0.2        # seconds _machine_speed waits before measuring all threads again


def _speed_round(K, sW, threads):
    """(seconds of one Cholesky factorisation of I + sW K sW, seconds of forming it), each the best
    of three, with `threads` BLAS threads (None: as set now)."""
    import time

    from threadpoolctl import threadpool_limits

    t_chol = t_pass = np.inf
    with threadpool_limits(limits=threads, user_api="blas"):
        for _ in range(3):
            t = time.perf_counter()
            B = _form_B(K, sW)                                   # one O(n^2) pass, as the boxes' loops
            t_pass = min(t_pass, time.perf_counter() - t)
            t = time.perf_counter()
            _cholesky(B)
            t_chol = min(t_chol, time.perf_counter() - t)
    return t_chol, t_pass


def _memory_available():
    """Bytes of memory available to a new allocation (Linux MemAvailable), else the machine's."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return _memory_bytes()


def _gib(b):
    return f"{b / 2 ** 30:.1f} GiB"


def _duration(s):
    if s < 90:
        return f"{s:.0f} s"
    if s < 5400:
        return f"{s / 60:.0f} min"
    return f"{s / 3600:.1f} h"


def _fit_estimate(n, m, n_latent, method, optimize, runs, measure=None, every=None):
    """What a fit will take: ML-II (or EM-EP) on m of the n points, then the approximation at all n.

    n_latent: latent functions per point in one n x n block (multi-class Laplace factorises C
    blocks of n; multi-class EP one matrix of n (C - 1)); runs: ML-II runs (1 + n_restarts).
    Returns a dict: seconds (total), seconds_ml2, evaluations (EM-EP: its rounds), peak_bytes,
    final_bytes, threads, measured, or None below _ESTIMATE_FROM_N. measure: None, this machine's
    speed is measured (_machine_speed, 0.05-0.9 s) only when the fit might be long: when at
    _ROUGH_SPEED it is expected to take more than _SLOW_FIT_SECONDS / _ROUGH_MARGIN; True, always
    (verbose fits).
    Without it the estimate is at _ROUGH_SPEED (measured False, threads None: left as they are).
    every: _machine_speed's count of all BLAS threads.
    """
    kind = "laplace" if method == "laplace" else "ep"      # EM-EP's E-step is EP
    blocks, size = n_latent
    if size * n < _ESTIMATE_FROM_N:
        return None
    est = _estimate_at(n, m, blocks, size, kind, method, optimize, runs, _ROUGH_SPEED)
    if measure or (measure is None and est["seconds"] * _ROUGH_MARGIN >= _SLOW_FIT_SECONDS):
        est = _estimate_at(n, m, blocks, size, kind, method, optimize, runs, _machine_speed(every))
        est["measured"] = True
    return est


def _estimate_at(n, m, blocks, size, kind, method, optimize, runs, speed):
    """_fit_estimate at the speed (seconds of one Cholesky factorisation and of one pass at
    _SPEED_N, BLAS threads)."""
    t_chol, t_pass, threads = speed

    def seconds(work, k):
        chol, passes = work
        N = size * k
        return blocks * (chol * t_chol * (N / _SPEED_N) ** 3 + passes * t_pass * (N / _SPEED_N) ** 2)

    evals = (_EMEP_ROUNDS if method == "emep" else _TYPICAL_EVALS) * runs if optimize else 0
    ml2 = evals * (_EMEP_ROUND_WORK if method == "emep" else 1.0) * seconds(_EVAL_WORK[kind], m)
    final = seconds(_FINAL_WORK[kind], n)
    grad_arrays, plain_arrays = _PEAK_ARRAYS[kind]
    peak = 8.0 * blocks * max(grad_arrays * (size * m) ** 2 if optimize else 0, plain_arrays * (size * n) ** 2)
    return {"seconds": ml2 + final, "seconds_ml2": ml2, "evaluations": evals, "peak_bytes": peak, "threads": threads,
            "final_bytes": 8.0 * blocks * plain_arrays * (size * n) ** 2, "n": n, "m": m, "measured": False}


class _FitThreads:
    """The BLAS threads of one large fit: limit(k) sets k for the rest of the fit (the faster
    count measured by _machine_speed), and leaving the context gives back the count before.
    outer: the BLAS threads before the fit held one (_blas_threads_for), the most it may set;
    None when it held none (the count set now is the user's)."""

    def __init__(self, outer=None):
        self.outer = outer
        self.limits = None
        self.alarm = None

    def __enter__(self):
        return self

    def tick(self, monitor):
        """monitor.tick() every _PROGRESS_EVERY s for the rest of the fit, by SIGALRM: CPython runs
        the handler between bytecodes and in numba code at every check_interrupt (PyErr_CheckSignals),
        so a line comes during a long evaluation too, with no thread (a thread would be starved of
        the GIL while numba code holds it). Only in the main thread, and only when SIGALRM and the
        real-time timer are unused (their owner's are left alone)."""
        import signal
        import threading

        if (not hasattr(signal, "setitimer") or threading.current_thread() is not threading.main_thread()
                or signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
                or signal.getitimer(signal.ITIMER_REAL) != (0.0, 0.0)):
            return

        def handler(signum, frame):
            try:
                monitor.tick()
            except Exception:              # a line that cannot be written must not end the fit
                pass

        signal.signal(signal.SIGALRM, handler)
        signal.setitimer(signal.ITIMER_REAL, _PROGRESS_EVERY, _PROGRESS_EVERY)
        self.alarm = True

    def limit(self, k):
        from threadpoolctl import threadpool_limits

        self.limits = threadpool_limits(limits=k, user_api="blas")
        self.token = _fit_threads_set.set(True)     # the calls inside the fit keep this count

    def __exit__(self, *exc):
        if self.alarm is not None:
            import signal

            signal.setitimer(signal.ITIMER_REAL, 0.0)
            signal.signal(signal.SIGALRM, signal.SIG_DFL)
            self.alarm = None
        if self.limits is not None:
            _fit_threads_set.reset(self.token)
            self.limits.restore_original_limits()


class _FitMonitor:
    """ML-II's (or EM-EP's) progress during GPClassifier.fit: evaluations (rounds) done, the
    evidence, time per evaluation (round), the time left; and the best log_hyp so far, which an
    interrupt reports. ML-II: a line after the first evaluation, then after an evaluation at
    most every _PROGRESS_EVERY s; EM-EP (rounds=True): a line after every round."""

    def __init__(self, show, expected, stream=None, rounds=False):
        import time

        self.clock = time.perf_counter
        self.show, self.expected = show, expected
        self.stream = stream
        self.rounds = rounds
        self.start = self.last = self.event = self.summary = self.clock()
        self.count = 0
        self.round = 0
        self.final = None                 # (n, started) during the approximation at all n
        self.optimize = True
        self.best_x, self.best_v = None, -np.inf

    def say(self, text):
        import sys

        print("GPClassifier.fit: " + text, file=self.stream or sys.stderr, flush=True)
        self.last = self.clock()

    def _done_text(self):
        """'3 ML-II evaluations', '1 EM-EP round': the work finished so far."""
        k, unit = (self.round, "EM-EP round") if self.rounds else (self.count, "ML-II evaluation")
        return f"{k} {unit}{'' if k == 1 else 's'}"

    def __call__(self, x, value, k=None):
        """After an evaluation of the evidence at log_hyp x (ML-II), or after EM-EP's round k
        (its E-step's log Z_EP; k = 0 the start)."""
        self.count += 1
        if k is not None:
            self.round = int(k)
        if value > self.best_v:
            self.best_x, self.best_v = np.array(x, dtype=float), float(value)
        now = self.event = self.clock()
        # the evaluation lines keep their own pace: the lines of a long step in between (tick) must
        # not crowd them out, or a fit of evaluations of a few seconds shows only "running for" lines
        if self.show and (self.rounds or now - self.summary >= _PROGRESS_EVERY or self.count == 1):
            self.summary = now
            per = (now - self.start) / self.count
            unit = "round" if self.rounds else "evaluation"
            done = self.round if self.rounds else self.count    # EM-EP's round 0 is the E-step at the start
            if self.expected and done < self.expected:
                left = f", about {_duration(per * (self.expected - done))} left"
            elif self.expected and done > self.expected:    # past the count: "round 45 of about 40" reads as an error
                stops = "EM-EP" if self.rounds else "L-BFGS-B"
                left = f", beyond the typical {self.expected} ({stops} stops at convergence or max_iter)"
            else:
                left = ""
            of = f" of about {self.expected}" if self.expected and done <= self.expected else ""
            if self.rounds:
                self.say(f"EM-EP round {self.round}{of}: log Z_EP {value:.4f} (best {self.best_v:.4f}), "
                         f"{per:.2f} s per {unit}{left}")
            else:
                self.say(f"ML-II evaluation {self.count}{of}: log evidence {value:.4f} "
                         f"(best {self.best_v:.4f}), {per:.2f} s per {unit}{left}")

    def tick(self):
        """A line during a long step (_FitThreads.tick: every _PROGRESS_EVERY s) if none came for
        _PROGRESS_EVERY s and the step has run that long: what is running and for how long."""
        now = self.clock()
        started = self.final[1] if self.final is not None else self.event
        if not self.show or min(now - self.last, now - started) < 0.9 * _PROGRESS_EVERY:
            return
        if self.final is not None:
            self.say(f"the approximation at all n = {self.final[0]}: running for {_duration(now - started)}")
        elif not self.optimize:
            return
        elif self.rounds:
            self.say(f"EM-EP round {self.round + 1 if self.count else 0}: running for "
                     f"{_duration(now - self.event)}")
        else:
            self.say(f"ML-II evaluation {self.count + 1}: running for {_duration(now - self.event)}")

    def interrupted(self, where, shape, log_hyp=None):
        """The KeyboardInterrupt that ends an interrupted fit: where it stopped, that the
        estimator is left unfitted, and the best log_hyp so far (its attribute best_log_hyp)."""
        best = log_hyp if log_hyp is not None else self.best_x
        if best is not None and np.size(best) == int(np.prod(shape)):
            best = np.reshape(best, shape)
        text = (f"GPClassifier.fit interrupted {where} after {self._done_text()} "
                f"({_duration(self.clock() - self.start)}); the estimator is left unfitted")
        if best is not None:
            told = np.round(best, 6).tolist()
            what = "log Z_EP" if self.rounds else "log evidence"
            text += (f". The best log_hyp so far{'' if log_hyp is not None else f' ({what} {self.best_v:.4f})'}"
                     f": {told}. GPClassifier(log_hyp={told}, optimize=False) fits with it, or pass it as "
                     f"log_hyp to start {'EM-EP' if self.rounds else 'ML-II'} from it")
        else:
            text += (" (no E-step of EM-EP had finished)" if self.rounds
                     else " (no evaluation of the evidence had finished)")
        e = KeyboardInterrupt(text)
        e.best_log_hyp = best
        return e

    def done(self):
        if self.show:
            est = getattr(self, "estimate", None)
            self.say(f"done in {_duration(self.clock() - self.start)}"
                     + (f" (estimated {_duration(est['seconds'])})" if est else ""))


# gpclab.GPClassifier is this class with scikit-learn's ClassifierMixin and BaseEstimator as bases,
# made when it is first used (Part III, _estimator): importing gpclab does not import scikit-learn,
# 0.6 s of a new process's first cell, which only the estimator needs. Until then its body is kept
# as _GPClassifier (below the class).
class GPClassifier:
    """Gaussian-process classifier in the scikit-learn style.

    Two classes: binary GPC with the logistic or probit likelihood by Laplace
    (GPML 3.4), with the probit or K&G's labelling-noise step likelihood by EP
    (GPML 3.6; K&G 10), hyperparameters by ML-II, or by EM-EP (K&G 3.3).
    More than two classes: the softmax model by the multi-class Laplace
    approximation (GPML 3.5), or K&G's model on difference latents by EP
    (K&G 4.2), with hyperparameters by EM-EP (method 'emep') or ML-II on
    log Z_EP (method 'ep').

    Parameters
    ----------
    kernel : {'se', 'ard', 'kg', 'kg_iso'}, optional
        Squared exponential (GPML section 3.7), Williams & Barber's ARD form
        with a bias (W&B 4), or Kim & Ghahramani's covariance with bias and
        latent noise (K&G 13) with one inverse length-scale per input ('kg',
        ARD on: K&G's "(m)" models) or one for all ('kg_iso', ARD off: "(s)");
        see the covariance functions (Part I) for log_hyp. Default: 'se', or 'kg' for
        method 'emep', for EP on more than two classes and for likelihood 'step'
        (K&G's model: its latent noise t2 is the step's noise, and keeps the
        covariance of the difference latents positive definite, which with 'se'
        it is not in floating point at n = 300). Method 'emep' takes 'kg' or
        'kg_iso' only: its bound needs C^-1 and log|Sigma|, singular in floating
        point without t2. With the step and no noise (kernel 'se' or 'ard',
        eps = 0) the labels must be reproduced exactly by the sign of f: on
        overlapping classes (make_three_gaussians) EP has no fixed point at
        moderate length-scales and fit warns with what failed.
    likelihood : {'logistic', 'probit', 'step'}, optional
        'step' is K&G's eps + (1 - 2 eps) H(y f) (K&G 10), for EP and EM-EP.
        For more than two classes 'logistic' means its generalisation, the
        softmax (3.34), and 'step' the product of steps (K&G 47). Default:
        'logistic' for Laplace, 'probit' for binary EP, 'step' for EM-EP and
        for EP on more than two classes (K&G's model, the only multi-class EP).
    method : {'laplace', 'ep', 'emep'}
        Laplace (GPML 3.4, 3.5), expectation propagation with ML-II (GPML
        3.6; K&G 4.2 for more than two classes), or EP with EM-EP learning of
        the hyperparameters (K&G; em_ep).
    log_hyp : array-like, optional
        Log-hyperparameters; the starting point of ML-II or EM-EP if
        `optimize`, otherwise used as they are. Default: for ML-II
        data_log_hyp (from the median distance between inputs and the label
        balance), else default_log_hyp (unit length-scales and signal
        variance; K&G's footnote 11 for 'kg', 'kg_iso', EM-EP's start). Measured
        (benchmarks/bench_ml2_starts.py, inputs as given): from these starts
        ML-II reached the best evidence of all its runs (the start, three
        restarts, random starts) on three-Gaussians, crabs and Pima (Laplace
        and EP) and Ionosphere (Laplace) without restarts, and EM-EP came
        within 0.004 nats (its tolerance) on three-Gaussians; restarts added
        nothing there, hence n_restarts = 0. The evidence of an ARD kernel on
        raw inputs can have several maxima: on K&G's Table 1 problems (two
        inputs, 200 points) one start of ten latent functions stopped on a
        lower maximum, which n_restarts=3 found (lecture 3.6b).
    optimize : bool
        Fit log_hyp by ML-II (maximising the approximate log evidence) or, for
        method 'emep', by EM-EP.
    bounds : list of (low, high), optional
        Box bounds for ML-II or the M-step in log space, one pair per
        log-hyperparameter. Default: default_bounds(kernel, d, X), whose
        length-scale bounds follow the spread of X (so that the fit does not
        depend on the unit of X); for EM-EP, K&G's start and bounds for
        standardised inputs (default_log_hyp, default_bounds(kernel, d)) with
        each inverse squared length-scale divided by its input's variance
        (_emep_unit_shift): the same start on standardised inputs, and a fit
        that does not depend on the unit of X.
    n_restarts : int
        Extra ML-II or EM-EP runs from random starts, normal with sd 1 in log
        space around the start and within `bounds`; the one of largest
        evidence is kept. (Starts drawn uniformly within the bounds mostly
        land on the flat evidence n log(1/C) of K ~ 0 or a tiny length-scale,
        where ML-II stops at once.) A fit that ends there warns.
    random_state : None, int, numpy RandomState or Generator
        Seed for the restarts and for the Monte Carlo predictions of the
        multi-class Laplace model: an int gives the same fit and predictions
        every time; None, a RandomState or a Generator give one seed per fit
        (seed_), so that a fitted model predicts the same each time.
    shared_hyp : bool
        Multi-class Laplace only: one set of hyperparameters for all C latent
        functions (default) or one per class (as Williams & Barber).
    n_samples : int
        Multi-class Laplace only: Monte Carlo samples per test case (Algorithm 3.4).
    hyp_prior : (mean, sd), optional
        Gaussian prior on every log-hyperparameter: ML-II becomes maximum
        penalised likelihood (Williams & Barber: (-3, 3)). Not for 'emep'.
    max_iter : int
        Iterations of the ML-II optimiser, or EM rounds of EM-EP.
    discrete : array-like, optional
        The discrete inputs, as column indices or a boolean mask: their
        distance is 1 - delta(x^m, x'^m) instead of (x^m - x'^m)^2 (K&G 14).
    eps : float
        Labelling noise of the 'step' likelihood (K&G 10), in [0, 0.5): held
        fixed, or the starting value if learn_eps. K&G's experiments use 0.
    learn_eps : bool
        Method 'emep', two classes: update eps in each M-step (em_ep_eps).
    tol : float
        Method 'emep': convergence of EM-EP, in nats (em_ep).
    max_ml2_n : int, optional
        ML-II (or EM-EP) on a random subset of max_ml2_n points when n is
        larger, drawn without replacement from the fit's seed (every class
        kept; the indices are ml2_subset_), then the approximation at all n
        with the hyperparameters found: the same numbers as a fit on that
        subset, then a fit at all n with optimize=False. Default None: ML-II
        on all n, unless that is expected to take over 10 minutes (then fit
        refuses to start, saying what it expects; max_ml2_n=n runs it anyway). ML-II costs about 15 evaluations of n^3 work, the final
        approximation one: at n = 10,000 ML-II on all points takes hours,
        max_ml2_n=2000 minutes. Measured (benchmarks/bench_large_n.py, Laplace,
        2 inputs): at n = 4,000, ML-II on 2,000 gave log q 0.85 nats below
        full ML-II's, test accuracy 0.8936 against 0.8924, in 224 s against
        598 s; at n = 2,000, ML-II on 1,000 gave 0.31 nats less and 0.8940
        against 0.8936.
    verbose : None, bool or int
        Progress on stderr: first the expected time and peak memory; then,
        during ML-II, a line after the first evaluation of the evidence and
        after an evaluation at most every 5 s with the evaluations done, the
        log evidence (and the best), the time per evaluation and the time
        left, and while a step runs with no line for 5 s, what runs and for
        how long (by a SIGALRM timer: in the main thread, when the caller
        has no SIGALRM handler or timer of its own); during
        EM-EP a line after every round (round k, its log Z_EP and the best,
        seconds per round, the time left); a line when the approximation at
        all n starts (with its expected time) and ends; the total time. Fits
        too small to be estimated count without "of about". None (default):
        shown for fits expected to take over 30 s; True (or a positive int):
        always; False or 0: never.

    Large n: before a fit of 1,500 points or more (summed over the latent
    blocks), fit estimates its time and peak memory from a model of this
    machine's speed, measured once per process (and again after 5 min):
    the time of one Cholesky factorisation and one O(n^2) pass at n = 1,000,
    scaled by n^3 and n^2, times the work of an evaluation of the evidence
    and the evaluations a typical ML-II takes (good to about a factor of
    two). A fit whose peak memory (4 n x n arrays for Laplace ML-II, 6 for
    EP) exceeds the memory available raises MemoryError before it starts,
    naming n, the estimate, the memory needed and available, and what to do
    instead (max_ml2_n, or a subset of the rows); an ML-II (or EM-EP) on all
    n expected to take over 10 minutes is not started when max_ml2_n is left
    at None: RuntimeError with the estimate and what to do instead
    (max_ml2_n=2000, EM-EP 1000, and its time; max_ml2_n=n to run it on all
    n anyway; or fixed log_hyp); asked for (max_ml2_n=n, or a subset that
    long), it runs with a RuntimeWarning saying the same. The fit runs with the BLAS thread count
    measured faster at its start: all of them on an idle machine, one when
    other processes hold the cores (two OpenBLAS threads are then several
    times slower than one); below 1,500 points BLAS always runs one thread.
    Ctrl-C (Jupyter's Interrupt) ends a fit with KeyboardInterrupt; above
    n = 2,048 the n^3 steps (Cholesky factorisations, B^-1, EP's triangular
    solves and products) run in blocks with a check between them, each block
    operation at most about 2 n 256 1024 flops (0.1-0.5 s at n = 10,000 on
    one core), so that the fit stops within about a second; the O(n^2) loops
    between checks take a fraction of a second at n = 10,000. An interrupted fit leaves the estimator unfitted; the message and the
    exception's best_log_hyp give the best log_hyp so far (EM-EP: of the
    finished round with the best log Z_EP), to pass as log_hyp (with
    optimize=False to fit at once).

    scikit-learn: GPClassifier is a scikit-learn estimator (clone, Pipeline,
    GridSearchCV, cross_val_score, CalibratedClassifierCV, OneVsRestClassifier)
    and passes sklearn.utils.estimator_checks.check_estimator for the three
    methods with no expected failure: EXPECTED_FAILED_CHECKS, the place to
    declare one with its GP reason, is empty. X is checked by scikit-learn's
    validate_data (its messages), y by check_classification_targets. fit
    warns (RuntimeWarning) without touching the global warning filters, so
    that models can be fitted in several threads at once.

    Attributes (after fit)
    ----------------------
    classes_ : the labels; for two classes classes_[1] is class +1.
    n_features_in_, feature_names_in_ : scikit-learn's: the number of inputs,
        and the column names of a DataFrame X (predictions check them).
    converged_ : whether ML-II's optimiser (L-BFGS-B) or EM-EP converged
        (True without optimize); fit warns when not.
    n_iter_ : ML-II iterations of the best run, or EM rounds of EM-EP; without
        optimize, the Newton steps (Laplace) or EP sweeps of the approximation.
    seed_ : the seed of the multi-class Laplace predictions, from random_state.
    kernel_, likelihood_ : the covariance function and likelihood used.
    log_hyp_ : fitted log-hyperparameters: (p,), or (C, p) for a multi-class
        Laplace model with shared_hyp=False.
    log_marginal_likelihood_ : approximate log evidence at log_hyp_ (log q for
        Laplace, log Z_EP for EP and EM-EP).
    f_hat_ : posterior mode of the training latents (Laplace).
    nu_tilde_, tau_tilde_ : natural site parameters (EP, EM-EP).
    eps_ : the labelling noise used (EP, EM-EP).
    emep_ : the EMEPResult of em_ep, with the histories of log Z_EP and F.
    ml2_subset_ : the indices of the points ML-II was run on (max_ml2_n), or
        None for all of them.
    result_ : the LaplaceMode, MultiLaplaceMode or EPResult at log_hyp_ (multi-class
        EP: from multiclass_ep_evidence, whose Sigma is empty, shape (0, 0), as the
        predictions need only the sites and L; ep_multiclass forms it).
    G_ : multiclass_G(result_.E, result_.M), kept for the predictions
        (multi-class Laplace).
    ep_fold_ : _ep_predict_fold's (bc, T), the training side of the predictions
        folded onto cases and classes, J (J + 1) / 2 matrices of (n, n), kept for
        the predictions (multi-class EP and EM-EP).
    """

    def __init__(self, kernel=None, likelihood=None, method="laplace", log_hyp=None,
                 optimize=True, bounds=None, n_restarts=0, random_state=0, shared_hyp=True,
                 n_samples=2000, hyp_prior=None, max_iter=200, discrete=None, eps=0.0,
                 learn_eps=False, tol=1e-4, max_ml2_n=None, verbose=None):
        self.kernel = kernel
        self.likelihood = likelihood
        self.method = method
        self.log_hyp = log_hyp
        self.optimize = optimize
        self.bounds = bounds
        self.n_restarts = n_restarts
        self.random_state = random_state
        self.shared_hyp = shared_hyp
        self.n_samples = n_samples
        self.hyp_prior = hyp_prior
        self.max_iter = max_iter
        self.discrete = discrete
        self.eps = eps
        self.learn_eps = learn_eps
        self.tol = tol
        self.max_ml2_n = max_ml2_n
        self.verbose = verbose

    _DEFAULT_LIKELIHOOD = {"laplace": "logistic", "ep": "probit", "emep": "step"}
    _METHOD_LIKELIHOODS = {"laplace": _LAPLACE_LIKELIHOODS, "ep": _EP_LIKELIHOODS,   # from LIKELIHOODS
                           "emep": _EM_EP_LIKELIHOODS}

    # check_estimator's checks that a GP classifier cannot meet, with the reason (see the
    # class docstring); tests/test_sklearn.py passes them to scikit-learn's checks.
    EXPECTED_FAILED_CHECKS = {}

    def __sklearn_tags__(self):
        tags = super(GPClassifier, self).__sklearn_tags__()     # GPClassifier: the estimator (Part III)
        tags.input_tags.sparse = False           # K is dense: (n, n) covariances
        return tags

    def _check_params(self):
        _check_choice(self.method, "method", _METHODS, "GPClassifier")
        if self.kernel is not None:
            _check_choice(self.kernel, "kernel", _KERNELS, "GPClassifier")
        if self.likelihood is not None:
            _check_choice(self.likelihood, "likelihood", _LIKELIHOODS, "GPClassifier")
            allowed = self._METHOD_LIKELIHOODS[self.method]
            if self.likelihood not in allowed:
                raise ValueError(f"GPClassifier: method {self.method!r} needs likelihood "
                                 f"{' or '.join(map(repr, allowed))}, got likelihood={self.likelihood!r}")
        if not isinstance(self.n_restarts, (int, np.integer)) or isinstance(self.n_restarts, bool) \
                or self.n_restarts < 0:
            raise ValueError(f"GPClassifier: n_restarts must be a non-negative integer, got {_brief(self.n_restarts)}")
        _check_hyp_prior(self.hyp_prior, "GPClassifier")
        ctx = _Context("GPClassifier")
        for name in ("optimize", "shared_hyp", "learn_eps"):     # no truthy strings: 'no' is not False
            _flag(getattr(self, name), name, ctx)
        if self.method == "emep" and self.kernel in ("se", "ard"):
            raise ValueError(f"GPClassifier: method 'emep' needs kernel 'kg' or 'kg_iso' (K&G's covariance, "
                             f"the default), got kernel={self.kernel!r}: EM-EP's bound (K&G 29) needs C^-1 "
                             "and log|Sigma|, and without the latent noise t2 of K&G's covariance those of a "
                             "smooth covariance are singular in floating point (as for every seed of "
                             "make_three_gaussians). For kernel 'se' or 'ard' use method 'ep' (ML-II on "
                             "log Z_EP) or 'laplace'")
        if self.hyp_prior is not None and self.method == "emep":
            raise ValueError("GPClassifier: hyp_prior is for ML-II; EM-EP maximises the evidence bound "
                             "without a prior")
        if not isinstance(self.n_samples, (int, np.integer)) or isinstance(self.n_samples, bool) \
                or self.n_samples < 1:
            raise ValueError(f"GPClassifier: n_samples must be a positive integer, got {_brief(self.n_samples)}")
        if not (isinstance(self.eps, (int, float, np.floating)) and 0.0 <= self.eps < 0.5):
            raise ValueError(f"GPClassifier: eps must be a number in [0, 0.5), got {_brief(self.eps)}")
        if self.eps != 0.0 and self.likelihood not in ("step", None):
            raise ValueError(f"GPClassifier: eps is the labelling noise of likelihood 'step', got "
                             f"likelihood={self.likelihood!r} with eps={self.eps}")
        if self.eps != 0.0 and self.likelihood is None and self.method == "laplace":
            raise ValueError(f"GPClassifier: eps is the labelling noise of likelihood 'step' (methods "
                             f"'ep', 'emep'), got method='laplace' with eps={self.eps}")
        if self.learn_eps and self.method != "emep":
            raise ValueError("GPClassifier: learn_eps is for method 'emep'")
        ctx = _Context("GPClassifier")
        for name, kind in (("max_iter", "count"), ("tol", "nonneg")):
            _SCALARS[kind](getattr(self, name), name, ctx)
        m = self.max_ml2_n
        if m is not None and (not isinstance(m, (int, np.integer)) or isinstance(m, (bool, np.bool_)) or m < 2):
            raise ValueError(f"GPClassifier: max_ml2_n must be None (ML-II on all points) or an integer of at "
                             f"least 2 (ML-II on a random subset of that many), got {_brief(m)}")
        v = self.verbose
        if v is not None and (not isinstance(v, (int, np.integer, bool, np.bool_)) or v < 0):
            raise ValueError(f"GPClassifier: verbose must be None (progress for fits expected to take over "
                             f"{_SLOW_FIT_SECONDS:.0f} s), True/False or a non-negative integer, got {_brief(v)}")
        rs = self.random_state
        if not (rs is None or isinstance(rs, (np.random.RandomState, np.random.Generator))):
            if isinstance(rs, (bool, np.bool_)) or not isinstance(rs, (int, np.integer)):
                raise TypeError(f"GPClassifier: random_state must be None, an int, a "
                                f"numpy.random.RandomState or a numpy.random.Generator, got {_brief(rs)}")
            _SCALARS["seed"](rs, "random_state", ctx)

    def _random(self):
        """(generator of the restarts, seed of the Monte Carlo predictions) from random_state.

        An int seeds both (the same fit and predictions each time); None draws them afresh;
        a RandomState or Generator gives one number, which seeds both."""
        rs = self.random_state
        if rs is None:
            seed = int(np.random.default_rng().integers(2 ** 31))
        elif isinstance(rs, np.random.RandomState):
            seed = int(rs.randint(2 ** 31))
        elif isinstance(rs, np.random.Generator):
            seed = int(rs.integers(2 ** 31))
        else:
            seed = int(rs)
        return np.random.default_rng(seed), seed

    def _labels(self, y):
        """classes_ and the index of each label; scikit-learn's checks and messages."""
        from sklearn.utils.multiclass import check_classification_targets

        def mixed():
            kinds = sorted({type(v).__name__ for v in np.asarray(y, dtype=object).ravel()})
            return ValueError(f"GPClassifier.fit: y mixes labels of types {', '.join(kinds)}, which do "
                              "not sort together; give labels of one type (e.g. all str or all int), "
                              "without None")

        if y.dtype.kind == "S" or (y.dtype == object and len(y) and all(isinstance(v, bytes) for v in y)):
            # bytes labels (b"yes", b"no"), as scikit-learn accepts them: classes_ of dtype bytes
            classes, idx = np.unique(np.array(list(y), dtype=bytes), return_inverse=True)
            if classes.shape[0] < 2:
                raise ValueError(f"GPClassifier.fit: y has 1 class ({_brief(classes.tolist()[0])}) in {len(y)} "
                                 "sample(s); a classifier needs at least two classes")
            return classes, idx
        if y.dtype == object:
            kinds = {str if isinstance(v, str) else int if isinstance(v, (int, np.integer)) else type(v)
                     for v in y}
            if len(kinds) > 1 or type(None) in kinds:
                raise mixed()
        try:
            _named_errors("GPClassifier.fit", check_classification_targets, y)
            classes, idx = np.unique(y, return_inverse=True)
        except TypeError:
            raise mixed() from None
        if classes.shape[0] < 2:
            raise ValueError(f"GPClassifier.fit: y has 1 class ({classes.tolist()[0]!r}) in {len(y)} "
                             "sample(s); a classifier needs at least two classes")
        return classes, idx.ravel()

    def fit(self, X, y):
        """Fit the hyperparameters (if optimize) and the approximate posterior.

        X : array-like (n, d) of numbers (a DataFrame's column names are kept
        and checked at prediction), in any unit per input, with entries below
        1e150 in size and, when optimize, each input spread over 1e-50 to 1e50
        (its median distance; beyond, the length-scales that fit it leave the
        +-300 of log_hyp): a ValueError names X otherwise. y : n labels of any
        one type (str, int, bytes, ...), two or more classes. A second fit
        starts from a clean state.
        """
        with _blas_threads_for([X]) as held, _FitThreads(held.outer) as threads:   # ML-II's own numpy too
            return self._fit(X, y, threads)

    def _fit(self, X, y, threads=None):
        from sklearn.utils.validation import validate_data

        for key in [k for k in vars(self) if k.endswith("_") and not k.startswith("_")]:
            delattr(self, key)                                # refit from a clean state
        self._check_params()
        _check_frame(X, "GPClassifier.fit")
        X, y = _named_errors("GPClassifier.fit", validate_data, self, X, y, dtype=np.float64, order="C",
                             copy=True)                   # the model owns X
        _check_X_range(X, "GPClassifier.fit", spread=bool(self.optimize))
        self.classes_, idx = self._labels(y)
        C = self.classes_.shape[0]
        d = X.shape[1]
        multiclass = C > 2
        method = self.method
        # K&G's covariance for their models (EM-EP, multi-class EP): its latent noise t2 keeps the
        # covariance of the difference latents positive definite (with 'se' at n = 300 it is not)
        kernel = (self.kernel if self.kernel is not None else
                  "kg" if method == "emep" or (multiclass and method == "ep") or self.likelihood == "step"
                  else "se")
        if self.likelihood is not None:
            likelihood = self.likelihood
        else:   # multi-class EP is K&G's model on difference latents: the step is its likelihood
            likelihood = "step" if multiclass and method == "ep" else self._DEFAULT_LIKELIHOOD[method]
        if self.eps != 0.0 and likelihood != "step":
            raise ValueError(f"GPClassifier.fit: eps is the labelling noise of likelihood 'step', got "
                             f"likelihood={likelihood!r} with eps={self.eps}")
        if multiclass:
            if method == "laplace" and likelihood != "logistic":
                raise ValueError(f"GPClassifier.fit: y has {C} classes: the multi-class Laplace model is the "
                                 f"softmax (GPML 3.5), likelihood='logistic', got {likelihood!r}")
            if method != "laplace" and likelihood != "step":
                raise ValueError(f"GPClassifier.fit: y has {C} classes: multi-class EP is Kim & Ghahramani's "
                                 f"model on difference latents, likelihood='step' (the default), got "
                                 f"{likelihood!r}")
            if method != "laplace" and (self.eps != 0.0 or self.learn_eps):
                raise ValueError(f"GPClassifier.fit: y has {C} classes: multi-class EP has eps = 0 (K&G 47)")
            if method != "laplace" and not self.shared_hyp:
                raise ValueError("GPClassifier.fit: multi-class EP has one covariance function for all "
                                 "classes (K&G 38): shared_hyp must be True")
        discrete = _named_errors("GPClassifier.fit", discrete_flags, self.discrete, d)
        _warn_mixed_units(X, kernel, discrete, "GPClassifier.fit")
        per_class = multiclass and method == "laplace" and not self.shared_hyp
        y_t = one_hot(idx, C) if multiclass else np.where(idx == 1, 1.0, -1.0)
        rng, seed = self._random()
        n = X.shape[0]
        # ML-II (or EM-EP) on a random subset of max_ml2_n points, then the approximation at all n
        sub = (self._ml2_subset(idx, C, seed) if self.optimize and self.max_ml2_n is not None
               and n > self.max_ml2_n else None)
        X_h, idx_h = (X, idx) if sub is None else (X[sub], idx[sub])
        y_h = y_t if sub is None else y_t[..., sub]
        monitor = self._announce(n, len(idx_h), C, method, multiclass, threads)
        # EM-EP starts from K&G's hyperparameters for standardised inputs (footnote 11), in X's unit
        unit = _emep_unit_shift(kernel, X_h, discrete) if method == "emep" else 0.0
        if self.log_hyp is None:
            # ML-II starts from the data (data_log_hyp); EM-EP from K&G's start (footnote 11),
            # which measured as close to the best log Z_EP (benchmarks/bench_ml2_starts.py)
            h0 = (data_log_hyp(kernel, X_h, idx_h) if self.optimize and method != "emep"
                  else default_log_hyp(kernel, X_h) + unit)
            if per_class:
                h0 = np.tile(h0, (C, 1))
        elif per_class:
            h0 = np.asarray(self.log_hyp, dtype=float)
            if h0.ndim == 1:
                h0 = np.tile(h0, (C, 1))
            if h0.shape[0] != C:
                raise ValueError(f"GPClassifier.fit: log_hyp for shared_hyp=False must have one row per "
                                 f"class ({C}), got shape {h0.shape}")
            h0 = np.stack([_named_errors("GPClassifier.fit", _check_log_hyp, h, kernel, d) for h in h0])
        else:
            h0 = _named_errors("GPClassifier.fit", _check_log_hyp, self.log_hyp, kernel, d)
        eps = float(self.eps)
        emep = None
        res = None
        n_iter = 0
        converged = True
        if self.optimize:
            if self.bounds is not None:
                bounds = self._checked_bounds(kernel, d)
            elif method == "emep":   # K&G's bounds for standardised inputs, in X's unit like the start
                bounds = [(lo + u, hi + u) for (lo, hi), u in zip(default_bounds(kernel, d), unit)]
            else:
                bounds = default_bounds(kernel, d, X_h)

            def run(start):
                if method == "emep":
                    token = _emep_monitor.set(monitor)
                    try:
                        out = em_ep(X_h, self.classes_[idx_h], start, kernel, self.eps, self.learn_eps,
                                    self.max_iter, self.tol, bounds, discrete=discrete)
                    finally:
                        _emep_monitor.reset(token)
                    return out.log_hyp, out.result.log_Z, out, {}
                h, v, opt, notes = _ml2_run(X_h, y_h, start, kernel, likelihood, bounds, self.max_iter,
                                            method, self.hyp_prior, discrete, self.eps, None, monitor)
                return h, v, opt, notes

            lo, hi = np.array([b[0] for b in bounds]), np.array([b[1] for b in bounds])
            try:
                best = run(h0)
                for _ in range(self.n_restarts):
                    # restarts around the start, 1 (sd) in log space, within the bounds
                    start = np.clip(np.mean(np.atleast_2d(h0), axis=0) + rng.standard_normal(lo.size), lo, hi)
                    start = np.broadcast_to(start, h0.shape).copy() if h0.ndim == 2 else start
                    trial = run(start)
                    if trial[1] > best[1]:
                        best = trial
            except KeyboardInterrupt:
                raise monitor.interrupted("during EM-EP" if method == "emep" else "during ML-II",
                                          h0.shape) from None
            h0, _, out, notes = best
            if method == "emep":
                emep = out
                eps = float(emep.eps)
                res = emep.result
                n_iter, converged = emep.n_iter, bool(emep.converged)
            else:
                n_iter, converged = int(out.nit), bool(out.success)
            if self.hyp_prior is not None:
                notes.pop("plateau", None)
            for note in notes.values():     # of the best run: a start on the plateau is what restarts are for
                warnings.warn("GPClassifier.fit: ML-II " + note, RuntimeWarning, stacklevel=3)
        log_hyp = np.ascontiguousarray(h0, dtype=float)
        class_hyp = (np.tile(log_hyp, (C, 1)) if multiclass and method == "laplace" and log_hyp.ndim == 1
                     else log_hyp)
        if res is not None and sub is not None:
            res = None                   # EM-EP's sites belong to the subset
        # ML-II's last sites at the log_hyp found start EP there (a sweep or two instead of ten)
        warm = (getattr(out, "warm", None) if self.optimize and method == "ep" and sub is None
                and res is None else None)
        try:
            # binary: the K of the approximation is the model's (kept for the predictions)
            K = None if multiclass else kernel_matrix.unchecked(kernel, X, X, log_hyp, discrete)
            if res is None:
                if monitor.show:
                    est = monitor.estimate
                    left = (f": expected about {_duration(est['seconds'] - est['seconds_ml2'])}" if est else "")
                    found = (f" with the log_hyp of {'EM-EP' if method == 'emep' else 'ML-II'} on {len(sub)}"
                             if sub is not None else "")
                    monitor.say(f"fitting at all n = {n}{left}{found}: log_hyp {np.round(log_hyp, 4).tolist()}")
                    started = monitor.clock()
                    monitor.final = (n, started)
                for start in (warm, None):          # as ml2: a failed warm start again cold
                    if multiclass:
                        _, _, res, _ = evidence(X, y_t, class_hyp, kernel, likelihood, method, start, False,
                                                discrete, eps)
                    else:
                        res = _binary_approximation(K, y_t, likelihood, method, start, eps)
                    if start is None or res.converged:
                        break
                if monitor.show:
                    monitor.say(f"the approximation at all n = {n} done in {_duration(monitor.clock() - started)}")
            if multiclass and method == "laplace":
                K = _class_kernels(kernel, X, class_hyp, discrete)
            elif multiclass:
                K = kernel_matrix.unchecked(kernel, X, X, log_hyp, discrete)
        except KeyboardInterrupt:
            raise monitor.interrupted(f"in the approximation at all n = {n}", log_hyp.shape,
                                      log_hyp) from None
        if not self.optimize:            # the iterations of the one approximation
            n_iter = int(res.n_iter if method == "laplace" else res.n_sweeps)
        monitor.done()
        _warn_not_converged(res, "GPClassifier.fit", None if multiclass else K, likelihood, stacklevel=4)
        if emep is not None and not emep.converged:
            warnings.warn(f"GPClassifier.fit: EM-EP did not converge in {emep.n_iter} rounds "
                          f"(tol {self.tol}); the last hyperparameters are used. EM-EP's rounds can "
                          f"creep up the evidence slowly: raise max_iter (e.g. max_iter="
                          f"{5 * max(int(self.max_iter), 1)}) or tol, or use method='ep' (ML-II on the "
                          f"same log Z_EP)", RuntimeWarning, stacklevel=3)
        # every fitted attribute is set here, at the end: a fit that fails leaves none
        self.kernel_, self.likelihood_, self.multiclass_, self.discrete_ = kernel, likelihood, multiclass, discrete
        self.seed_ = seed
        self.eps_ = eps
        self.emep_ = emep
        self.log_hyp_ = log_hyp
        self.X_train_ = X
        self.y_train_ = y_t
        self.K_ = K
        self.result_ = res
        self.n_iter_ = n_iter
        self.converged_ = converged
        self.ml2_subset_ = sub
        if multiclass and method == "laplace":
            self.G_ = multiclass_G.unchecked(res.E, res.M)  # M\E_c, reused by every prediction
        if multiclass and method != "laplace":   # multi-class EP: the fold of its predictions, reused by every one
            self.ep_fold_ = _ep_predict_fold(res.nu_tilde, res.tau_tilde, K, y_t, res.L)
        if method == "laplace":
            self.f_hat_ = res.f_hat
            self.log_marginal_likelihood_ = float(res.log_q)
        else:
            self.nu_tilde_ = res.nu_tilde
            self.tau_tilde_ = res.tau_tilde
            self.log_marginal_likelihood_ = float(res.log_Z)
        return self

    def _ml2_subset(self, idx, C, seed):
        """The sorted indices of max_ml2_n points drawn at random without replacement (a stream
        of its own from the fit's seed), every class kept: a class the draw missed gets one
        random point of it in place of a point of the largest class."""
        n, m = idx.shape[0], int(self.max_ml2_n)
        r = np.random.default_rng([seed, 1])
        sub = r.choice(n, m, replace=False)
        for c in range(C):
            if not np.any(idx[sub] == c):
                big = np.bincount(idx[sub], minlength=C).argmax()
                sub[np.flatnonzero(idx[sub] == big)[0]] = r.choice(np.flatnonzero(idx == c))
        return np.sort(sub)

    def _announce(self, n, m, C, method, multiclass, threads=None):
        """The fit's estimate of its time and peak memory (_fit_estimate), stated before it
        starts; MemoryError if the memory would not fit; the BLAS threads measured faster set
        for the fit (threads, a _FitThreads). Returns the _FitMonitor of the fit."""
        blocks = (C, 1) if multiclass and method == "laplace" else (1, C - 1) if multiclass else (1, 1)
        runs = 1 + int(self.n_restarts)
        outer = threads.outer if threads is not None else None
        est = _fit_estimate(n, m, blocks, method, bool(self.optimize), runs, True if self.verbose else None,
                            outer)
        show = bool(self.verbose) if self.verbose is not None else (
            est is not None and est["seconds"] >= _SLOW_FIT_SECONDS)
        rounds = method == "emep" and bool(self.optimize)
        # EM-EP's rounds count from 0 in each run (restarts), ML-II's evaluations across the runs
        monitor = _FitMonitor(show, (est["evaluations"] // runs if rounds else est["evaluations"]) if est else None,
                              rounds=rounds)
        monitor.estimate = est
        monitor.optimize = bool(self.optimize)
        if threads is not None and show:
            threads.tick(monitor)
        if (est is None or not est["measured"]) and outer is not None and outer > 1 and blocks[1] > 1 \
                and blocks[1] * n >= _MC_EP_THREADS_FROM:
            # multi-class EP's N x N sweeps on small X (which held one thread): the faster count,
            # at most the user's
            threads.limit(_machine_speed(outer)[2] or outer)
        if est is None:
            return monitor
        what = ("EM-EP" if method == "emep" else "ML-II") if self.optimize else None
        on = f" on a random subset of {m}" if m < n else " on all n"
        statement = (f"n = {n}, method {method!r}: expected about {_duration(est['seconds'])} on this machine"
                     + (f" ({what}{on}: about {monitor.expected} {'rounds' if rounds else 'evaluations'}, "
                        f"{_duration(est['seconds_ml2'])}; then the approximation at all n)" if what else "")
                     + f", peak memory about {_gib(est['peak_bytes'])}")
        have = _memory_available()
        size = blocks[1]
        if have and est["peak_bytes"] > have:
            per = 8.0 * blocks[0] * (size * n) ** 2
            if est["final_bytes"] <= have:
                k = _PEAK_ARRAYS["laplace" if method == "laplace" else "ep"][0]
                m_fit = int(math.sqrt(have / (8.0 * blocks[0] * k)) / size) // 100 * 100
                instead = (f"ML-II on all n needs more than the approximation at all n: pass max_ml2_n="
                           f"{m_fit} (ML-II on a random subset of {m_fit}, then the approximation at all n)")
            else:
                k = _PEAK_ARRAYS["laplace" if method == "laplace" else "ep"][1]
                n_fit = int(math.sqrt(have / (8.0 * blocks[0] * k)) / size) // 100 * 100
                instead = (f"fit a random subset of at most {n_fit} rows instead (and set max_ml2_n for "
                           f"ML-II), or use a machine with more memory")
            raise MemoryError(f"GPClassifier.fit: {statement}, more than the {_gib(have)} of memory available "
                              f"(the fit keeps n x n float64 matrices of {_gib(per)} each); not started: "
                              f"{instead}")
        if threads is not None and est["threads"] is not None:
            threads.limit(est["threads"])
        elif threads is not None and est["measured"] and outer is not None and outer > 1:
            threads.limit(outer)            # all were faster, and the fit had held one (small X)
        if show:
            blas = "all BLAS threads" if est["threads"] is None else f"{est['threads']} BLAS thread"
            monitor.say(statement + (f" ({_gib(have)} available)" if have else "")
                        + f"; {blas} (measured faster now)")
        if self.optimize and est["seconds_ml2"] >= _LONG_FIT_SECONDS:
            hint = ""
            m_alt = 1000 if method == "emep" else 2000      # EM-EP: about 40 rounds of EP and eq. 31
            if m > m_alt:
                alt = _fit_estimate(n, m_alt, blocks, method, True, runs)
                hint = (f" max_ml2_n={m_alt} ({what} on a random subset of {m_alt}, then the approximation "
                        f"at all n) is expected to take about {_duration(alt['seconds'])}.")
            if self.max_ml2_n is None and est["seconds_ml2"] >= _REFUSE_ML2_SECONDS:
                raise RuntimeError(f"GPClassifier.fit: {statement}; not started: {what} on all n would take "
                                   f"over {_duration(_REFUSE_ML2_SECONDS)}.{hint} To run {what} on all n "
                                   f"anyway, pass max_ml2_n={n}; or give log_hyp with optimize=False")
            warnings.warn(f"GPClassifier.fit: {statement}.{hint} Ctrl-C stops the fit, and its message "
                          "gives the best log_hyp so far", RuntimeWarning, stacklevel=4)
        return monitor

    def _checked_bounds(self, kernel, d):
        """self.bounds as a list of (low, high), one per log-hyperparameter of one class."""
        p = n_hyp(kernel, d)
        try:
            b = np.asarray(self.bounds, dtype=float)
        except (TypeError, ValueError):
            b = None
        if b is None or b.shape != (p, 2):
            raise ValueError(f"GPClassifier.fit: bounds must have shape ({p}, 2), one (low, high) pair per "
                             f"log-hyperparameter of kernel {kernel!r} on {d} inputs, got "
                             f"{'shape ' + str(b.shape) if b is not None else _brief(self.bounds)}")
        if np.any(np.isnan(b)) or np.any(b[:, 0] > b[:, 1]):
            i = int(np.argmax(np.isnan(b).any(axis=1) | (b[:, 0] > b[:, 1])))
            raise ValueError(f"GPClassifier.fit: bounds must be (low, high) pairs with low <= high, got "
                             f"{tuple(b[i])} at {i}")
        return [tuple(map(float, r)) for r in b]

    def _class_hyp(self, h):
        """Log-hyperparameters as the numba layer wants them: (C, p) for multi-class Laplace."""
        if not self.multiclass_ or self.method != "laplace":
            return h
        return np.tile(h, (self.classes_.shape[0], 1)) if h.ndim == 1 else h

    def _check_fitted(self):
        from sklearn.utils.validation import check_is_fitted

        check_is_fitted(self, "log_hyp_")

    def _X_test(self, X, where):
        from sklearn.utils.validation import validate_data

        self._check_fitted()
        _check_frame(X, where)
        X = _named_errors(where, validate_data, self, X, reset=False, dtype=np.float64, order="C")
        return X if X.flags.writeable else X.copy()

    def predict_latent(self, X):
        """Latent predictive mean and variance at the rows of X.

        Binary: mean (3.21 / 3.60) and variance (3.24 / 3.61), each (m,).
        Multi-class: means (3.41; K&G 51), shape (m, C), and covariances
        (3.43), (m, C, C).
        """
        return self._latent(X, "GPClassifier.predict_latent")

    def _latent(self, X, where):
        _, f_bar, V = self._predict(X, "average", where)
        if self.multiclass_:
            return f_bar.T.copy(), V
        return f_bar, V

    def _predict(self, X, rule, where):
        X = self._X_test(X, where)
        disc = self.discrete_
        # the arguments below were built and checked by fit and _X_test: the calls skip the
        # checks of the public entries (which would factorise K again, once per class)
        if self.multiclass_:
            hyp = self._class_hyp(self.log_hyp_)
            if self.method != "laplace":
                K_star = kernel_matrix.unchecked(self.kernel_, self.X_train_, X, hyp, disc)
                kss = kernel_diag.unchecked(self.kernel_, X, hyp)
                # ep_predict_multiclass (defaults n_points 128, seed 0, abseps 1e-5), with the
                # folded training matrices of the fit (formed here for a model pickled without them)
                fold = getattr(self, "ep_fold_", None)
                if fold is None:
                    fold = _ep_predict_fold(self.nu_tilde_, self.tau_tilde_, self.K_, self.y_train_,
                                            self.result_.L)
                with _blas_threads_for([self.X_train_, X]):   # (n, n) products: one BLAS thread below n ~ 1500
                    p, f_bar, V, _, _ = _ep_predict_folded(fold[0], fold[1], K_star, kss, 128, 0, 1e-5)
                return p, f_bar, V
            ks = [kernel_matrix.unchecked(self.kernel_, self.X_train_, X, hyp[0], disc)]
            for h in hyp[1:]:   # classes that share the first class's hyperparameters share its matrix
                ks.append(ks[0] if np.array_equal(h, hyp[0]) else
                          kernel_matrix.unchecked(self.kernel_, self.X_train_, X, h, disc))
            K_star = np.stack(ks)
            kss = np.stack([kernel_diag.unchecked(self.kernel_, X, h) for h in hyp])
            return laplace_predict_multiclass.unchecked(self.K_, self.y_train_, self.result_.f_hat, K_star,
                                                        kss, self.n_samples,
                                                        getattr(self, "seed_", self.random_state),
                                                        self.result_.E, self.result_.M,
                                                        getattr(self, "G_", None))   # None: a model pickled before G_
        K_star = kernel_matrix.unchecked(self.kernel_, self.X_train_, X, self.log_hyp_, disc)
        kss = kernel_diag.unchecked(self.kernel_, X, self.log_hyp_)
        if self.method != "laplace":
            p, f_bar, V = ep_predict.unchecked(self.nu_tilde_, self.tau_tilde_, self.K_, K_star, kss,
                                               self.result_.L, self.likelihood_, self.eps_)
            if rule == "map":
                from scipy.special import ndtr
                noise = LIKELIHOODS[self.likelihood_].ep_noise     # EP's site: a step of f + N(0, noise)
                P = ndtr(f_bar / math.sqrt(noise)) if noise > 0 else (f_bar > 0).astype(float)
                p = self.eps_ + (1.0 - 2.0 * self.eps_) * P
            return p, f_bar, V
        return laplace_predict.unchecked(self.f_hat_, self.K_, self.y_train_, self.likelihood_,
                                         K_star, kss, rule, self.result_.L)

    def predict_proba(self, X, rule="average"):
        """Class probabilities, shape (m, C), columns in the order of classes_.

        Binary, rule: 'average' (3.25, default), 'map' or 'mackay' (section
        3.4.2). Multi-class Laplace: Monte Carlo averages of the softmax
        (Algorithm 3.4) with n_samples samples, seeded by random_state.
        Multi-class EP: the orthant probabilities of K&G eq. 50
        (ep_predict_multiclass with its defaults: each to a standard error of about
        1e-5; the class of the largest mean as 1 - the others, so that every row
        sums to 1 to rounding).
        """
        return self._proba(X, rule, "GPClassifier.predict_proba")

    def _proba(self, X, rule, where):
        _check_choice(rule, "rule", ("average", "map", "mackay"), where)
        self._check_fitted()
        if self.multiclass_:
            if rule != "average":
                raise ValueError(f"{where}: rule must be 'average' for a multi-class model, got {rule!r}")
            p, _, _ = self._predict(X, rule, where)
            return p.T.copy()
        if rule == "mackay" and LIKELIHOODS[self.likelihood_].average != "logistic":
            raise ValueError(f"{where}: rule 'mackay' is for the logistic likelihood, got likelihood "
                             f"{self.likelihood_!r}")
        p, _, _ = self._predict(X, rule, where)
        return np.column_stack([1.0 - p, p])

    def predict(self, X):
        """Most probable class of each row of X (the same for all rules, section 3.4.2)."""
        self._check_fitted()
        if self.multiclass_:
            return self.classes_[np.argmax(self._proba(X, "average", "GPClassifier.predict"), axis=1)]
        f_bar, _ = self._latent(X, "GPClassifier.predict")
        return self.classes_[(f_bar > 0).astype(int)]

    def log_marginal_likelihood(self, log_hyp=None, eval_gradient=False):
        """Approximate log evidence at log_hyp (default: the fitted one), with its gradient."""
        self._check_fitted()
        d = self.X_train_.shape[1]
        if log_hyp is None:
            h = self.log_hyp_
        elif self.log_hyp_.ndim == 2:
            h = np.stack([_named_errors("GPClassifier.log_marginal_likelihood", _check_log_hyp, r, self.kernel_, d)
                          for r in np.asarray(log_hyp, dtype=float)])
        else:
            h = _named_errors("GPClassifier.log_marginal_likelihood", _check_log_hyp, log_hyp, self.kernel_, d)
        v, g, _, _ = evidence(self.X_train_, self.y_train_, self._class_hyp(h), self.kernel_,
                              self.likelihood_, self.method, None, eval_gradient, self.discrete_,
                              self.eps_)
        if eval_gradient and self.multiclass_ and self.method == "laplace" and h.ndim == 1:
            g = g.sum(axis=0)  # shared hyperparameters: sum of the per-class gradients
        return (v, g) if eval_gradient else v


_GPClassifier = GPClassifier       # the body; gpclab.GPClassifier is made from it on first use
del GPClassifier


def exact_log_evidence_probit(K, y, releps=1e-5, abseps=1e-14, maxpts=None):
    """The exact log p(y|X) of the probit model, for small n (up to about 15).

    With Gaussian latent noise e ~ N(0, I), the probit likelihood is a step
    function of f + e (GPML section 3.3), so p(y|X) is the orthant probability
    P(y_i (f_i + e_i) > 0 for all i) with f + e ~ N(0, K + I): the normal cdf
    at 0 of N(0, D (K + I) D), D = diag(y). Computed by scipy's
    multivariate normal cdf (Genz's quasi-Monte Carlo method; exact
    bivariate formulas for n = 2): a test oracle and a teaching tool. The
    error of the returned log probability is about releps for n > 2
    (measured: below 1e-4 at n = 10, about a second); maxpts defaults to
    1e5 n. Returns the log probability.
    """
    from scipy.stats import multivariate_normal

    where = "exact_log_evidence_probit"
    ctx = _Context(where)
    releps = _SCALARS["nonneg"](releps, "releps", ctx)
    abseps = _SCALARS["nonneg"](abseps, "abseps", ctx)
    if maxpts is not None:
        maxpts = _SCALARS["count"](maxpts, "maxpts", ctx)
    K = np.asarray(K, dtype=float)
    y = np.asarray(y, dtype=float)
    if y.ndim != 1:
        raise ValueError(f"{where}: y must be 1-D, got shape {y.shape}")
    n = y.shape[0]
    if K.shape != (n, n):
        raise ValueError(f"{where}: K must have shape ({n}, {n}) to match y, got {K.shape}")
    if not np.all(np.isfinite(K)):
        raise ValueError(f"{where}: K must be finite")
    if not np.allclose(K, K.T, rtol=0.0, atol=1e-8 * max(np.max(np.abs(K)), 1e-300)):
        i, j = np.unravel_index(np.argmax(np.abs(K - K.T)), K.shape)
        raise ValueError(f"{where}: K must be symmetric, got K[{i}, {j}] = {K[i, j]:g} but K[{j}, {i}] = "
                         f"{K[j, i]:g}")
    if not np.all((y == 1) | (y == -1)):
        raise ValueError(f"{where}: y must contain only -1 and +1")
    if n > 25:
        raise ValueError(f"exact_log_evidence_probit is for small problems (n <= 25), got n = {n}")
    C = (K + np.eye(n)) * np.outer(y, y)
    if maxpts is None:
        maxpts = 100_000 * n
    p = multivariate_normal.cdf(np.zeros(n), mean=np.zeros(n), cov=C, maxpts=maxpts,
                                abseps=abseps, releps=releps, rng=np.random.default_rng(0))
    if not p > 0:
        raise ValueError("the orthant probability underflowed: the problem is too large or K too extreme")
    return float(np.log(p))


@public(kernel="{se,ard,kg,kg_iso}", likelihood=_EP_LIKELIHOOD_SPEC, X="X", y="(n,) pm1 nonempty", log_hyp="(p,) loghyp",
        eval_gradient="bool", discrete="(d,) flags ?", eps="eps", tol="nonneg")
def ep_evidence(X, y, log_hyp, kernel="se", sites=None, eval_gradient=True, discrete=None,
                likelihood="probit", eps=0.0, tol=1e-9):
    """EP log Z_EP (3.65) and its gradient in log_hyp (K&R 51).

    y must be -1/+1. sites: optional (nu_tilde, tau_tilde) warm start.
    likelihood 'probit' (3.16) or 'step' with labelling noise eps (K&G 10).
    tol: ep's convergence tolerance. Returns (log_Z, grad, result) with
    result the EPResult of ep.
    """
    K = kernel_matrix.unchecked(kernel, X, X, log_hyp, discrete)
    res = _ep_or_raise(K, y, sites, tol, likelihood, eps)
    grad = None
    if eval_gradient:
        grad = ep_log_Z_grad.unchecked(K, X, kernel, log_hyp, res.nu_tilde, res.tau_tilde, res.L, discrete)
    return res.log_Z, grad, res


@public(kernel="{se,ard,kg,kg_iso}", X="X", Y="(J, n) onehot nonempty", log_hyp="(p,) loghyp", eval_gradient="bool",
        discrete="(d,) flags ?")
def multiclass_ep_evidence(X, Y, log_hyp, kernel="kg", sites=None, eval_gradient=True,
                           discrete=None, tol=1e-9):
    """Multi-class EP log Z_EP on K&G's difference latents and its gradient in log_hyp.

    Y one-hot (J, n); log_hyp (p,), one covariance function for all classes
    (K&G 38); sites (nu~, tau~) a warm start; tol ep_multiclass's tolerance. The
    gradient is eq. 31 at the EP fixed point, which equals d log Z_EP / d log_hyp
    there (K&G Theorem 1), computed from the sites and L (_ep_log_Z_grad_multiclass).
    Returns (log_Z, grad, result).

    EP runs ep_multiclass's sweeps and convergence test, and returns log Z_EP
    of the sweep that passed the test (line 13's L, Sigma's diagonal and mu as
    the rank-one updates left them: within 1e-10 of ep_multiclass's, 1e-7 at
    extreme hyperparameters), without forming Sigma again from the final sites
    (2 N^3 for N = n (J - 1)); after a sweep of large site changes (above 1,
    relative) Sigma's diagonal and mu are first checked for drift, as
    ep_multiclass always checks them:
    result.Sigma is empty, shape (0, 0) (ep_multiclass returns it).
    """
    C = kernel_matrix.unchecked(kernel, X, X, log_hyp, discrete)
    N = Y.shape[1] * (Y.shape[0] - 1)
    nu0, tau0 = (np.zeros(N), np.zeros(N)) if sites is None else sites
    try:
        res = EPResult(*_ep_multiclass_run(C, Y, nu0, tau0, tol, 100, True))
    except np.linalg.LinAlgError as e:
        raise _factorisation_failed("multiclass_ep_evidence", "ep_multiclass", e, [("C", C)]) from None
    grad = None
    if eval_gradient:
        disc = np.zeros(X.shape[1]) if discrete is None else np.asarray(discrete, dtype=float)
        grad = _ep_log_Z_grad_multiclass(C, Y, X, kernel, log_hyp, res.nu_tilde, res.tau_tilde, res.L, disc)
    return res.log_Z, grad, res


@public(K="(n, n) sym", y="(n,) pm1 nonempty", likelihood=_LIKELIHOOD_SPEC, m="(n,)", A="(n, n) sym")
def lower_bound(K, y, likelihood, m, A):
    """Jensen lower bound on log p(y|X) for any Gaussian q(f) = N(m, A) (K&R eq. 35).

    For example m, A = the EP posterior (mu, Sigma), or the Laplace mode and
    (K^-1 + W)^-1. See _lower_bound for the formula. K and A must be
    positive definite (add jitter to a nearly singular K).
    """
    try:
        return _lower_bound(K, y, likelihood, m, A)
    except np.linalg.LinAlgError:
        for name, M in (("K", K), ("A", A)):
            try:
                np.linalg.cholesky(M)
            except np.linalg.LinAlgError:
                raise ValueError(f"{name} must be positive definite for the lower bound "
                                 "(add a little jitter to its diagonal)") from None
        raise


def information_bits(p_star, y_test, y_train):
    """Average information about the test targets in bits (K&R eq. 34, GPML 3.76).

    mean over test cases of log2 p(y_*) plus the base line of GPML (3.76): the
    bits a model that ignores the inputs and predicts the training class
    frequencies would need. 0 is no better than that, 1 (for balanced
    classes) is perfect, confident classification.

    p_star : probabilities of class +1; y_test, y_train : -1/+1 labels.
    A test case given probability 0 for its class (p = 0 for a +1, p = 1 for
    a -1) costs infinitely many bits: the result is -inf. Refused with a
    ValueError: empty p_star, y_test or y_train, and y_train of one class
    (the base line would give the other class probability 0).
    """
    p = np.asarray(p_star, dtype=float)
    yt = np.asarray(y_test, dtype=float)
    ytr = np.asarray(y_train, dtype=float)
    if p.shape != yt.shape:
        raise ValueError(f"information_bits: p_star and y_test must have the same shape, got {p.shape} "
                         f"and {yt.shape}")
    if p.size == 0:
        raise ValueError("information_bits: p_star and y_test must not be empty")
    for name, v in (("y_test", yt), ("y_train", ytr)):
        if not np.all((v == 1) | (v == -1)):
            raise ValueError(f"information_bits: {name} must contain only -1 and +1")
    if not (np.any(ytr > 0) and np.any(ytr < 0)):
        raise ValueError(f"information_bits: y_train must hold both classes, -1 and +1, got "
                         f"{ytr.size} label(s) of {np.unique(ytr).tolist()}: the base line (3.76) "
                         "predicts the training frequencies and would give the other class probability 0")
    if np.any((p < 0) | (p > 1)) or not np.all(np.isfinite(p)):
        raise ValueError("information_bits: p_star must be probabilities in [0, 1]")
    with np.errstate(divide="ignore"):
        ll = np.where(yt > 0, np.log2(p), np.log2(1.0 - p))
    q1 = np.mean(ytr > 0)
    f1 = np.mean(yt > 0)
    base = -f1 * np.log2(q1) - (1 - f1) * np.log2(1 - q1)
    return float(np.mean(ll) + base)


def information_bits_multiclass(P, y_test, y_train):
    """Average information about the test targets in bits, C classes (K&R 34, GPML 3.76).

    P : (m, C) predicted class probabilities; y_test, y_train : class indices
    0..C-1. Mean log2 P[i, y_test[i]] plus the bits of the base line that
    predicts the training class frequencies (3.76). log2 C is perfect,
    confident classification for balanced classes; 0 is no better than the
    base line. A test case given probability 0 for its class gives -inf.
    Refused with a ValueError: empty input, rows of P that do not sum to 1,
    and a class of y_test that y_train lacks (the base line would give it
    probability 0).
    """
    P = np.asarray(P, dtype=float)
    yt = np.asarray(y_test)
    ytr = np.asarray(y_train)
    if P.ndim != 2 or P.shape[0] != yt.shape[0]:
        raise ValueError(f"information_bits_multiclass: P must have shape (len(y_test), C), got {P.shape}")
    if yt.size == 0 or ytr.size == 0:
        raise ValueError("information_bits_multiclass: P, y_test and y_train must not be empty")
    C = P.shape[1]
    for name, v in (("y_test", yt), ("y_train", ytr)):
        if v.ndim != 1 or not np.issubdtype(v.dtype, np.integer) or v.min() < 0 or v.max() >= C:
            raise ValueError(f"information_bits_multiclass: {name} must be class indices 0..{C - 1}")
    if np.any((P < 0) | (P > 1)) or not np.all(np.isfinite(P)):
        raise ValueError("information_bits_multiclass: P must be probabilities in [0, 1]")
    bad = np.flatnonzero(np.abs(P.sum(axis=1) - 1.0) > 1e-6)
    if bad.size:
        raise ValueError(f"information_bits_multiclass: each row of P must sum to 1 (the class "
                         f"probabilities of one test case), got {P[bad[0]].sum():.6g} in row {bad[0]}")
    q = np.bincount(ytr, minlength=C) / ytr.shape[0]
    f = np.bincount(yt, minlength=C) / yt.shape[0]
    missing = np.flatnonzero((f > 0) & (q == 0))
    if missing.size:
        raise ValueError(f"information_bits_multiclass: y_test holds class(es) {missing.tolist()} that "
                         "y_train lacks: the base line (3.76) predicts the training frequencies and "
                         "would give them probability 0")
    with np.errstate(divide="ignore"):
        ll = np.log2(P[np.arange(yt.shape[0]), yt])
        base = -np.sum(np.where(f > 0, f * np.log2(np.where(q > 0, q, 1.0)), 0.0))
    return float(np.mean(ll) + base)


def error_reject_curve(p_star, y_test, y_train=None):
    """Error rate (and information) on the test cases kept, as rejections grow (GPML Figure 3.10).

    A case is rejected when its larger class probability max(p, 1 - p) is
    below a threshold; the thresholds run over the distinct confidences, so
    cases of equal confidence are kept or rejected together. p_star : (m,)
    probabilities of class +1; y_test, y_train : -1/+1 labels.

    Returns a dict of arrays, one entry per threshold from the most to the
    least confident: 'reject' (fraction of test cases rejected, ending at 0),
    'error' (error rate among the cases kept) and, with y_train,
    'information' (information_bits of the cases kept).
    """
    p = np.asarray(p_star, dtype=float)
    yt = np.asarray(y_test, dtype=float)
    if p.ndim != 1 or p.shape != yt.shape or p.size == 0:
        raise ValueError(f"error_reject_curve: p_star and y_test must be non-empty 1-D arrays of one shape, got {p.shape} and {yt.shape}")
    if not np.all((yt == 1) | (yt == -1)):
        raise ValueError("error_reject_curve: y_test must contain only -1 and +1")
    if not np.all(np.isfinite(p)) or np.any((p < 0) | (p > 1)):
        raise ValueError("error_reject_curve: p_star must be probabilities in [0, 1]")
    conf = np.maximum(p, 1.0 - p)
    order = np.argsort(-conf, kind="stable")                  # most confident first
    wrong = (np.where(p > 0.5, 1.0, -1.0) != yt)[order]
    m = p.size
    # the last case of each group of equal confidence: keeping it keeps the whole group
    ends = np.flatnonzero(np.append(np.diff(conf[order]) != 0, True))
    kept = ends + 1
    out = {"reject": 1.0 - kept / m, "error": np.cumsum(wrong)[ends] / kept}
    if y_train is not None:
        out["information"] = np.array([information_bits(p[order[:k]], yt[order[:k]], y_train) for k in kept])
    return out


def _cv_fold(X, y, test, method, likelihood, log_hyp0, max_iter):
    """One fold of cross_validate (module level so that a process pool can pickle it)."""
    train = np.setdiff1d(np.arange(y.shape[0]), test)
    mu, sd = X[train].mean(axis=0), X[train].std(axis=0)
    sd = np.where(sd > 0, sd, 1.0)
    Xtr, Xte = (X[train] - mu) / sd, (X[test] - mu) / sd
    GPClassifier = _estimator()          # gpclab.GPClassifier, made on first use (Part III)
    model = GPClassifier(kernel="se", likelihood=likelihood, method=method, log_hyp=log_hyp0,
                         max_iter=max_iter).fit(Xtr, y[train])
    p = model.predict_proba(Xte)[:, 1]                   # classes_[1] is +1
    m = model.f_hat_ if method == "laplace" else model.result_.mu
    return {"error": float(np.mean(np.where(p > 0.5, 1.0, -1.0) != y[test])),
            "information": information_bits(p, y[test], y[train]),
            "norm_m": float(np.linalg.norm(m)), "log_hyp": model.log_hyp_,
            "log_evidence": model.log_marginal_likelihood_}


def cross_validate(X, y, method="laplace", likelihood="probit", n_folds=10, seed=0, log_hyp0=None,
                   max_iter=200, executor=None):
    """K-fold cross-validation with ML-II on each fold, as in Kuss & Rasmussen's Table 1 (K&R 7.5).

    Squared exponential covariance (K&R 33). The cases are shuffled with
    `seed` and cut into n_folds folds (np.array_split); each fold in turn is
    the test set of a model whose inputs are standardised with the other
    folds' mean and s.d. and whose (log l, log sf) maximise the approximate
    log evidence of `method` ('laplace' or 'ep') from log_hyp0 (default:
    l = sqrt(d), sf = e, a length-scale of the order of the distance between
    standardised inputs). executor: None (folds in turn) or a
    concurrent.futures-style Executor
    (ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")),
    or a dask Client.get_executor()): one task per fold, results collected in fold
    order, identical to the serial run.

    Returns a dict of (n_folds,) arrays: 'error' (the test error rate E,
    thresholding p at 1/2), 'information' (bits, K&R 34: information_bits),
    'norm_m' (||m||, the length of the mean of q(f|D) on the training cases:
    Laplace's mode, EP's mu), 'log_evidence', and 'log_hyp' (n_folds, 2);
    'folds' lists the test indices of each fold.
    """
    _check_choice(method, "method", ("laplace", "ep"), "cross_validate")
    _check_choice(likelihood, "likelihood", _LAPLACE_LIKELIHOODS, "cross_validate")
    if method == "ep" and likelihood != "probit":
        raise ValueError(f"cross_validate: method 'ep' needs likelihood 'probit', got likelihood={likelihood!r}")
    ctx = _Context("cross_validate")
    seed = _SCALARS["seed"](seed, "seed", ctx)
    max_iter = _SCALARS["count"](max_iter, "max_iter", ctx)
    _check_executor(executor, "cross_validate")
    X = _check("X", X, "X", "cross_validate")
    y_pm, _ = binary_labels(y, "y", "cross_validate")
    n = X.shape[0]
    if y_pm.shape[0] != n:
        raise ValueError(f"cross_validate: X and y must have the same number of samples, got {n} and {y_pm.shape[0]}")
    if not isinstance(n_folds, (int, np.integer)) or not 2 <= n_folds <= n:
        raise ValueError(f"cross_validate: n_folds must be an integer from 2 to the number of samples ({n}), got {n_folds!r}")
    h0 = (np.array([0.5 * np.log(X.shape[1]), 1.0]) if log_hyp0 is None
          else _check_log_hyp(log_hyp0, "se", X.shape[1], "log_hyp0", "cross_validate"))
    folds = np.array_split(np.random.default_rng(seed).permutation(n), n_folds)
    args = [(X, y_pm, test, method, likelihood, h0, max_iter) for test in folds]
    if executor is None:
        results = [_cv_fold(*a) for a in args]
    else:
        futures = [executor.submit(_cv_fold, *a) for a in args]
        results = [fut.result() for fut in futures]
    out = {key: np.array([r[key] for r in results])
           for key in ("error", "information", "norm_m", "log_evidence", "log_hyp")}
    out["folds"] = folds
    return out


def _progress(iterable, total, progress, desc):
    if not progress:
        return iterable
    from tqdm.auto import tqdm
    return tqdm(iterable, total=total, desc=desc)


@public(X="X", kernel="{se}", likelihood=_ANY_LIKELIHOOD_SPEC, method="{laplace,ep,emep}",
        n_samples="count", seed="seed", progress="bool")
def evidence_grid(X, y, log_ell, log_sf, kernel="se", likelihood="logistic", method="laplace",
                  X_test=None, y_test=None, progress=True, n_samples=1000, seed=0, executor=None):
    """Approximate log evidence on a grid of (log l, log sf), for contour figures.

    method 'laplace' gives log q (3.32), 'ep' log Z_EP (3.65); with more
    than two classes in y, the multi-class Laplace log q (3.44), the same
    (l, sf) for every class (GPML Figure 3.11). Returns a dict of arrays of
    shape (len(log_sf), len(log_ell)): 'log_q' always; with X_test and
    y_test also 'information' (bits: information_bits, or
    information_bits_multiclass with n_samples Monte Carlo samples seeded
    by seed) and 'error' (test error rate). Rows run over log_sf, columns
    over log_ell, as plt.contour(log_ell, log_sf, Z) expects. Newton's
    method (or EP) warm-starts from the neighbouring grid point of its row. A point
    where the approximation has no value (B has no Cholesky factor, as when
    K is not positive definite in floating point at a huge signal variance)
    is nan in every array; one warning names the failed points, another
    those where Newton's method or EP did not converge.

    executor: a concurrent.futures-style executor (anything with
    submit(fn, *args) returning a future with .result()), e.g.
    ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn"))
    (a fork pool works too: a worker forked after numba's threads started
    runs them serially) or, on a cluster,
    dask.distributed's Client(...).get_executor(). Each row of the grid is
    one task (the warm starts run along a row, from its first column, in
    the serial run too), so the result is identical to executor=None.
    Workers run numba with one thread each. See the README, "Running grids
    on a cluster".
    """
    if method == "ep" and likelihood != "probit":
        raise ValueError(f"evidence_grid: method 'ep' needs likelihood 'probit', got likelihood={likelihood!r}")
    _check_executor(executor, "evidence_grid")
    idx, classes = class_labels(y, "y", "evidence_grid")
    C = classes.shape[0]
    multi = C > 2
    if multi and (method != "laplace" or likelihood != "logistic"):
        raise ValueError(f"evidence_grid: y has {C} classes: the multi-class grid is for method='laplace', "
                         "likelihood='logistic' (softmax)")
    y_pm = one_hot(idx, C) if multi else np.where(idx == 1, 1.0, -1.0)
    if idx.shape[0] != X.shape[0]:
        raise ValueError(f"evidence_grid: X and y must have the same number of samples, got {X.shape[0]} and {y_pm.shape[0]}")
    log_ell = np.atleast_1d(np.asarray(log_ell, dtype=float))
    log_sf = np.atleast_1d(np.asarray(log_sf, dtype=float))
    for name, v in (("log_ell", log_ell), ("log_sf", log_sf)):
        if v.ndim != 1 or v.size == 0 or not np.all(np.isfinite(v)):
            raise ValueError(f"evidence_grid: {name} must be a non-empty 1-D array of finite values")
    with_test = X_test is not None or y_test is not None
    if with_test:
        if X_test is None or y_test is None:
            raise ValueError("evidence_grid: X_test and y_test must be given together")
        X_test = _check("X", X_test, "X_test", "evidence_grid")
        if X_test.shape[1] != X.shape[1]:
            raise ValueError(f"evidence_grid: X_test must have {X.shape[1]} features, got {X_test.shape[1]}")
        y_test = np.asarray(y_test)
        if y_test.shape != (X_test.shape[0],):
            raise ValueError(f"evidence_grid: y_test must have one label per row of X_test, got shape {y_test.shape}")
        unknown = ~np.isin(y_test, classes)
        if unknown.any():
            raise ValueError(f"evidence_grid: y_test has a label not seen in y: {y_test[unknown][0]!r}")
        yt_idx = np.searchsorted(classes, y_test)
        yt_pm = np.where(yt_idx == 1, 1.0, -1.0)
    shape = (log_sf.size, log_ell.size)
    out = {"log_q": np.empty(shape)}
    if with_test:
        out["information"] = np.empty(shape)
        out["error"] = np.empty(shape)
    else:
        X_test = yt_idx = yt_pm = None
    task = (X, y_pm, idx, C, log_ell, kernel, likelihood, method, X_test, yt_idx, yt_pm, n_samples, seed)
    rows = _run_tasks(_evidence_grid_row, [task + (log_sf[i],) for i in range(shape[0])], executor,
                      progress, f"{method} evidence grid")
    failed, not_converged = [], []
    for i, (log_q, info, err, caught, row_failed, row_not_converged) in enumerate(rows):
        for message in caught:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        failed += row_failed
        not_converged += row_not_converged
        out["log_q"][i] = log_q
        if with_test:
            out["information"][i] = info
            out["error"][i] = err
    if failed:
        warnings.warn(f"evidence_grid: {len(failed)} point(s) marked nan, no approximation there: "
                      + "; ".join(failed), RuntimeWarning, stacklevel=2)
    if not_converged:
        warnings.warn(f"evidence_grid: {'EP' if method != 'laplace' else 'Newton'} did not converge at "
                      f"(log l, log sf) = {', '.join(not_converged)}; the last iterate is used there",
                      RuntimeWarning, stacklevel=2)
    return out


def _run_tasks(fn, tasks, executor, progress, desc):
    """[fn(*t) for t in tasks], serially or on a concurrent.futures-style executor.

    With an executor every task is submitted at once and the results are
    collected in the order of tasks; each task runs with one numba thread so
    that workers sharing a machine do not oversubscribe it. Both ways run
    the tasks with one BLAS thread: the Cholesky factor of a 180 x 180
    matrix differs in its last bits between one and two OpenBLAS threads,
    and dask's workers start with one.
    """
    if executor is None:
        return [_one_blas_thread(fn, t) for t in _progress(tasks, len(tasks), progress, desc)]
    futures = [executor.submit(_single_threaded, fn, t) for t in tasks]
    return [f.result() for f in _progress(futures, len(futures), progress, desc)]


_SPAWN_POOL = 'ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn"))'


def _check_executor(executor, where):
    """A concurrent.futures-style executor, or an error that says what to pass. A fork pool is
    fine, also after numba's threads have started here: its workers run numba's parallel code
    serially (_after_fork_in_child in Part III)."""
    if executor is None:
        return None
    if isinstance(executor, type):
        raise ValueError(f"{where}: executor must be an executor object, e.g. {_SPAWN_POOL}, "
                         f"got the class {executor.__name__} itself (call it)")
    if not callable(getattr(executor, "submit", None)):
        raise ValueError(f"{where}: executor must have a submit(fn, *args) method (a "
                         f"concurrent.futures.Executor such as {_SPAWN_POOL}, or dask's "
                         f"Client(...).get_executor()), got {type(executor).__name__}")
    return executor


def _one_blas_thread(fn, args):
    """fn(*args) with one BLAS thread."""
    from threadpoolctl import threadpool_limits
    with threadpool_limits(1):
        return fn(*args)


def _single_threaded(fn, args):
    """fn(*args) in an executor's worker, with one numba thread and one BLAS thread."""
    import numba
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        return _one_blas_thread(fn, args)
    finally:
        numba.set_num_threads(threads)


def _evidence_grid_row(X, y_pm, idx, C, log_ell, kernel, likelihood, method, X_test, yt_idx, yt_pm,
                       n_samples, seed, log_sf_i):
    """One row of evidence_grid (fixed log sf), warm-starting along it from its first column.

    Returns (log_q, information, error, warning messages, failed points, points
    not converged); a point without an approximation (no Cholesky factor) is nan."""
    multi = C > 2
    m = log_ell.size
    log_q = np.empty(m)
    info = np.full(m, np.nan)
    err = np.full(m, np.nan)
    warm = None
    failed, not_converged = [], []
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for j in range(m):
            h = np.array([log_ell[j], log_sf_i])
            hh = np.tile(h, (C, 1)) if multi else h
            try:
                v, _, res, warm = evidence(X, y_pm, hh, kernel, likelihood, method, warm, False)
            except ValueError as e:   # no Cholesky factor at this point: mark it, go on
                failed.append(f"(log l, log sf) = ({log_ell[j]:g}, {log_sf_i:g}): {e}")
                log_q[j] = info[j] = err[j] = np.nan
                warm = None
                continue
            _warn_skipped(res, "evidence_grid")
            if not res.converged:
                not_converged.append(f"({log_ell[j]:g}, {log_sf_i:g})")
            log_q[j] = v
            # built here from checked data: the predictions skip the public entries' checks
            if X_test is not None and multi:
                Kc = kernel_matrix.unchecked(kernel, X, X, h)
                Ks = kernel_matrix.unchecked(kernel, X, X_test, h)
                kss = kernel_diag.unchecked(kernel, X_test, h)
                P, _, _ = laplace_predict_multiclass.unchecked(
                    np.stack([Kc] * C), y_pm, res.f_hat, np.stack([Ks] * C), np.stack([kss] * C),
                    S=n_samples, seed=seed, E=res.E, M=res.M, G=multiclass_G.unchecked(res.E, res.M))
                info[j] = information_bits_multiclass(P.T, yt_idx, idx)
                err[j] = np.mean(np.argmax(P, axis=0) != yt_idx)
            elif X_test is not None:
                K = kernel_matrix.unchecked(kernel, X, X, h)
                K_star = kernel_matrix.unchecked(kernel, X, X_test, h)
                kss = kernel_diag.unchecked(kernel, X_test, h)
                if method == "laplace":
                    p, _, _ = laplace_predict.unchecked(res.f_hat, K, y_pm, likelihood, K_star, kss, L=res.L)
                else:
                    p, _, _ = ep_predict.unchecked(res.nu_tilde, res.tau_tilde, K, K_star, kss, L=res.L)
                info[j] = information_bits(p, yt_pm, y_pm)
                err[j] = np.mean(np.where(p > 0.5, 1.0, -1.0) != yt_pm)
    return (log_q, info, err, [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)],
            failed, not_converged)


# --- MCMC: the gold standard (K&R section 6, W&B section 3.2) ---------------------


_HEALTHY_ACCEPTANCE = (0.3, 0.995)


def _warn_acceptance(acc, where, what="HMC"):
    """Warn when an HMC acceptance rate says the step does not suit the target."""
    lo, hi = _HEALTHY_ACCEPTANCE
    if acc < lo:
        warnings.warn(f"{where}: {what} acceptance {acc:.3f} is below {lo}: the chain hardly moves; "
                      "use a smaller step (the default, step=None, follows the covariance)",
                      RuntimeWarning, stacklevel=3)
    elif acc > hi:
        warnings.warn(f"{where}: {what} acceptance {acc:.3f} is above {hi}: the step is needlessly "
                      "small and the chain moves slowly; use a larger step (or step=None)",
                      RuntimeWarning, stacklevel=3)


@public(X="X", kernel="{se,ard,kg,kg_iso}", log_hyp="(p,) loghyp", likelihood=_LIKELIHOOD_SPEC, n_samples="count",
        step="positive ?", n_leapfrog="count ?", burn_in="count0", thin="count", seed="seed", sampler="{hmc,elliptical}")
def mcmc_posterior(X, y, log_hyp, X_test=None, kernel="se", likelihood="probit", n_samples=2000,
                   step=None, n_leapfrog=None, burn_in=200, thin=1, seed=0, sampler="hmc"):
    """Posterior latent samples by HMC and MCMC predictions (K&R section 6.1).

    y: any two labels (classes_[1] is +1). step, n_leapfrog: as hmc_latent
    (default: hmc_step_size of K). Returns a dict with 'F' (n_samples, n)
    samples of the training latents, 'acceptance', 'ess' (effective sample
    size of the worst-mixing latent, hmc_latent), and with X_test 'p_test'
    (m,), the MCMC predictive probability of class +1 (mcmc_predict). Warns
    when the acceptance is outside 0.3-0.995. K carries the module's jitter,
    1e-8 of the largest prior variance on its diagonal.
    sampler: 'hmc' (K&R's) or 'elliptical' (elliptical_slice_latent, no step
    size, which mixes at large signal variances where HMC does not); with
    'elliptical' the dict holds 'evaluations' (likelihood evaluations per
    transition) instead of 'acceptance', and step and n_leapfrog are unused.
    """
    y_pm, classes = binary_labels(y, "y", "mcmc_posterior")
    if y_pm.shape[0] != X.shape[0]:
        raise ValueError(f"mcmc_posterior: X and y must have the same number of samples, got {X.shape[0]} and {y_pm.shape[0]}")
    h = log_hyp
    if sampler == "elliptical" and (step is not None or n_leapfrog is not None):
        raise ValueError("mcmc_posterior: step and n_leapfrog are for sampler 'hmc'; elliptical slice "
                         "sampling has no step size")
    K = kernel_matrix(kernel, X, X, h)
    if sampler == "elliptical":
        F, evaluations, ess = elliptical_slice_latent(K, y_pm, likelihood, n_samples, seed, burn_in, thin)
        out = {"F": F, "evaluations": evaluations, "classes": classes, "ess": ess}
    else:
        F, acc, ess = hmc_latent(K, y_pm, likelihood, n_samples, step, n_leapfrog, seed, burn_in, thin)
        _warn_acceptance(acc, "mcmc_posterior")
        out = {"F": F, "acceptance": acc, "classes": classes, "ess": ess}
    K = K + 1e-8 * np.max(np.diag(K)) * np.eye(X.shape[0])  # the jitter the samplers used
    if X_test is not None:
        X_test = _check("X", X_test, "X_test", "mcmc_posterior")
        p, _ = mcmc_predict(F, K, likelihood, kernel_matrix(kernel, X, X_test, h),
                            kernel_diag(kernel, X_test, h))
        out["p_test"] = p
    return out


def autocorrelation_time(x):
    """Integrated autocorrelation time of a chain, 1 + 2 sum_k rho_k (Geyer's initial positive sequence).

    The sum runs over pairs rho_2m + rho_2m+1 while they stay positive. A
    chain of N states carries about N / autocorrelation_time independent
    samples' worth of information about the mean.
    """
    x = np.asarray(x, dtype=float).ravel()
    N = x.size
    if N < 4 or not np.all(np.isfinite(x)):
        raise ValueError("x must be a finite chain of at least 4 states")
    x = x - x.mean()
    if not np.any(x):
        return 1.0
    fx = np.fft.rfft(x, 2 * N)
    acf = np.fft.irfft(fx * np.conj(fx))[:N]
    rho = acf / acf[0]
    tau = -1.0  # so that the first pair (rho_0 + rho_1) gives 1 + 2 rho_1
    for m in range(0, N // 2 - 1):
        pair = rho[2 * m] + rho[2 * m + 1]
        if pair <= 0:
            break
        tau += 2 * pair
    return float(max(tau, 1.0))


@public(K="(n, n) psd nonempty", likelihood=_LIKELIHOOD_SPEC)
def hmc_step_size(K, likelihood):
    """A leapfrog step for HMC on whitened latents: 1.5 / sqrt(1 + w lambda_max(K)).

    In g = L^-1 f the potential's curvature is at most 1 + w lambda_max(K),
    with w the largest W of the likelihood in the bulk of the posterior (1
    for probit, 1/4 for logistic); leapfrog is stable for steps below
    2 / sqrt(curvature). Returns (step, n_leapfrog) with a trajectory of
    length about 1.5, at most 50 steps: the default of hmc_latent,
    mcmc_posterior and (at each temperature) ais. Measured on 80 crabs cases
    at four (l, sf), both likelihoods: acceptance 0.56-0.98, largest
    autocorrelation time of a latent 2.8-5.5; a third of this step accepted
    0.97-1.00 with times up to 52.
    """
    step, n_leapfrog = _auto_step(float(np.linalg.eigvalsh(K)[-1]), likelihood, 1.0)
    return float(step), int(n_leapfrog)


@public(X="X", likelihood=_LIKELIHOOD_SPEC, log_ell="grid", log_sf="grid", T="count",
        R="count", n_leapfrog="count", seed="seed", progress="bool")
def ais_grid(X, y, log_ell, log_sf, likelihood="probit", T=8000, R=3, step="auto", n_leapfrog=10,
             seed=0, progress=True, executor=None):
    """AIS log p(y|X) (K&R Algorithm 3) on a grid of (log l, log sf), SE covariance.

    step 'auto' picks the step and number of leapfrog steps at each grid
    point and temperature (ais's default: the signal variance and the
    temperature change the stiffness by orders of magnitude); a number fixes
    them. Returns a dict of (len(log_sf), len(log_ell)) arrays 'log_Z', 'se'
    (its standard error), 'acceptance' and 'ess' (ais), laid out as
    evidence_grid's; one warning lists the points whose acceptance is
    outside 0.3-0.995.

    executor: a concurrent.futures-style executor, as in evidence_grid:
    ProcessPoolExecutor(mp_context=multiprocessing.get_context("spawn")), or
    dask.distributed's Client(...).get_executor() on a cluster. A fork pool
    works too: a worker forked after this process started numba's threads
    (any ais call) runs ais serially. Each grid point is one task, run with one numba thread
    (ais's runs then go one after the other in each worker instead of in
    threads); the result is identical to executor=None. Grid point (i, j)
    is seeded with seed + 1000 (i len(log_ell) + j).
    """
    _check_executor(executor, "ais_grid")
    y_pm, _ = binary_labels(y, "y", "ais_grid")
    if y_pm.shape[0] != X.shape[0]:
        raise ValueError(f"ais_grid: X and y must have the same number of samples, got {X.shape[0]} and {y_pm.shape[0]}")
    if not (isinstance(step, str) and step == "auto"):
        step = _SCALARS["positive"](step, "step", _Context("ais_grid"))
    shape = (log_sf.size, log_ell.size)
    last = seed + 1000 * (shape[0] * shape[1] - 1)
    if last >= 2 ** 31:
        raise ValueError(f"ais_grid: seed must leave room for the seeds of the grid points, seed + 1000 k "
                         f"for k < {shape[0] * shape[1]}: at most {2 ** 31 - 1 - (last - seed)}, got {seed}")
    out = {"log_Z": np.empty(shape), "se": np.empty(shape), "acceptance": np.empty(shape),
           "ess": np.empty(shape)}
    tasks = [(X, y_pm, likelihood, T, R, step, n_leapfrog, log_ell[j], log_sf[i],
              seed + 1000 * (i * shape[1] + j)) for i in range(shape[0]) for j in range(shape[1])]
    results = _run_tasks(_ais_grid_point, tasks, executor, progress, "AIS grid")
    lo, hi = _HEALTHY_ACCEPTANCE
    unhealthy = []
    for k, (lz, se, acc, ess) in enumerate(results):
        i, j = k // shape[1], k % shape[1]
        out["log_Z"][i, j] = lz
        out["se"][i, j] = se
        out["acceptance"][i, j] = acc
        out["ess"][i, j] = ess
        if not lo <= acc <= hi:
            unhealthy.append(f"({log_ell[j]:g}, {log_sf[i]:g}): {acc:.3f}")
    if unhealthy:
        warnings.warn(f"ais_grid: HMC acceptance outside {lo}-{hi} at (log l, log sf) = "
                      + "; ".join(unhealthy), RuntimeWarning, stacklevel=2)
    return out


def _ais_grid_point(X, y_pm, likelihood, T, R, step, n_leapfrog, log_ell_j, log_sf_i, seed):
    """One point of ais_grid: (log Z, its standard error, HMC acceptance, effective sample size)."""
    h = np.array([log_ell_j, log_sf_i])
    K = kernel_matrix("se", X, X, h)
    eps, nl = (None, None) if isinstance(step, str) and step == "auto" else (step, n_leapfrog)
    # unchecked: ais_grid checked these, and warns once for all points whose acceptance is off
    lz, _, se, acc, ess = ais.unchecked(K, y_pm, likelihood, T, R, eps, nl, seed)
    return lz, se, acc, ess


@public(X="X", kernel="{se,ard,kg,kg_iso}", likelihood=_LIKELIHOOD_SPEC, n_iter="count", n_leapfrog="count",
        step="positive", seed="seed", progress="bool")
def hmc_hyperparameters(X, y, kernel="ard", likelihood="logistic", log_hyp0=None, n_iter=200,
                        n_leapfrog=20, step=0.1, prior=(-3.0, 3.0), seed=0, progress=False):
    """Samples of the log-hyperparameters by HMC (Williams & Barber section 3.2 and appendix D).

    The potential is -log q(y|X, theta) - log p(theta): Laplace's approximate
    log evidence (3.32) with its analytic gradient (K&R 42-47), and an
    independent Gaussian prior (W&B: mean -3, sd 3) on every log-parameter.
    W&B's settings are the defaults: 20 leapfrog steps of size 0.1, 200
    iterations; their start for the ARD covariance is log w = -2, log v0 = 0.
    Returns a dict with 'samples' (n_iter, p) (every iteration; discard the
    first third as burn-in, as W&B do), 'log_q' and 'acceptance'.
    """
    y_pm, classes = binary_labels(y, "y", "hmc_hyperparameters")
    if y_pm.shape[0] != X.shape[0]:
        raise ValueError(f"hmc_hyperparameters: X and y must have the same number of samples, got {X.shape[0]} and {y_pm.shape[0]}")
    d = X.shape[1]
    if log_hyp0 is None:
        log_hyp0 = (np.concatenate([[0.0, prior[0]], np.full(d, -2.0)]) if kernel == "ard"
                    else np.zeros(2))
    theta = _check_log_hyp(log_hyp0, kernel, d, "log_hyp0", "hmc_hyperparameters")
    if len(prior) != 2 or not (np.isfinite(prior[0]) and prior[1] > 0):
        raise ValueError(f"hmc_hyperparameters: prior must be (mean, sd) with sd > 0, got {prior!r}")
    m0, s0 = prior
    rng = np.random.default_rng(seed)
    warm = {"a": None}

    def energy(th):
        lq, g, mode = laplace_evidence(X, y_pm, th, kernel, likelihood, warm["a"])
        warm["a"] = mode.a
        E = -lq + 0.5 * np.sum(((th - m0) / s0) ** 2)
        return E, -g + (th - m0) / s0 ** 2, lq

    E, grad, lq = energy(theta)
    samples = np.empty((n_iter, theta.size))
    log_qs = np.empty(n_iter)
    accepted = 0
    for it in _progress(range(n_iter), n_iter, progress, "HMC over hyperparameters"):
        p = rng.standard_normal(theta.size)
        H0 = E + 0.5 * p @ p
        th, gr = theta.copy(), grad.copy()
        p = p - 0.5 * step * gr
        for k in range(n_leapfrog):
            th = th + step * p
            E1, gr, lq1 = energy(th)
            p = p - (step if k < n_leapfrog - 1 else 0.5 * step) * gr
        H1 = E1 + 0.5 * p @ p
        if np.isfinite(H1) and rng.random() < np.exp(min(0.0, H0 - H1)):
            theta, E, grad, lq = th, E1, gr, lq1
            accepted += 1
        samples[it] = theta
        log_qs[it] = lq
    return {"samples": samples, "log_q": log_qs, "acceptance": accepted / n_iter, "classes": classes}


@public(X="X", kernel="{se,ard,kg,kg_iso}", likelihood=_LIKELIHOOD_SPEC)
def predict_averaged(X, y, X_test, samples, kernel="ard", likelihood="logistic"):
    """Predictive probabilities of class classes_[1] averaged over hyperparameter samples (W&B eq. 7).

    Each sample gives Laplace's averaged prediction (Algorithm 3.2); the
    result is their mean, shape (m,).
    """
    X_test = _check("X", X_test, "X_test", "predict_averaged")
    y_pm, _ = binary_labels(y, "y", "predict_averaged")
    samples = np.atleast_2d(np.asarray(samples, dtype=float))
    p = np.zeros(X_test.shape[0])
    for h in samples:
        h = _check_log_hyp(h, kernel, X.shape[1], "samples", "predict_averaged")
        K = kernel_matrix(kernel, X, X, h)
        mode = _mode_or_raise(K, y_pm, likelihood, where="predict_averaged")
        pi, _, _ = laplace_predict.unchecked(mode.f_hat, K, y_pm, likelihood, kernel_matrix(kernel, X, X_test, h),
                                             kernel_diag(kernel, X_test, h), L=mode.L)
        p += pi
    return p / samples.shape[0]


# --- data read from a path the user gives ---------------------------------------


def _digit_list(digits):
    """digits as a list of ints 0-9, e.g. (3, 5)."""
    if isinstance(digits, (str, bytes, int, np.integer)):
        digits = [digits]
    out = []
    for v in digits:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)) or not 0 <= v <= 9:
            raise ValueError(f"load_usps: digits must be digits 0-9 given as ints, e.g. (3, 5), "
                             f"got {digits!r}")
        out.append(int(v))
    if not out:
        raise ValueError("load_usps: digits must name at least one digit, e.g. (3, 5)")
    return out


# the largest data file a loader reads: GPML's usps_resampled.mat is 20 MB, ionosphere.data 75 kB
_MAX_FILE_BYTES = {"load_usps": 500 * 2 ** 20, "load_ionosphere": 50 * 2 ** 20}


def _data_file(path, where, what):
    """path, checked: a str or os.PathLike naming a regular file of a size the loader can read.

    A directory, FIFO (which would block) or device (/dev/zero would be read for ever) is
    refused before it is opened."""
    import stat

    if isinstance(path, bool) or not isinstance(path, (str, bytes, os.PathLike)):
        raise TypeError(f"{where}: path must be a str or os.PathLike naming your copy of {what}, "
                        f"got {type(path).__name__}")
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise ValueError(f"{where}: path {_brief(path)} does not exist: path must be a readable {what} file") from None
    except (OSError, ValueError) as e:                  # ValueError: a null byte in the path
        raise ValueError(f"{where}: path {_brief(path)} cannot be read: path must be a readable {what} "
                         f"file ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISREG(st.st_mode):
        kind = ("a directory" if stat.S_ISDIR(st.st_mode) else "a FIFO" if stat.S_ISFIFO(st.st_mode)
                else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(st.st_mode) else "not a file")
        raise ValueError(f"{where}: path {path!r} is {kind}, not a regular file: path must be a "
                         f"readable {what} file")
    limit = _MAX_FILE_BYTES[where]
    if st.st_size > limit:
        raise ValueError(f"{where}: path {path!r} holds {st.st_size / 2 ** 20:.0f} MB, more than "
                         f"{limit / 2 ** 20:.0f} MB: not {what}")
    return path


def load_usps(path, digits=None):
    """GPML's USPS set (usps_resampled.mat: 4649 + 4649 16x16 images, values in [-1, 1]).

    The file is not shipped with gpclab; give the path to your copy. Returns
    X_train (n, 256), y_train (n,) digit labels 0-9, X_test, y_test. With
    digits, ints such as (3, 5), only those classes are kept (GPML section
    3.7.3). A path that is not a regular file of at most 500 MB, or a file
    that is not this MATLAB file, raises ValueError (TypeError if path is
    not a str or os.PathLike).
    """
    from scipy.io import loadmat

    keep = None if digits is None else _digit_list(digits)
    _data_file(path, "load_usps", "usps_resampled.mat")
    try:
        data = loadmat(path)
    except FileNotFoundError:
        raise ValueError(f"load_usps: path {path!r} does not exist") from None
    except Exception as e:                                    # empty, truncated, not a .mat file
        raise ValueError(f"load_usps: path {path!r} is not a readable MATLAB file like "
                         f"usps_resampled.mat ({type(e).__name__}: {e})") from None
    keys = ("train_patterns", "train_labels", "test_patterns", "test_labels")
    missing = [k for k in keys if k not in data]
    if missing:
        raise ValueError(f"load_usps: path {path!r} has no {', '.join(missing)}: not usps_resampled.mat")
    out = []
    for part in ("train", "test"):
        try:
            X = np.asarray(data[f"{part}_patterns"], dtype=float).T
            Y = np.asarray(data[f"{part}_labels"], dtype=float)
        except (TypeError, ValueError):
            raise ValueError(f"load_usps: {part}_patterns and {part}_labels of {path!r} must be "
                             "numeric matrices") from None
        if X.ndim != 2 or X.shape[1] != 256 or X.shape[0] == 0:
            raise ValueError(f"load_usps: {part}_patterns must be 256 x n (16x16 images), got shape "
                             f"{X.T.shape}")
        if not np.all(np.isfinite(X)):
            raise ValueError(f"load_usps: {part}_patterns holds non-finite values")
        if Y.ndim != 2 or Y.shape[0] != 10 or Y.shape[1] != X.shape[0] or np.any((Y != 1).sum(axis=0) != 9):
            raise ValueError(f"load_usps: {part}_labels must be 10 x n with one +1 per column "
                             f"(-1 elsewhere), n = {X.shape[0]}; got shape {Y.shape}")
        bad = ~((Y == 1) | (Y == -1))                     # NaN, inf, 0.5: not a label
        if np.any(bad):
            i, j = np.argwhere(bad)[0]
            raise ValueError(f"load_usps: {part}_labels must hold only +1 and -1 (one +1 per column), got "
                             f"{Y[i, j]} at row {i}, column {j}")
        y = np.argmax(Y, axis=0)
        if keep is not None:
            sel = np.isin(y, keep)
            X, y = X[sel], y[sel]
        out += [np.ascontiguousarray(X), y]
    return tuple(out)


_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?")   # no 1_0, no nan, no inf


def load_ionosphere(path):
    """UCI Ionosphere (351 radar returns, 34 inputs, label 'g'ood or 'b'ad), as K&G Table 4 use it.

    The file is not shipped with gpclab; give the path to your copy of
    ionosphere.data (comma-separated, 34 numbers and a label per line; blank
    lines, spaces around fields, Windows line ends and a header line are
    accepted). A header is a first line without a single number in it; any
    other line is data, and a line that is not 34 numbers and a label raises
    ValueError naming the line (a typo in the first row is an error, not a
    header). Numbers are decimal (1.5, -2e-3; not 1_0, nan or inf). Returns X
    (n, 34) and y, the labels as strings. A path that is not a regular file of
    at most 50 MB raises ValueError (TypeError if path is not a str or
    os.PathLike).
    """
    _data_file(path, "load_ionosphere", "ionosphere.data")
    try:
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_FILE_BYTES["load_ionosphere"] + 1)
    except OSError as e:
        raise ValueError(f"load_ionosphere: path must be a readable ionosphere.data file: {e}") from None
    if raw.startswith(b"MATLAB") or b"\x00" in raw[:4096]:
        raise ValueError(f"load_ionosphere: path {path!r} is a binary file, not the text file "
                         "ionosphere.data")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"load_ionosphere: path {path!r} is not a text file (not UTF-8)") from None
    rows, labels = [], []
    first = True
    for k, line in enumerate(text.splitlines()):
        if not line.strip():
            continue
        parts = [v.strip() for v in line.strip().rstrip(",").split(",")]
        numeric = [_NUMBER.fullmatch(v) is not None for v in parts[:-1]]
        if first and not any(numeric) and not _NUMBER.fullmatch(parts[-1]):
            first = False
            continue                                   # a header line: not one number in it
        first = False
        where = f"load_ionosphere: {path!r}, line {k + 1}"
        bad = [v for v, ok in zip(parts[:-1], numeric) if not ok]
        if bad and all(v.lower().lstrip("+-") in ("nan", "inf", "infinity") for v in bad):
            raise ValueError(f"{where}: values must be finite, got {bad[0]!r}")
        if bad or len(parts) - 1 != 34 or parts[-1] not in ("g", "b"):
            got = (f"{bad[0]!r}, which is not a number" if bad else
                   f"{len(parts) - 1} numbers and {parts[-1]!r}")
            raise ValueError(f"{where}: expected 34 numbers and a label g or b, got {got}")
        row = [float(v) for v in parts[:-1]]
        if not all(math.isfinite(v) for v in row):     # 1e400 is a decimal number, and inf as a float
            v = next(p for p, f in zip(parts[:-1], row) if not math.isfinite(f))
            raise ValueError(f"{where}: values must be finite, got {v!r}, beyond float64's range (1.8e308)")
        rows.append(row)
        labels.append(parts[-1])
    if not rows:
        raise ValueError(f"load_ionosphere: path {path!r} holds no data lines")
    return np.array(rows), np.array(labels)


# --- toy data of the book ----------------------------------------------------


def make_figure35_data(seed=3):
    """20 points in [0, 1]^2 like GPML Figure 3.5(a).

    Class +1 (open circles) mostly towards the south-west, class -1 towards
    the north-east, with one lone +1 point in the NE corner and one lone -1
    point in the SW corner. Returns X (20, 2) and y in {-1, +1}.
    """
    rng = np.random.default_rng(seed)

    lone_pos, lone_neg = np.array([0.85, 0.85]), np.array([0.15, 0.15])

    def draw(k, below):
        pts = []
        while len(pts) < k:
            x = rng.uniform(0.05, 0.95, size=2)
            side = (x.sum() < 0.85) if below else (x.sum() > 1.15)
            apart = min(np.linalg.norm(x - lone_pos), np.linalg.norm(x - lone_neg)) > 0.12
            if side and apart:
                pts.append(x)
        return pts

    X = draw(9, True) + draw(9, False) + [lone_pos, lone_neg]
    y = [1.0] * 9 + [-1.0] * 9 + [1.0, -1.0]  # the lone points: +1 in the NE, -1 in the SW
    return np.array(X), np.array(y)


_THREE_GAUSSIANS = ((-6.0, 20, 1.0), (0.0, 30, -1.0), (2.0, 10, 1.0))


def make_three_gaussians(seed=0):
    """The 1-D data of GPML section 3.7.2 / Figure 3.6.

    60 points from three Gaussians with standard deviation 0.8, centred on
    -6 (20 points, class +1), 0 (30 points, class -1) and 2 (10 points,
    class +1). Returns X (60, 1) and y in {-1, +1}.
    """
    rng = np.random.default_rng(seed)
    x = np.concatenate([c + 0.8 * rng.standard_normal(k) for c, k, _ in _THREE_GAUSSIANS])
    y = np.concatenate([np.full(k, lab) for _, k, lab in _THREE_GAUSSIANS])
    return x[:, None], y


def three_gaussians_probability(x):
    """p(y = +1|x) of the data-generating process of make_three_gaussians."""
    x = np.asarray(x, dtype=float)
    dens = [k * np.exp(-0.5 * ((x - c) / 0.8) ** 2) for c, k, _ in _THREE_GAUSSIANS]
    return (dens[0] + dens[2]) / (dens[0] + dens[1] + dens[2])


# --- Plotting helpers the lectures share -------------------------------------------
# The set-up every lecture makes, and the panels that recur in several lectures: an evidence grid
# drawn at levels below its maximum, a band panel of differences, latent means with +/- 2 sd bands,
# MAP against averaged predictions, and a figure redrawn in place by sliders. One spelling per axis
# label (LABELS). matplotlib and ipywidgets are imported only when a helper is called.

LABELS = {
    "log_ell": r"log length-scale, $\log \ell$",
    "log_sf": r"log magnitude, $\log \sigma_f$",
    "x": "input $x$",
    "f": "latent function $f(x)$",
    "p": "predictive probability $p(y=+1|x)$",
}

# The course's one figure style (lecture_setup sets it; check_figure_style enforces it)
STYLE = {
    "max_width": 12.0,                     # inches (figsize): renders at ~90 % or more in JupyterLab
    "min_fontsize": 9.0,                   # points, every visible text: titles, labels, ticks, legends, colour bars
    "cmaps": ("viridis", "RdBu_r"),        # sequential and diverging (reversed versions allowed)
}
_RC = {
    "font.size": 10, "axes.titlesize": 11, "axes.labelsize": 10, "xtick.labelsize": 9,
    "ytick.labelsize": 9, "legend.fontsize": 9, "legend.title_fontsize": 9, "figure.titlesize": 12,
    "image.cmap": "viridis",
}
# ASCII spellings a label must write in mathtext: "tau~_i", "nu~" (use $\tilde\tau_i$), "sigma_f", "mu^2"
_ASCII_MATH = re.compile(r"[A-Za-z]~|\b(?:tau|nu|mu|sigma|Sigma|pi|theta|kappa|lambda|ell|alpha|beta)[_^]")


def _allowed_colours():
    import matplotlib as mpl

    return np.vstack([mpl.colormaps[name](np.linspace(0.0, 1.0, 1024))[:, :3] for name in STYLE["cmaps"]])


def _cmap_offence(cmap):
    """None if cmap is one of the course's colour maps or made of their colours (or of greys); else why not."""
    import matplotlib as mpl

    allowed = set(STYLE["cmaps"]) | {n[:-2] if n.endswith("_r") else n + "_r" for n in STYLE["cmaps"]}
    if cmap.name in allowed:
        return None
    if cmap.name in mpl.colormaps and cmap is not None and not isinstance(cmap, mpl.colors.ListedColormap):
        return f"colour map {cmap.name!r}"
    rgb = np.asarray(cmap(np.arange(min(cmap.N, 256))))[:, :3]
    grey = np.ptp(rgb, axis=1) < 0.02
    d = np.sqrt(((rgb[:, None, :] - _allowed_colours()[None, :, :]) ** 2).sum(-1)).min(axis=1)
    bad = ~grey & (d > 0.03)
    if bad.any() and len(np.unique(rgb.round(3), axis=0)) > 1:
        return f"colour map {cmap.name!r} with colours not taken from {' or '.join(STYLE['cmaps'])}"
    return None


def _strip_math(s):
    return re.sub(r"(?<!\\)\$.*?(?<!\\)\$", "", s)


def check_figure_style(fig, name="figure"):
    """Check a lecture figure against the course's style; raise AssertionError naming the figure and the offence.

    Enforced (STYLE): the figure's width (figsize) is at most 12 inches; every visible, non-empty text
    (titles, axis labels, tick labels, legend entries and titles, colour-bar labels and ticks, contour
    labels, annotations, the suptitle) is at least 9 pt; every colour-mapped artist (images, contour
    sets, pcolormesh, scatter with c=values, colour bars) uses "viridis" or "RdBu_r" (or their reverses),
    or a ListedColormap whose colours come from them or are greys, and a contour set drawn in one
    explicit colour is not colour-mapped; no text writes a symbol in ASCII where mathtext is meant:
    a letter followed by "~" ("tau~_i") or a Greek name followed by "_" or "^" ("sigma_f", "mu^2")
    outside $...$. Returns None when the figure complies.
    """
    import matplotlib.colors as mcolors
    import matplotlib.text as mtext

    problems = []
    width = fig.get_size_inches()[0]
    if width > STYLE["max_width"] + 1e-9:
        problems.append(f"width {width:g} in > {STYLE['max_width']:g} in (figsize)")
    fig.draw_without_rendering()            # fills in tick labels, colour bars and legends as drawn
    small, ascii_ = [], []
    for t in fig.findobj(mtext.Text):
        s = t.get_text()
        if not t.get_visible() or not s.strip() or (t.axes is not None and not t.axes.get_visible()):
            continue
        if t.get_fontsize() < STYLE["min_fontsize"] - 1e-9:
            small.append(f"{s[:30]!r} at {t.get_fontsize():g} pt")
        if _ASCII_MATH.search(_strip_math(s)):
            ascii_.append(repr(s[:40]))
    if small:
        problems.append(f"text below {STYLE['min_fontsize']:g} pt: " + ", ".join(sorted(set(small))[:6])
                        + (f" (and {len(set(small)) - 6} more)" if len(set(small)) > 6 else ""))
    if ascii_:
        problems.append("ASCII where mathtext is meant: " + ", ".join(sorted(set(ascii_))[:6]))
    seen = set()
    for a in fig.findobj(lambda o: hasattr(o, "get_cmap") and hasattr(o, "get_array")):
        if a.get_array() is None:
            continue
        colors = getattr(a, "colors", None)
        if colors is not None and len(np.unique(mcolors.to_rgba_array(colors), axis=0)) == 1:
            continue                        # a contour set in one explicit colour
        offence = _cmap_offence(a.get_cmap())
        if offence and offence not in seen:
            seen.add(offence)
            problems.append(f"{offence} ({type(a).__name__})")
    if problems:
        raise AssertionError(f"figure {name!r} breaks the lecture style: " + "; ".join(problems))


class LectureSetup:
    """What a lecture's first cell needs: QUICK, the folder figures go to, and save(fig, name)."""

    def __init__(self, quick=None):
        self.QUICK = os.environ.get("GPCLAB_QUICK", "0") == "1" if quick is None else bool(quick)
        self.SAVE = os.environ.get("GPCLAB_SAVE_FIGURES") or None
        self.USPS = os.environ.get("GPCLAB_USPS") or None

    def save(self, fig, name):
        """Check fig against the course's style (check_figure_style: AssertionError naming the figure and
        what breaks it), then write it as <GPCLAB_SAVE_FIGURES>/<name>.png if that variable names a folder."""
        check_figure_style(fig, name)
        if self.SAVE:
            os.makedirs(self.SAVE, exist_ok=True)
            fig.savefig(os.path.join(self.SAVE, name + ".png"), dpi=120, bbox_inches="tight")


INLINE_DPI = 88     # the dots per inch of figures shown in a notebook (lecture_setup, slider_figure)


def lecture_setup(quick=None):
    """The set-up shared by the lectures: returns (QUICK, save).

    QUICK is True when the environment has GPCLAB_QUICK=1 (small grids and short chains, as the test
    suite runs the lectures), unless quick=True/False is given. save(fig, name) checks the figure
    against the course's style (check_figure_style: at most 12 inches wide, no text under 9 pt, colour
    maps viridis and RdBu_r, mathtext symbols) and writes name.png into the folder GPCLAB_SAVE_FIGURES
    names, if any. Also sets matplotlib's font sizes and default colour map to that style, and the
    resolution of the figures a notebook shows inline (figure.dpi = 88): in JupyterLab at a
    1400-px window with the file browser open (an output column of about 950 CSS px) a 12-inch figure
    then shows at >= 90 % of its size and 9-pt text at >= 10 CSS px (11 px in figures up to 10.8 in).
    The PNGs save writes keep their own 120 dpi.
    """
    import matplotlib as mpl

    mpl.rcParams.update(_RC)
    mpl.rcParams["figure.dpi"] = INLINE_DPI   # matplotlib-inline renders at the figure's dpi (savefig.dpi "figure")
    setup = LectureSetup(quick)
    return setup.QUICK, setup.save


def grid_axes(ax, xlabel=True, ylabel=True):
    """Label a panel over (log l, log sf) with the lectures' one spelling of each axis."""
    if xlabel:
        ax.set_xlabel(LABELS["log_ell"])
    if ylabel:
        ax.set_ylabel(LABELS["log_sf"])


def _dark_to_light(n, cmap="viridis"):
    """n colours from a colour map's dark end to its middle: every one readable on white."""
    import matplotlib.pyplot as plt

    return plt.get_cmap(cmap)(np.linspace(0.0, 0.75, max(n, 1)))


EVIDENCE_BELOW = (0.25, 0.5, 1, 2, 4, 8, 16, 32, 64)


def _refined(x, y, Z, refine):
    """Z on a grid `refine` times finer in each direction, by a cubic spline through the grid's values
    (NaN-free grids of at least 4 x 4 points; otherwise Z itself)."""
    from scipy.interpolate import RectBivariateSpline

    x, y, Z = np.asarray(x, dtype=float), np.asarray(y, dtype=float), np.asarray(Z, dtype=float)
    if refine <= 1 or min(len(x), len(y)) < 4 or not np.all(np.isfinite(Z)):
        return x, y, Z
    xf = np.linspace(x[0], x[-1], (len(x) - 1) * refine + 1)
    yf = np.linspace(y[0], y[-1], (len(y) - 1) * refine + 1)
    return xf, yf, RectBivariateSpline(y, x, Z)(yf, xf)


def evidence_panel(ax, log_ell, log_sf, Z, below=EVIDENCE_BELOW, title=None, colorbar=True, mark=True,
                   top=None, refine=None):
    """Contours of a log evidence Z (len(log_sf), len(log_ell)) at `below` nats under its maximum.

    The contour nearest the maximum is darkest and the farthest lightest (all visible on white); a
    colour bar, not inline labels, names each level in nats below the maximum, so no label is
    clipped or covered. Only the levels that occur on the panel are drawn and named in the colour bar.
    mark: a black + at the grid's maximum. top: the value levels count down from (default the
    maximum of Z; give a shared top to compare panels). refine: the contours are traced on a cubic
    spline through the grid's values, `refine` times finer in each direction (default: fine enough
    for about 100 points a side), so that a contour enclosing only a few grid points is drawn as the
    smooth curve it is, not as a polygon of the grid; refine=1 contours the grid itself. Returns
    (i, j), the indices of the grid's maximum.
    """
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap

    Z = np.asarray(Z, dtype=float)
    top = np.nanmax(Z) if top is None else float(top)
    if refine is None:
        refine = max(1, int(np.ceil(100 / max(min(Z.shape) - 1, 1))))
    xf, yf, Zf = _refined(log_ell, log_sf, Z, int(refine))
    below = np.sort(np.asarray(below, dtype=float))[::-1]               # far levels first
    levels = top - below
    colours = _dark_to_light(len(levels))[::-1]                          # nearest the top: darkest
    occur = (levels < np.nanmax(Zf)) & (levels > np.nanmin(Zf))
    below, levels, colours = below[occur], levels[occur], colours[occur]  # a level keeps its colour across panels
    if len(levels):
        cmap = ListedColormap(colours)
        edges = np.concatenate([levels - 1e-9, [max(top, np.nanmax(Zf)) + 1e-9]])
        cs = ax.contour(xf, yf, Zf, levels=levels, cmap=cmap, norm=BoundaryNorm(edges, cmap.N),
                        linewidths=1.3)
        if colorbar:
            cb = plt.colorbar(cs, ax=ax, spacing="uniform", ticks=levels)
            cb.ax.set_yticklabels([f"-{b:g}" for b in below])
            cb.set_label("nats below the maximum")
    i, j = np.unravel_index(np.nanargmax(Z), Z.shape)
    if mark:
        ax.plot(log_ell[j], log_sf[i], "k+", ms=10, mew=2, clip_on=False, zorder=5)
    if title:
        ax.set_title(title)
    grid_axes(ax)
    return i, j


_DIVERGING = ("RdBu_r", "RdBu", "PuOr", "PuOr_r", "coolwarm", "bwr")


def band_panel(ax, log_ell, log_sf, D, levels, title=None, cmap="RdBu_r", label=None, tick_labels=None):
    """Filled bands of a difference D over (log l, log sf), one colour per band however uneven the
    levels, thin black lines between bands, and a colour bar with a tick at every level (or at
    band centres with tick_labels). Only the bands that D occupies are kept (levels below the band
    holding D's minimum and above the one holding its maximum are dropped), so the colour bar names
    the values that occur. With a diverging colour map and 0 among the levels (or all levels on one
    side of it), the bands below 0 take the map's lower half and those above its upper half, so
    white is 0 however many bands lie on each side, and a difference of one sign keeps its colour
    whether or not the other sign occurs. Returns the colour bar."""
    import matplotlib.pyplot as plt
    from matplotlib.colors import BoundaryNorm, ListedColormap

    levels = np.asarray(levels, dtype=float)
    D = np.asarray(D, dtype=float)
    lo = max(int(np.searchsorted(levels, np.nanmin(D), side="right")) - 1, 0)
    hi = min(int(np.searchsorted(levels, np.nanmax(D), side="left")), len(levels) - 1)
    hi = max(hi, lo + 1)
    if tick_labels is not None:
        tick_labels = list(tick_labels)[lo:hi]
    levels = levels[lo:hi + 1]
    base = plt.get_cmap(cmap)
    n_neg, n_pos = int(np.sum(levels[1:] <= 0)), int(np.sum(levels[:-1] >= 0))
    if cmap in _DIVERGING and n_neg + n_pos == len(levels) - 1:     # no band straddles 0
        colours = np.vstack([base(np.linspace(0.05, 0.45, n_neg)), base(np.linspace(0.55, 0.95, n_pos))])
        cmap = ListedColormap(colours).with_extremes(under=base(0.0), over=base(1.0))
        norm = BoundaryNorm(levels, cmap.N)
    else:
        cmap = base
        norm = BoundaryNorm(levels, base.N, extend="both")
    cf = ax.contourf(log_ell, log_sf, D, levels=levels, cmap=cmap, norm=norm, extend="both")
    ax.contour(log_ell, log_sf, D, levels=levels, colors="k", linewidths=0.4)
    cb = plt.colorbar(cf, ax=ax, spacing="uniform")
    if tick_labels is not None:
        cb.set_ticks(0.5 * (levels[:-1] + levels[1:]))
        cb.set_ticklabels(tick_labels)
    else:
        cb.set_ticks(levels)
        cb.set_ticklabels([f"{v:g}" for v in levels])
    if label:
        cb.set_label(label)
    if title:
        ax.set_title(title)
    grid_axes(ax)
    return cb


def latent_panels(axes, xs, models, X=None, y=None, truth=None):
    """GPML Figure 3.6's two panels for 1-D inputs: (a) predictive probabilities, (b) latent means
    with +/- 2 sd bands (3.21, 3.24), for (model, name, colour) triples of fitted GPClassifiers.
    X, y: the training data, drawn at p = 1 (+1) and 0 (-1); truth: a function of x drawn dotted.
    Each band is drawn as its two edges, dashed in the model's colour, over a faint fill, so that
    overlapping bands stay identifiable.
    The legends sit outside the axes, to the right, so that they cover no data."""
    xs = np.asarray(xs, dtype=float).reshape(-1, 1)
    ax_p, ax_f = axes
    if X is not None:
        X = np.asarray(X, dtype=float).reshape(len(y), -1)
        ax_p.plot(X[y > 0, 0], np.ones(int((y > 0).sum())), "k+", label="class +1")
        ax_p.plot(X[y < 0, 0], np.zeros(int((y < 0).sum())), "kx", label="class -1")
    if truth is not None:
        ax_p.plot(xs[:, 0], truth(xs[:, 0]), "k:", label="$p(y=+1|x)$, generating")
    for model, name, c in models:
        ax_p.plot(xs[:, 0], model.predict_proba(xs)[:, 1], color=c, label=name)
        m, V = model.predict_latent(xs)
        sd = np.sqrt(V)
        ax_f.plot(xs[:, 0], m, color=c, label=f"{name} mean")
        ax_f.fill_between(xs[:, 0], m - 2 * sd, m + 2 * sd, color=c, alpha=0.1, lw=0)
        ax_f.plot(xs[:, 0], m - 2 * sd, color=c, ls="--", lw=1.2, label=f"{name} $\\pm$ 2 sd")
        ax_f.plot(xs[:, 0], m + 2 * sd, color=c, ls="--", lw=1.2)
    ax_f.axhline(0, color="k", lw=0.5)
    ax_p.set(xlabel=LABELS["x"], ylabel=LABELS["p"], title="(a)", ylim=(-0.05, 1.05))
    ax_f.set(xlabel=LABELS["x"], ylabel=LABELS["f"], title="(b)")
    for ax in axes:
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0.0)


def map_averaged_panel(ax, p_map, p_avg, y_test, label="$p(y_*=+1|x_*)$"):
    """GPML Figure 3.9(a): averaged (3.25) against MAP predictions, misclassified cases marked."""
    p_map, p_avg = np.asarray(p_map, dtype=float), np.asarray(p_avg, dtype=float)
    wrong = np.where(p_avg > 0.5, 1.0, -1.0) != np.asarray(y_test)
    ax.plot(p_map[~wrong], p_avg[~wrong], "k.", label="correct")
    ax.plot(p_map[wrong], p_avg[wrong], "rx", ms=9, mew=2, label="misclassified")
    ax.plot([0, 1], [0, 1], "k:", lw=0.8)
    ax.axhline(0.5, color="k", lw=0.5)
    ax.set(xlabel=f"MAP prediction {label}", ylabel=f"averaged prediction {label}", xlim=(-0.02, 1.02),
           ylim=(-0.02, 1.02))
    ax.legend(loc="upper left")
    return wrong


class _Readout(str):
    """A line of text shown as itself (no quotes) in a notebook's output."""

    def __repr__(self):
        return str(self)


def slider_figure(draw, sliders, columns=3, readout=None):
    """A figure that sliders redraw in place: draw(**values) -> (fig, result).

    The figure at the sliders' initial values is shown as an ordinary output, a PNG image (so a static
    render, an exported HTML page or a notebook viewer, shows it, whatever matplotlib's backend), under
    the sliders; moving a slider calls draw again and replaces that image in place (IPython's display
    update). sliders: a dict name -> ipywidgets slider. Returns (result at the initial values, the
    widget box, a list that collects each redraw's seconds: computation, drawing and the PNG). Nothing
    else is drawn: no stray figure. The first image is cropped to its tight bounding box; redraws keep
    that box, which spares matplotlib the extra drawing pass that finding it costs (about a third of
    a redraw) and keeps the image from jumping as titles change length. The first figure is checked
    against the course's style (check_figure_style). readout: a function of draw's result returning a
    line of text, shown under the image and rewritten at every move, so the printed numbers always
    belong to the sliders' current values.
    """
    import io
    import time

    import ipywidgets as widgets
    import matplotlib.pyplot as plt
    from IPython.display import Image, display

    crop = []                                   # the first image's bounding box, in inches

    def render():
        t0 = time.perf_counter()
        fig, result = draw(**{name: s.value for name, s in sliders.items()})
        if not crop:
            check_figure_style(fig, "slider figure (" + getattr(draw, "__name__", "draw") + ")")
            crop.append(fig.get_tightbbox().padded(0.1))
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=INLINE_DPI, bbox_inches=crop[0])
        plt.close(fig)
        return Image(data=buf.getvalue(), format="png"), result, t0

    image, result, _ = render()
    rows = [widgets.HBox(list(sliders.values())[k:k + columns]) for k in range(0, len(sliders), columns)]
    box = widgets.VBox(rows)
    display(box)
    handle = display(image, display_id=True)
    text = display(_Readout(readout(result)), display_id=True) if readout is not None else None
    seconds = []

    def on_change(change):
        image, res, t0 = render()
        handle.update(image)
        if text is not None:
            text.update(_Readout(readout(res)))
        seconds.append(time.perf_counter() - t0)

    for s in sliders.values():
        s.observe(on_change, names="value")
    return result, box, seconds


# ############################################################################
# PART III. MACHINERY (not needed to follow the book)
# ############################################################################
#
# What follows serves the functions above without changing what they compute:
#   - numba's cache, for an installation shared by many users (read from several folders);
#   - the dispatcher, compiling gpclab's functions at LLVM level 1;
#   - the checked public face: every public function converts and checks its arguments once,
#     at the door, from the specs written in @public(...);
#   - interrupts: check_interrupt() lets Ctrl-C end a long numba loop;
#   - the assembly of the recorded functions; the compile command.
# Everything that touches numba's internals is here, and tests/test_machinery.py fails with a
# clear message if one of them moves in a new numba release.

import ctypes
import difflib
import functools
import inspect
import tempfile
import threading
from functools import lru_cache

with _gc_paused_then_frozen():
    import llvmlite.binding as _llvm
    import numba
    import scipy.linalg.cython_blas  # noqa: F401  (scipy's OpenBLAS, loaded here: see _gc_paused_then_frozen)
    from numba import config, types
    from numba.core import caching as _caching
    from numba.extending import get_cython_function_address, typeof_impl
    from numba.misc.appdirs import AppDirs as _AppDirs

# ----------------------------------------------------------------------------
# The public face, in short
# ----------------------------------------------------------------------------
# Every public function is called through one checked entry, declared above its body:
#
#     @public(returns=LaplaceMode, K="(n, n) psd", y="(n,) pm1 nonempty",
#             likelihood=_LIKELIHOOD_SPEC, a_init="(n,) ?0", tol="nonneg",
#             max_iter="count")
#     @njit(cache=True)
#     def laplace_mode(K, y, likelihood, a_init=None, tol=1e-10, max_iter=100):
#
# The wrapper converts each array once to a float64 C-contiguous array (lists,
# ints, float32, Fortran order and slices give the float64 answer), checks
# shapes against the symbols (n above is fixed by K, and y must agree), refuses
# NaN and inf, checks the constraints named in the spec (symmetric, positive
# semidefinite, -1/+1 labels, one-hot, flags, non-negative, log_hyp's length
# for the kernel, ...), and passes scalars as Python int or float and names as
# str: so an njit body receives only float64 C arrays, int64, float64, str or
# None, whatever the caller passed. An optional array whose spec ends in "?0"
# (a warm start, discrete flags) arrives as zeros when left out, and one whose spec
# ends in "?e" (a Cholesky factor the body computes when it is not given) as an
# empty array, so that the body compiles once, not once with None and once with
# an array; every default
# is passed explicitly, for the same reason. fn.unchecked(...) does the same
# (and turns boolean arrays into float64) without the checks.
# Bad input raises ValueError or TypeError,
# "laplace_mode: y must have shape (n,) with n = 60 from K, got shape (59,)".
# It then calls the njit body, turns numba's Cholesky failure into a ValueError
# with advice (jitter, other hyperparameters), and builds the namedtuple of
# `returns` from the plain tuple the body returns. numba code calls the body
# directly (numba sees the dispatcher), so checks run once, at the door.
# ``fn.py_func`` is the plain Python body and ``fn.unchecked(...)`` the call
# without checks; NUMBA_DISABLE_JIT=1 runs everything as plain Python.
#
# To add a public function: write the @njit(cache=True) body, then put
# @public(...) above it with a spec for every argument (the test
# tests/test_public_face.py insists on that, and generates bad inputs from the
# specs): a shape in symbols, "(n, d)", followed by constraints from
# _ARRAY_CHECKS, "?" if None is allowed; or a scalar kind from _SCALARS
# ("count", "seed", "positive", "eps", ...); or "{a,b}" for a name. New kinds
# go into those tables, never into the body. Return a plain tuple from the
# body and name its fields with returns= (a namedtuple made inside njit code
# crashes the process when an interrupt is pending). Python-layer functions
# take the same decorator.
#
# Interrupt. numba code never looks at signals, so every long loop calls
# check_interrupt() once per outer iteration (a Newton step, a block of 48 EP
# site updates, an HMC transition, a block of 32 AIS temperatures, a row of
# K, ...), never inside prange. Ctrl-C or Jupyter's Interrupt then ends any
# call within a fraction of a second with KeyboardInterrupt, and the process
# or kernel carries on.


# ----------------------------------------------------------------------------
# numba's cache for an installation shared by many users
# ----------------------------------------------------------------------------
# Every function of Part I is @njit(cache=True): it compiles at its first call
# for each new combination of argument types and is saved to disk, so the next
# process loads it instead (see `python -m gpclab compile` at the end of the
# file). numba's own cache takes one folder per function: next to the source
# when that is writable, else ~/.cache/numba. A cache warmed inside a read-only
# installation is then ignored, and with no writable home import fails.
# _numba_function keeps numba's compilation and
# its cache files but looks in several folders: it reads from NUMBA_CACHE_DIR
# (if set), the installation's __pycache__ and the per-user folder, and writes
# new compilations to the first of them that is writable. With none writable it
# warns once and compiles in memory.


@lru_cache(maxsize=None)
def _writable(path):
    """True if `path` exists or can be made, and a file can be created in it."""
    try:
        os.makedirs(path, exist_ok=True)
        tempfile.TemporaryFile(dir=path).close()
        return True
    except OSError:
        return False


def _cache_candidates(py_file):
    """The cache folders for functions defined in py_file, in the order they are tried:
    NUMBA_CACHE_DIR (if set), the installation's __pycache__, the per-user folder."""
    sub = _caching._CacheLocator.get_suitable_cache_subpath(py_file)
    candidates = []
    if numba.config.CACHE_DIR:
        candidates.append(os.path.join(numba.config.CACHE_DIR, sub))
    candidates.append(os.path.join(os.path.dirname(os.path.abspath(py_file)), "__pycache__"))
    candidates.append(os.path.join(_AppDirs(appname="numba", appauthor=False).user_cache_dir, sub))
    return candidates


@lru_cache(maxsize=None)
def _cache_dirs(py_file):
    """(write folder or None, folders to read in order) for functions defined in py_file: new
    compilations go to the first writable candidate, which is also read first; the other
    candidates that exist are read after it, in the order of _cache_candidates."""
    candidates = _cache_candidates(py_file)
    write = next((c for c in candidates if _writable(c)), None)
    read = ([write] if write else []) + [c for c in candidates if c != write and os.path.isdir(c)]
    return write, tuple(read)


class _SharedCacheLocator(_caching._SourceFileBackedLocatorMixin, _caching._CacheLocator):
    """numba cache locator: the folders of _cache_dirs; never refuses a function."""

    def __init__(self, py_func, py_file):
        self._py_file = py_file
        self._lineno = py_func.__code__.co_firstlineno
        self.write_path, self.read_paths = _cache_dirs(py_file)

    def get_cache_path(self):
        return self.write_path or (self.read_paths or (os.path.dirname(self._py_file),))[0]

    def ensure_cache_path(self):
        if self.write_path is None:
            raise OSError("no writable numba cache folder")
        super().ensure_cache_path()

    @classmethod
    def from_function(cls, py_func, py_file):
        return cls(py_func, py_file)


class _SharedCacheImpl(_caching.CompileResultCacheImpl):
    _locator_classes = [_SharedCacheLocator]


_cache_warned = []


def _runtime_for_cached_code(target_context):
    """The symbols that numba code loaded from the cache links to, beyond those numba registers
    when it starts: its runtime (NRT) and the secret of its string hash."""
    import numba.cpython.hashing  # noqa: F401  (registers _numba_hashsecret_*)
    from numba.core.runtime import rtsys

    rtsys.initialize(target_context)


class _SharedCache(_caching.FunctionCache):
    """numba's FunctionCache reading from every folder of the locator, writing to the first."""

    _impl_class = _SharedCacheImpl

    def __init__(self, py_func):
        super().__init__(py_func)
        stamp = self._impl.locator.get_source_stamp()
        self._read_files = [_caching.IndexDataCacheFile(path, self._impl.filename_base, stamp)
                            for path in self._impl.locator.read_paths]

    def _index_key(self, sig, codegen):
        # numba's key leaves out LLVM's optimisation level: add it, so that code compiled at
        # another level (NUMBA_OPT) is neither loaded nor overwritten by this one
        return super()._index_key(sig, codegen) + (int(config.OPT),)

    def load_overload(self, sig, target_context):
        # numba's load_overload refreshes the whole target context first: the first time, 0.15 s
        # of importing and registering everything numba can compile, a tenth of a new process's
        # first cell. Code loaded from the cache needs only what it links to: numba's runtime
        # (NRT) and the string-hash secret; the helpers and gpclab's BLAS symbols are there
        # already. A compilation still refreshes everything itself (numba's CompilerBase), and
        # tests/test_deploy.py loads every path of the compile command this way in a new process.
        _runtime_for_cached_code(target_context)
        with self._guard_against_spurious_io_errors():
            return self._load_overload(sig, target_context)

    def _load_overload(self, sig, target_context):
        if not self._enabled:
            return None
        key = self._index_key(sig, target_context.codegen())
        for cache_file in self._read_files:
            try:
                data = cache_file.load(key)
            except OSError:
                continue
            if data is not None:
                return self._impl.rebuild(target_context, data)
        return None

    def _save_overload(self, sig, data):
        try:
            super()._save_overload(sig, data)
        except OSError as e:
            if not _cache_warned:
                _cache_warned.append(True)
                warnings.warn(f"gpclab: cannot save compiled functions ({e}; no writable folder "
                              f"among {', '.join(_cache_candidates(self._impl.locator._py_file))}): "
                              "each new process compiles again. Set NUMBA_CACHE_DIR to a writable "
                              "folder, or ask the administrator to run `python -m gpclab compile`.",
                              RuntimeWarning, stacklevel=2)


# LLVM's optimisation level for gpclab's functions. At numba's default (3) every public
# path took 53 s to compile in one process on the development machine, at 1 it took 41 s,
# and the compiled code ran as fast (one BLAS thread, best of 15 runs, within 4% on ep,
# laplace_mode, laplace_mode_multiclass, the multi-class predictions, AIS, HMC and the
# samplers). NUMBA_OPT, if set, is obeyed instead.
_COMPILE_OPT = 1


class _Dispatcher(numba.core.registry.CPUDispatcher):
    """numba's dispatcher, compiling at LLVM level _COMPILE_OPT unless NUMBA_OPT is set.

    The level is read by the pass builders of each compilation, so it is set for the
    duration of one (under numba's compiler lock, so no other thread's compilation
    sees it); functions of gpclab that this one calls compile inside it.
    """

    def compile(self, sig):
        if "NUMBA_OPT" in os.environ:
            return super().compile(sig)
        with numba.core.compiler_lock.global_compiler_lock:
            saved = config.OPT
            ours = config.OPT = config._OptLevel(_COMPILE_OPT)
            try:
                return super().compile(sig)
            finally:
                if config.OPT is ours:          # numba may have reloaded its configuration meanwhile
                    config.OPT = saved


def _numba_function(py_func, options):
    """numba.njit(**options)(py_func); with cache=True the dispatcher is _Dispatcher and the
    cache _SharedCache."""
    if not options.get("cache") or config.DISABLE_JIT:
        return numba.njit(**options)(py_func)
    options = dict(options, nopython=True)
    del options["cache"]
    local_types = options.pop("locals", {})
    disp = _Dispatcher(py_func=py_func, locals=local_types, targetoptions=options)
    disp._cache = _SharedCache(py_func)
    return disp

# ============================================================================
# The public face: one checked entry to every public function
# ============================================================================
#
# Each public function is declared with @public(arg="spec", ...) on top of its
# @njit(cache=True) body. The spec of an argument is a few words:
#
#   "(n, n) psd"     an array: converted once to a float64 C array, then its shape
#                    checked against the symbols (n is bound by the first argument
#                    that has it, and every other use must agree), its values
#                    finite, then the constraints that follow (_ARRAY_CHECKS)
#   "(n,) pm1 ?"     the same; "?" allows None ("?0": None arrives as zeros,
#                    "?e": as an empty array, so that the body compiles once)
#   "count"          a scalar kind (_SCALARS): count, int, seed, real, positive, ...
#   "{probit,step}"  one of these names
#
# The wrapper (PublicFunction) binds the arguments like Python does, converts
# and checks each one, calls the njit body and turns what it returns into the
# namedtuple given by returns=. numba's "Matrix is not positive definite."
# becomes the ValueError of _factorisation_failed, which names the matrix, the
# algorithm and what is wrong (the Python layer's callers of unchecked bodies
# use it too, and _check for the checks of an argument). numba code calls
# the body directly (numba sees the dispatcher, see _typeof_public), so the
# checks run once, at the door.

_SYM_RTOL = 1e-8          # symmetry: |A - A^T| <= 1e-8 max|A|
_PSD_JITTER = 1e-6        # psd: cholesky(A + 1e-6 max(diag A) I) must exist (float32 rounding passes)
_LOG_HYP_MAX = 300.0      # |log_hyp| beyond this overflows exp() in the covariance


class Interrupted(KeyboardInterrupt, Exception):
    """Ctrl-C or Jupyter's Interrupt seen inside numba code (a KeyboardInterrupt).

    numba can raise only Exception subclasses; the public face re-raises it as
    a plain KeyboardInterrupt.
    """


def _c_function(symbol, address, restype, nargs):
    """A C function callable from njit code under a registered symbol name (which keeps
    numba's cache valid: a ctypes pointer would not), or through ctypes when
    NUMBA_DISABLE_JIT=1 runs the same code as plain Python. Pointer arguments only."""
    _llvm.add_symbol(symbol, address)
    if config.DISABLE_JIT:
        return ctypes.CFUNCTYPE(restype[1], *([ctypes.c_void_p] * nargs))(address)
    return types.ExternalFunction(symbol, restype[0](*([types.voidptr] * nargs)))


def _c_address(fn):
    return ctypes.cast(fn, ctypes.c_void_p).value


_check_signals = _c_function("gpclab_check_signals", _c_address(ctypes.pythonapi.PyErr_CheckSignals),
                             (types.int32, ctypes.c_int), 0)
_clear_error = _c_function("gpclab_clear_error", _c_address(ctypes.pythonapi.PyErr_Clear),
                           (types.void, None), 0)


@njit(cache=True)
def check_interrupt():
    """Raise KeyboardInterrupt (Interrupted) if Ctrl-C or Jupyter's Interrupt has arrived.

    numba code never looks at signals by itself: long loops call this once
    per outer iteration. It runs CPython's signal handlers (PyErr_CheckSignals,
    a few nanoseconds when nothing is pending). Main thread only: never call
    it inside prange, whose worker threads have no Python thread state.
    """
    if _check_signals() != 0:
        _clear_error()            # numba raises its own exception below
        raise Interrupted("interrupted")


_TRUE = np.ones(1, dtype=np.bool_)


@njit(cache=True)
def _main_thread():
    """True: the caller runs in the main thread, which sees Ctrl-C (check_interrupt).

    True read from an array, not the constant True, is a run-time boolean to numba: a function
    called with it here and with a variable elsewhere compiles once (a constant argument is
    typed as a literal, and each literal value is a compilation of its own).
    """
    return _TRUE[0]


if config.DISABLE_JIT:
    def check_interrupt():        # noqa: F811  plain Python sees signals by itself
        """Nothing to do without numba: Python checks for signals between bytecodes."""


class _Context:
    """What the checks of one call have learnt: dimension symbols and converted arguments."""

    def __init__(self, where):
        self.where = where
        self.dims = {}            # symbol -> (value, name of the argument that fixed it)
        self.args = {}


_MESSAGE_CHARS = 2000                  # an error message quotes at most this much of what it was given


def _brief(value, limit=200):
    """repr(value), at most about `limit` characters: what an error message quotes of an argument
    (a million-character name or list would otherwise make a million-character message)."""
    text = repr(value)
    if len(text) <= limit:
        return text
    return f"{text[:limit // 2]}...{text[-limit // 4:]} ({len(text):,} characters)"


def _bounded(message, limit=_MESSAGE_CHARS):
    """message, cut in the middle if longer than limit characters."""
    if len(message) <= limit:
        return message
    return f"{message[:limit // 2]} [... {len(message) - limit:,} characters left out ...] {message[-limit // 2:]}"


def _fail(exc, ctx, name, message):
    name = name if len(name) <= 200 else _brief(name)
    raise exc(_bounded(f"{ctx.where}: {name} {message}" if ctx.where else f"{name} {message}"))


def _scalar_number(value, name, ctx, integer):
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, np.integer, np.floating)):
        hint = ""
        if isinstance(value, tuple):
            hint = " (a tuple: unpack it first, e.g. step, n_leapfrog = hmc_step_size(K, likelihood))"
        elif isinstance(value, np.ndarray) and value.size == 1:
            hint = " (a one-element array: use .item())"
        _fail(TypeError, ctx, name, f"must be {'an integer' if integer else 'a number'}, "
                                    f"got {type(value).__name__}{hint}")
    if integer:
        if not isinstance(value, (int, np.integer)):
            if not float(value).is_integer():
                _fail(TypeError, ctx, name, f"must be an integer, got {value!r}")
        if not -2 ** 63 <= int(value) < 2 ** 63:
            _fail(ValueError, ctx, name, f"must be an integer that fits in 64 bits, got {value!r}")
        return int(value)
    return float(value)


def _scalar(test, what, integer=False, allow_inf=False):
    def check(value, name, ctx):
        v = _scalar_number(value, name, ctx, integer)
        if not integer and not allow_inf and not math.isfinite(v):
            _fail(ValueError, ctx, name, f"must be finite, got {v}")
        if not integer and allow_inf and math.isnan(v):
            _fail(ValueError, ctx, name, "must not be NaN")
        if not test(v):
            _fail(ValueError, ctx, name, f"must be {what}, got {_brief(value)}")
        return v
    return check


_SCALARS = {
    "real": _scalar(lambda v: True, "a finite number"),
    "number": _scalar(lambda v: True, "a number", allow_inf=True),
    "positive": _scalar(lambda v: v > 0, "> 0"),
    "nonneg": _scalar(lambda v: v >= 0, ">= 0"),
    "unit": _scalar(lambda v: 0 <= v <= 1, "in [0, 1]"),
    "eps": _scalar(lambda v: 0 <= v < 0.5, "in [0, 0.5) (a labelling-noise probability)"),
    "int": _scalar(lambda v: True, "an integer", integer=True),
    "count": _scalar(lambda v: v >= 1, "a positive integer (>= 1)", integer=True),
    "count0": _scalar(lambda v: v >= 0, "a non-negative integer", integer=True),
    "seed": _scalar(lambda v: 0 <= v < 2 ** 31, "an integer in [0, 2**31)", integer=True),
    "pm1": _scalar(lambda v: v in (-1.0, 1.0), "-1 or +1"),
}


def _choice(choices):
    def check(value, name, ctx):
        if not isinstance(value, str):
            _fail(TypeError, ctx, name, f"must be a name, one of {', '.join(map(repr, choices))}; "
                                        f"got {type(value).__name__}")
        if value not in choices:
            close = (difflib.get_close_matches(value.lower(), choices, n=1, cutoff=0.5)
                     if len(value) < 100 else [])
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            _fail(ValueError, ctx, name, f"must be one of {', '.join(map(repr, choices))}, "
                                         f"got {_brief(value)}{hint}")
        return value
    return check


def _as_float_array(value, name, ctx):
    """value as a float64 C-contiguous array: the one conversion of the public face."""
    if isinstance(value, (str, bytes, dict, set)) or value is None:
        _fail(TypeError, ctx, name, f"must be an array of numbers, got {type(value).__name__}")
    try:
        a = np.asarray(value)
    except ValueError as e:                                   # ragged nested lists
        _fail(ValueError, ctx, name, f"must be a rectangular array of numbers: {e}")
    if a.dtype.kind not in "biuf":
        _fail(TypeError, ctx, name, f"must be an array of real numbers, got dtype {a.dtype}"
                                    + (" (ragged or mixed input?)" if a.dtype == object else ""))
    a = np.asarray(a, dtype=np.float64, order="C")            # (ascontiguousarray would make 0-D 1-D)
    if not a.flags.writeable:                                 # read-only (pandas 3, np.broadcast_to):
        a = a.copy()                                          # numba would compile a second version
    return a


def _check_shape(a, dims, name, ctx):
    if a.ndim != len(dims):
        _fail(ValueError, ctx, name, f"must be {len(dims)}-D of shape ({', '.join(dims)}"
                                     f"{',' if len(dims) == 1 else ''}), got shape {a.shape}")
    for axis, sym in enumerate(dims):
        if sym == "*":
            continue
        if sym.isdigit():
            fixed, source = int(sym), None
        elif not sym.isidentifier():                          # an expression, "n*(J-1)"
            fixed, source = _dim_value(sym, {k: v[0] for k, v in ctx.dims.items()}), None
        elif sym in ctx.dims:
            fixed, source = ctx.dims[sym]
        else:
            ctx.dims[sym] = (a.shape[axis], name)
            continue
        if a.shape[axis] != fixed:
            shape = ", ".join(dims) + ("," if len(dims) == 1 else "")
            where = "" if source is None else (f" (the shape of {name} itself)" if source == name
                                               else f" from {source}")
            _fail(ValueError, ctx, name, f"must have shape ({shape}) with {sym} = {fixed}{where}, "
                                         f"got shape {a.shape}")


def _first_bad(mask):
    return tuple(int(i) for i in np.argwhere(mask)[0])


_PSD_PROOF_N = 300        # psd proved by a Cholesky of A + jitter at the door up to this n (< 1 ms)


@njit(cache=True)
def _square_defect(A, jitter):
    """One pass over the lower triangle of a square matrix A: (kind, i, j) of its worst defect.

    kind 0: none; 1: asymmetric, |A_ij - A_ji| > _SYM_RTOL max|A| (the largest gap); 2: a
    negative diagonal entry; 3: a 2 x 2 principal minor of A + jitter I below 0,
    A_ij^2 > (A_ii + jitter)(A_jj + jitter) (a necessary condition for psd, O(n^2)).
    """
    n = A.shape[0]
    scale = 0.0
    for i in range(n):
        for j in range(n):
            scale = max(scale, abs(A[i, j]))
    gap, gi, gj = 0.0, 0, 0
    for i in range(n):
        for j in range(i):
            g = abs(A[i, j] - A[j, i])
            if g > gap:
                gap, gi, gj = g, i, j
    if gap > _SYM_RTOL * scale:
        return 1, gi, gj
    for i in range(n):
        if A[i, i] < 0.0:
            return 2, i, i
    for i in range(n):
        for j in range(i):
            if A[i, j] * A[i, j] > (A[i, i] + jitter) * (A[j, j] + jitter):
                return 3, i, j
    return 0, 0, 0


def _square_matrices(a, name, ctx):
    if a.size == 0:
        return []
    if a.shape[-1] != a.shape[-2]:
        _fail(ValueError, ctx, name, f"must be square, got shape {a.shape}")
    return list(a.reshape(-1, a.shape[-2], a.shape[-1]))


def _asymmetry_message(A, i, j, name):
    return (f"must be symmetric (to a relative tolerance {_SYM_RTOL:g}), got {name}[{i}, {j}] = "
            f"{A[i, j]:.6g} but {name}[{j}, {i}] = {A[j, i]:.6g}")


def _check_symmetric(a, name, ctx):
    for A in _square_matrices(a, name, ctx):
        kind, i, j = _square_defect(A, np.inf)             # infinite jitter: minors never fail
        if kind == 1:
            _fail(ValueError, ctx, name, _asymmetry_message(A, i, j, name))


def _not_psd_message(A, name):
    """The message for a matrix A that is not positive semidefinite, or None if it is (to jitter)."""
    n = A.shape[0]
    d = np.diagonal(A)
    jitter = _PSD_JITTER * max(d.max(), 1e-300)
    try:
        np.linalg.cholesky(A + jitter * np.eye(n))
        return None
    except np.linalg.LinAlgError:
        low = np.linalg.eigvalsh(A)[0]
        return (f"must be positive semidefinite (a covariance matrix): its smallest eigenvalue is "
                f"{low:.3g}, and {name} + {_PSD_JITTER:g} max(diag {name}) I has no Cholesky factor. "
                f"Build it with kernel_matrix, or add jitter to its diagonal, or choose other "
                f"hyperparameters")


def _check_psd(a, name, ctx):
    """Symmetric, non-negative diagonal, 2 x 2 minors >= 0 (all O(n^2)); for n <= _PSD_PROOF_N
    also a Cholesky factor of A + jitter I. A larger A that passes is proved or refuted by the
    algorithm's own factorisations: PublicFunction turns their failure into this same message."""
    for A in _square_matrices(a, name, ctx):
        n = A.shape[0]
        if n == 0:
            continue
        jitter = _PSD_JITTER * max(np.diagonal(A).max(), 1e-300)
        kind, i, j = _square_defect(A, jitter)
        if kind == 1:
            _fail(ValueError, ctx, name, _asymmetry_message(A, i, j, name))
        if kind == 2:
            _fail(ValueError, ctx, name, f"must be positive semidefinite, but its diagonal has "
                                         f"{A[i, i]:.6g} < 0 at {i}")
        if kind == 3:
            _fail(ValueError, ctx, name, f"must be positive semidefinite (a covariance matrix), but "
                                         f"{name}[{i}, {j}]^2 = {A[i, j] ** 2:.6g} exceeds "
                                         f"{name}[{i}, {i}] {name}[{j}, {j}] = {A[i, i] * A[j, j]:.6g} "
                                         f"(a correlation above 1). Build it with kernel_matrix")
        if n <= _PSD_PROOF_N:
            message = _not_psd_message(A, name)
            if message:
                _fail(ValueError, ctx, name, message)


def _values(test, what, hint=None):
    def check(a, name, ctx):
        bad = ~test(a)
        if bad.any():
            idx = _first_bad(bad)
            where = idx[0] if len(idx) == 1 else list(idx)
            extra = hint(a) if hint else ""
            _fail(ValueError, ctx, name, f"must contain only {what}, got {a[idx]:g} at index {where}{extra}")
    return check


def _zero_one_hint(a):
    """For -1/+1 labels given as 0/1: say how to convert them."""
    if np.all((a == 0) | (a == 1)):
        return " (labels 0/1: use 2 * y - 1; gpclab.GPClassifier takes any two labels)"
    return ""


def _check_one_hot(a, name, ctx):
    _values(lambda v: (v == 0) | (v == 1), "0 and 1 (one-hot)")(a, name, ctx)
    if a.shape[0] < 2:
        _fail(ValueError, ctx, name, f"must have at least 2 classes (rows), got shape {a.shape}")
    s = a.sum(axis=0)
    if np.any(s != 1):
        i = int(np.argmax(s != 1))
        _fail(ValueError, ctx, name, f"must be one-hot: exactly one 1 in each column, column {i} "
                                     f"has {int(s[i])}")


def _check_log_hyp_len(a, name, ctx):
    kernel = ctx.args.get("kernel")
    d = ctx.dims.get("d", (None,))[0]
    if kernel is not None and d is not None:
        p = n_hyp(kernel, d)
        if a.shape[-1] != p:
            what = {"se": "(log l, log sf)", "ard": "(log v0, log v1, log w_1..log w_d)",
                    "kg": "(log t0, log t1, log t2, log l_1..log l_d)",
                    "kg_iso": "(log t0, log t1, log t2, log l)"}[kernel]
            _fail(ValueError, ctx, name, f"for kernel {kernel!r} on d = {d} inputs must have "
                                         f"length {p} {what}, got shape {a.shape}")
    big = np.abs(a) > _LOG_HYP_MAX
    if big.any():
        _fail(ValueError, ctx, name, f"holds {a[big][0]:g}: log-hyperparameters beyond "
                                     f"+-{_LOG_HYP_MAX:g} overflow the covariance")


def _check_nonempty(a, name, ctx):
    if a.size == 0:
        _fail(ValueError, ctx, name, f"must not be empty, got shape {a.shape}")


_ARRAY_CHECKS = {
    "sym": _check_symmetric,
    "psd": _check_psd,
    "pm1": _values(lambda v: (v == 1) | (v == -1), "-1 and +1", _zero_one_hint),
    "onehot": _check_one_hot,
    "nonneg": _values(lambda v: v >= 0, "values >= 0"),
    "positive": _values(lambda v: v > 0, "values > 0"),
    "unit": _values(lambda v: (v >= 0) & (v <= 1), "values in [0, 1]"),
    "flags": _values(lambda v: (v == 0) | (v == 1), "flags 0/1 or False/True, one per input column "
                                                   "(for column indices use discrete_flags)"),
    "loghyp": _check_log_hyp_len,
    "nonempty": _check_nonempty,
}


def _chol_diag(a, name, ctx):
    d = np.diagonal(a, axis1=-2, axis2=-1)
    if np.any(d <= 0):
        _fail(ValueError, ctx, name, "must be a Cholesky factor (lower triangular, positive diagonal), "
                                     f"got a diagonal entry {d[d <= 0][0]:g}")


_ARRAY_CHECKS["chol"] = _chol_diag


def _check_bounds(a, name, ctx):
    if np.any(a[:, 0] > a[:, 1]):
        i = int(np.argmax(a[:, 0] > a[:, 1]))
        _fail(ValueError, ctx, name, f"must be (low, high) pairs with low <= high, got {tuple(a[i])} "
                                     f"at {i}")


_ARRAY_CHECKS["bounds"] = _check_bounds


def _targets(value, name, ctx):
    """Targets of the numba layer: -1/+1 of shape (n,), or one-hot of shape (C, n)."""
    if np.ndim(value) == 2:
        return _compile_spec("(C, n) onehot nonempty")(value, name, ctx)
    return _compile_spec("(n,) pm1 nonempty")(value, name, ctx)


def _log_hyp_any(value, name, ctx):
    """Log-hyperparameters (p,), or (C, p) for one set per class."""
    if np.ndim(value) == 2:
        return _compile_spec("(C, p) loghyp")(value, name, ctx)
    return _compile_spec("(p,) loghyp")(value, name, ctx)


def _data_matrix(value, name, ctx):
    """Inputs X of the Python layer, (n, d): with a hint for a 1-D array."""
    if np.ndim(value) == 1:
        _fail(ValueError, ctx, name, f"must be 2-D of shape (n_samples, n_features), got shape "
                                     f"{np.shape(value)}; use {name}.reshape(-1, 1) for a single feature")
    return _compile_spec("(n, d) nonempty")(value, name, ctx)


def _flag(value, name, ctx):
    if not isinstance(value, (bool, np.bool_)):
        _fail(TypeError, ctx, name, f"must be True or False, got {_brief(value)}"
                                    + (" (a string is not a flag)" if isinstance(value, str) else ""))
    return bool(value)


def _grid_axis(value, name, ctx):
    """The values of one axis of a grid: a number or a non-empty 1-D array."""
    if np.ndim(value) == 0:
        value = [value]
    return _compile_spec("(*,) nonempty")(value, name, ctx)


_WHOLE = {"targets": _targets, "loghyp_any": _log_hyp_any, "X": _data_matrix, "bool": _flag,
          "grid": _grid_axis}


def _check(spec, value, name, where=None, kernel=None, d=None):
    """value checked and converted by a public spec outside a public call: the Python layer's
    door to the same checks and messages. where: the function named in a message (none if
    None); kernel and d (the number of inputs): what a "loghyp" length check needs."""
    ctx = _Context(where)
    if kernel is not None:
        ctx.args["kernel"] = kernel
    if d is not None:
        ctx.dims["d"] = (d, "X")
    return _compile_spec(spec)(value, name, ctx)


def _check_choice(value, name, choices, where=None):
    """value, one of the names in choices (a "{a,b}" spec)."""
    return _choice(tuple(choices))(value, name, _Context(where))


def _check_log_hyp(log_hyp, kernel, d, name="log_hyp", where=None):
    """log_hyp (raveled) as a "(p,) loghyp" spec for `kernel` on d inputs."""
    return _check("(p,) loghyp", np.ravel(log_hyp), name, where, kernel, d)


def _spec_dims(spec):
    """The shape symbols of an array spec, ["n", "n"] for "(n, n) psd"; None for a scalar spec."""
    first = spec.replace(", ", ",").split()[0]
    if not first.startswith("("):
        return None
    return [s.strip() for s in first.strip("()").split(",") if s.strip()]


def _dim_value(sym, shapes):
    """The size a shape symbol stands for: a number, a symbol, or an expression of symbols
    ("n*(J-1)"); KeyError if a symbol is not known."""
    if sym.isdigit():
        return int(sym)
    if sym.isidentifier():
        return shapes[sym]
    try:
        return int(eval(sym, {"__builtins__": {}}, dict(shapes)))
    except NameError as e:
        raise KeyError(str(e)) from None


def _zeros_for(dims, shapes, name, where):
    """zeros of shape dims, the symbols looked up in shapes (symbol -> size)."""
    try:
        return np.zeros(tuple(_dim_value(s, shapes) for s in dims))
    except KeyError:
        raise TypeError(f"{where}: {name} is None and its shape ({', '.join(dims)}) is not fixed "
                        f"by the other arguments: pass an array") from None


def _compile_spec(spec):
    """Turn an argument's spec string into a function (value, name, ctx) -> converted value."""
    words = spec.replace(", ", ",").split()
    optional = "?" in words or "?0" in words or "?e" in words
    zeros = "?0" in words
    empty = "?e" in words
    words = [w for w in words if w not in ("?", "?0", "?e")]
    if words and words[0].startswith("("):
        dims = _spec_dims(spec)
        inplace = "inplace" in words
        checks = [_ARRAY_CHECKS[w] for w in words[1:] if w != "inplace"]

        def convert(value, name, ctx):
            if value is None and zeros:                       # absent: zeros, one compiled type
                return _zeros_for(dims, {k: v[0] for k, v in ctx.dims.items()}, name, ctx.where)
            if value is None and empty:                       # absent: empty, one compiled type
                return np.empty((0,) * len(dims))
            if value is None and optional:
                return None
            if inplace:                                       # written in place: no copy allowed
                if not (isinstance(value, np.ndarray) and value.dtype == np.float64
                        and value.flags.c_contiguous and value.flags.writeable):
                    _fail(TypeError, ctx, name, "is updated in place and must be a writeable "
                                                "C-contiguous float64 ndarray")
                a = value
            else:
                a = _as_float_array(value, name, ctx)
            _check_shape(a, dims, name, ctx)
            if not np.all(np.isfinite(a)):
                idx = _first_bad(~np.isfinite(a))
                where = idx[0] if len(idx) == 1 else list(idx)
                _fail(ValueError, ctx, name, f"must be finite, got {a[idx]} at index {where}")
            for check in checks:
                check(a, name, ctx)
            return a
        return convert
    (word,) = words
    if word in _WHOLE:
        base = _WHOLE[word]
    elif word.startswith("{"):
        base = _choice(tuple(word.strip("{}").split(",")))
    else:
        base = _SCALARS[word]

    def convert_scalar(value, name, ctx):
        if value is None and optional:
            return None
        return base(value, name, ctx)
    return convert_scalar


def _one_array_stays_one(given, converted):
    """An array given for two arguments is passed on as one array after conversion, not as two
    copies: kernel_matrix(kernel, X, X, ...) adds the latent noise of 'kg' and 'kg_iso' only when
    X1 and X2 are the same array (k(X, X)), and a Fortran-ordered, integer, list or read-only X was
    converted once for each argument."""
    first = {}
    for name, value in given.items():
        if value is None or isinstance(value, (str, bytes, int, float, bool, np.generic)):
            continue
        if id(value) not in first:
            first[id(value)] = name
            continue
        a, b = converted[first[id(value)]], converted[name]
        if (isinstance(a, np.ndarray) and isinstance(b, np.ndarray) and a is not b
                and a.shape == b.shape and a.dtype == b.dtype):
            converted[name] = a


def _caused_by_interrupt(e):
    """Whether a KeyboardInterrupt stands anywhere in the chain of causes of exception e."""
    seen = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, KeyboardInterrupt):
            return True
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return False


_BLAS_ONE_THREAD_BELOW = 1500    # arrays with every dimension below this: one BLAS thread
_blas_libraries = []
# inside a fit whose BLAS threads _FitThreads.limit set (from _machine_speed): the calls it makes
# keep them (multi-class EP's N x N sweeps at n = 214 and 6 classes are large work on small X)
_fit_threads_set = contextvars.ContextVar("gpclab_fit_threads_set", default=False)


class _blas_threads_for:
    """One BLAS thread for the length of a call whose arrays are all smaller than
    _BLAS_ONE_THREAD_BELOW in every dimension, then the number there was before.

    Two BLAS threads pay off only from n ~ 1500 (NUMBA.md); below that OpenBLAS's threads mostly
    spin, and on a hub where several kernels share few cores they take each other's time (four
    students' first cells at once: 4-15 s each, 2-2.5 s with one thread). Costs ~30 us a call.
    """

    def __init__(self, values):
        dims = [d for v in values for d in getattr(v, "shape", ())]      # arrays and DataFrames
        self.active = bool(dims) and max(dims) < _BLAS_ONE_THREAD_BELOW and not _fit_threads_set.get()
        self.before = None
        self.outer = None            # the most threads there were when it held one

    def __enter__(self):
        if self.active:
            if not _blas_libraries:
                from threadpoolctl import ThreadpoolController
                _blas_libraries.extend(c for c in ThreadpoolController().lib_controllers
                                       if c.user_api == "blas")
            self.before = [lib.get_num_threads() for lib in _blas_libraries]
            self.outer = max(self.before, default=1)
            for lib, n in zip(_blas_libraries, self.before):
                if n != 1:
                    lib.set_num_threads(1)
        return self

    def __exit__(self, *exc):
        if self.before is not None:
            for lib, n in zip(_blas_libraries, self.before):
                if n != 1:
                    lib.set_num_threads(n)


# What a call stores, in float64 numbers, as an expression of its arguments and shape symbols:
# a count that would need more memory than the machine has is refused at the door, with the
# memory it would need, instead of a MemoryError (or swapping) inside the body.
_ALLOCATES = {
    "hmc_latent": "n_samples * n",
    "elliptical_slice_latent": "n_samples * n",
    "truncated_gaussian_gibbs": "n_samples * n",
    "truncated_gaussian_mh": "n_samples * n",
    "ais": "3 * (T + 1) + 2 * R * n",
    "mcmc_predict": "S * m",
    "mcmc_posterior": "n_samples * n",
    "hmc_hyperparameters": "n_iter * 4 * d",
}


def _memory_bytes():
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return None


def _check_allocation(expr, ctx):
    """Refuse a call whose arrays (expr float64 numbers) would not fit in the machine's memory."""
    names = {k: v[0] for k, v in ctx.dims.items()}
    names.update((k, v) for k, v in ctx.args.items() if isinstance(v, int) and not isinstance(v, bool))
    try:
        need = 8 * int(eval(expr, {"__builtins__": {}}, names))
    except (NameError, TypeError):
        return
    have = _memory_bytes()
    if have and need > have:
        count = next(k for k in ctx.args if k in expr and k in names and k not in ctx.dims)
        raise ValueError(f"{ctx.where}: {count} = {ctx.args[count]} would need {need / 2 ** 30:,.1f} GiB "
                         f"({expr} numbers of 8 bytes), more than this machine's {have / 2 ** 30:.0f} GiB")


# The matrix each algorithm factorises, for _factorisation_failed: (matrix, source, EP?).
_FACTORISES = {
    "laplace_mode": ("B = I + W^1/2 K W^1/2", "GPML Algorithm 3.1", False),
    "laplace_predict": ("B = I + W^1/2 K W^1/2", "GPML Algorithm 3.2", False),
    "laplace_mode_multiclass": ("B_c = I + D_c^1/2 K_c D_c^1/2 or sum_c E_c", "GPML Algorithm 3.3", False),
    "laplace_predict_multiclass": ("B_c = I + D_c^1/2 K_c D_c^1/2 or sum_c E_c", "GPML Algorithm 3.4", False),
    "ep": ("B = I + S~^1/2 K S~^1/2", "GPML Algorithm 3.5", True),
    "ep_predict": ("B = I + S~^1/2 K S~^1/2", "GPML Algorithm 3.6", True),
    "ep_multiclass": ("B = I + S~^1/2 Kg S~^1/2", "EP on the difference latents, K&G 4.2", True),
    "ep_predict_multiclass": ("B = I + S~^1/2 Kg S~^1/2", "EP on the difference latents, K&G 4.2", True),
}


def _factorisation_failed(where, body, e, covariances):
    """The one message (a ValueError) for a Cholesky factorisation that failed inside the body of
    `body`, raised as `where`, given the covariance matrices it was given, (name, array) pairs.

    The public face and the Python layer's callers of unchecked bodies both use it. A covariance
    that is not positive semidefinite is named, as the door names it (the door proves psd only up
    to n = _PSD_PROOF_N, and unchecked calls skip the door); one that is psd to the jitter but has
    a negative eigenvalue is named as not psd in floating point. Otherwise the covariances are
    fine: EP's B can still fail when its site precisions grow huge; say so instead of blaming K.
    """
    matrix, source, ep_sites = _FACTORISES.get(body, (None, None, False))
    failed = (f"{matrix} of {body} ({source}) has no Cholesky factor" if matrix
              else f"a Cholesky factorisation in {body} failed ({e})")
    covariances = [(name, a) for name, a in covariances if a is not None and a.size > 0]
    for name, a in covariances:
        for A in a.reshape(-1, a.shape[-2], a.shape[-1]):
            message = _not_psd_message(A, name)
            if message:
                return ValueError(f"{where}: {name} {message}")
    for name, a in covariances:
        for A in a.reshape(-1, a.shape[-2], a.shape[-1]):
            low, high = np.linalg.eigvalsh(A)[[0, -1]]
            if low < 0:
                return ValueError(f"{where}: {failed}: {name} is not positive semidefinite in floating "
                                  f"point (eigenvalues from {low:.3g} to {high:.3g}: rounding errors of "
                                  f"{name} exceed its smallest eigenvalues); lower the signal variance or "
                                  f"add jitter to the diagonal of {name}")
    names = " and ".join(name for name, _ in covariances) or "the covariance"
    if ep_sites:
        return ValueError(f"{where}: {failed}, although {names} is positive semidefinite: EP's site "
                          f"precisions tau~ are so large that B, >= I in exact arithmetic, lost its "
                          f"positive definiteness to rounding. Start from smaller sites, add jitter "
                          f"to the diagonal of {names}, or choose other hyperparameters")
    return ValueError(f"{where}: {failed}: {names} must be positive definite enough for this step. "
                      f"Add jitter to the diagonal (e.g. K + 1e-8 * np.eye(n) * K.diagonal().mean()) "
                      f"or choose other hyperparameters")


class PublicFunction:
    """A public function of gpclab: checks and converts its arguments, calls the body.

    Attributes: py_func, the plain Python body (to step through in a debugger);
    dispatcher, the njit function itself (numba code calls it directly);
    unchecked(...), the call without the checks (for callers that built the
    arguments themselves). Other attributes are the dispatcher's.
    """

    def __init__(self, body, specs, returns, prepare=None, together=()):
        self.prepare = prepare
        self.together = together
        self.dispatcher = body
        self.py_func = getattr(body, "py_func", body)
        self.signature = inspect.signature(self.py_func)
        unknown = set(specs) - set(self.signature.parameters)
        if unknown:
            raise TypeError(f"public spec for {self.py_func.__name__} names no argument {unknown}")
        self.specs = {k: _compile_spec(v) for k, v in specs.items()}
        self.spec_text = dict(specs)
        self._dims = {k: d for k, d in ((k, _spec_dims(v)) for k, v in specs.items()) if d}
        self._zero_fill = [k for k, v in specs.items() if "?0" in v.split()]
        self._empty_fill = [k for k, v in specs.items() if "?e" in v.split()]
        self._inplace = {k for k, v in specs.items() if "inplace" in v.split()}
        self.returns = returns
        self._psd = [k for k, v in specs.items() if "psd" in v.split() or "chol" in v.split()]
        functools.update_wrapper(self, self.py_func)

    def __call__(self, *args, **kwargs):
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as e:                          # too many, missing or unknown arguments
            raise TypeError(_bounded(f"{self.__name__}: {e}", 500)) from None
        bound.apply_defaults()
        ctx = _Context(self.__name__)
        ctx.args = dict(bound.arguments)
        self._check_together(bound.arguments)
        given = dict(bound.arguments)
        for name, check in self.specs.items():               # in the order of the spec
            bound.arguments[name] = ctx.args[name] = check(bound.arguments[name], name, ctx)
        _one_array_stays_one(given, bound.arguments)
        if self.__name__ in _ALLOCATES:
            _check_allocation(_ALLOCATES[self.__name__], ctx)
        try:
            out = self._run(bound)
        except np.linalg.LinAlgError as e:
            raise self._factorisation_failed(bound.arguments, e) from None
        if self.__name__ in _AFTER:                          # warnings about the result (checked calls only)
            globals()[_AFTER[self.__name__]](out)
        return out

    def _factorisation_failed(self, arguments, e):
        """A Cholesky factorisation failed inside the body: the message of _factorisation_failed."""
        covariances = [(name, arguments[name]) for name in self._psd if "psd" in self.spec_text[name].split()]
        return _factorisation_failed(self.__name__, self.__name__, e, covariances)

    def unchecked(self, *args, **kwargs):
        """The call without checks. The arguments are only brought to the types that the
        checked call passes (every default filled in, an absent "?0" array as zeros, an absent
        "?e" array empty, a read-only array copied, boolean
        flags as float64), so that both share one compilation of the body."""
        bound = self.signature.bind(*args, **kwargs)
        bound.apply_defaults()
        a = bound.arguments
        given = dict(a)
        self._check_together(a)
        shapes = {}
        for name, dims in self._dims.items():
            v = a[name]
            if isinstance(v, np.ndarray):
                if v.dtype == np.bool_:
                    a[name] = v = v.astype(np.float64)
                elif not v.flags.writeable and name not in self._inplace:
                    a[name] = v = v.copy()           # numba types a read-only array apart (a memory-mapped model)
                if v.ndim == len(dims):
                    shapes.update((s, k) for s, k in zip(dims, v.shape) if s.isidentifier())
        for name in self._zero_fill:
            if a[name] is None:
                a[name] = _zeros_for(self._dims[name], shapes, name, self.__name__)
        for name in self._empty_fill:
            if a[name] is None:
                a[name] = np.empty((0,) * len(self._dims[name]))
        _one_array_stays_one(given, a)
        return self._run(bound)

    def _check_together(self, arguments):
        """Arguments of a `together` group are given all or none (a half warm start is a mistake)."""
        for group in self.together:
            given = [arguments[name] is not None for name in group]
            if any(given) and not all(given):
                raise ValueError(f"{self.__name__}: {' and '.join(group)} go together: give both, or neither")

    def _run(self, bound):
        if self.prepare is not None:
            self.prepare()
        try:
            with _blas_threads_for(bound.arguments.values()):
                out = self.dispatcher(*bound.args, **bound.kwargs)
        except Interrupted:
            raise KeyboardInterrupt(f"{self.__name__} interrupted") from None
        except SystemError as e:
            # numba's dispatcher runs a little Python to type some arguments (str) and to
            # unpickle constants: an interrupt that lands there is reported as "returned a
            # result with an exception set", with the KeyboardInterrupt somewhere down the
            # chain of causes (one SystemError per numba frame it passed through)
            if _caused_by_interrupt(e):
                raise KeyboardInterrupt(f"{self.__name__} interrupted") from None
            raise
        if self.returns is not None:
            out = self.returns(*out)
        return out

    def __getattr__(self, attr):
        if attr == "dispatcher":
            raise AttributeError(attr)
        return getattr(self.dispatcher, attr)

    def __get__(self, obj, objtype=None):
        return self               # a descriptor, so that help() shows the function's docstring

    def __reduce__(self):
        return _public_by_name, (self.__name__,)          # pickled by name, e.g. for executors

    def __repr__(self):
        return f"<gpclab public function {self.__name__}{self.signature}>"


if not config.DISABLE_JIT:
    @typeof_impl.register(PublicFunction)
    def _typeof_public(val, c):
        """numba code that calls a public function calls its njit body (no checks there)."""
        return typeof_impl(val.dispatcher, c)


def _public_by_name(name):
    return globals()[name]


def _start_threads():
    """Start numba's worker threads. numba does it when a parallel function is called from
    Python, or loaded from the cache; a cached function that calls a parallel one from numba
    code (ais calls _ais_temperatures) must do it itself, or the parallel loop crashes.

    In a process forked after its parent started numba's threads (_after_fork_in_child), the
    calling thread gets one numba thread, so that ais runs its runs one after the other in it
    (_ais_block): same numbers, and the child never enters the threading layer that the fork
    broke."""
    if not config.DISABLE_JIT:
        from numba import get_num_threads, set_num_threads
        if get_num_threads() != 1 and _FORKED_AFTER_THREADS:
            set_num_threads(1)


# A fork copies only the forking thread: numba's worker threads do not exist in the child, and
# its threading layers are not fork-safe except TBB's. GNU OpenMP (numba's 'omp' layer on Linux)
# ends a forked child that enters a parallel loop ("Terminating: fork() called from a process
# already using GNU OpenMP, this is unsafe.") and the user's multiprocessing.Pool then waits
# for ever for the task it had; the 'workqueue' layer's queues belong to threads that are gone.
# A child forked after the threads started therefore runs numba's parallel code serially.
_FORKED_AFTER_THREADS = False


def _numba_threads():
    """numba's number of threads for the calling thread (numba.get_num_threads), also from numba
    code, where numba's own get_num_threads calls through a ctypes pointer and cannot be cached."""
    if config.DISABLE_JIT:
        return 1
    return numba.get_num_threads()


if not config.DISABLE_JIT:
    from numba.extending import overload as _overload
    from numba.np.ufunc.parallel import _iget_num_threads

    @_overload(_numba_threads)
    def _numba_threads_in_numba():
        return lambda: _iget_num_threads()


def _threads_started():
    """The name of numba's threading layer if its threads have started in this process, else None."""
    if config.DISABLE_JIT:
        return None
    try:
        return numba.threading_layer()            # ValueError until the threads have started
    except ValueError:
        return None


def _after_fork_in_child():
    global _FORKED_AFTER_THREADS
    layer = _threads_started()
    if layer is not None and layer != "tbb":
        _FORKED_AFTER_THREADS = True
        numba.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# BLAS dtrsm and dsyrk, LAPACK dpotri and dpotrf, called from numba through scipy's Cython
# exports. Registering the symbol by name keeps the numba cache valid across
# processes (a ctypes pointer would disable caching). All integer arguments
# are 32-bit and passed by pointer; a C-order array is the Fortran transpose.
# madvise for _empty's huge pages: libc's on Linux (MADV_HUGEPAGE = 14, <sys/mman.h>); elsewhere
# a no-op (no transparent huge pages to ask for). Integer arguments: the address is passed as
# size_t, which 64-bit ABIs pass as they pass a pointer.
_HUGE_PAGE = 2 * 1024 * 1024
_HUGE_MIN = 4 * 1024 * 1024                                   # numpy's threshold for the same advice
if sys.platform.startswith("linux"):
    _MADV_HUGEPAGE = 14
    _libc_madvise = ctypes.CDLL(None).madvise
    _libc_madvise.argtypes, _libc_madvise.restype = [ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int], ctypes.c_int
else:
    _MADV_HUGEPAGE = 0                                        # never called: _empty tests it first
    _libc_madvise = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_size_t, ctypes.c_size_t, ctypes.c_int)(
        lambda address, length, advice: 0)
_llvm.add_symbol("gpclab_madvise", _c_address(_libc_madvise))
if config.DISABLE_JIT:
    _madvise = _libc_madvise
else:
    _madvise = types.ExternalFunction("gpclab_madvise", types.intc(types.uintp, types.uintp, types.intc))

_dtrsm = _c_function("gpclab_dtrsm", get_cython_function_address("scipy.linalg.cython_blas", "dtrsm"),
                     (types.void, None), 11)
_dsyrk = _c_function("gpclab_dsyrk", get_cython_function_address("scipy.linalg.cython_blas", "dsyrk"),
                     (types.void, None), 10)
_dpotri = _c_function("gpclab_dpotri", get_cython_function_address("scipy.linalg.cython_lapack", "dpotri"),
                      (types.void, None), 5)
_dpotrf = _c_function("gpclab_dpotrf", get_cython_function_address("scipy.linalg.cython_lapack", "dpotrf"),
                      (types.void, None), 5)
# and the block operations of _cholesky_blocked and _potri_blocked (large n)
_dgemm = _c_function("gpclab_dgemm", get_cython_function_address("scipy.linalg.cython_blas", "dgemm"),
                     (types.void, None), 13)
_dtrmm = _c_function("gpclab_dtrmm", get_cython_function_address("scipy.linalg.cython_blas", "dtrmm"),
                     (types.void, None), 11)
_dtrtri = _c_function("gpclab_dtrtri", get_cython_function_address("scipy.linalg.cython_lapack", "dtrtri"),
                      (types.void, None), 6)
_dlauum = _c_function("gpclab_dlauum", get_cython_function_address("scipy.linalg.cython_lapack", "dlauum"),
                      (types.void, None), 5)


# ----------------------------------------------------------------------------
# Assembly: every function recorded by @njit / @public becomes what it is used as
# ----------------------------------------------------------------------------

# public functions that run a parallel numba loop from numba code start numba's threads first
_PREPARE = {"ais": "_start_threads"}
# public functions whose checked calls warn about what they return (ais_grid and others call
# them unchecked and warn once for all their points)
_AFTER = {"ais": "_warn_ais"}

_AIS_MEANINGLESS = 0.1


def _warn_ais(out):
    """ais: warn when the HMC transitions hardly ever move (acceptance below 0.1): the chains then
    stay at their draws from the prior, log Z is an importance-sampling estimate from the prior
    whose weights one draw dominates, and se, computed from the same few weights, cannot show it."""
    acceptance = out[3]
    if acceptance < _AIS_MEANINGLESS:
        warnings.warn(f"ais: HMC acceptance {acceptance:.3g} is below {_AIS_MEANINGLESS}: the chains hardly "
                      "move, so log_Z is an estimate from the prior's draws alone, with an error that se "
                      "cannot show; use a smaller step (step=None, the default, follows K)",
                      RuntimeWarning, stacklevel=3)


def _assemble_one(fn):
    """The numba function (and checked public entry) for a function recorded above."""
    body = fn
    if inspect.isfunction(fn) and hasattr(fn, "_njit_options"):
        body = _numba_function(fn, fn._njit_options)
    if hasattr(fn, "_public_specs"):
        returns, together, specs = fn._public_specs
        prepare = _PREPARE.get(fn.__name__)
        body = PublicFunction(body, specs, returns, globals()[prepare] if prepare else None, together)
    return body


with _gc_paused_then_frozen():
    for _name, _fn in list(globals().items()):
        if inspect.isfunction(_fn) and _fn.__module__ == __name__ and (
                hasattr(_fn, "_njit_options") or hasattr(_fn, "_public_specs")):
            globals()[_name] = _assemble_one(_fn)
    del _name, _fn
_ASSEMBLED = True          # from now on @njit and @public build at once (functions defined later)

# ----------------------------------------------------------------------------
# GPClassifier: scikit-learn's estimator, made on first use
# ----------------------------------------------------------------------------

_estimator_lock = threading.Lock()


def _estimator():
    """gpclab.GPClassifier, made on first use: a class with _GPClassifier's body (Part II) and
    scikit-learn's ClassifierMixin and BaseEstimator as bases. Importing scikit-learn costs 0.6 s
    (scipy.stats, pandas), which a process that never uses the estimator does not pay."""
    with _estimator_lock:                  # one class, also when two threads ask at once
        if "GPClassifier" not in globals():
            with _gc_paused_then_frozen(freeze=False):    # the user's objects of the moment are not frozen
                from sklearn.base import BaseEstimator, ClassifierMixin
            body = {k: v for k, v in vars(_GPClassifier).items() if k not in ("__dict__", "__weakref__")}
            globals()["GPClassifier"] = type("GPClassifier", (ClassifierMixin, BaseEstimator), body)
    return globals()["GPClassifier"]


def __getattr__(name):
    """gpclab.GPClassifier (see _estimator); other names are not there."""
    if name == "GPClassifier":
        return _estimator()
    raise AttributeError(f"module 'gpclab' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | {"GPClassifier"})


# ============================================================================
# `python -m gpclab compile`: warm numba's cache for every user of this installation
# ============================================================================

def _compile_all(paths=None, log=print):
    """Run every public code path once on tiny data, so numba compiles and caches it.

    The argument types are those the lectures and exercises use (float arrays, label
    strings, optional warm starts given or None). paths: a subset of _COMPILE_PATHS
    (default all). Returns {path: seconds}.
    """
    import time
    r = np.random.default_rng(0)
    X = r.standard_normal((8, 2))
    Xs = r.standard_normal((3, 2))
    X1 = np.ascontiguousarray(X[:, :1])
    y = np.where(X[:, 0] > 0, 1.0, -1.0)
    y[0] = -y[0]
    labels3 = np.array([0, 1, 2, 0, 1, 2, 0, 1])
    grid = np.array([0.0, 0.5])
    GPClassifier = _estimator()
    K = kernel_matrix("se", X, X, np.zeros(2))

    def binary_laplace():
        for lik in _LAPLACE_LIKELIHOODS:                           # every likelihood of LIKELIHOODS
            m = GPClassifier(likelihood=lik, max_iter=3).fit(X, y)
            m.predict_proba(Xs), m.predict_proba(Xs, rule="map"), m.predict(Xs)
            log_likelihood(lik, y, np.zeros(8))
        GPClassifier(kernel="ard", max_iter=3).fit(X, y).predict_proba(Xs)
        evidence_grid(X1, y, grid, grid, progress=False, X_test=X1[:3], y_test=y[:3])
        laplace_mode(K, y, "logistic")
        logistic(y, np.zeros(8)), probit(y, np.zeros(8))
        kernel_diag("se", Xs, np.zeros(2))

    def binary_ep():
        for lik in _EP_LIKELIHOODS:                                # every EP site of LIKELIHOODS
            GPClassifier(method="ep", likelihood=lik, max_iter=3).fit(X, y).predict_proba(Xs)
        evidence_grid(X1, y, grid, grid, method="ep", likelihood="probit", progress=False,
                      X_test=X1[:3], y_test=y[:3])
        ep(K, y), ep(K, y, likelihood="step", eps=0.1), probit_moments(1.0, 0.0, 1.0)
        exact_log_evidence_probit(K, y)

    def em_ep_paths():
        GPClassifier(method="emep", max_iter=2).fit(X, y).predict_proba(Xs)
        GPClassifier(method="emep", kernel="kg_iso", max_iter=2, learn_eps=True).fit(X, y)
        Xd = np.column_stack([X[:, 0], (X[:, 1] > 0).astype(float)])
        GPClassifier(method="emep", max_iter=2, discrete=[False, True]).fit(Xd, y).predict_proba(Xs)

    def em_ep_multiclass():
        m = GPClassifier(method="emep", max_iter=2).fit(X, labels3)
        m.predict_proba(Xs), m.predict(Xs)

    def multiclass_laplace():
        GPClassifier(max_iter=3).fit(X, labels3).predict_proba(Xs)
        GPClassifier(max_iter=3, shared_hyp=False).fit(X, labels3).predict_proba(Xs)
        evidence_grid(X1, labels3, grid, grid, progress=False, X_test=X1[:3], y_test=labels3[:3],
                      n_samples=10)

    Kj = K + 1e-8 * np.eye(8)

    def mcmc():
        mcmc_posterior(X, y, np.zeros(2), X_test=Xs, n_samples=5, burn_in=2)
        mcmc_posterior(X, y, np.zeros(2), X_test=Xs, n_samples=5, burn_in=2, thin=2, sampler="elliptical")
        s = hmc_hyperparameters(X, y, n_iter=2, n_leapfrog=2)
        predict_averaged(X, y, Xs, s["samples"])

    def ais_paths():
        ais_grid(X1, y, grid[:1], grid[:1], T=5, R=1, progress=False)
        ais(Kj, y, "logistic", T=5, R=1), hmc_step_size(Kj, "probit")

    def multiclass_predict():
        Y = np.ascontiguousarray(np.eye(3)[:, labels3])            # C arrays, as GPClassifier calls it
        E = np.stack([np.eye(8)] * 3)
        K3 = np.stack([K] * 3)
        laplace_predict_multiclass.unchecked(K3, Y, np.zeros((3, 8)), K3[:, :, :3].copy(), np.ones((3, 3)),
                                             S=10, seed=0, E=E, M=np.eye(8), G=multiclass_G.unchecked(E, np.eye(8)))

    def truncated():
        C = Kj[:3, :3] + np.eye(3)
        truncated_gaussian_gibbs(C, 5), truncated_gaussian_mh(C, 5, 0.1)

    times = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        runs = {"laplace": binary_laplace, "ep": binary_ep, "emep": em_ep_paths,
                "emep_multiclass": em_ep_multiclass,
                "multiclass": multiclass_laplace, "mcmc": mcmc, "ais": ais_paths,
                "truncated": truncated, "multiclass_predict": multiclass_predict}
        for name in paths or _COMPILE_PATHS:
            run = runs[name]
            t0 = time.perf_counter()
            run()
            times[name] = time.perf_counter() - t0
            log(f"  {_COMPILE_PATHS[name]:28s} {times[name]:6.1f} s")
    return times


_COMPILE_PATHS = {"laplace": "binary Laplace", "multiclass": "multi-class Laplace",
                  "multiclass_predict": "multi-class Laplace predictions",
                  "ep": "binary EP", "emep": "binary EM-EP", "emep_multiclass": "multi-class EM-EP",
                  "mcmc": "MCMC posteriors and hyperparameters", "ais": "AIS, HMC step sizes",
                  "truncated": "truncated Gaussians"}

# How compile_paths shares the paths out over worker processes. Paths that call the same
# functions go to the same worker, which then compiles those once (numba compiles each
# function with all it calls; two workers would both compile what they share). These two
# chains share about 3 s of 35 s of compilation and take about as long as each other
# (measured per function with numba's compile events); more workers split them further.
_COMPILE_CHAINS = (("mcmc", "laplace", "ais", "multiclass"),
                   ("multiclass_predict", "emep", "emep_multiclass", "ep", "truncated"))


def _compile_worker(chain):
    """The paths of chain, one after the other in a worker process: [(path, seconds)], CPU seconds."""
    import time
    c0 = time.process_time()
    times = _compile_all(chain, log=lambda s: None)
    return [(path, times[path]) for path in chain], time.process_time() - c0


def _split_chains(paths, jobs):
    """_COMPILE_CHAINS restricted to paths, split (longest chain in halves) until there are jobs."""
    chains = [[p for p in chain if p in paths] for chain in _COMPILE_CHAINS]
    chains = [c for c in chains if c]
    while len(chains) < jobs:
        longest = max(chains, key=len)
        if len(longest) == 1:
            break
        chains.remove(longest)
        half = (len(longest) + 1) // 2
        chains += [longest[:half], longest[half:]]
    return chains


def _save_missing_overloads():
    """Save again every compiled gpclab function that the cache index lacks: the check of
    compile_paths for what this process compiled itself (which it holds in memory, so running
    the paths again would not consult the cache). Returns how many were saved."""
    saved = 0
    for obj in list(globals().values()):
        disp = getattr(obj, "dispatcher", obj)
        if not isinstance(disp, _Dispatcher) or not isinstance(disp._cache, _SharedCache):
            continue
        index = disp._cache._cache_file._load_index()
        opt = config.OPT                                   # the level the keys were made with
        config.OPT = config._OptLevel(_COMPILE_OPT) if "NUMBA_OPT" not in os.environ else opt
        try:
            for sig, cres in list(disp.overloads.items()):
                if disp._cache._index_key(sig, disp.targetctx.codegen()) not in index:
                    disp._cache.save_overload(sig, cres)
                    saved += 1
        finally:
            config.OPT = opt
    return saved


def _count_compilations(run):
    """Run run() and count the numba compilations of gpclab's functions it caused."""
    from numba.core import event

    count = [0]

    class Listener(event.Listener):
        def on_start(self, ev):
            if getattr(ev.data["dispatcher"].py_func, "__module__", "") == __name__:
                count[0] += 1

        def on_end(self, ev):
            pass

    listener = Listener()
    event.register("numba:compile", listener)
    try:
        run()
    finally:
        event.unregister("numba:compile", listener)
    return count[0]


def compile_paths(paths=None, jobs=None, log=print):
    """Compile and cache every public code path (or those named in paths), as
    `python -m gpclab compile` does; returns the wall-clock seconds.

    jobs: worker processes (default: one per core, at most one per path). numba compiles
    one function at a time in a process, so the paths are shared out over `jobs` processes
    ("spawn": numba's threading layer is not safe to fork) in the chains of _COMPILE_CHAINS,
    and what one saves the others load. Then this process runs every path again: everything must now come from the cache,
    and anything that does not (a cache index entry lost between processes writing at once,
    which numba does not guard against) is compiled and saved here.
    """
    import multiprocessing
    import time
    from concurrent.futures import ProcessPoolExecutor

    unknown = [p for p in paths or () if p not in _COMPILE_PATHS]
    if unknown:
        raise ValueError(f"compile_paths: unknown path(s) {unknown}; choose from {', '.join(_COMPILE_PATHS)}")
    paths = [p for p in _COMPILE_PATHS if p in (paths or _COMPILE_PATHS)]
    jobs = jobs or os.cpu_count() or 1
    chains = _split_chains(paths, jobs)
    t0 = time.perf_counter()
    if len(chains) > 1 and jobs > 1 and not config.DISABLE_JIT:
        # this process compiles the first chain while workers compile the others
        pool = ProcessPoolExecutor(len(chains) - 1, mp_context=multiprocessing.get_context("spawn"))
        try:
            futures = [pool.submit(_compile_worker, chain) for chain in chains[1:]]
            results = [_compile_worker(chains[0])] + [f.result() for f in futures]
        except KeyboardInterrupt:                             # Ctrl-C: drop the chains not started
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        for worker, (times, cpu) in enumerate(results):
            for path, seconds in times:
                log(f"  {_COMPILE_PATHS[path]:38s} {seconds:5.1f} s  (process {worker})")
            log(f"  {'':38s}        (process {worker}: CPU {cpu:.1f} s)")
        recompiled = _count_compilations(lambda: _compile_all(paths, log=lambda s: None))
        resaved = _save_missing_overloads()
        if recompiled or resaved:
            log(f"  checked: {recompiled + resaved} compilation(s) missing from the cache were saved again")
        else:
            log("  checked: every path loads from the cache")
    else:
        _compile_all(paths, log=log)
    return time.perf_counter() - t0


def _installed_file():
    """The gpclab.py of the installed distribution (pip install .), or None (not installed, or
    installed editable, where the installation is the checkout itself)."""
    from importlib import metadata
    try:
        files = metadata.distribution("gpclab").files or ()
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == "gpclab.py" and len(f.parts) == 1:
            return os.path.realpath(f.locate())
    return None


def main(argv=None):
    """Command line: `gpclab compile` (run once after installing; also `python -m gpclab compile`)."""
    import argparse
    import sys
    parser = argparse.ArgumentParser(
        prog="gpclab",
        description="gpclab command line. compile: compile every public code path into numba's "
                    "cache, so that every user of this installation loads it instead of compiling. "
                    "The cache goes to NUMBA_CACHE_DIR if set, else next to gpclab.py.")
    parser.add_argument("command", choices=["compile"])
    parser.add_argument("paths", nargs="*", metavar="path",
                        help="only these code paths (default: all): " + ", ".join(
                            f"{k} ({v})" for k, v in _COMPILE_PATHS.items()))
    parser.add_argument("-j", "--jobs", type=int, default=None,
                        help="worker processes compiling at once (default: one per core)")
    args = parser.parse_intermixed_args(argv)          # `compile -j 2 ep` as well as `compile ep -j 2`
    for path in args.paths:
        if path not in _COMPILE_PATHS:
            parser.error(f"unknown path {path!r}; choose from {', '.join(_COMPILE_PATHS)}")
    if args.jobs is not None and args.jobs < 1:
        parser.error(f"--jobs must be a positive number of processes, got {args.jobs}")
    installed = _installed_file()
    if installed and installed != os.path.realpath(__file__):
        print(f"this is {os.path.realpath(__file__)} (python -m imports the gpclab.py of the current "
              f"folder first), not the installed {installed} that users import: run `gpclab compile` "
              f"instead, or run this from another folder", file=sys.stderr)
        return 2
    write, read = _cache_dirs(os.path.abspath(__file__))
    print(f"gpclab {__version__}: compiling into {write or 'memory only'}")
    if write is None:
        print("no writable cache folder: nothing can be saved (set NUMBA_CACHE_DIR or run as the "
              "installation's owner)")
        return 1
    total = compile_paths(args.paths, args.jobs)
    print(f"done in {total:.1f} s")
    return 0


# `from gpclab import *`: the public names, GPClassifier among them (made then), not the modules
__all__ = sorted({k for k, v in globals().items() if not k.startswith("_") and not inspect.ismodule(v)}
                 | {"GPClassifier"})


if __name__ == "__main__":
    # Run the function of the imported module, so the cache belongs to gpclab's
    # functions and not to a second copy of them defined in __main__.
    import sys

    import gpclab
    sys.exit(gpclab.main())

