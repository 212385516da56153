"""Large n: GPClassifier.fit states its expected time and memory, refuses what would not fit,
shows progress, stops on Ctrl-C, and fits ML-II on a random subset (max_ml2_n).

Fast: small n, with the speed model of the machine replaced by a fixed one (a Cholesky of
_SPEED_N points taking t_chol seconds) and the size above which fits are estimated lowered.
"""
import os
import re
import signal
import subprocess
import sys
import time
import warnings

import numpy as np
import pytest

import gpclab


def problem(n, seed=0):
    r = np.random.default_rng(seed)
    X = r.standard_normal((n, 2))
    y = np.where(X[:, 0] + 0.5 * r.standard_normal(n) > 0, "b", "a")
    return X, y


@pytest.fixture
def slow_machine(monkeypatch):
    """A machine on which a Cholesky factorisation of _SPEED_N points takes 1e5 s (passes free),
    and fits of 10 points or more are estimated."""
    monkeypatch.setattr(gpclab, "_machine_speed_cache", [(1e5, 0.0, None), float("inf")])
    monkeypatch.setattr(gpclab, "_ROUGH_SPEED", (1e5, 0.0, None))    # long even at the rough speed: measured
    monkeypatch.setattr(gpclab, "_ESTIMATE_FROM_N", 10)


def test_speed_is_measured_only_for_fits_that_might_be_long(monkeypatch):
    """A fit short even on a machine _ROUGH_MARGIN times slower than _ROUGH_SPEED is estimated
    without measuring this machine (which takes 0.05-0.3 s); a longer one, or a verbose one, is
    measured."""
    calls = []

    def speed(every=None):
        calls.append(1)
        return (1e-3, 1e-4, 1)

    monkeypatch.setattr(gpclab, "_machine_speed", speed)
    short = gpclab._fit_estimate(2000, 2000, (1, 1), "laplace", False, 1)     # 10 factorisations of 2,000
    assert calls == [] and short["measured"] is False and short["threads"] is None
    t_chol, t_pass, _ = gpclab._ROUGH_SPEED
    assert short["seconds"] == pytest.approx(10 * t_chol * 8 + 40 * t_pass * 4)
    assert short["seconds"] * gpclab._ROUGH_MARGIN < gpclab._SLOW_FIT_SECONDS
    long = gpclab._fit_estimate(2000, 2000, (1, 1), "ep", True, 1)            # ML-II on EP: 15 x 40
    assert calls == [1] and long["measured"] is True and long["threads"] == 1
    assert long["seconds"] == pytest.approx((15 * 40 + 60) * 1e-3 * 8 + (15 * 40 + 40) * 1e-4 * 4)
    emep = gpclab._fit_estimate(2000, 2000, (1, 1), "emep", True, 1)         # 40 rounds of 2.5 x 40
    assert emep["evaluations"] == 40
    assert emep["seconds"] == pytest.approx((40 * 2.5 * 40 + 60) * 1e-3 * 8 + (40 * 2.5 * 40 + 40) * 1e-4 * 4)
    asked = gpclab._fit_estimate(2000, 2000, (1, 1), "laplace", False, 1, measure=True)
    assert calls == [1, 1, 1] and asked["measured"] is True
    X, y = problem(2000)
    gpclab.GPClassifier(optimize=False).fit(X, y)                     # short: not measured
    assert calls == [1, 1, 1]


def test_estimate_scales_as_n_cubed(slow_machine):
    """Twice the points: eight times the time (passes free), four times the memory."""
    one = gpclab._fit_estimate(100, 100, (1, 1), "laplace", True, 1)
    two = gpclab._fit_estimate(200, 200, (1, 1), "laplace", True, 1)
    assert two["seconds"] == pytest.approx(8 * one["seconds"], rel=1e-12)
    assert two["peak_bytes"] == pytest.approx(4 * one["peak_bytes"], rel=1e-12)
    # the numbers themselves, from the model's definition: Cholesky factorisations of n^3/3
    # flops, 1e5 s each at 1000 points; 15 evaluations of 6 during ML-II, 10 for the final fit
    t = 1e5 * (100 / 1000) ** 3
    assert one["seconds"] == pytest.approx(15 * 6 * t + 10 * t)
    assert one["peak_bytes"] == 4 * 8 * 100 ** 2          # K, L, B^-1, dK
    # ML-II on a subset of m: its part scales with m^3, the approximation at all n with n^3
    sub = gpclab._fit_estimate(200, 100, (1, 1), "laplace", True, 1)
    assert sub["seconds_ml2"] == pytest.approx(one["seconds_ml2"])
    assert sub["seconds"] - sub["seconds_ml2"] == pytest.approx(80 * t)


