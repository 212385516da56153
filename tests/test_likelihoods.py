"""A likelihood is defined once, in gpclab.LIKELIHOODS (Part I), and every place reads it there.

The first tests check the table against what reads it in this process. The last two edit a copy
of gpclab.py the way its header says a likelihood is added (or take one away) and run the copy in
a fresh process with its own numba cache: adding the complementary log-log likelihood must give
Laplace's mode and predictions of a plain NumPy Newton iteration, and removing 'probit' must make
every spec, GPClassifier and the compile command refuse it.
"""
import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import gpclab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _public_functions():
    return {name: fn for name, fn in vars(gpclab).items() if isinstance(fn, gpclab.PublicFunction)}


def test_every_likelihood_spec_is_one_the_table_makes():
    tab = gpclab.LIKELIHOODS
    laplace = {n for n, row in tab.items() if row.laplace}
    ep = {n for n, row in tab.items() if row.ep_noise is not None}
    made = {frozenset(laplace), frozenset(ep), frozenset(tab)}
    assert laplace == {"logistic", "probit"} and ep == {"probit", "step"}
    seen = 0
    for name, fn in _public_functions().items():
        text = fn.spec_text.get("likelihood")
        if text is None:
            continue
        seen += 1
        assert text.startswith("{") and text.endswith("}"), (name, text)
        assert frozenset(text[1:-1].split(",")) in made, (name, text)
    assert seen >= 20, seen            # the book's functions and Part II's


def test_gpclassifier_and_the_compile_paths_take_the_table_s_names():
    tab = gpclab.LIKELIHOODS
    methods = gpclab.GPClassifier._METHOD_LIKELIHOODS
    assert set(methods["laplace"]) == {n for n, row in tab.items() if row.laplace}
    assert set(methods["ep"]) == {n for n, row in tab.items() if row.ep_noise is not None}
    assert set(methods["emep"]) == {n for n, row in tab.items() if row.em_ep}
    assert set(gpclab._LIKELIHOODS) == set(tab)
    with pytest.raises(ValueError, match="GPClassifier: likelihood"):
        gpclab.GPClassifier(likelihood="cauchit").fit(np.zeros((4, 1)), [0, 1, 0, 1])
    with pytest.raises(ValueError, match="needs likelihood"):
        gpclab.GPClassifier(method="ep", likelihood="logistic").fit(np.zeros((4, 1)), [0, 1, 0, 1])


def test_the_compiled_code_s_tuples_are_the_table():
    tab = gpclab.LIKELIHOODS
    assert gpclab._ROW_NAMES == tuple(tab)
    for i, row in enumerate(tab.values()):
        w, noise = gpclab._ROW_W_MAX[i], gpclab._ROW_EP_NOISE[i]
        assert (np.isnan(w) if row.w_max is None else w == row.w_max)
        assert (np.isnan(noise) if row.ep_noise is None else noise == row.ep_noise)
        assert gpclab._ROW_AVERAGE[i] == (-1 if row.average is None else
                                          gpclab._AVERAGE_RULES.index(row.average))
    # the compiled lookups answer from them: an HMC step for each likelihood with log p ...
    assert gpclab._w_max("logistic") == 0.25 and gpclab._w_max("probit") == 1.0
    assert gpclab._ep_noise("probit") == 1.0 and gpclab._ep_noise("step") == 0.0
    for name in ("cauchit", "logistic"):         # ... and no EP site for a name without one
        with pytest.raises(ValueError, match="gpclab.LIKELIHOODS"):
            gpclab._ep_noise(name)


# --- a copy of gpclab.py with a likelihood added or taken away, in a fresh process -------------

# The complementary log-log likelihood: p(y=+1|f) = 1 - exp(-e^f), p(y=-1|f) = exp(-e^f); log-concave,
# not symmetric in f. With t = e^f, g = t / (e^t - 1) and h = t / (1 - e^-t):
#   y = -1: log p = -t, and each derivative in f is -t;
#   y = +1: log p = log(1 - e^-t), d = g, d2 = g (1 - h), d3 = d2 (1 - 2 h) - g h t.
CLOGLOG = '''
@njit(cache=True)
def cloglog(y, f):
    """log p(y|f) and three derivatives, p(y=+1|f) = 1 - exp(-exp(f))."""
    n = f.shape[0]
    lp, dlp, d2lp, d3lp = np.empty(n), np.empty(n), np.empty(n), np.empty(n)
    for i in range(n):
        t = math.exp(f[i])
        if y[i] < 0:
            lp[i] = dlp[i] = d2lp[i] = d3lp[i] = -t
        else:
            g = t / math.expm1(t)
            h = t / -math.expm1(-t)
            lp[i] = math.log(-math.expm1(-t))
            dlp[i] = g
            d2lp[i] = g * (1.0 - h)
            d3lp[i] = d2lp[i] * (1.0 - 2.0 * h) - g * h * t
    return lp, dlp, d2lp, d3lp


'''
ROW = ('    "cloglog": Likelihood(laplace=True, w_max=1.0, average="gauss_hermite", ep_noise=None,\n'
       '                          em_ep=False, formula="1 - exp(-exp(f)) for y = +1"),\n')


