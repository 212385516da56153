"""Every lecture notebook executes headless, assertions included (GPCLAB_QUICK shrinks grids only)."""
import glob
import os

import nbformat
import numpy as np
import pytest
from nbclient import NotebookClient

import gpclab

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LECTURES = sorted(glob.glob(os.path.join(ROOT, "lectures", "*.ipynb")))


def test_there_are_lectures():
    assert LECTURES


@pytest.mark.parametrize("path", LECTURES, ids=os.path.basename)
def test_lecture_executes(path, tmp_path, monkeypatch):
    monkeypatch.setenv("GPCLAB_QUICK", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    for var in ("JUPYTER_CONFIG_DIR", "JUPYTER_DATA_DIR", "JUPYTER_RUNTIME_DIR", "IPYTHONDIR"):
        monkeypatch.setenv(var, str(tmp_path / var.lower()))
    nb = nbformat.read(path, as_version=4)
    assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), \
        "lecture notebooks are committed without outputs"
    NotebookClient(nb, timeout=900, kernel_name="python3",
                   resources={"metadata": {"path": os.path.dirname(path)}}).execute()


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
def test_lecture_runs_on_usps_from_a_path(name, tmp_path, monkeypatch):
    """The USPS branch (GPCLAB_USPS=<path to usps_resampled.mat>) of the two digit lectures, on a file
    in that format made from the 8x8 digits (GPML's file cannot be shipped), in quick mode."""
    path = tmp_path / "usps_resampled.mat"
    _usps_like_file(path, USPS_SCALE[name])
    Xtr, ytr, Xte, yte = gpclab.load_usps(str(path), digits=(3, 5))
    assert Xtr.shape == (90, 256) and Xte.shape == (275, 256) and set(ytr) == {3, 5}
    monkeypatch.setenv("GPCLAB_USPS", str(path))
    test_lecture_executes(os.path.join(ROOT, "lectures", name), tmp_path, monkeypatch)
