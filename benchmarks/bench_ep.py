"""Binary EP (probit): gpclab against pyGPs and GPy, side by side in one run.

For n = 200, 767, 1500 training points (d = 10, synthetic as in
bench_laplace.py, SE kernel with l = 3, sf = 2 for all three libraries):
  * EP to convergence plus log Z_EP and its gradient, each library with its
    own stopping rule (pyGPs: |change of log Z| < 1e-4, at least 2 and at most
    10 sweeps in natural order; GPy: mean squared change of the sites < 1e-6,
    random order; gpclab: |change of log Z| < 1e-9 and relative site change
    < 3e-5, natural order);
  * the sweeps each made, the time per sweep, and the log Z_EP each returns
    against gpclab's tightly converged one;
  * gpclab for exactly 4 sweeps.
At n = 200 also the accuracy of each library's gradient against central
finite differences of its own log Z_EP.
One BLAS thread for all (threadpoolctl); medians over repeats (one repeat
for the peers at n = 1500, where a run takes a minute or more).

Needs: pip install pygps future GPy
Usage: python benchmarks/bench_ep.py [--quick]
"""
import sys
import warnings

import numpy as np
from threadpoolctl import threadpool_limits

import gpclab
from bench_laplace import make_data, median_time

ELL, SF = 3.0, 2.0
LOG_HYP = np.log([ELL, SF])


SWEEPS = {}


def _count_sweeps():
    """Count the sweeps each peer makes, by wrapping the function it calls once per sweep."""
    import GPy
    import pyGPs

    ep_py = pyGPs.Core.inf.EP
    ep_gpy = GPy.inference.latent_function_inference.EP
    orig_py, orig_gpy = ep_py._epComputeParams, ep_gpy._local_updates

    def py(self, *a, **k):
        SWEEPS["pyGPs"] = SWEEPS.get("pyGPs", 0) + 1
        return orig_py(self, *a, **k)

    def gpy(self, *a, **k):
        SWEEPS["GPy"] = SWEEPS.get("GPy", 0) + 1
        return orig_gpy(self, *a, **k)

    ep_py._epComputeParams, ep_gpy._local_updates = py, gpy


def pygps_run(X, y, ell=ELL, sf=SF):
    import pyGPs

    m = pyGPs.GPC()
    m.setPrior(kernel=pyGPs.cov.RBF(log_ell=np.log(ell), log_sigma=np.log(sf)))
    m.setData(X, y[:, None])
    m.inffunc.last_ttau = None  # no warm start
    m.getPosterior(X, y[:, None])
    # pyGPs returns -log Z and its gradient in (log l, log sf)
    return -float(np.ravel(m.nlZ)[0]), -np.array(m.dnlZ.cov, dtype=float)


def gpy_run(X, y, ell=ELL, sf=SF):
    import GPy

    k = GPy.kern.RBF(X.shape[1], variance=sf ** 2, lengthscale=ell)
    m = GPy.core.GP(X, ((y + 1) / 2)[:, None], kernel=k, likelihood=GPy.likelihoods.Bernoulli(),
                    inference_method=GPy.inference.latent_function_inference.EP())
    g = np.array(m.gradient, dtype=float)  # d/d variance, d/d lengthscale
    return float(m.log_likelihood()), np.array([g[1] * ell, g[0] * 2 * sf ** 2])


def gpclab_run(X, y, ell=ELL, sf=SF):
    v, g, res = gpclab.ep_evidence(X, y, np.log([ell, sf]))
    SWEEPS["gpclab"] = SWEEPS.get("gpclab", 0) + res.n_sweeps
    return v, g


def gpclab_4_sweeps(X, y):
    K = gpclab.kernel_matrix("se", X, X, LOG_HYP)
    res = gpclab.ep(K, y, None, None, 0.0, 4)
    return res.log_Z, gpclab.ep_log_Z_grad(K, X, "se", LOG_HYP, res.nu_tilde, res.tau_tilde, res.L)


