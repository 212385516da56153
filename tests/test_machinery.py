"""Part III of gpclab.py relies on a few numba internals (its cache that reads several folders, its
dispatcher that compiles at LLVM level 1, the C functions it calls from numba code, the typing of
public functions inside numba code). pyproject.toml pins numba to the releases these tests cover;
when a new numba moves one of these names, this file says which, instead of a failure deep inside
a compilation."""
import importlib
import inspect

import numba
import pytest

import gpclab

# (module, attribute path, what gpclab uses it for)
INTERNALS = [
    ("numba.core.caching", "_CacheLocator", "base class of the shared cache's locator"),
    ("numba.core.caching", "_CacheLocator.get_suitable_cache_subpath", "the cache folder of a source file"),
    ("numba.core.caching", "_CacheLocator.ensure_cache_path", "overridden to refuse read-only folders"),
    ("numba.core.caching", "_SourceFileBackedLocatorMixin", "source stamp of the cache index"),
    ("numba.core.caching", "_SourceFileBackedLocatorMixin.get_source_stamp", "source stamp of the cache index"),
    ("numba.core.caching", "CompileResultCacheImpl", "implementation class of the shared cache"),
    ("numba.core.caching", "CompileResultCacheImpl.rebuild", "loads a compiled overload"),
    ("numba.core.caching", "FunctionCache", "base class of the shared cache"),
    ("numba.core.caching", "FunctionCache._index_key", "extended with LLVM's level"),
    ("numba.core.caching", "FunctionCache._load_overload", "overridden to read several folders"),
    ("numba.core.caching", "FunctionCache._save_overload", "overridden to warn once"),
    ("numba.core.caching", "Cache.load_overload", "overridden to refresh only what cached code links to"),
    ("numba.core.caching", "Cache._guard_against_spurious_io_errors", "wraps the load, as numba's does"),
    ("numba.core.runtime", "rtsys.initialize", "numba's runtime, which cached code links to"),
    ("numba.cpython.hashing", "_Py_HashSecret_t", "the string-hash secret, which cached code links to"),
    ("numba.core.caching", "IndexDataCacheFile", "one cache folder's index"),
    ("numba.core.caching", "IndexDataCacheFile.load", "reads one folder"),
    ("numba.core.registry", "CPUDispatcher", "base class of gpclab's dispatcher"),
    ("numba.core.registry", "CPUDispatcher.compile", "overridden to set LLVM's level"),
    ("numba.core.compiler_lock", "global_compiler_lock", "held while LLVM's level is changed"),
    ("numba.core.config", "_OptLevel", "LLVM's optimisation level object"),
    ("numba.core.config", "OPT", "LLVM's optimisation level"),
    ("numba.extending", "typeof_impl", "public functions typed as their numba body"),
    ("numba.extending", "get_cython_function_address", "BLAS/LAPACK and CPython C functions"),
    ("numba.core.types", "ExternalFunction", "C functions called from numba code"),
    ("numba.misc.appdirs", "AppDirs", "the per-user cache folder"),
    ("numba.np.ufunc.parallel", "_iget_num_threads", "numba's thread count read from numba code, cacheably "
     "(a process forked after numba's threads started runs ais serially)"),
    ("numba.extending", "overload", "_numba_threads inside numba code"),
]


@pytest.mark.parametrize("module, path, use", INTERNALS, ids=[f"{m}.{p}" for m, p, _ in INTERNALS])
def test_numba_internal_is_where_gpclab_expects_it(module, path, use):
    try:
        obj = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as e:
        pytest.fail(f"numba {numba.__version__} has no {module}.{path} ({e}); gpclab's Part III uses it "
                    f"for: {use}. Adapt Part III of gpclab.py, or install a numba in the range "
                    f"pyproject.toml pins.")


def test_overridden_methods_keep_their_signatures():
    """The shared cache overrides four FunctionCache methods; their arguments must still match."""
    from numba.core import caching
    for name, params in [("_index_key", ["self", "sig", "codegen"]),
                         ("load_overload", ["self", "sig", "target_context"]),
                         ("_load_overload", ["self", "sig", "target_context"]),
                         ("_save_overload", ["self", "sig", "data"])]:
        got = list(inspect.signature(getattr(caching.FunctionCache, name)).parameters)
        assert got == params, (f"numba {numba.__version__}: FunctionCache.{name}{tuple(got)} is not "
                               f"{tuple(params)}, as gpclab's _SharedCache expects")


def test_the_pinned_range_is_the_installed_numba():
    """pyproject.toml's numba range contains the numba these tests ran with."""
    import re
    import tomllib
    root = __import__("os").path.dirname(__import__("os").path.dirname(__file__))
    with open(f"{root}/pyproject.toml", "rb") as fh:
        deps = tomllib.load(fh)["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"numba\b", d))
    low, high = re.search(r">=([\d.]+),<([\d.]+)", spec).groups()
    version = tuple(int(x) for x in numba.__version__.split(".")[:2])
    assert tuple(int(x) for x in low.split(".")[:2]) <= version < tuple(int(x) for x in high.split(".")[:2]), \
        (spec, numba.__version__)


def test_no_numba_internal_above_part_three():
    """Part I and II of gpclab.py use numba only through @njit and prange: its internals are in Part III."""
    src = inspect.getsource(gpclab)
    head, part3 = src.split("# PART III. MACHINERY", 1)
    for word in ("numba.core", "numba.extending", "numba.misc", "llvmlite", "_caching", "typeof_impl",
                 "ExternalFunction", "get_cython_function_address", "config."):
        assert word not in head, f"{word} appears above Part III"
        assert word in part3 or word == "config.", word


def test_small_problems_run_with_one_blas_thread_and_restore_the_count():
    """On a hub, several kernels share few cores: gpclab's calls whose arrays are all smaller than
    _BLAS_ONE_THREAD_BELOW run with one BLAS thread, and leave the count as they found it (also when
    the call raises); larger problems keep every thread."""
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})

    def body(A, fail):
        seen.append(blas_threads())
        if fail:
            raise ValueError("inside")
        return A.shape

    f = gpclab.public(A="(n, m)", fail="bool")(body)
    big = gpclab._BLAS_ONE_THREAD_BELOW
    with threadpool_limits(2, user_api="blas"):
        seen = []
        f(np.zeros((10, 10)), False)
        assert seen == [[1]] and blas_threads() == [2]
        with pytest.raises(ValueError, match="inside"):
            f(np.zeros((10, 10)), True)
        assert blas_threads() == [2]
        seen = []
        f(np.zeros((big, 1)), False)
        assert seen == [[2]]


