import os
import sys

import numpy as np
import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
# Test this checkout's gpclab.py, in this process and in the kernels and nbgrader processes it
# starts, whatever copy of gpclab is installed.
sys.path.insert(0, ROOT)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])


@pytest.fixture
def rng():
    return np.random.default_rng(12345)


def small_problem(seed, n=12, d=2):
    """A random binary problem: X (n, d) standard normal, noisy labels from the first input."""
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, d))
    y = np.where(X[:, 0] + 0.7 * r.standard_normal(n) > 0, 1.0, -1.0)
    return X, y
