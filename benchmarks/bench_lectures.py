"""Full-mode run time of each lecture: the wall seconds from kernel start to the last cell.

The README's lecture table and each lecture's introduction state these times. Run from the
repository root, on an otherwise idle machine, after `gpclab compile` (or one earlier run) so
that numba's cache is warm: `python benchmarks/bench_lectures.py [name ...]` (default: every
lecture; a name is a substring of a notebook's file name). Add `--quick` for the test suite's
quick mode. The load average before and after each run is printed beside its time: a time
taken at a load above the number of cores is not an idle machine's.
"""
import argparse
import glob
import os
import time

import nbformat
from nbclient import NotebookClient

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(path, quick):
    nb = nbformat.read(path, as_version=4)
    env_before = {k: os.environ.get(k) for k in ("GPCLAB_QUICK", "MPLBACKEND")}
    os.environ["GPCLAB_QUICK"] = "1" if quick else "0"
    os.environ["MPLBACKEND"] = "Agg"
    try:
        t0 = time.perf_counter()
        NotebookClient(nb, timeout=1800, kernel_name="python3",
                       resources={"metadata": {"path": os.path.dirname(path)}}).execute()
        return time.perf_counter() - t0
    finally:
        for k, v in env_before.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="substrings of notebook file names (default: all)")
    parser.add_argument("--quick", action="store_true", help="quick mode (GPCLAB_QUICK=1)")
    args = parser.parse_args()
    paths = sorted(glob.glob(os.path.join(ROOT, "lectures", "*.ipynb")))
    if args.names:
        paths = [p for p in paths if any(n in os.path.basename(p) for n in args.names)]
    print(f"{'lecture':45s} {'seconds':>8s}  load before/after ({os.cpu_count()} cores)")
    for path in paths:
        before = os.getloadavg()[0]
        seconds = run(path, args.quick)
        print(f"{os.path.basename(path):45s} {seconds:8.1f}  {before:.1f} / {os.getloadavg()[0]:.1f}",
              flush=True)


if __name__ == "__main__":
    main()
