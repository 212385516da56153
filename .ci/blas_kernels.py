"""Print the OpenBLAS kernel this machine uses, then the kernels CI runs the numeric tests under again.

OPENBLAS_CORETYPE forces the kernels of numpy's and scipy's bundled OpenBLAS, which changes the
rounding of every BLAS and LAPACK call as another CPU would. CI takes the generic Prescott kernels
and, of Haswell (AVX2) and SkylakeX (AVX-512), the one this machine does not pick, if its CPU can run
it (a kernel whose instructions the CPU lacks would stop the process). OpenBLAS reports its forced
Prescott kernels by the name of the table they share, "Katmai".

Usage: python .ci/blas_kernels.py            # "own: Haswell" then one kernel per line
       python .ci/blas_kernels.py --current  # the kernels in use in this process, as threadpoolctl sees them
"""
import sys

from threadpoolctl import threadpool_info


def current():
    import numpy  # noqa: F401  (loads numpy's OpenBLAS)
    import scipy.linalg  # noqa: F401  (and scipy's)
    return sorted({i.get("architecture") or "?" for i in threadpool_info() if i.get("internal_api") == "openblas"})


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def main():
    if "--current" in sys.argv:
        print(", ".join(current()))
        return
    own = current()
    flags = cpu_flags()
    can = {"Haswell": {"avx2", "fma"} <= flags,
           "SkylakeX": {"avx512f", "avx512bw", "avx512dq", "avx512vl"} <= flags}
    others = ["Prescott"]
    if "SkylakeX" in own:
        others.append("Haswell")
    elif can["SkylakeX"]:
        others.append("SkylakeX")
    elif "Haswell" not in own and can["Haswell"]:
        others.append("Haswell")
    elif can.get("Haswell") and "Sandybridge" not in own:
        others.append("Sandybridge")
    print("own: " + ", ".join(own))
    for k in others:
        print(k)


if __name__ == "__main__":
    main()