def fd_error(run, X, y, eps=1e-4):
    """Largest relative difference between a library's gradient and central differences of its log Z."""
    _, g = run(X, y)
    fd = np.empty(2)
    for j in range(2):
        e = np.zeros(2)
        e[j] = eps
        up = run(X, y, *np.exp(LOG_HYP + e))[0]
        down = run(X, y, *np.exp(LOG_HYP - e))[0]
        fd[j] = (up - down) / (2 * eps)
    return np.max(np.abs(g - fd) / np.abs(fd))


def main():
    quick = "--quick" in sys.argv
    sizes = [200, 767] if quick else [200, 767, 1500]
    warnings.filterwarnings("ignore")
    rows = []
    _count_sweeps()
    with threadpool_limits(1):
        X0, t0, _ = make_data(50)
        gpclab_run(X0, np.where(t0 == 1, 1.0, -1.0))  # load the numba cache
        gpclab_4_sweeps(X0, np.where(t0 == 1, 1.0, -1.0))
        for n in sizes:
            X, t, _ = make_data(n)
            y = np.where(t == 1, 1.0, -1.0)
            reps_peer = 1 if n > 1000 else 3
            SWEEPS.clear()
            out = {name: fn(X, y) for name, fn in
                   [("pyGPs", pygps_run), ("GPy", gpy_run), ("gpclab", gpclab_run), ("gpclab4", gpclab_4_sweeps)]}
            # pyGPs recomputes the posterior once more when it starts from zero sites
            sweeps = dict(SWEEPS)
            times = {
                "pyGPs": median_time(lambda: pygps_run(X, y), reps_peer),
                "GPy": median_time(lambda: gpy_run(X, y), reps_peer),
                "gpclab": median_time(lambda: gpclab_run(X, y), 5),
                "gpclab4": median_time(lambda: gpclab_4_sweeps(X, y), 5),
            }
            rows.append((n, times, out, sweeps))
        fd = {name: fd_error(fn, *(lambda d: (d[0], np.where(d[1] == 1, 1.0, -1.0)))(make_data(200)))
              for name, fn in [("pyGPs", pygps_run), ("GPy", gpy_run), ("gpclab", gpclab_run)]}

    print("\nEP to convergence + log Z_EP + gradient, each with its own stopping rule; one BLAS thread")
    print("(time in s; sweeps; |log Z - gpclab's| ; ratio = faster peer / gpclab)")
    print(f"{'n':>5} | {'pyGPs':>17} {'d log Z':>8} | {'GPy':>17} {'d log Z':>8} | {'gpclab':>17} "
          f"{'ratio':>6} | {'per sweep ratio':>15} | {'gpclab, 4 sweeps':>16} {'ratio':>6}")
    for n, tm, out, sw in rows:
        lz = out["gpclab"][0]
        best = min(tm["pyGPs"], tm["GPy"])
        per = {k: tm[k] / sw[k] for k in ("pyGPs", "GPy", "gpclab")}
        print(f"{n:5d} | {tm['pyGPs']:8.3f} ({sw['pyGPs']:2d} sw) {abs(out['pyGPs'][0] - lz):8.1e} | "
              f"{tm['GPy']:8.3f} ({sw['GPy']:2d} sw) {abs(out['GPy'][0] - lz):8.1e} | "
              f"{tm['gpclab']:8.3f} ({sw['gpclab']:2d} sw) {best / tm['gpclab']:6.1f} | "
              f"{min(per['pyGPs'], per['GPy']) / per['gpclab']:15.1f} | {tm['gpclab4']:16.3f} "
              f"{best / tm['gpclab4']:6.1f}")
    print("\ngradient of log Z_EP against central differences of the same library's log Z_EP (n = 200):")
    for name, err in fd.items():
        print(f"  {name:7s} largest relative error {err:.1e}")


if __name__ == "__main__":
    main()
