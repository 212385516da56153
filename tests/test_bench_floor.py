"""The floor benchmark's counting and tables (benchmarks/bench_floor.py, bench_fits.py), on n = 60.

The floor of a list of box calls is checked against the sum written out by hand, with each timed
operation replaced by a distinct power of ten, so that a miscounted operation changes the total.
"""
import os
import sys
from collections import namedtuple

import numpy as np

import gpclab

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import bench_fits    # noqa: E402
import bench_floor   # noqa: E402

COST = {"chol": 1.0, "potri": 10.0, "trsm": 100.0, "syrk": 1e3, "rank1": 1e4, "gemm": 1e5, "trmv": 1e6}


class FixedFloor(bench_floor.Floor):
    """A Floor whose operations cost COST[name] x (N / 60), whatever the machine."""

    def __init__(self):
        super().__init__(np.eye(2), 1)

    def op(self, name, N):
        return COST[name] * N / 60


Mode = namedtuple("Mode", "n_iter")
EPRes = namedtuple("EPRes", "nu_tilde n_sweeps")


def test_floor_counts_each_call_as_documented():
    calls = [("laplace_mode", (60, 60), Mode(4), False),                 # 5 Choleskys
             ("ep", (60, 60), EPRes(np.zeros(60), 3), False),            # 3 x (rank1 + chol + trsm + syrk)
             ("ep", (60, 60), EPRes(np.zeros(60), 2), True),             # warm: one refactorisation more
             ("ep_multiclass", (30, 30), EPRes(np.zeros(60), 1), False),  # N = n (J - 1) = 60 latents
             ("laplace_mode_multiclass", (3, 60, 60), Mode(1), False),   # 2 x (3 (chol + potri) + chol)
             ("multiclass_G", (3, 60, 60), None, False),                 # 3 trsm
             ("laplace_log_q_grad", (60, 60), None, False),              # potri
             ("ep_log_Z_grad", (120, 120), None, False),                 # potri at N = 120
             ("em_ep_grad", (60, 60), None, False),                      # chol + potri + 2 gemm
             ("em_ep_bound", (60, 60), None, False)]                     # 2 chol + trsm
    refactor = 1 + 100 + 1e3
    expected = (5 + 3 * (1e4 + refactor) + 2 * (1e4 + refactor) + refactor + (1e4 + refactor)
                + 2 * (3 * (1 + 10) + 1) + 300 + 10 + 20 + (1 + 10 + 2e5) + (2 + 100))
    assert bench_floor.floor_of(calls, FixedFloor()) == expected


def test_counter_records_the_fit_and_restores_the_functions():
    X, y = bench_floor.synthetic(60)
    entry = gpclab.laplace_mode.unchecked
    with bench_floor.Counter() as c:
        m = gpclab.GPClassifier(optimize=False).fit(X, y)
    assert [name for name, *_ in c.calls] == ["laplace_mode"]
    name, shape, res, warm = c.calls[0]
    assert shape == (60, 60) and res.n_iter == m.n_iter_ and not warm
    assert c.threads == 1 and c.inside > 0                     # n = 60: gpclab runs one BLAS thread
    assert gpclab.laplace_mode.unchecked == entry              # the entry as it was before
    before = len(c.calls)
    gpclab.GPClassifier(optimize=False).fit(X, y)
    assert len(c.calls) == before                              # nothing counted outside the block
    # multi-class EP's fit runs ep_multiclass's body through the evidence: counted as ep_multiclass
    X3, y3 = bench_floor.synthetic(30, classes=3)
    run = gpclab._ep_multiclass_run
    with bench_floor.Counter() as c:
        m = gpclab.GPClassifier(method="ep", optimize=False).fit(X3, y3)
    assert [name for name, *_ in c.calls] == ["ep_multiclass"]
    name, shape, res, warm = c.calls[0]
    assert shape == (30, 30) and res.nu_tilde.shape == (60,) and res.log_Z == m.log_marginal_likelihood_
    assert gpclab._ep_multiclass_run is run
    # multi-class Laplace's fit: the mode, and the G_c = M\E_c it keeps for its predictions
    with bench_floor.Counter() as c:
        gpclab.GPClassifier(optimize=False).fit(X3, y3)
    assert [(name, shape) for name, shape, *_ in c.calls] == [("laplace_mode_multiclass", (3, 30, 30)),
                                                              ("multiclass_G", (3, 30, 30))]