@pytest.mark.filterwarnings("ignore:GPClassifier.fit. ML-II L-BFGS-B stopped:RuntimeWarning")
def test_fit_runs_with_one_blas_thread_between_gpclab_calls_too(monkeypatch):
    """GPClassifier.fit on a small problem holds one BLAS thread for the whole fit, so that the
    optimiser's own numpy (L-BFGS-B, the Python layer of ML-II) does not wake BLAS's threads
    between gpclab's calls; the count is restored afterwards."""
    import numpy as np
    from threadpoolctl import threadpool_info, threadpool_limits

    def blas_threads():
        return sorted({lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"})

    seen = []
    run = gpclab._ml2_run

    def spy(*args, **kwargs):
        seen.append(blas_threads())
        return run(*args, **kwargs)

    monkeypatch.setattr(gpclab, "_ml2_run", spy)
    X, y = gpclab.make_three_gaussians(seed=0)
    with threadpool_limits(2, user_api="blas"):
        gpclab.GPClassifier(max_iter=2).fit(X, y)
        assert seen == [[1]] and blas_threads() == [2]


# Runs in a fresh process: the state that importing gpclab leaves behind.
IMPORT_STATE = r"""
import gc, json, os, sys, threading, weakref
if sys.argv[1] == "gc-off":
    gc.disable()

class Node:
    pass

b = Node(); b.self = b; before = weakref.ref(b); del b   # garbage when gpclab is imported
import gpclab
state = {"sklearn": "sklearn" in sys.modules, "gc": gc.isenabled(), "frozen": gc.get_freeze_count(),
         "timeout": os.environ.get("OPENBLAS_THREAD_TIMEOUT"), "garbage freed": before() is None}
gc.enable()
a = Node(); a.self = a; ref = weakref.ref(a); del a
gc.collect()
state["cycle collected"] = ref() is None                 # a cycle made after the import is still freed
classes = []
barrier = threading.Barrier(4)

def get():
    barrier.wait()
    classes.append(gpclab.GPClassifier)

threads = [threading.Thread(target=get) for _ in range(4)]
for t in threads: t.start()
for t in threads: t.join()
from sklearn.base import BaseEstimator, ClassifierMixin, is_classifier
G = gpclab.GPClassifier
from gpclab import GPClassifier
state["one class"] = len({id(c) for c in classes + [G, GPClassifier]}) == 1
state["estimator"] = issubclass(G, BaseEstimator) and issubclass(G, ClassifierMixin) and is_classifier(G())
state["name"] = (G.__module__, G.__qualname__, G.__doc__ == gpclab._GPClassifier.__doc__)
import inspect
state["source"] = inspect.getsource(G).splitlines()[0]           # IPython's GPClassifier?? too
try:
    G(no_such_argument=1)
except TypeError as e:
    state["bad argument"] = str(e)
state["own methods"] = "fit" in vars(G) and G.__mro__[1:3] == (ClassifierMixin, BaseEstimator)
ns = {}
exec("from gpclab import *", ns)
state["star import"] = ns.get("GPClassifier") is G
state["in dir"] = "GPClassifier" in dir(gpclab)
try:
    gpclab.no_such_name
except AttributeError as e:
    state["missing"] = str(e)
print(json.dumps(state))
"""


@pytest.mark.parametrize("case", ["default", "gc-off", "timeout-set"])
def test_import_leaves_gc_and_environment_as_found_and_makes_the_estimator_on_first_use(case):
    """Importing gpclab does not import scikit-learn; it freezes what the import made (so later
    collections skip it) and leaves the collector on or off as it found it, and the environment
    unchanged (OPENBLAS_THREAD_TIMEOUT only while loading, and a user's value is kept). The
    estimator is made once on first use, also by four threads at once, with scikit-learn's bases,
    and reads as if written so: its source, its methods, its name in errors, `import *`."""
    import json
    import os
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_THREAD_TIMEOUT"}
    if case == "timeout-set":
        env["OPENBLAS_THREAD_TIMEOUT"] = "20"
    r = subprocess.run([sys.executable, "-c", IMPORT_STATE, case], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    state = json.loads(r.stdout.strip().splitlines()[-1])
    assert state["sklearn"] is False
    assert state["gc"] is (case != "gc-off")
    assert state["frozen"] > 10000
    assert state["garbage freed"] is (case != "gc-off")      # collected, not frozen (unless GC is off)
    assert state["timeout"] == ("20" if case == "timeout-set" else None)
    assert state["cycle collected"] and state["one class"] and state["estimator"] and state["in dir"]
    assert state["name"] == ["gpclab", "GPClassifier", True]
    assert state["source"] == "class GPClassifier:" and state["own methods"] and state["star import"]
    assert state["bad argument"] == "GPClassifier.__init__() got an unexpected keyword argument 'no_such_argument'"
    assert state["missing"] == "module 'gpclab' has no attribute 'no_such_name'"
