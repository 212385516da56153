"""The box beside its code, checked: every line of each algorithm box (gpclab.BOXES, transcribed from
GPML chapter 3 and Kuss & Rasmussen 2005) has exactly one labelled code line in its function, in the
book's order (except the lines the box data records as moved, with a reason), on a statement that does
what the line says; the helpers' labels name lines of the box; show_box puts the errata and departures
beside their lines; each box function is at most three times its box in code lines, its source fits
one screen, and its .py_func (the plain Python body) gives the compiled function's results. That
each box computes what the book prints is tests/test_transcriptions.py."""
import ast
import inspect
import io
import re
import tokenize

import numpy as np
import pytest

import gpclab

BOXES = list(gpclab.BOXES)


def _exempt(text):
    """Box lines with no code of their own: the input line (the signature) and block closers."""
    t = text.strip()
    return t.startswith(("input:", "Given:")) or t in ("end for", "end", "end if")


def _code_lines(fn):
    """Lines of the function that hold code: not blank, not comments, not the docstring or decorators."""
    src = inspect.getsource(fn.py_func)
    node = ast.parse(src).body[0]
    skip = set()
    for dec in node.decorator_list:
        skip.update(range(dec.lineno, dec.end_lineno + 1))
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        skip.update(range(first.lineno, first.end_lineno + 1))
    code = set()
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type not in (tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT,
                            tokenize.DEDENT, tokenize.ENDMARKER):
            code.update(range(tok.start[0], tok.end[0] + 1))
    return sorted(code - skip)


@pytest.mark.parametrize("name", BOXES)
def test_every_box_line_has_exactly_one_label_in_order(name):
    box = gpclab.BOXES[name]
    labels = gpclab.box_labels(name)
    numbers = [n for n, _ in box["lines"]]
    assert numbers == list(range(1, len(numbers) + 1)), "box lines are numbered 1, 2, ..."
    covered = {}
    for first, last, code, _ in labels:
        assert 1 <= first <= last <= len(numbers), f"label 'line {first}-{last}' outside the box: {code}"
        for k in range(first, last + 1):
            covered[k] = covered.get(k, 0) + 1
    texts = dict(box["lines"])
    missing = [k for k in numbers if not _exempt(texts[k]) and covered.get(k, 0) == 0]
    twice = [k for k, c in covered.items() if c > 1]
    assert not missing, f"{name}: box lines with no labelled code line in {box['function']}: {missing}"
    assert not twice, f"{name}: box lines labelled more than once: {twice}"
    # the labels in the book's order: without the lines recorded as moved (with a reason), the labels
    # increase; each moved line, put back, breaks the order (so it is truly done out of order)
    moved = box.get("moved", {})
    assert all(isinstance(why, str) and why for why in moved.values())
    rest = [(first, last) for first, last, *_ in labels if first not in moved]
    assert all(a[1] < b[0] for a, b in zip(rest, rest[1:])), (
        f"{name}: labels out of the book's order {rest}; record such lines, with a reason, in "
        f"BOXES[{name!r}]['moved']")
    for k in moved:
        back = [(first, last) for first, last, *_ in labels if first not in moved or first == k]
        assert not all(a[1] < b[0] for a, b in zip(back, back[1:])), f"{name}: line {k} is in order"


@pytest.mark.parametrize("name", BOXES)
def test_box_function_is_about_the_size_of_its_box(name):
    box = gpclab.BOXES[name]
    fn = getattr(gpclab, box["function"])
    n_code = len(_code_lines(fn))
    assert n_code <= 3 * len(box["lines"]), (f"{box['function']}: {n_code} code lines for a "
                                             f"{len(box['lines'])}-line box")
    n_source = len(inspect.getsource(fn).splitlines())
    assert n_source < 80, f"inspect.getsource({box['function']}) is {n_source} lines"


@pytest.mark.parametrize("name", BOXES)
def test_no_other_comment_looks_like_a_label(name):
    """A comment-only line starting 'line N' would read as a label but is not on a code line."""
    fn = getattr(gpclab, gpclab.BOXES[name]["function"])
    for line in inspect.getsource(fn.py_func).splitlines():
        if line.strip().startswith("#"):
            assert not re.match(r"#\s*lines?\s+\d", line.strip()), line


