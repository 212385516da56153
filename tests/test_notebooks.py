"""Every lecture notebook executes headless, assertions included (GPCLAB_QUICK shrinks grids only)."""
import glob
import os

import nbformat
import pytest
from nbclient import NotebookClient

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