def _edited_copy(tmp_path, add=False, remove=None):
    """gpclab.py with cloglog added as the header says (its function, one branch of log_likelihood,
    one row of LIKELIHOODS), or the row `remove` taken out of LIKELIHOODS and nothing else."""
    source = open(os.path.join(ROOT, "gpclab.py"), encoding="utf-8").read()
    table_start = source.index("LIKELIHOODS = {\n")
    table_end = source.index("\n}\n", table_start) + 1
    table = source[table_start:table_end]
    if add:
        anchor = "# ----------------------------------------------------------------------------\n# The likelihoods, one table"
        branch = '    if likelihood == "probit":\n        return probit(y, f)\n'
        assert source.count(anchor) == 1 and source.count(branch) == 1
        table = table + ROW
        source = source.replace(anchor, CLOGLOG + anchor).replace(
            branch, branch + '    if likelihood == "cloglog":\n        return cloglog(y, f)\n')
        table_start = source.index("LIKELIHOODS = {\n")
        table_end = source.index("\n}\n", table_start) + 1
    if remove:
        lines = table.splitlines(keepends=True)
        first = next(i for i, line in enumerate(lines) if line.startswith(f'    "{remove}": '))
        last = next(i for i in range(first, len(lines)) if lines[i].rstrip().endswith("),"))
        table = "".join(lines[:first] + lines[last + 1:])
    source = source[:table_start] + table + source[table_end:]
    folder = tmp_path / "copy"
    folder.mkdir()
    (folder / "gpclab.py").write_text(source, encoding="utf-8")
    return folder


def _run(folder, tmp_path, code):
    env = dict(os.environ, PYTHONPATH=str(folder), NUMBA_CACHE_DIR=str(tmp_path / "numba_cache"))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=str(folder), env=env,
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def _cloglog_numpy(y, f):
    """log p and the first two derivatives, from p(y=+1|f) = 1 - exp(-e^f) directly."""
    t = np.exp(f)
    p_plus = -np.expm1(-t)
    lp = np.where(y > 0, np.log(p_plus), -t)
    dp_plus = t * np.exp(-t)                                # d p(+1|f) / df
    dlp = np.where(y > 0, dp_plus / p_plus, -t)
    d2p_plus = dp_plus * (1.0 - t)
    d2lp = np.where(y > 0, d2p_plus / p_plus - (dp_plus / p_plus) ** 2, -t)
    return lp, dlp, d2lp


def _numpy_laplace(K, y, K_star, kss):
    """Newton's iteration f := (K^-1 + W)^-1 (W f + grad log p) from f = 0 (GPML 3.18) in plain NumPy,
    log q (3.32), and the predictions (3.21), (3.24), (3.25) by adaptive quadrature."""
    from scipy import integrate, stats
    n = len(y)
    f = np.zeros(n)
    for _ in range(100):
        _, dlp, d2lp = _cloglog_numpy(y, f)
        W = -d2lp
        f_new = K @ np.linalg.solve(np.eye(n) + W[:, None] * K, W * f + dlp)
        done = np.max(np.abs(f_new - f)) < 1e-13
        f = f_new
        if done:
            break
    lp, dlp, d2lp = _cloglog_numpy(y, f)
    W = -d2lp
    a = np.linalg.solve(K, f)
    B = np.eye(n) + np.sqrt(W)[:, None] * K * np.sqrt(W)[None, :]
    log_q = -0.5 * a @ f + lp.sum() - 0.5 * np.linalg.slogdet(B)[1]
    f_bar = K_star.T @ dlp
    V = kss - np.einsum("ij,ij->j", K_star, np.linalg.solve(K + np.diag(1.0 / W), K_star))
    pi_bar = np.array([integrate.quad(lambda z: -np.expm1(-np.exp(z)) * stats.norm.pdf(z, m, np.sqrt(v)),
                                      m - 12 * np.sqrt(v), m + 12 * np.sqrt(v), epsabs=1e-13, epsrel=1e-12)[0]
                       for m, v in zip(f_bar, V)])
    return f, log_q, pi_bar, f_bar, V