def test_fit_states_its_estimate_and_progress(slow_machine, capsys):
    """Estimated above 30 s: the estimate first, then progress lines, without being asked; above
    10 minutes also a RuntimeWarning."""
    X, y = problem(100)
    with pytest.warns(RuntimeWarning, match=r"n = 100, method 'laplace': expected about 2\.8 h"):
        gpclab.GPClassifier(max_ml2_n=100).fit(X, y)          # asked for ML-II on all n
    err = capsys.readouterr().err
    est = gpclab._fit_estimate(100, 100, (1, 1), "laplace", True, 1)["seconds"]
    assert est == pytest.approx(15 * 6 * 100.0 + 10 * 100.0)   # 2.8 h
    lines = [s for s in err.splitlines() if ": running for " not in s]   # but a long step's (a compile)
    assert lines[0].startswith("GPClassifier.fit: n = 100, method 'laplace': expected about 2.8 h on this machine "
                               "(ML-II on all n: about 15 evaluations")
    assert "peak memory about 0.0 GiB" in lines[0]
    assert re.match(r"GPClassifier.fit: ML-II evaluation 1 of about 15: log evidence -\d+\.\d+ \(best", lines[1])
    assert lines[-1].startswith("GPClassifier.fit: done in")


def test_no_progress_for_small_fits_unless_asked(capsys):
    X, y = problem(60)
    gpclab.GPClassifier().fit(X, y)                       # the real machine: 60 points are not estimated
    assert capsys.readouterr().err == ""
    gpclab.GPClassifier(verbose=True).fit(X, y)          # asked: progress at any size
    err = capsys.readouterr().err
    lines = [s for s in err.splitlines() if ": running for " not in s]   # but a long step's (a compile)
    # no estimate below _ESTIMATE_FROM_N: the lines count without a typical count to compare with
    assert re.match(r"GPClassifier.fit: ML-II evaluation 1: log evidence -\d+\.\d+ \(best -\d+\.\d+\), "
                    r"\d+\.\d+ s per evaluation$", lines[0]), lines[0]
    assert "None" not in err and "of about" not in err and "beyond the typical" not in err
    assert lines[-3].startswith("GPClassifier.fit: fitting at all n = 60: log_hyp [")
    assert lines[-2].startswith("GPClassifier.fit: the approximation at all n = 60 done in")
    assert lines[-1].startswith("GPClassifier.fit: done in")


def test_evaluation_lines_are_not_crowded_out_by_the_lines_of_a_long_step():
    """Evaluations of a few seconds each (ML-II on EP at n = 2,500): after each one that ends at least
    _PROGRESS_EVERY s after the last evaluation line, its line (value, best, time left) comes, even if a
    long-step line ('running for') came just before; a long-step line comes only once the step has run
    about _PROGRESS_EVERY s, not 1 s into an evaluation. A clock set by hand, _PROGRESS_EVERY = 5."""
    import io

    out = io.StringIO()
    m = gpclab._FitMonitor(True, 10, stream=out)
    t = {"now": 0.0}
    m.clock = lambda: t["now"]
    m.start = m.last = m.event = m.summary = 0.0

    def at(when, what):
        t["now"] = when
        what()

    at(1.0, lambda: m(np.zeros(2), -10.0))                  # evaluation 1: its line
    at(6.0, m.tick)                                         # evaluation 2 running for 5 s: a line
    at(7.0, lambda: m(np.ones(2), -9.0))                    # evaluation 2 ends: its line, not crowded out
    at(12.0, lambda: m(np.ones(2), -8.0))                   # evaluation 3 ends 5 s later: its line
    at(13.0, m.tick)                                        # evaluation 4 running for 1 s: nothing
    at(16.5, m.tick)                                        # 4.5 s: the step has run about a period
    lines = [line.replace("GPClassifier.fit: ", "") for line in out.getvalue().splitlines()]
    assert [line.split(":")[0] for line in lines] == ["ML-II evaluation 1 of about 10", "ML-II evaluation 2",
                                                    "ML-II evaluation 2 of about 10",
                                                    "ML-II evaluation 3 of about 10", "ML-II evaluation 4"], lines
    assert lines[1].endswith("running for 5 s") and lines[4].endswith("running for 4 s"), lines
    assert "log evidence -9.0000 (best -9.0000)" in lines[2] and "left" in lines[2]