def test_show_box_puts_each_labelled_code_line_beside_its_box_line():
    text = str(gpclab.show_box("3.2"))
    rows = text.splitlines()
    row6 = next(r for r in rows if re.match(r"\s*6\s", r))
    assert "V[f∗] := k(x∗, x∗) − v^T v" in row6
    code6 = next(code for first, last, code, _ in gpclab.box_labels("3.2") if first <= 6 <= last)
    group6 = " ".join(rows[rows.index(row6):next(i for i, r in enumerate(rows) if re.match(r"\s*7\s", r))])
    assert code6.strip() in re.sub(r"\s+\|?\s+", " ", group6)
    html = gpclab.show_box("Algorithm 3.2")._repr_html_()
    assert html.startswith("<table") and "V[f∗]" in html
    with pytest.raises(ValueError, match="show_box: no box '3.9'"):
        gpclab.show_box("3.9")


def _py_func_calls():
    """Each box function with the arguments a student would pass, with and without the optional ones."""
    from test_transcriptions import binary_problem, multiclass_problem

    X, y, K, K_star, kss = binary_problem(1, 12)
    Y, K3, K3_star, kss3 = multiclass_problem(2, 9)
    mode = gpclab.laplace_mode(K, y, "logistic")
    mode3 = gpclab.laplace_mode_multiclass(K3, Y)
    sites = gpclab.ep(K, y)
    return [
        ("laplace_mode", (K, y, "logistic"), {}),
        ("laplace_mode", (K, y, "probit"), {"a_init": 0.5 * mode.a, "max_iter": 2}),
        ("laplace_predict", (mode.f_hat, K, y, "logistic", K_star, kss), {}),
        ("laplace_predict", (mode.f_hat, K, y, "logistic", K_star, kss), {"L": mode.L, "rule": "mackay"}),
        ("laplace_mode_multiclass", (K3, Y), {}),
        ("laplace_mode_multiclass", (K3, Y), {"a_init": 0.5 * mode3.a}),
        ("laplace_predict_multiclass", (K3, Y, mode3.f_hat, K3_star, kss3), {"S": 100}),
        ("laplace_predict_multiclass", (K3, Y, mode3.f_hat, K3_star, kss3), {"S": 100, "E": mode3.E, "M": mode3.M}),
        ("ep", (K, y), {}),
        ("ep", (K, y, 0.5 * sites.nu_tilde, 0.5 * sites.tau_tilde), {"max_sweeps": 2}),
        ("ep", (K + 0.5 * np.eye(12), y), {"likelihood": "step", "eps": 0.1}),
        ("ep_predict", (sites.nu_tilde, sites.tau_tilde, K, K_star, kss), {}),
        ("ep_predict", (sites.nu_tilde, sites.tau_tilde, K, K_star, kss), {"L": sites.L}),
        ("ais", (K, y, "probit"), {"T": 64, "R": 2}),
        ("ais", (K, y, "logistic"), {"T": 40, "R": 2, "step": 0.3, "n_leapfrog": 4, "seed": 3}),
    ]


def test_every_box_function_py_func_runs_and_gives_the_compiled_result():
    """fn.py_func (the plain Python body, to step through in a debugger) takes the same arguments
    as fn, optional ones left out or given, and returns the same numbers."""
    calls = _py_func_calls()
    assert {name for name, _, _ in calls} == {box["function"] for box in gpclab.BOXES.values()}
    for name, args, kwargs in calls:
        fn = getattr(gpclab, name)
        compiled = fn(*args, **kwargs)
        plain = fn.py_func(*args, **kwargs)
        assert len(plain) == len(compiled), name
        for x, z in zip(compiled, plain):
            np.testing.assert_allclose(np.asarray(z, float), np.asarray(x, float), rtol=1e-12, atol=1e-12,
                                       err_msg=f"{name}.py_func{kwargs}")