def test_cloglog_numpy_derivatives_are_right():
    """The reference's derivatives against central differences of its log p."""
    f = np.linspace(-2.5, 2.5, 11)
    for label in (-1.0, 1.0):
        y = np.full(11, label)
        lp, dlp, d2lp = _cloglog_numpy(y, f)
        h = 1e-5
        num1 = (_cloglog_numpy(y, f + h)[0] - _cloglog_numpy(y, f - h)[0]) / (2 * h)
        num2 = (_cloglog_numpy(y, f + h)[1] - _cloglog_numpy(y, f - h)[1]) / (2 * h)
        np.testing.assert_allclose(dlp, num1, rtol=1e-7, atol=1e-9)
        np.testing.assert_allclose(d2lp, num2, rtol=1e-7, atol=1e-9)


def test_a_likelihood_added_in_one_place_runs_laplace_as_numpy_newton_does(tmp_path):
    """cloglog, added to a copy of gpclab.py as its header says, reaches every public path: the
    specs, the compiled code, GPClassifier and the compile command take it; Laplace's mode, log q
    and predictions are those of a plain NumPy Newton iteration; EP refuses it (no site)."""
    folder = _edited_copy(tmp_path, add=True)
    r = np.random.default_rng(7)
    X = r.standard_normal((14, 2))
    y = np.where(X[:, 0] + 0.3 * r.standard_normal(14) > 0, 1.0, -1.0)
    Xs = r.standard_normal((5, 2))
    np.save(tmp_path / "X.npy", X), np.save(tmp_path / "y.npy", y), np.save(tmp_path / "Xs.npy", Xs)
    got = _run(folder, tmp_path, f"""
        import json, numpy as np, gpclab
        X, y, Xs = (np.load(r"{tmp_path}" + "/" + k + ".npy") for k in ("X", "y", "Xs"))
        h = np.array([0.0, 0.5])
        K = gpclab.kernel_matrix("se", X, X, h)
        K_star = gpclab.kernel_matrix("se", X, Xs, h)
        kss = gpclab.kernel_diag("se", Xs, h)
        mode = gpclab.laplace_mode(K, y, "cloglog")
        pi, f_bar, V = gpclab.laplace_predict(mode.f_hat, K, y, "cloglog", K_star, kss)
        p_map = gpclab.laplace_predict(mode.f_hat, K, y, "cloglog", K_star, kss, rule="map")[0]
        refused = []
        for call in (lambda: gpclab.ep(K, y, likelihood="cloglog"),
                     lambda: gpclab.laplace_predict(mode.f_hat, K, y, "cloglog", K_star, kss, rule="mackay"),
                     lambda: gpclab.GPClassifier(method="ep", likelihood="cloglog").fit(X, y)):
            try:
                call()
            except ValueError as e:
                refused.append(str(e)[:200])
        m = gpclab.GPClassifier(likelihood="cloglog", optimize=False, kernel="se").fit(X, y)
        print(json.dumps(dict(
            f_hat=mode.f_hat.tolist(), log_q=float(mode.log_q), pi=pi.tolist(), f_bar=f_bar.tolist(),
            V=V.tolist(), p_map=p_map.tolist(), refused=refused,
            specs=[gpclab._LIKELIHOOD_SPEC, gpclab._ANY_LIKELIHOOD_SPEC],
            compile_laplace=list(gpclab._LAPLACE_LIKELIHOODS),
            step=gpclab.hmc_step_size(K + 1e-8 * np.eye(len(y)), "cloglog")[0],
            step_probit=gpclab.hmc_step_size(K + 1e-8 * np.eye(len(y)), "probit")[0],
            fit_proba=m.predict_proba(Xs)[:, 1].tolist(), fit_hyp=m.log_hyp_.tolist())))
    """)
    K = gpclab.kernel_matrix("se", X, X, np.array([0.0, 0.5]))
    K_star = gpclab.kernel_matrix("se", X, Xs, np.array([0.0, 0.5]))
    kss = gpclab.kernel_diag("se", Xs, np.array([0.0, 0.5]))
    f, log_q, pi_bar, f_bar, V = _numpy_laplace(K, y, K_star, kss)
    assert np.max(np.abs(f)) > 0.3                              # a mode away from f = 0
    np.testing.assert_allclose(got["f_hat"], f, rtol=0, atol=1e-10)
    assert abs(got["log_q"] - log_q) < 1e-10
    np.testing.assert_allclose(got["f_bar"], f_bar, rtol=0, atol=1e-10)
    np.testing.assert_allclose(got["V"], V, rtol=0, atol=1e-10)
    # (3.25) by the 64-point Gauss-Hermite rule of average="gauss_hermite": its arithmetic to rounding,
    # and the rule's own error against adaptive quadrature (4.6e-8 here: cloglog is not smooth enough
    # on the scale of N(f_bar, V) for 64 points to reach 1e-9)
    x, w = np.polynomial.hermite.hermgauss(64)
    pi_rule = [(w * -np.expm1(-np.exp(m + np.sqrt(2 * v) * x))).sum() / np.sqrt(np.pi) for m, v in zip(f_bar, V)]
    np.testing.assert_allclose(got["pi"], pi_rule, rtol=0, atol=1e-13)
    np.testing.assert_allclose(got["pi"], pi_bar, rtol=0, atol=1e-7)
    np.testing.assert_allclose(got["p_map"], -np.expm1(-np.exp(f_bar)), rtol=0, atol=1e-12)
    assert len(got["refused"]) == 3, got["refused"]
    assert "cloglog" in got["specs"][0] and "cloglog" in got["specs"][1]
    assert "cloglog" in got["compile_laplace"]                 # _compile_all's Laplace paths run it
    assert got["step"] == pytest.approx(got["step_probit"])      # w_max 1, as probit's
    # GPClassifier with the hyperparameters of its default, the same model as above's plain Laplace
    K_fit = gpclab.kernel_matrix("se", X, X, np.array(got["fit_hyp"]))
    K_fit_star = gpclab.kernel_matrix("se", X, Xs, np.array(got["fit_hyp"]))
    kss_fit = gpclab.kernel_diag("se", Xs, np.array(got["fit_hyp"]))
    np.testing.assert_allclose(got["fit_proba"], _numpy_laplace(K_fit, y, K_fit_star, kss_fit)[2],
                               rtol=0, atol=1e-7)


