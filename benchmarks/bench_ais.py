"""Annealed importance sampling (K&R Algorithm 3) and HMC: wall time on this machine.

* AIS with T = 8000 temperatures and R = 3 runs (K&R's settings) on n = 767
  (synthetic, d = 10, SE kernel with l = 3, sf = 2, probit), runs in
  parallel over the machine's cores; repeated with other seeds to show the
  spread of log Z, beside EP's log Z_EP.
* HMC transitions per second on the latent posterior at n = 200 and 767.
* An AIS evidence grid of 21 x 21 (log l, log sf) at n = 180 (scikit-learn's
  digits, 3 against 5, inputs scaled to [0, 1]; the size of GPML's Figure 3.7
  grids), serially and with executor=ProcessPoolExecutor(2): the serial run
  with numba's default threads (ais runs its R = 3 runs in parallel threads)
  and with one thread, and two worker processes with one numba thread each;
  the pool is started and its workers have loaded gpclab before the clock
  starts. All three give identical grids (checked). T = 100 temperatures per
  point (--quick: 50 on 7 x 7): the ratio does not depend on T, the time
  of a full T = 8000 grid is about 80 times the one printed.
The leapfrog step comes from hmc_step_size; 10 leapfrog steps per transition.
K&R report "several hours" for one AIS estimate on a few hundred points.

Usage: python benchmarks/bench_ais.py [--quick] [--grid-only]
"""
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

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


def digits_3_5(n=180):
    """The first n of scikit-learn's digits 3 and 5, inputs in [0, 1], labels +1 (3) and -1 (5)."""
    from sklearn.datasets import load_digits

    X, t = load_digits(return_X_y=True)
    keep = np.flatnonzero((t == 3) | (t == 5))[:n]
    return X[keep] / 16.0, np.where(t[keep] == 3, 1.0, -1.0)


def _load_gpclab():
    return gpclab.ais(np.eye(3), np.array([1.0, -1.0, 1.0]), "probit", 5, 1, 0.1, 2, 0)[0]


def grid_ratio(T=100, size=21, n_workers=2):
    """Time ais_grid on a size x size grid at n = 180: serial and on a process pool.

    Returns a dict of wall times in seconds ('serial': numba's default threads,
    'serial_1_thread', 'pool': n_workers processes, one numba thread each,
    'pool_start': starting the pool and loading gpclab in its workers) and the
    ratios 'speedup' (serial / pool) and 'speedup_1_thread' (serial_1_thread / pool).
    """
    X, y = digits_3_5()
    log_ell, log_sf = np.linspace(0.0, 4.0, size), np.linspace(0.0, 5.0, size)
    run = lambda ex=None: gpclab.ais_grid(X, y, log_ell, log_sf, T=T, R=3, progress=False, executor=ex)
    gpclab.ais_grid(X[:20], y[:20], [1.0], [1.0], T=5, progress=False)    # load from the numba cache
    out = {}
    t = time.perf_counter()
    ref = run()
    out["serial"] = time.perf_counter() - t
    threads = numba.get_num_threads()
    numba.set_num_threads(1)
    t = time.perf_counter()
    one = run()
    out["serial_1_thread"] = time.perf_counter() - t
    numba.set_num_threads(threads)
    t = time.perf_counter()
    with ProcessPoolExecutor(n_workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for f in [pool.submit(_load_gpclab) for _ in range(4 * n_workers)]:
            f.result()
        out["pool_start"] = time.perf_counter() - t
        t = time.perf_counter()
        par = run(pool)
        out["pool"] = time.perf_counter() - t
    for grid in (one, par):
        for key in ref:
            if not np.array_equal(ref[key], grid[key]):
                raise AssertionError(f"ais_grid on the pool differs from the serial run in {key!r}")
    out["speedup"] = out["serial"] / out["pool"]
    out["speedup_1_thread"] = out["serial_1_thread"] / out["pool"]
    return out


def print_grid_ratio(quick=False):
    T, size = (50, 7) if quick else (100, 21)
    r = grid_ratio(T, size)
    print(f"\nAIS grid {size} x {size}, n = 180 (digits 3 vs 5), T = {T}, R = 3; identical grids")
    print(f"  serial, {numba.get_num_threads()} numba threads: {r['serial']:7.1f} s")
    print(f"  serial, 1 numba thread:   {r['serial_1_thread']:7.1f} s")
    print(f"  2 worker processes:       {r['pool']:7.1f} s   (pool start {r['pool_start']:.1f} s)")
    print(f"  ratio serial / pool: {r['speedup']:.2f} (one-thread serial / pool: {r['speedup_1_thread']:.2f})")


def main():
    quick = "--quick" in sys.argv
    if "--grid-only" in sys.argv:
        print_grid_ratio(quick)
        return
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
    print_grid_ratio(quick)


if __name__ == "__main__":
    main()