# What the statement under each label does, written from the box (a label moved to another
# statement fails here): box -> line -> a regular expression the labelled statement matches.
STATEMENTS = {
    "3.1": {2: r"^a, f, psi = _warm_start\(_objective, a_init, K @ a_init,", 3: r"^while True:$",
            4: r"^W = -d2lp$", 5: r"^L = _cholesky\(_form_B\(K, sW\)\)$", 6: r"^b = W \* f \+ dlp$",
            7: r"^a_new = b - sW \* solve_lower_transpose\(L, solve_lower\(L, sW \* \(K @ b\)\)\)$",
            8: r"^a, f, psi, step = _step_search\(_objective, a, a_new - a, f, K @ a_new - f,",
            9: r"^if full_step and .*:$", 10: r"^log_q = psi - half_log_det\(L\)$", 11: r"^return f, log_q,"},
    "3.2": {2: r"^W = -d2lp$", 3: r"^L = _cholesky\(_form_B\(K, sW\)\)$", 4: r"^f_bar_star = K_star\.T @ dlp$",
            5: r"^v = solve_lower_matrix\(L, _scale_rows\(sW, K_star\)\)$", 6: r"^V_f_star = k_star_star - \(v \* v\)\.sum\(axis=0\)$",
            7: r"^pi_bar_star = averaged_probability\(likelihood, f_bar_star, V_f_star,", 8: r"^return pi_bar_star,"},
    "3.3": {2: r"^a, f, psi = _warm_start\(_multiclass_objective,", 3: r"^while True:$", 4: r"^pi = softmax\(f\)$",
            5: r"^E, z, M = _multiclass_E_M\(K, pi\)$", 11: r"^b = pi \* f - pi \* pf \+ y - pi$",
            12: r"^c = _per_class\(E, _per_class\(K, b\)\)$",
            13: r"^a_new = b - c \+ _per_class\(E, np\.ones\(\(C, 1\)\) \* r\)$",
            14: r"^a, f, psi, step = _step_search\(_multiclass_objective, a, a_new - a, f, _per_class\(K, a_new\) - f,",
            15: r"^if full_step and psi - psi_old < tol:$", 16: r"^log_q = psi - z - half_log_det\(M\)$",
            17: r"^return f, log_q,"},
    "3.4": {2: r"^pi = softmax\(f_hat\)$", 3: r"^E, _, M = _multiclass_E_M\(K, pi\)$", 8: r"^for c in range\(C\):$",
            9: r"^mu_star\[c\] = \(y\[c\] - pi\[c\]\) @ K_star\[c\]$", 10: r"^Mb, bTk = _M_solves\(E, M, G, K_star\)$",
            12: r"^Sigma_star = _cross_dots\(Mb\)$", 15: r"^Sigma_star\[:, c, c\] \+= k_star_star\[c\] - bTk\[c\]$",
            17: r"^pi_bar_star = _antithetic_average\(mu_star, Sigma_star, S, seed\)$", 23: r"^return pi_bar_star,"},
    "3.5": {2: r"^nu_tilde, tau_tilde, Sigma, mu = _ep_init\(K, nu_tilde_init, tau_tilde_init\)$",
            3: r"^for n_sweeps in range\(", 4: r"^for i in perm:$", 5: r"^tau_cav = 1\.0 / s_i\[i\] - tau_tilde\[i\]$",
            6: r"^nu_cav = mu\[i\] / s_i\[i\] - nu_tilde\[i\]$", 7: r"^tau_new, nu_new = _site_update\(y\[i\], tau_cav, nu_cav,",
            8: r"^d_tau = tau_new - tau_tilde\[i\]$", 9: r"^nu_tilde\[i\] = nu_new$",
            10: r"^m = _rank_one_update\(Sigma, U, c, m, s_i, ci\)$", 11: r"^mu \+= .* \* s_i$",
            13: r"^Sigma, mu, L = _ep_posterior\(K, tau_tilde, nu_tilde\)$", 16: r"^if abs\(log_Z - log_Z_old\) < tol",
            17: r"^log_Z, n_bad = _ep_log_Z\(y, tau_tilde, nu_tilde, Sigma, mu, L,", 18: r"^return nu_tilde, tau_tilde, log_Z,"},
    "3.6": {2: r"^L = _cholesky\(_form_B\(K, sS\)\)$",
            3: r"^z = sS \* solve_lower_transpose\(L, solve_lower\(L, sS \* \(K @ nu_tilde\)\)\)$",
            4: r"^f_bar_star = K_star\.T @ \(nu_tilde - z\)$", 5: r"^v = solve_lower_matrix\(L, _scale_rows\(sS, K_star\)\)$",
            6: r"^V_f_star = k_star_star - \(v \* v\)\.sum\(axis=0\)$", 7: r"^P = std_normal_cdf\(f_bar_star\[j\] / sd\)$",
            8: r"^return pi_bar_star,"},
    "AIS": {1: r"^tau = _ais_schedule\(T, schedule\)$", 2: r"^for r in range\(R\):$",
            3: r"^g\[r, i\] = np\.random\.standard_normal\(\)$", 4: r"^for t0 in range\(1, T \+ 1, _AIS_BLOCK\):$",
            5: r"^_ais_block\(L, y, likelihood, tau, t0,", 8: r"^w = np\.exp\(log_w - m\)$",
            10: r"^log_Z = m \+ math\.log\(mean_w\)$"},
}
HELPER_STATEMENTS = {                                             # (box, line, helper): regex
    ("3.3", 6, "_multiclass_E_M"): r"^L = _cholesky\(_form_B_in\(E\[c\], K\[c\], sD\)\)$",
    ("3.3", 7, "_multiclass_E_M"): r"^E_c = _scaled_inverse_in_place\(L, sD\)$",
    ("3.3", 8, "_multiclass_E_M"): r"^z \+= half_log_det\(L\)$",
    ("3.3", 10, "_multiclass_E_M"): r"^M = _cholesky\(E_sum\)$",
    ("3.4", 10, "_M_solves"): r"^b = E\[c\] @ K_star\[c\]$",
    ("3.4", 11, "_M_solves"): r"^Mb\[c\] = solve_lower_matrix\(M, b\)$",
    ("3.4", 13, "_cross_dots"): r"^hh\[c, c2, j\] \+= Mb\[c, i, j\] \* Mb\[c2, i, j\]$",
    ("3.4", 17, "_antithetic_average"): r"^pi_bar_star = np\.zeros\(\(C, m\)\)$",
    ("3.4", 18, "_antithetic_average"): r"^for i in range\(pairs\):$",
    ("3.4", 22, "_antithetic_average"): r"^pi_bar_star /= 2 \* pairs$",
    ("3.5", 8, "_site_update"): r"^tau_new = min\(max\(",
    ("3.5", 9, "_site_update"): r"^nu_new = tau_new \* mu_cav",
    ("3.5", 13, "_ep_posterior"): r"^L = _cholesky\(_form_B\(K, sS\)\)$",
    ("3.5", 14, "_ep_posterior"): r"^V = solve_lower_matrix\(L, _scale_rows\(sS, K\)\)$",
    ("AIS", 5, "_ais_run"): r"^gr, acc, llr = _hmc_transition\(L, y, likelihood, tau\[t\], gr,",
    ("AIS", 6, "_ais_run"): r"^lw \+= \(tau\[t\] - tau\[t - 1\]\) \* llr$",
}


