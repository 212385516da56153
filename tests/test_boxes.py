"""The box beside its code, checked: every line of each algorithm box (gpclab.BOXES, transcribed from
GPML chapter 3 and Kuss & Rasmussen 2005) has exactly one labelled code line in its function, in the
book's order (except the lines the box data records as moved, with a reason); each box function is
at most three times its box in code lines, and its source fits one screen."""
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
    # the labels in the book's order are the longest increasing run through them; the others are
    # the lines the code does elsewhere, and BOXES[name]["moved"] must name exactly those, with a reason
    moved = box.get("moved", {})
    out_of_order = _not_in_order(labels)
    assert all(isinstance(why, str) and why for why in moved.values())
    assert out_of_order == set(moved), (
        f"{name}: labels out of the book's order {sorted(out_of_order)}; recorded as moved, with a "
        f"reason, in BOXES[{name!r}]['moved']: {sorted(moved)}")


def _not_in_order(labels):
    """Box lines whose labels are not on the longest increasing subsequence of the labels."""
    firsts = [first for first, *_ in labels]
    best = [1] * len(firsts)
    prev = [-1] * len(firsts)
    for i in range(len(firsts)):
        for j in range(i):
            if labels[j][1] < firsts[i] and best[j] + 1 > best[i]:
                best[i], prev[i] = best[j] + 1, j
    keep = set()
    i = max(range(len(firsts)), key=lambda k: (best[k], -k)) if firsts else -1
    while i >= 0:
        keep.add(i)
        i = prev[i]
    return {k for i, (first, last, *_) in enumerate(labels) if i not in keep for k in range(first, last + 1)}


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
    assert code6.strip() in row6
    html = gpclab.show_box("Algorithm 3.2")._repr_html_()
    assert html.startswith("<table>") and "V[f∗]" in html
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