def test_a_likelihood_taken_from_the_table_is_refused_everywhere(tmp_path):
    """Without the row 'probit' (its code still in the file), every public function that takes a
    likelihood, GPClassifier and the compile command refuse 'probit' before any compiled code runs."""
    folder = _edited_copy(tmp_path, remove="probit")
    got = _run(folder, tmp_path, """
        import json, numpy as np, gpclab
        taking = [name for name, fn in vars(gpclab).items()
                  if isinstance(fn, gpclab.PublicFunction) and "likelihood" in fn.spec_text]
        allowed = {name: vars(gpclab)[name].spec_text["likelihood"] for name in taking}
        refused = []
        try:
            gpclab.GPClassifier(likelihood="probit").fit(np.zeros((4, 1)), [0, 1, 0, 1])
        except ValueError as e:
            refused.append(str(e)[:300])
        try:
            gpclab.GPClassifier(method="ep", likelihood="probit").fit(np.zeros((4, 1)), [0, 1, 0, 1])
        except ValueError as e:
            refused.append(str(e)[:300])
        try:
            gpclab.laplace_mode(np.eye(3), np.ones(3), "probit")
        except ValueError as e:
            refused.append(str(e)[:300])
        print(json.dumps(dict(allowed=allowed, refused=refused, table=list(gpclab.LIKELIHOODS),
                              laplace=list(gpclab._LAPLACE_LIKELIHOODS), ep=list(gpclab._EP_LIKELIHOODS),
                              methods={k: list(v) for k, v in gpclab.GPClassifier._METHOD_LIKELIHOODS.items()},
                              rows=list(gpclab._ROW_NAMES))))
    """)
    assert got["table"] == ["logistic", "step"] and got["rows"] == ["logistic", "step"]
    assert len(got["allowed"]) >= 20
    for name, spec in got["allowed"].items():
        assert "probit" not in spec, (name, spec)
    assert got["laplace"] == ["logistic"] and got["ep"] == ["step"]
    assert "probit" not in str(got["methods"])
    assert len(got["refused"]) == 3 and all("probit" in e for e in got["refused"]), got["refused"]