@pytest.mark.parametrize("name", BOXES)
def test_each_label_sits_on_a_statement_that_does_the_line(name):
    expected = STATEMENTS[name]
    labels = {first: code for first, _, code, _ in gpclab.box_labels(name)}
    assert set(labels) == set(expected), f"{name}: labelled lines {sorted(labels)}, expected {sorted(expected)}"
    for k, pattern in expected.items():
        assert re.search(pattern, labels[k]), f"{name} line {k} is on {labels[k]!r}"
    helpers = gpclab.helper_labels(name)
    for (box, k, helper), pattern in HELPER_STATEMENTS.items():
        if box == name:
            codes = [code for first, last, code, _, h in helpers if h == helper and first == k]
            assert any(re.search(pattern, c) for c in codes), f"{name} line {k} in {helper}: {codes}"


@pytest.mark.parametrize("name", BOXES)
def test_helpers_carry_the_lines_they_do(name):
    """Each helper of a box labels lines of that box, and is reached from the box's function."""
    box = gpclab.BOXES[name]
    n_lines = len(box["lines"])
    sources = inspect.getsource(getattr(gpclab, box["function"]).py_func)
    for helper in box["helpers"]:
        labels = [h for h in gpclab.helper_labels(name) if h[4] == helper]
        assert labels, f"{name}: helper {helper} carries no label of the box"
        assert all(1 <= first <= last <= n_lines for first, last, *_ in labels)
        callers = [box["function"]] + [h for h in box["helpers"] if h != helper]
        assert any(re.search(rf"\b{helper}\(", inspect.getsource(getattr(gpclab, f).py_func)) for f in callers)
    assert sources


