"""Every lecture notebook executes headless, its checks included (GPCLAB_QUICK shrinks grids only), from a
copy of lectures/ alone in a temporary home, as an instructor hands the lectures to students; and every
lecture has the shape the course shares (learning goals, try-this prompts with their observations, key
ideas, references, checks in hidden cells of their own)."""
import glob
import os
import re
import shutil

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

import gpclab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LECTURES = sorted(glob.glob(os.path.join(ROOT, "lectures", "*.ipynb")))


def test_there_are_lectures():
    assert LECTURES


@pytest.fixture(scope="session")
def mpl_config(tmp_path_factory):
    """One matplotlib configuration folder for all the lecture runs: its font cache is built once."""
    return str(tmp_path_factory.mktemp("mplconfig"))


def student_copy(tmp_path):
    """lectures/ copied alone into a fresh home folder, with no repository beside it (no benchmarks/,
    no gpclab.py: gpclab comes from the checkout through PYTHONPATH, as an installed package would)."""
    home = tmp_path / "home"
    shutil.copytree(os.path.join(ROOT, "lectures"), home / "lectures",
                    ignore=shutil.ignore_patterns(".ipynb_checkpoints", "__pycache__"))
    assert not (home / "benchmarks").exists() and not (home / "gpclab.py").exists()
    return home