def test_progress_past_the_typical_count_says_so_without_of_about():
    """A fit can run past its typical count (EM-EP's rounds: 23-111 E-steps on the floor table's sets
    against 40): up to the count a line says "of about N" (with a time left before it), past it
    "beyond the typical N", not "round 45 of about 40" nor a time left. EM-EP's round 0 is the
    E-step at the start, so its round N is the last typical one; ML-II counts from evaluation 1."""
    import io

    for rounds in (True, False):
        out = io.StringIO()
        m = gpclab._FitMonitor(True, 3, stream=out, rounds=rounds)
        t = {"now": 0.0}
        m.clock = lambda: t["now"]
        m.start = m.last = m.event = m.summary = 0.0
        first = 0 if rounds else 1
        for k in range(first, first + 5):
            t["now"] += 10.0                                # an evaluation line at most every 5 s
            m(np.zeros(2), -10.0 + k, k if rounds else None)
        lines = [line.replace("GPClassifier.fit: ", "") for line in out.getvalue().splitlines()]
        unit, what = ("EM-EP round", "EM-EP") if rounds else ("ML-II evaluation", "L-BFGS-B")
        heads = [line.split(":")[0] for line in lines]
        assert heads == ([f"{unit} {k} of about 3" for k in range(first, 4)]
                         + [f"{unit} {k}" for k in range(4, first + 5)]), lines
        at = 3 - first                                       # the line of the typical count itself
        assert all(line.endswith(" left") for line in lines[:at]), lines
        assert lines[at].endswith(" s per round" if rounds else " s per evaluation"), lines
        assert all(line.endswith(f", beyond the typical 3 ({what} stops at convergence or max_iter)")
                   for line in lines[at + 1:]) and len(lines) == 5, lines


def test_interrupt_message_counts_in_the_singular_and_plural():
    for rounds, unit in ((False, "ML-II evaluation"), (True, "EM-EP round")):
        m = gpclab._FitMonitor(False, None, rounds=rounds)
        m(np.zeros(2), -3.0, 0 if rounds else None)
        if rounds:
            m(np.ones(2), -2.0, 1)           # the E-step at the start, then round 1
        e = m.interrupted("somewhere", (2,))
        assert f"after 1 {unit} (" in str(e), str(e)
        assert e.best_log_hyp.tolist() == ([1.0, 1.0] if rounds else [0.0, 0.0])
        m(np.full(2, 2.0), -1.0, 2 if rounds else None)
        assert f"after 2 {unit}s (" in str(m.interrupted("somewhere", (2,)))


def test_the_approximation_at_all_n_after_ml2_on_a_subset_is_announced(slow_machine, capsys):
    """After ML-II on a subset, the fit at all n says when it starts (with its expected time) and
    when it ends."""
    X, y = problem(80)
    with pytest.warns(RuntimeWarning, match="expected about"):
        gpclab.GPClassifier(max_ml2_n=50, verbose=True).fit(X, y)
    lines = [s for s in capsys.readouterr().err.splitlines() if ": running for " not in s]
    est = gpclab._fit_estimate(80, 50, (1, 1), "laplace", True, 1)
    final = gpclab._duration(est["seconds"] - est["seconds_ml2"])
    assert final == gpclab._duration(10 * 1e5 * (80 / 1000) ** 3)         # 10 factorisations at n = 80
    assert lines[-3].startswith(f"GPClassifier.fit: fitting at all n = 80: expected about {final} with the "
                                f"log_hyp of ML-II on 50: log_hyp [")
    assert lines[-2].startswith("GPClassifier.fit: the approximation at all n = 80 done in")


@pytest.mark.filterwarnings("ignore:GPClassifier.fit. EM-EP did not converge")
def test_emep_shows_a_line_per_round(slow_machine, capsys):
    """EM-EP's progress: one line per round (round 0: the E-step at the start) with its log Z_EP,
    the values of the fit's own history, counted against the typical rounds (_EMEP_ROUNDS)."""
    X, y = problem(60)
    with pytest.warns(RuntimeWarning, match=f"EM-EP on all n: about {gpclab._EMEP_ROUNDS} rounds"):
        clf = gpclab.GPClassifier(method="emep", max_iter=4, max_ml2_n=60, verbose=True).fit(X, y)
    lines = [s for s in capsys.readouterr().err.splitlines() if "EM-EP round" in s and ": running for " not in s]
    assert len(lines) == clf.n_iter_ + 1 == clf.emep_.log_Z.shape[0]
    for k, (line, log_Z) in enumerate(zip(lines, clf.emep_.log_Z)):
        got = re.match(rf"GPClassifier.fit: EM-EP round (\d+) of about {gpclab._EMEP_ROUNDS}: log Z_EP "
                       r"(-?\d+\.\d+) \(best (-?\d+\.\d+)\), \d+\.\d+ s per round, about .* left$", line)
        assert got, line
        assert int(got[1]) == k
        assert float(got[2]) == pytest.approx(log_Z, abs=1e-4)
        assert float(got[3]) == pytest.approx(clf.emep_.log_Z[:k + 1].max(), abs=1e-4)