@pytest.mark.parametrize("name", BOXES)
def test_every_line_is_visible_under_its_label(name):
    """show_box shows code under every line that is not an input line or a block closer: the
    line's own label, or a helper's line that carries it (not only 'in the call at line N')."""
    view = gpclab.show_box(name)
    for row, (number, text) in zip(view.rows, gpclab.BOXES[name]["lines"]):
        if not _exempt(text):
            assert any(not c.startswith("(in the call") for c in row["code"]), f"{name} line {number}: {row['code']}"


@pytest.mark.parametrize("name", BOXES)
def test_errata_and_departures_are_recorded_in_full(name):
    box = gpclab.BOXES[name]
    numbers = {k for k, _ in box["lines"]}
    for k, erratum in box["errata"].items():
        assert k in numbers and set(erratum) == {"printed", "right", "why", "checked"}
        assert all(isinstance(v, str) and v for v in erratum.values())
        assert erratum["printed"] != erratum["right"]
    for k, why in {**box["departs"], **box.get("moved", {})}.items():
        assert k in numbers and isinstance(why, str) and len(why) > 20


ERRATA = {("3.3", 15), ("3.3", 16), ("3.5", 14), ("AIS", 6)}


def test_the_known_errata_are_recorded():
    assert {(name, k) for name, box in gpclab.BOXES.items() for k in box["errata"]} == ERRATA


@pytest.mark.parametrize("name", BOXES)
def test_show_box_puts_errata_and_departures_beside_their_line_aligned(name):
    box = gpclab.BOXES[name]
    view = gpclab.show_box(name)
    text = str(view)
    lines = text.splitlines()
    rows = lines[next(i for i, r in enumerate(lines) if "-+-" in r) + 1:]
    # the column separator at one display column on every row, the box's column wrapped to fit
    columns = {gpclab._display_width(r.partition(" |")[0]) for r in rows}
    assert columns == {view.LEFT}, columns
    # each note in the row group of its line: after the line's number, before the next line's
    starts = [i for i, r in enumerate(rows) if re.match(r"\s*\d+[! ] ", r)]
    assert len(starts) == len(box["lines"])
    squeeze = lambda lines: re.sub(r"\s+", " ", " ".join(lines))
    left, right = {}, {}
    for (k, _), a, b in zip(box["lines"], starts, starts[1:] + [len(rows)]):
        left[k] = squeeze(r.partition(" |")[0] for r in rows[a:b])
        right[k] = squeeze(r.partition(" |")[2] for r in rows[a:b])
    for k, erratum in box["errata"].items():
        assert re.match(rf"\s*{k}! ", rows[starts[k - 1]])
        assert squeeze(["correct: " + erratum["right"]]) in left[k]
        assert squeeze(["erratum: the book prints " + erratum["printed"]]) in right[k]
        assert squeeze(["Checked: " + erratum["checked"]]) in right[k]
    for k, why in box["departs"].items():
        assert squeeze(["departs: " + why]) in right[k], (k, why)
    for k, why in box.get("moved", {}).items():
        assert squeeze(["out of the box's order: " + why]) in right[k], (k, why)
    html = view._repr_html_()
    assert html.startswith("<table") and html.count("<tr>") == len(box["lines"]) + 1
    import html as html_module
    for k, erratum in box["errata"].items():
        row = html.split("<tr>")[1 + k]
        shown = lambda text: gpclab._html_accents(html_module.escape(text))   # (accents set in their font)
        assert shown(erratum["right"]) in row and shown(erratum["why"]) in row
    for k, why in box["departs"].items():
        assert gpclab._html_accents(html_module.escape(why)) in html.split("<tr>")[1 + k]


