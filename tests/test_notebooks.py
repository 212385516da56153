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