def test_emep_over_ten_minutes_names_max_ml2_n(slow_machine):
    """EM-EP on all n refused like ML-II, naming EM-EP on a subset of 1,000 and its time."""
    X, y = problem(1200)
    alt = gpclab._fit_estimate(1200, 1000, (1, 1), "emep", True, 1)
    with pytest.raises(RuntimeError, match=r"not started: EM-EP on all n would take over 10 min\. "
                       r"max_ml2_n=1000 \(EM-EP on a random subset of 1000, then the approximation at all n\) "
                       rf"is expected to take about {gpclab._duration(alt['seconds'])}\. To run EM-EP on all n "
                       r"anyway, pass max_ml2_n=1200"):
        gpclab.GPClassifier(method="emep", verbose=False).fit(X, y)


def test_verbose_false_silences_progress_not_the_warning(slow_machine, capsys):
    X, y = problem(100)
    with pytest.warns(RuntimeWarning, match="expected about"):
        gpclab.GPClassifier(verbose=False, max_ml2_n=100).fit(X, y)
    assert capsys.readouterr().err == ""


def test_ml2_over_ten_minutes_is_refused_unless_asked(slow_machine, monkeypatch):
    """ML-II on all n expected over 10 minutes: not started by default, with the estimate, the
    subset's time and how to run it anyway; asked for, it runs with a warning; under 10 minutes
    it runs without one."""
    X, y = problem(100)
    clf = gpclab.GPClassifier(verbose=False)
    with pytest.raises(RuntimeError) as e:
        clf.fit(X, y)
    msg = str(e.value)
    assert "n = 100, method 'laplace': expected about 2.8 h" in msg and "not started" in msg
    assert "over 10 min" in msg and "pass max_ml2_n=100" in msg and "optimize=False" in msg
    assert not hasattr(clf, "log_hyp_")
    # 1e5 s / 1000^3 * 100^3 = 100 s a factorisation; at a tenth of that ML-II's 90 factorisations
    # take 15 min: refused by default, run with a warning when asked for
    monkeypatch.setattr(gpclab, "_machine_speed_cache", [(1e4, 0.0, None), float("inf")])
    with pytest.raises(RuntimeError, match="not started"):
        gpclab.GPClassifier(verbose=False).fit(X, y)
    with pytest.warns(RuntimeWarning, match="expected about 17 min"):
        gpclab.GPClassifier(verbose=False, max_ml2_n=100).fit(X, y)
    # a hundredth: 1.5 min, neither refused nor warned
    monkeypatch.setattr(gpclab, "_machine_speed_cache", [(1e3, 0.0, None), float("inf")])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        gpclab.GPClassifier(verbose=False).fit(X, y)


def test_refused_when_memory_would_not_fit(slow_machine, monkeypatch):
    """The approximation at all n needs 3 arrays of n x n: refused with the numbers, unfitted."""
    X, y = problem(300)
    monkeypatch.setattr(gpclab, "_memory_available", lambda: 10 ** 6)
    clf = gpclab.GPClassifier()
    with pytest.raises(MemoryError) as e:
        clf.fit(X, y)
    msg = str(e.value)
    assert "n = 300" in msg and "expected about" in msg
    assert "peak memory about 0.0 GiB" in msg and "more than the 0.0 GiB of memory available" in msg
    # at most sqrt(1e6 / (3 * 8)) = 204 rows, rounded down to 200
    assert "fit a random subset of at most 200 rows" in msg
    assert not hasattr(clf, "log_hyp_")


def test_refusal_names_max_ml2_n_when_only_ml2_would_not_fit(slow_machine, monkeypatch):
    """2.5 MB: ML-II at n = 300 needs 4 x 8 x 300^2 = 2.9 MB, the approximation 2.2 MB."""
    X, y = problem(300)
    monkeypatch.setattr(gpclab, "_memory_available", lambda: 2_500_000)
    with pytest.raises(MemoryError, match=r"pass max_ml2_n=200 \(ML-II on a random subset of 200"):
        gpclab.GPClassifier(verbose=False).fit(X, y)
    with pytest.warns(RuntimeWarning, match="expected about"):       # the advice fits
        clf = gpclab.GPClassifier(max_ml2_n=200, verbose=False).fit(X, y)
    assert len(clf.ml2_subset_) == 200