def test_show_box_escapes_html_and_measures_combining_marks():
    html = gpclab.show_box("AIS")._repr_html_()
    assert "Kuss &amp; Rasmussen" in html and "Kuss & Rasmussen" not in html
    assert gpclab._display_width("τ̃_i := τ̃_i + Δτ̃") == len("t_i := t_i + Dt")
    assert gpclab._display_width("f̂") == 1


def test_the_contents_at_the_top_give_each_box_its_function_and_line():
    """The table of contents in gpclab's docstring: box -> function -> line of its def (or of BOXES)."""
    lines = open(gpclab.__file__, encoding="utf-8").read().splitlines()
    rows = re.findall(r"^    (GPML Algorithm 3\.\d|K&R Algorithm 3)\s+.+?  (\w+)\s+line (\d+)$", gpclab.__doc__, re.M)
    by_source = {box["source"].replace("Kuss & Rasmussen (2005), ", "K&R "): box["function"]
                 for box in gpclab.BOXES.values()}
    assert {(s, f) for s, f, _ in rows} == set(by_source.items())
    for _, function, number in rows:
        actual = next(i for i, l in enumerate(lines, 1) if l.startswith(f"def {function}("))
        assert int(number) == actual, f"the contents give {function} at line {number}, it is at line {actual}"
    number = re.search(r"BOXES, show_box\s+line (\d+)$", gpclab.__doc__, re.M).group(1)
    assert lines[int(number) - 1].startswith("BOXES = {")


def test_no_likelihood_name_falls_through_in_the_compiled_functions():
    """Part I compares a likelihood's name only in log_likelihood and _likelihood_row (the row of
    LIKELIHOODS; _w_max, _ep_noise and _average_rule read it), which refuse a name they do not
    know: a name that gets past the checks (an unchecked call) is refused, never run as logistic,
    probit or step, and a likelihood without what a function needs (EP's site, log p) too."""
    import ast as ast_module
    source = open(gpclab.__file__, encoding="utf-8").read()
    part_one = source[:source.index("# PART II. USING IT")]
    branching = set()
    for node in ast_module.walk(ast_module.parse(part_one)):
        if isinstance(node, ast_module.FunctionDef):
            for sub in ast_module.walk(node):
                if (isinstance(sub, ast_module.Compare) and isinstance(sub.left, ast_module.Name)
                        and sub.left.id == "likelihood"):
                    branching.add(node.name)
    assert branching == {"log_likelihood", "_likelihood_row"}, branching
    from test_transcriptions import binary_problem

    X, y, K, K_star, kss = binary_problem(3, 8)
    calls = [
        (gpclab.log_likelihood, ("toy", y, np.zeros(8)), {}),
        (gpclab.laplace_mode, (K, y, "toy"), {}),
        (gpclab.laplace_predict, (np.zeros(8), K, y, "toy", K_star, kss), {}),
        (gpclab.averaged_probability, ("toy", np.zeros(3), np.ones(3), "average"), {}),
        (gpclab.hmc_latent, (K, y, "toy", 5), {}),
        (gpclab.ais, (K, y, "toy"), {"T": 8, "R": 2}),
        (gpclab.mcmc_predict, (np.zeros((2, 8)), K, "toy", K_star, kss), {}),
        (gpclab.ep, (K, y), {"likelihood": "toy"}),
        (gpclab.ep_predict, (np.zeros(8), np.ones(8), K, K_star, kss), {"likelihood": "toy"}),
    ]
    for fn, args, kwargs in calls:
        with pytest.raises(ValueError, match="gpclab.LIKELIHOODS"):
            fn.unchecked(*args, **kwargs)
    for fn, args, kwargs in [(gpclab.ep, (K, y), {"likelihood": "logistic"}),    # no EP site
                             (gpclab.hmc_latent, (K, y, "step", 5), {}),         # no log p
                             (gpclab.averaged_probability, ("step", np.zeros(3), np.ones(3), "map"), {})]:
        with pytest.raises(ValueError, match="gpclab.LIKELIHOODS"):
            fn.unchecked(*args, **kwargs)


