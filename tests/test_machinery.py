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
    """The shared cache overrides three FunctionCache methods; their arguments must still match."""
    from numba.core import caching
    for name, params in [("_index_key", ["self", "sig", "codegen"]),
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