def test_max_ml2_n_is_ml2_on_the_subset():
    """ML-II on the random subset, then the approximation at all n with its log_hyp: the same
    numbers as a plain fit on that subset, and a plain fit at all n with those log_hyp."""
    X, y = problem(150, seed=3)
    clf = gpclab.GPClassifier(max_ml2_n=60).fit(X, y)
    sub = clf.ml2_subset_
    assert sub.shape == (60,) and np.all(np.diff(sub) > 0) and set(y[sub]) == {"a", "b"}
    plain = gpclab.GPClassifier().fit(X[sub], y[sub])
    np.testing.assert_allclose(clf.log_hyp_, plain.log_hyp_, rtol=1e-12)
    fixed = gpclab.GPClassifier(log_hyp=plain.log_hyp_, optimize=False).fit(X, y)
    assert clf.log_marginal_likelihood_ == pytest.approx(fixed.log_marginal_likelihood_, rel=1e-12)
    np.testing.assert_allclose(clf.predict_proba(X), fixed.predict_proba(X), rtol=1e-10)
    # the subset differs from the first 60 points (it is drawn) and is the same for the same seed
    assert not np.array_equal(sub, np.arange(60))
    np.testing.assert_array_equal(gpclab.GPClassifier(max_ml2_n=60).fit(X, y).ml2_subset_, sub)
    # max_ml2_n >= n: ML-II on all points
    assert gpclab.GPClassifier(max_ml2_n=150).fit(X, y).ml2_subset_ is None


@pytest.mark.filterwarnings("ignore:GPClassifier.fit. ML-II L-BFGS-B stopped")
def test_max_ml2_n_keeps_every_class():
    X, y = problem(200, seed=1)
    y = y.astype(object)
    y[[17, 101]] = "c"                                    # a class of two points
    clf = gpclab.GPClassifier(max_ml2_n=20, optimize=True, max_iter=2).fit(X, y)
    assert set(y[clf.ml2_subset_]) == {"a", "b", "c"}


@pytest.mark.parametrize("name, value", [("max_ml2_n", 1), ("max_ml2_n", 2.5), ("max_ml2_n", True),
                                         ("max_ml2_n", "2000"), ("verbose", -1), ("verbose", "yes")])
def test_bad_large_n_parameters(name, value):
    X, y = problem(20)
    with pytest.raises(ValueError, match=f"GPClassifier: {name} must be"):
        gpclab.GPClassifier(**{name: value}).fit(X, y)


INTERRUPT = r"""
import signal, sys
import numpy as np
import gpclab
signal.signal(signal.SIGINT, signal.default_int_handler)   # whatever the parent left us
r = np.random.default_rng(0)
X = r.standard_normal((700, 2))
y = np.where(X[:, 0] + 0.5 * r.standard_normal(700) > 0, 1, 0)
gpclab.GPClassifier(max_iter=1).fit(X[:50], y[:50])               # compiled before the clock starts
clf = gpclab.GPClassifier(n_restarts=10 ** 6, verbose=False)      # runs for ever unless interrupted
print("START", flush=True)
try:
    clf.fit(X, y)
    print("RETURNED", flush=True)
except KeyboardInterrupt as e:
    print("INTERRUPTED", flush=True)
    print("FITTED", hasattr(clf, "log_hyp_"))
    print("BEST", np.asarray(e.best_log_hyp).shape)
    print("MESSAGE", e, flush=True)
"""