@pytest.mark.parametrize("path", LECTURES, ids=os.path.basename)
def test_lecture_executes(path, tmp_path, monkeypatch, mpl_config):
    """The lecture runs in quick mode, every check cell passing, from a copy of lectures/ alone in a
    temporary home (its saved results must ship in lectures/results/ and be found from the notebook)."""
    home = student_copy(tmp_path)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GPCLAB_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    monkeypatch.setenv("MPLCONFIGDIR", mpl_config)
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    copy = home / "lectures" / os.path.basename(path)
    nb = nbformat.read(str(copy), as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "lecture notebooks are committed without outputs"
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": str(copy.parent)}}).execute()


def test_student_copy_has_no_repository_beside_it(tmp_path):
    """The copy the execution test runs from holds the lectures and their saved results, and nothing of
    the repository: a lecture that reached for ../benchmarks or ../gpclab.py would fail there."""
    home = student_copy(tmp_path)
    assert sorted(os.listdir(home)) == ["lectures"]
    assert os.listdir(home / "lectures" / "results")
    for path in LECTURES:
        code = "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert not re.search(r"""["']\.\.(/|["'])|["'][^"'\n]*benchmarks/""", code), \
            f"{os.path.basename(path)} reaches outside lectures/"


def _is_check(cell):
    return "check" in cell.metadata.get("tags", [])


ASSERT = re.compile(r"^\s*(assert\b|np\.testing\.assert_|numpy\.testing\.assert_)", re.M)


@pytest.mark.parametrize("path", LECTURES, ids=os.path.basename)
def test_lecture_shape(path):
    """The course's lecture shape: `## Learning goals` right after the title; a "**What to look at.**"
    paragraph before each figure; at least two "**Try this.**" prompts, each followed by its observation in
    a <details> block; `## Key ideas`, `## References` and `## Appendix` at the end, in that order; asserts
    only in code cells tagged `check`, each hidden (jupyter.source_hidden), opening with a `# Check:`
    comment, and drawing nothing."""
    name = os.path.basename(path)
    cells = nbformat.read(path, as_version=4).cells
    assert cells[0].cell_type == "markdown" and cells[0].source.startswith("# "), name
    assert cells[1].cell_type == "markdown" and cells[1].source.startswith("## Learning goals"), name

    heads = [line.strip() for c in cells if c.cell_type == "markdown" for line in c.source.splitlines()
             if line.startswith("## ")]
    order = [next((i for i, h in enumerate(heads) if h.startswith(key)), None)
             for key in ("## Key ideas", "## References", "## Appendix")]
    assert None not in order and order == sorted(order), (name, "Key ideas, References, Appendix", order)

    prose = "\n".join(c.source for c in cells if c.cell_type == "markdown")
    tries = [m.start() for m in re.finditer(r"\*\*Try this\.\*\*", prose)]
    assert len(tries) >= 2, (name, "at least two Try this prompts")
    for a, b in zip(tries, tries[1:] + [len(prose)]):
        assert re.search(r"<details>\s*<summary>", prose[a:b]), (name, "a Try this without its observation")

    seen_look = False
    for c in cells:
        if c.cell_type == "markdown" and "**What to look at.**" in c.source:
            seen_look = True
        if c.cell_type == "code" and re.search(r'\bsave\(fig, "', c.source) and not _is_check(c):
            assert seen_look, (name, "a figure without a What to look at paragraph before it", c.source[:80])
            seen_look = False

    for c in cells:
        if c.cell_type != "code":
            continue
        if _is_check(c):
            assert c.metadata.get("jupyter", {}).get("source_hidden") is True, (name, "check cell not hidden")
            assert c.source.startswith("# Check: "), (name, "check cell without its # Check: line")
            assert not re.search(r"\bplt\.|save\(fig|widgets\.", c.source), (name, "a check cell that draws")
        else:
            assert not ASSERT.search(c.source), (name, "assert outside a check cell", c.source[:80])


def test_figures_csv_points_at_notebook_headings():
    """Check that every row of lectures/FIGURES.csv names an existing notebook (or script) and, for a
    notebook, a '## ' heading in it that starts with the row's section heading."""
    import csv

    with open(os.path.join(ROOT, "lectures", "FIGURES.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert rows
    for row in rows:
        target = row["notebook"]
        if not target.endswith(".ipynb"):
            assert os.path.exists(os.path.join(ROOT, target)), target
            continue
        nb = nbformat.read(os.path.join(ROOT, "lectures", target), as_version=4)
        headings = [line[3:].strip() for c in nb.cells if c.cell_type == "markdown"
                    for line in c.source.splitlines() if line.startswith("## ")]
        assert any(h.startswith(row["section heading"]) for h in headings), (target, row["section heading"])


def test_figures_csv_lists_every_saved_png():
    """Check that the png column of lectures/FIGURES.csv names every PNG file a lecture saves (its
    save(fig, "name") calls), in rows of that lecture (a file may serve several rows), and that each name
    listed is one the lecture's code uses."""
    import csv
    import re

    with open(os.path.join(ROOT, "lectures", "FIGURES.csv"), newline="") as fh:
        rows = list(csv.DictReader(fh))
    listed = {}
    for row in rows:
        for name in filter(None, (row.get("png") or "").split(";")):
            assert listed.setdefault(name, row["notebook"]) == row["notebook"], (name, row["notebook"])
    code = {}
    for path in LECTURES:
        nb = nbformat.read(path, as_version=4)
        code[os.path.basename(path)] = "\n".join(c.source for c in nb.cells if c.cell_type == "code")
    for notebook, text in code.items():
        for name in re.findall(r'save\(fig, "([^"]+)"\)', text):
            assert listed.get(name + ".png") == notebook, f"{notebook} saves {name}.png: not in FIGURES.csv"
    for name, notebook in listed.items():
        assert f'"{name[:-4]}"' in code[notebook], f"{name} is listed for {notebook}, which never names it"


def _usps_like_file(path, scale):
    """A file in the layout of GPML's usps_resampled.mat (patterns 256 x n, labels 10 x n in {-1, +1}),
    made from scikit-learn's 8x8 digits blown up to 16x16, pixel values in [-scale, scale]: 45 cases of
    each digit in the training part (shuffled), the other 1347 images in the test part."""
    from scipy.io import savemat
    from sklearn.datasets import load_digits

    X, y = load_digits(return_X_y=True)
    X = scale * (np.stack([np.kron(img.reshape(8, 8), np.ones((2, 2))).ravel() for img in X]) / 8.0 - 1.0)
    r = np.random.default_rng(0)
    parts = {"train": [], "test": []}
    for digit in range(10):
        idx = r.permutation(np.flatnonzero(y == digit))
        parts["train"].append(idx[:45])
        parts["test"].append(idx[45:])
    mats = {}
    for part, chunks in parts.items():
        idx = r.permutation(np.concatenate(chunks))
        labels = -np.ones((10, idx.size))
        labels[y[idx], np.arange(idx.size)] = 1.0
        mats[f"{part}_patterns"] = X[idx].T
        mats[f"{part}_labels"] = labels
    savemat(path, mats)


# The lectures' USPS grids of log l lie above their 8x8 grids (3.05: by 1.0; 3.07.3: by 1.0 at the long
# end, where its figures make their points), as USPS distances are larger. Blowing the 8x8 images up to
# 16x16 multiplies squared distances by 4, and the pixel scale s by s^2 more (relative to the 8x8
# lecture's own pixel range, [0, 1] in 3.05 and [-1, 1] in 3.07.3): s is chosen so that each lecture's
# USPS grid covers these data where its 8x8 grid covers the 8x8 digits, 16 s^2 = e^2 and 4 s^2 = e^2.
USPS_SCALE = {"sec3_05_multiclass_laplace.ipynb": np.exp(1.0) / 4, "sec3_07_3_digits_3_vs_5.ipynb": np.exp(1.0) / 2}


@pytest.mark.parametrize("name", sorted(USPS_SCALE))
def test_lecture_runs_on_usps_from_a_path(name, tmp_path, monkeypatch, mpl_config):
    """The USPS branch (GPCLAB_USPS=<path to usps_resampled.mat>) of the two digit lectures, on a file
    in that format made from the 8x8 digits (GPML's file cannot be shipped), in quick mode."""
    path = tmp_path / "usps_resampled.mat"
    _usps_like_file(path, USPS_SCALE[name])
    Xtr, ytr, Xte, yte = gpclab.load_usps(str(path), digits=(3, 5))
    assert Xtr.shape == (90, 256) and Xte.shape == (275, 256) and set(ytr) == {3, 5}
    monkeypatch.setenv("GPCLAB_USPS", str(path))
    test_lecture_executes(os.path.join(ROOT, "lectures", name), tmp_path, monkeypatch, mpl_config)
