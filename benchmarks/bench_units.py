"""Raw data against scaled data: how far GPClassifier's and scikit-learn's predictions move when
each input is put in another unit.

The problem of tests/test_units.py (n = 60, three inputs, the class from the first two, 40 test
points); each input m is multiplied by c_m, the test inputs with it. For each method (Laplace and
EP with the 'ard' kernel, EM-EP with K&G's 'kg') and each set of units, the largest change of
p(y*=1|x*) against the fit in the original units, and the change of the log evidence; beside it
scikit-learn's GaussianProcessClassifier with an ARD RBF kernel (ConstantKernel * RBF, its length-
scale bounds widened to 1e-12..1e12 so that they cover the units, and with its default (1e-5, 1e5)).

Usage: python benchmarks/bench_units.py
"""
import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn.gaussian_process import GaussianProcessClassifier
from sklearn.gaussian_process.kernels import RBF, ConstantKernel

import gpclab

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from test_units import METHODS, problem  # noqa: E402

UNITS = [(1.0, 1.0, 1.0), (100.0, 0.01, 1.0), (1e6, 1e-6, 1.0), (1e-3, 1.0, 1e4), (1e-30,) * 3, (1e30,) * 3]


def main():
    X, y, Xt = problem()
    rows = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for c in UNITS:
            c_ = np.asarray(c)
            for name, kw in METHODS.items():
                m = gpclab.GPClassifier(**kw).fit(X * c_, y)
                rows[name, c] = m.predict_proba(Xt * c_)[:, 1], m.log_marginal_likelihood_
            for name, bounds in (("sklearn", (1e-12, 1e12)), ("sklearn default bounds", (1e-5, 1e5))):
                k = ConstantKernel(1.0, (1e-5, 1e5)) * RBF(np.ones(3) * c_ if name == "sklearn" else np.ones(3), bounds)
                g = GaussianProcessClassifier(k, random_state=0).fit(X * c_, y)
                rows[name, c] = g.predict_proba(Xt * c_)[:, 1], g.log_marginal_likelihood_value_
    names = list(METHODS) + ["sklearn", "sklearn default bounds"]
    print(f"{'units (c_1, c_2, c_3)':26s}" + "".join(f"{n:>26s}" for n in names))
    print(" " * 26 + "".join(f"{'max |dp|   d log Z':>26s}" for _ in names))
    for c in UNITS[1:]:
        line = f"{str(c):26s}"
        for n in names:
            p, v = rows[n, c]
            p0, v0 = rows[n, UNITS[0]]
            line += f"{np.max(np.abs(p - p0)):>14.1e}{v - v0:>12.1e}"
        print(line)


if __name__ == "__main__":
    main()