def _interrupt_after_start(script, on_stderr=None):
    """Run `script` in a new Python, send it SIGINT 2 s after it prints START (as Ctrl-C comes from
    the terminal), and return ({first word of each printed line: (time, line)}, when SIGINT was sent);
    `on_stderr` sees each line of its stderr."""
    import threading

    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE if on_stderr else None, text=True, env=dict(os.environ))
    seen = {}

    def read():
        for line in proc.stdout:
            seen.setdefault(line.split(" ", 1)[0].strip(), (time.perf_counter(), line.strip()))

    def read_err():
        for line in proc.stderr:
            on_stderr(line)

    readers = [threading.Thread(target=f, daemon=True) for f in ((read, read_err) if on_stderr else (read,))]
    for t in readers:
        t.start()
    try:
        deadline = time.perf_counter() + 900
        while "START" not in seen and proc.poll() is None and time.perf_counter() < deadline:
            time.sleep(0.05)
        assert "START" in seen, "the fit did not start"
        time.sleep(2.0)
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=300)
        for t in readers:
            t.join(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return seen, sent


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is POSIX")
def test_ctrl_c_stops_a_long_fit_within_a_second():
    """SIGINT from this process 2 s into a fit that would run for ever (as Ctrl-C comes from the
    terminal, not from a thread of the fit, which numba code holding the GIL would starve):
    KeyboardInterrupt within 1 s, the estimator unfitted, the message and best_log_hyp the
    best log_hyp so far."""
    seen, sent = _interrupt_after_start(INTERRUPT)
    assert "INTERRUPTED" in seen, seen
    assert seen["INTERRUPTED"][0] - sent < 1.0
    lines = {k: v[1].split(" ", 1)[-1] for k, v in seen.items()}
    assert lines["FITTED"] == "False"
    assert lines["BEST"] == "(2,)"
    assert lines["MESSAGE"].startswith("GPClassifier.fit interrupted during ML-II after ")
    assert "the estimator is left unfitted. The best log_hyp so far (log evidence -" in lines["MESSAGE"]
    assert "optimize=False) fits with it" in lines["MESSAGE"]


INTERRUPT_EMEP = r"""
import signal, sys
import numpy as np
import gpclab
signal.signal(signal.SIGINT, signal.default_int_handler)   # whatever the parent left us
r = np.random.default_rng(0)
X = r.standard_normal((600, 2))
y = np.where(X[:, 0] + 0.5 * r.standard_normal(600) > 0, 1, 0)
gpclab.GPClassifier(method="emep", max_iter=2).fit(X[:50], y[:50])     # compiled before the clock starts
gpclab.GPClassifier(method="ep", kernel="kg", likelihood="step", optimize=False).fit(X[:50], y[:50])
clf = gpclab.GPClassifier(method="emep", n_restarts=10 ** 6, verbose=True)   # runs for ever unless interrupted
print("START", flush=True)
try:
    clf.fit(X, y)
    print("RETURNED", flush=True)
except KeyboardInterrupt as e:
    print("INTERRUPTED", flush=True)
    print("FITTED", hasattr(clf, "log_hyp_"))
    print("BEST", np.asarray(e.best_log_hyp).shape)
    print("MESSAGE", e, flush=True)
    ep = gpclab.GPClassifier(method="ep", kernel="kg", likelihood="step", log_hyp=e.best_log_hyp,
                             optimize=False, verbose=False).fit(X, y)
    print("LOGZ", repr(ep.log_marginal_likelihood_), flush=True)
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT is POSIX")
def test_ctrl_c_stops_emep_with_its_last_round():
    """SIGINT 2 s into an EM-EP fit that would run for ever: KeyboardInterrupt within 1 s, in EM-EP
    rounds, its best_log_hyp a log_hyp whose E-step finished: EP from scratch there gives the log
    Z_EP the message states, which is the best of the round lines printed before."""
    rounds = []

    def on_stderr(line):
        got = re.match(r"GPClassifier.fit: EM-EP round \d+: log Z_EP (-?\d+\.\d+) \(best (-?\d+\.\d+)\)", line)
        if got:
            rounds.append((float(got[1]), float(got[2])))

    seen, sent = _interrupt_after_start(INTERRUPT_EMEP, on_stderr)
    assert "INTERRUPTED" in seen, seen
    assert seen["INTERRUPTED"][0] - sent < 1.0
    lines = {k: v[1].split(" ", 1)[-1] for k, v in seen.items()}
    assert lines["FITTED"] == "False"
    assert lines["BEST"] == "(5,)"                              # kg with 2 inputs: t0, 2 eta, t1, t2
    message = lines["MESSAGE"]
    assert re.match(r"GPClassifier.fit interrupted during EM-EP after \d+ EM-EP rounds? \(", message), message
    assert "ML-II" not in message
    stated = float(re.search(r"The best log_hyp so far \(log Z_EP (-?\d+\.\d+)\)", message)[1])
    assert rounds, "no EM-EP round line"
    assert stated == max(v for v, _ in rounds) == rounds[-1][1]
    assert float(lines["LOGZ"]) == pytest.approx(stated, abs=2e-4)


@pytest.mark.parametrize("n, nb", [(1, 4), (50, 7), (61, 16), (64, 16), (130, 32)])
def test_blocked_factorisations_match_lapack(n, nb):
    """_cholesky_blocked and _potri_blocked (used above _BLOCKED_N, Ctrl-C between blocks) give
    numpy's Cholesky factor and inverse, with small blocks so that every branch runs."""
    r = np.random.default_rng(n)
    G = r.standard_normal((n, n + 3))
    B = G @ G.T / n + np.eye(n)
    L = gpclab._cholesky_blocked(B.copy(), nb)
    np.testing.assert_allclose(L, np.linalg.cholesky(B), rtol=0, atol=1e-12)
    Binv = gpclab._potri_blocked(np.linalg.cholesky(B), nb)
    ref = np.linalg.inv(B)
    np.testing.assert_allclose(np.tril(Binv), np.tril(ref), rtol=0, atol=1e-12 * np.abs(ref).max())
    assert not np.triu(Binv, 1).any()                    # the upper triangle keeps L's zeros


def test_blocked_cholesky_refuses_an_indefinite_matrix():
    A = np.eye(40)
    A[30, 30] = -1.0
    with pytest.raises(np.linalg.LinAlgError):
        gpclab._cholesky_blocked(A, 8)


@pytest.mark.parametrize("n, m, nb, rows, step", [(40, 9, 8, 16, 3), (57, 57, 16, 5, 57), (33, 1, 32, 40, 1)])
def test_chunked_solve_and_syrk_match_the_dense_products(n, m, nb, rows, step):
    """_solve_lower_chunks and _syrk_strips (solve_lower_matrix, syrk_lower above _BLOCKED_N)
    against numpy's triangular solve and A^T A, with small pieces so that every branch runs."""
    r = np.random.default_rng(n + m)
    G = r.standard_normal((n, n))
    L = np.linalg.cholesky(G @ G.T / n + np.eye(n))
    B = r.standard_normal((n, m))
    X = gpclab._solve_lower_chunks(L, B.copy(), step)
    np.testing.assert_allclose(L @ X, B, rtol=0, atol=1e-12 * np.abs(B).max() * n)
    A = r.standard_normal((m, n))
    C = r.standard_normal((n, n))
    out = C.copy()
    gpclab._syrk_strips(out, A, -0.5, nb, rows)
    ref = C - 0.5 * A.T @ A
    np.testing.assert_allclose(np.tril(out), np.tril(ref), rtol=0, atol=1e-12 * np.abs(ref).max())
    np.testing.assert_array_equal(np.triu(out, 1), np.triu(C, 1))   # the upper triangle untouched


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="POSIX interval timers")
@pytest.mark.parametrize("which", ["cholesky", "potri"])
def test_blocked_factorisations_see_a_signal_between_blocks(which):
    """A signal that arrives during a blocked factorisation is seen at the next block (its
    handler raises, as Ctrl-C's does): the call stops long before it would have ended. Small
    blocks on n = 1200 make the call take long enough to tell (one LAPACK call is not stopped)."""
    n, nb = 1200, 8
    r = np.random.default_rng(0)
    G = r.standard_normal((n, n))
    B = G @ G.T / n + np.eye(n)
    L = np.linalg.cholesky(B)
    call = ((lambda: gpclab._cholesky_blocked(B.copy(), nb)) if which == "cholesky"
            else (lambda: gpclab._potri_blocked(L.copy(), nb)))
    from threadpoolctl import threadpool_limits

    limits = threadpool_limits(1)                          # one BLAS thread: times that load moves least
    call()                                                 # compiled
    t = time.perf_counter()
    call()
    full = time.perf_counter() - t                         # its time

    def alarm(signum, frame):
        raise KeyboardInterrupt("alarm")

    old = signal.signal(signal.SIGALRM, alarm)
    try:
        signal.setitimer(signal.ITIMER_REAL, full / 5)
        t = time.perf_counter()
        with pytest.raises(KeyboardInterrupt):
            call()
        stopped = time.perf_counter() - t
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
        limits.restore_original_limits()
    assert stopped < full / 5 + 0.3 * full, (stopped, full)


