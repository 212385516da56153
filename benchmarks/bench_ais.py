"""Annealed importance sampling (K&R Algorithm 3) and HMC: wall time on this machine.

* AIS with T = 8000 temperatures and R = 3 runs (K&R's settings) on n = 767
  (synthetic, d = 10, SE kernel with l = 3, sf = 2, probit), runs in
  parallel over the machine's cores; repeated with other seeds to show the
  spread of log Z, beside EP's log Z_EP.
* HMC transitions per second on the latent posterior at n = 200 and 767.
The leapfrog step comes from hmc_step_size; 10 leapfrog steps per transition.
K&R report "several hours" for one AIS estimate on a few hundred points.

Usage: python benchmarks/bench_ais.py [--quick]
"""
import sys
import time

import numba
import numpy as np

import gpclab
from bench_laplace import make_data

LOG_HYP = np.log([3.0, 2.0])


def problem(n):
    X, t, _ = make_data(n)
    y = np.where(t == 1, 1.0, -1.0)
    K = gpclab.kernel_matrix("se", X, X, LOG_HYP) + 1e-8 * np.eye(n)
    return K, y


def main():
    quick = "--quick" in sys.argv
    T = 2000 if quick else 8000
    K0, y0 = problem(20)
    gpclab.ais(K0, y0, "probit", 10, 3, 0.1, 10, 0)  # load from the numba cache
    gpclab.hmc_latent(K0, y0, "probit", 5, 0.1, 10, 0)
    K, y = problem(767)
    step, _ = gpclab.hmc_step_size(K, "probit")
    ep = gpclab.ep(K, y).log_Z
    print(f"\nAIS, n = 767, T = {T}, R = 3, step {step:.4f} x 10 leapfrog, {numba.get_num_threads()} threads")
    estimates = []
    for seed in range(1 if quick else 3):
        t = time.perf_counter()
        lz, lw, se, _, _ = gpclab.ais(K, y, "probit", T, 3, step, 10, 100 * seed)
        estimates.append(lz)
        print(f"  seed {100 * seed:4d}: log Z = {lz:9.3f} +/- {se:.3f} (runs {np.round(lw, 2)}), "
              f"{time.perf_counter() - t:6.1f} s")
    print(f"  spread of log Z over repeats: {np.ptp(estimates):.3f};  EP's log Z_EP = {ep:.3f}")
    print("\nHMC on the latent posterior (10 leapfrog steps per transition)")
    for n in (200, 767):
        K, y = problem(n)
        step, _ = gpclab.hmc_step_size(K, "probit")
        t = time.perf_counter()
        _, acc, _ = gpclab.hmc_latent(K, y, "probit", 2000, step, 10, 0)
        dt = time.perf_counter() - t
        print(f"  n = {n:4d}: {2000 / dt:8.0f} transitions per second, acceptance {acc:.2f}")


if __name__ == "__main__":
    main()