def _names(statement):
    """(names read, names bound) by a statement as show_box shows it (a compound statement's
    header is completed with a body)."""
    import builtins
    text = statement.strip()
    tree = ast.parse(text + " pass" if text.endswith(":") else text)
    read, bound = set(), set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            (read if isinstance(node.ctx, ast.Load) else bound).add(node.id)
        elif isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name):
            read.add(node.target.id)
    return read - set(dir(builtins)), bound


# 3.4 is left out: its sampling helpers (_cross_dots, _antithetic_average) are loops over test cases
# and sample pairs whose indices and scratch sums (j, pairs, t_plus, ...) carry no label.
@pytest.mark.parametrize("name", [b for b in BOXES if b != "3.4"])
def test_every_name_a_shown_line_uses_is_defined_in_what_is_shown(name):
    """A student reading show_box meets no variable from nowhere: each name that a shown code line
    reads is an argument of the box's function (or of the helper whose line it is), a name of
    gpclab, or bound by a shown line of the box (the box's own labels, its `# for line N` parts,
    its helpers' labelled lines)."""
    box = gpclab.BOXES[name]
    view = gpclab.show_box(name)
    known = set(dir(gpclab)) | set(inspect.signature(getattr(gpclab, box["function"]).py_func).parameters)
    shown = []
    for row in view.rows:
        for code in row["code"]:
            helper, sep, rest = code.partition(": ")
            if sep and helper in box["helpers"]:
                known |= set(inspect.signature(getattr(gpclab, helper).py_func).parameters)
                code = rest
            if code.startswith("(in the call"):
                continue
            shown.append((row["number"], code))
    bound = set()
    for _, code in shown:
        bound |= _names(code)[1]
    missing = {(k, n) for k, code in shown for n in _names(code)[0] - bound - known}
    assert not missing, f"{name}: shown lines read names that no shown line defines: {sorted(missing)}"


@pytest.mark.parametrize("columns", [80, 100, 200])
def test_show_box_text_fits_the_terminal(columns, monkeypatch):
    """The text view wraps to the terminal's width (COLUMNS, as shutil.get_terminal_size reads it;
    100 when unknown), a wrapped line's continuation indented, and shows every labelled statement."""
    monkeypatch.setenv("COLUMNS", str(columns))
    for name in BOXES:
        view = gpclab.show_box(name)
        lines = str(view).splitlines()
        long = [l for l in lines if gpclab._display_width(l) > columns
                and len(l.partition(" | ")[2].split()) > 1]                 # (not one word longer than the column)
        assert not long, (name, columns, long)
        assert view.LEFT == min(56, (columns - 3) * 9 // 20)
        right = re.sub(r"\s+", " ", " ".join(l.partition(" | ")[2] for l in lines))
        for row in view.rows:
            for code in row["code"]:
                assert re.sub(r"\s+", " ", code) in right, (name, code)
    monkeypatch.delenv("COLUMNS")
    import os

    def no_terminal(*args):
        raise OSError("not a terminal")
    monkeypatch.setattr(os, "get_terminal_size", no_terminal)
    assert gpclab.show_box("3.5")._widths() == (43, 54)                 # not a terminal: 100 columns


def test_show_box_html_keeps_the_hanging_indent_and_a_font_with_combining_marks():
    html = gpclab.show_box("3.5")._repr_html_()
    assert "DejaVu Sans Mono" in html
    # a letter with its combining mark is set in a font that places the mark over it
    assert re.search("<span style=\"font-family:'Liberation Mono'[^>]*>τ\u0303</span>", html)
    marks = list(re.finditer("[\u0302\u0303\u0304]", html))
    assert marks and all(html[m.end():m.end() + 7] == "</span>" for m in marks)
    assert "text-indent:-" in html and "padding-left:" in html       # wrapped lines keep their indent
    assert "min-width:" in html                                        # the box's column is not squeezed
    assert "tau_tilde[i] = tau_new" in html and "_current_column(Sigma, U, c, m, i, s_i)" in html