@pytest.mark.skipif(not hasattr(signal, "setitimer"), reason="SIGALRM is POSIX")
def test_progress_lines_come_during_a_long_step_too(monkeypatch):
    """During one long step in numba code (a blocked factorisation), progress lines still come every
    _PROGRESS_EVERY s (SIGALRM, whose handler numba's check_interrupt runs); the fit's end gives
    SIGALRM and the timer back; a SIGALRM handler of the caller's is left alone."""
    import io

    n, nb = 1200, 8
    r = np.random.default_rng(0)
    G = r.standard_normal((n, n))
    B = G @ G.T / n + np.eye(n)
    from threadpoolctl import threadpool_limits

    with threadpool_limits(1):
        gpclab._cholesky_blocked(B.copy(), nb)                 # compiled
        t = time.perf_counter()
        gpclab._cholesky_blocked(B.copy(), nb)
        full = time.perf_counter() - t
        monkeypatch.setattr(gpclab, "_PROGRESS_EVERY", full / 10)
        out = io.StringIO()
        m = gpclab._FitMonitor(True, None, stream=out)
        m(np.zeros(2), -1.0)                                    # the line of evaluation 1
        with gpclab._FitThreads() as threads:
            threads.tick(m)
            assert signal.getsignal(signal.SIGALRM) is not signal.SIG_DFL
            gpclab._cholesky_blocked(B.copy(), nb)              # one step in numba, about 10 periods
        assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
        assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("GPClassifier.fit: ML-II evaluation 1: log evidence -1.0000")
    ticks = lines[1:]
    assert len(ticks) >= 3, (lines, full)
    assert all(re.fullmatch(r"GPClassifier.fit: ML-II evaluation 2: running for \d+ s", t) for t in ticks), ticks

    def mine(signum, frame):
        pass

    old = signal.signal(signal.SIGALRM, mine)
    try:
        with gpclab._FitThreads() as threads:
            threads.tick(m)
            assert signal.getsignal(signal.SIGALRM) is mine
        assert signal.getsignal(signal.SIGALRM) is mine
    finally:
        signal.signal(signal.SIGALRM, old)