def test_tables_show_ratio_skips_and_timeouts():
    c = bench_floor.Counter()
    rows = [dict(fit="ep", data="synthetic", n=60, threads=1, time=2.0, floor=0.5, counter=c, evaluations=None,
                 evidence=-40.0, warnings=[]),
            dict(fit="ml2-laplace", data="synthetic", n=60, threads=1, time=3.0, floor=None, counter=c,
                 evaluations=12, evidence=-30.0, ref=(15, -30.5), warnings=[]),
            dict(fit="mc-ep", data="synthetic J=3", n=4000, skipped="n (J - 1) = 8000 difference latents")]
    lines = bench_floor.table(rows).splitlines()
    assert len(lines) == 5
    cells = [x.strip() for x in lines[2].split("|")]
    assert cells[5:8] == ["2 s", "n/a", "0.5 s"] and cells[8] == "4.00"
    cells = [x.strip() for x in lines[3].split("|")]
    assert cells[8] == "n/a" and cells[9] == "12 / 15" and cells[10] == "-30.000 / -30.500"
    assert "skipped" in lines[4] and "8000 difference latents" in lines[4]
    rs = [{"emep fit": 4.0, "emep converged": True, "emep iterations": 30, "emep warnings": [],
           "emep log evidence": -50.0, "laplace fit": 0.1, "ml2-ep-same fit": 1.0,
           "ml2-ep-same log evidence": -50.5}, {"timeout": 600.0}]
    rows = dict(bench_fits.rows_of("emep-sonar", rs, 600.0))
    assert rows["EM-EP time per fit"] == "> 600 s (1 of 2 timed out)"
    assert rows["EM-EP not converged"] == "0 of 1 folds"


def test_a_fit_gpclassifier_refuses_is_a_skipped_row(monkeypatch, tmp_path, capsys):
    """EM-EP at n = 4,000 run alone: GPClassifier refuses to start it (over 10 minutes); the run goes
    on and the table has a skipped row with the estimate, where it used to stop with no table. Any
    other RuntimeError still stops it."""
    def refused(fit, X, y, args):
        raise RuntimeError("GPClassifier.fit: n = 60, method 'emep': expected about 13 min on this machine "
                           "(EM-EP on all n: about 20 rounds, 12 min); not started: EM-EP on all n would "
                           "take over 10 min. Use max_ml2_n=1000")

    monkeypatch.setattr(bench_floor, "warm_up", lambda *a: None)
    monkeypatch.setattr(bench_floor, "run_fit", refused)
    out = tmp_path / "floor.md"
    bench_floor.main(["--n", "60", "--sets", "none", "--fits", "emep", "--no-reference", "--out", str(out)])
    text = out.read_text()
    assert "| EM-EP | synthetic | 60 | | skipped |" in text and "refused by GPClassifier" in text
    assert "expected about 13 min" in text

    def broken(fit, X, y, args):
        raise RuntimeError("something else")

    monkeypatch.setattr(bench_floor, "run_fit", broken)
    import pytest

    with pytest.raises(RuntimeError, match="something else"):
        bench_floor.main(["--n", "60", "--sets", "none", "--fits", "emep", "--no-reference"])


def test_a_short_fit_is_timed_as_its_fastest_run_with_that_runs_counts(monkeypatch):
    """A fit under SHORT_FIT runs REPEATS times (the floor's operations are each the best of a few):
    the run kept is the fastest, with its own counts; a fit that takes SHORT_FIT or more runs once."""
    args = namedtuple("Args", "ais_T ais_R")(10, 1)
    X, y = bench_floor.synthetic(60)
    r = bench_floor.run_fit("laplace", X, y, args)             # the real fit: one run's counts
    assert r["runs"] == bench_floor.REPEATS == 3
    assert [name for name, *_ in r["counter"].calls] == ["laplace_mode"]
    assert 0 < r["time"] < bench_floor.SHORT_FIT

    def scripted(times):
        def fit_once(fit, X, y, args):
            c = bench_floor.Counter()
            c.calls = [("laplace_mode", (60, 60), Mode(len(seen)), False)]
            seen.append(1)
            return {"evidence": None, "evaluations": None, "time": times[len(seen) - 1], "counter": c}
        seen = []
        return fit_once, seen

    for times, runs, kept in (([1.5, 0.5, 1.0], 3, 1), ([0.9, 0.4, 0.2], 3, 2), ([2.0, 0.1], 1, 0),
                              ([1.0, 3.0, 0.7], 3, 2)):
        once, seen = scripted(times)
        monkeypatch.setattr(bench_floor, "fit_once", once)
        r = bench_floor.run_fit("laplace", X, y, args)
        assert r["runs"] == runs == len(seen)
        assert r["time"] == times[kept] and r["counter"].calls[0][2].n_iter == kept