@pytest.mark.filterwarnings("ignore:GPClassifier.fit. EM-EP did not converge")
def test_max_ml2_n_with_emep_is_emep_on_the_subset():
    """EM-EP on the subset (its sites belong to the subset), then EP at all n with its log_hyp."""
    X, y = problem(120, seed=5)
    clf = gpclab.GPClassifier(method="emep", max_ml2_n=50, max_iter=3).fit(X, y)
    sub = clf.ml2_subset_
    plain = gpclab.GPClassifier(method="emep", max_iter=3).fit(X[sub], y[sub])
    np.testing.assert_allclose(clf.log_hyp_, plain.log_hyp_, rtol=1e-12)
    assert clf.nu_tilde_.shape == (120,)
    fixed = gpclab.GPClassifier(method="ep", kernel="kg", likelihood="step", log_hyp=plain.log_hyp_,
                                optimize=False).fit(X, y)
    assert clf.log_marginal_likelihood_ == pytest.approx(fixed.log_marginal_likelihood_, rel=1e-9)


def _blas_threads():
    from threadpoolctl import threadpool_info
    return max(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")


def _threads_in_the_ep(monkeypatch, fit):
    """The BLAS threads while the fit's multi-class EP runs (the fit stopped there)."""
    seen = []

    def stop(*args, **kwargs):
        seen.append(_blas_threads())
        raise KeyboardInterrupt
    monkeypatch.setattr(gpclab, "_ep_multiclass_run", stop)
    with pytest.raises(KeyboardInterrupt):
        fit()
    return seen[0]


@pytest.mark.parametrize("n", [400, 750])          # N = 800 (no estimate) and 1,500 (a rough one)
def test_multiclass_ep_on_small_X_uses_the_threads_measured_faster_but_not_more_than_the_users(monkeypatch, n):
    """Multi-class EP works on N = n (J - 1) latents: on small X (which holds one BLAS thread for
    its calls) with N >= 800 the fit sets the count measured faster; a limit the user set
    (threadpool_limits) is never exceeded; after the fit (here stopped by Ctrl-C) the count is
    as before."""
    from threadpoolctl import threadpool_limits

    before = _blas_threads()
    if before < 2:
        pytest.skip("one BLAS thread on this machine")
    r = np.random.default_rng(0)
    X, y = r.standard_normal((n, 2)), r.integers(0, 3, n)
    fit = gpclab.GPClassifier(method="ep", kernel="kg_iso", optimize=False,
                              log_hyp=np.log([1.0, 1e-4, 1e-3, 1.0])).fit
    monkeypatch.setattr(gpclab, "_machine_speed_cache", [(1e-3, 1e-4, None), float("inf")])  # all: faster
    assert _threads_in_the_ep(monkeypatch, lambda: fit(X, y)) == before
    assert _blas_threads() == before
    monkeypatch.setattr(gpclab, "_machine_speed_cache", [(1e-3, 1e-4, 1), float("inf")])     # one: faster
    assert _threads_in_the_ep(monkeypatch, lambda: fit(X, y)) == 1
    monkeypatch.setattr(gpclab, "_machine_speed_cache", [(1e-3, 1e-4, None), float("inf")])
    with threadpool_limits(1, user_api="blas"):
        assert _threads_in_the_ep(monkeypatch, lambda: fit(X, y)) == 1
        assert _blas_threads() == 1
    assert _blas_threads() == before
    small = r.standard_normal((60, 2)), r.integers(0, 3, 60)                  # N = 120: one thread
    assert _threads_in_the_ep(monkeypatch, lambda: fit(*small)) == 1


def test_one_thread_is_chosen_only_if_it_stays_faster(monkeypatch):
    """Another BLAS's threads spin for a moment after their work (numpy and scipy each load an
    OpenBLAS): a probe made then finds one thread faster. All threads are measured again after a
    pause, and one thread is chosen only if it still wins (a core held by another process)."""
    for rounds, want, calls in (([(9e-3, 1e-3), (7e-3, 1e-3), (5e-3, 1e-3)], (5e-3, 1e-3, None), 3),  # transient
                                ([(9e-3, 1e-3), (7e-3, 1e-3), (9.5e-3, 1e-3)], (7e-3, 1e-3, 1), 3),   # held core
                                ([(5e-3, 1e-3), (9e-3, 1e-3)], (5e-3, 1e-3, None), 2)):                # idle
        seen = []

        def speed_round(K, sW, threads):
            seen.append(threads)
            return rounds[len(seen) - 1]

        monkeypatch.setattr(gpclab, "_speed_round", speed_round)
        monkeypatch.setattr(gpclab, "_SPEED_SETTLE", 0.0)
        monkeypatch.setattr(gpclab, "_machine_speed_cache", [])
        assert gpclab._machine_speed() == want
        assert seen == [None, 1, None][:calls]
