"""Ctrl-C / Jupyter's Interrupt during every long call: KeyboardInterrupt, a live process, a
working next call.

One Python subprocess runs the calls one after another (each first once briefly, which compiles
it and shows that it works); the test sends SIGINT while the long version runs. A real Jupyter
kernel does the same for the two calls that used to kill it. The long calls would run for
minutes or forever if the interrupt were not seen.

The driver sets SIGINT's handler itself: a shell ignores SIGINT for its background jobs
(`python -m pytest &` in a script) and the child would inherit the ignored signal. The fixture
starts it with SIGINT ignored, so that every run shows this, and kills it in teardown whatever
happened.
"""
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import pytest
import gpclab

SETUP = r"""
import sys, time
import numpy as np
import gpclab

r = np.random.default_rng(0)
X = r.standard_normal((60, 2))
y = np.where(X[:, 0] + 0.5 * r.standard_normal(60) > 0, 1.0, -1.0)
K = gpclab.kernel_matrix("se", X, X, [0.0, 0.5]) + 1e-6 * np.eye(60)
X3 = r.standard_normal((300, 2))
y3 = np.where(X3[:, 0] > 0, 1.0, -1.0)
K3 = gpclab.kernel_matrix("se", X3, X3, [0.0, 0.5]) + 1e-6 * np.eye(300)
idx = np.arange(60) % 3
Y = gpclab.one_hot(idx, 3)
Kc = np.stack([K] * 3)
mm = gpclab.laplace_mode_multiclass(Kc, Y)
Xs = r.standard_normal((200, 2))
Ks = np.stack([gpclab.kernel_matrix("se", X, Xs, [0.0, 0.5])] * 3)
kss = np.ones((3, 200))
labels = np.where(y > 0, "a", "b")
Xbig = r.standard_normal((2000, 10000))
Y4 = gpclab.one_hot(np.arange(60) % 4, 4)
em4 = gpclab.ep_multiclass(K, Y4)


def loop(f):
    for _ in range(10 ** 7):
        f()


CALLS = {
    "laplace_mode (loop)": (lambda: gpclab.laplace_mode(K, y, "logistic"),
                            lambda: loop(lambda: gpclab.laplace_mode(K, y, "logistic"))),
    "ep": (lambda: gpclab.ep(K3, y3, max_sweeps=2),
           lambda: gpclab.ep(K3, y3, tol=0.0, max_sweeps=10 ** 8)),
    "laplace_mode_multiclass (loop)": (lambda: gpclab.laplace_mode_multiclass(Kc, Y),
                                       lambda: loop(lambda: gpclab.laplace_mode_multiclass(Kc, Y))),
    "laplace_predict_multiclass": (
        lambda: gpclab.laplace_predict_multiclass(Kc, Y, mm.f_hat, Ks, kss, 10),
        lambda: gpclab.laplace_predict_multiclass(Kc, Y, mm.f_hat, Ks, kss, 10 ** 7)),
    "ep_predict_multiclass": (  # four classes: three differences, integrated by QMC points
        lambda: gpclab.ep_predict_multiclass(em4.nu_tilde, em4.tau_tilde, K, Y4, Ks[0], kss[0], n_points=100),
        lambda: gpclab.ep_predict_multiclass(em4.nu_tilde, em4.tau_tilde, K, Y4, Ks[0], kss[0],
                                             n_points=10 ** 9, abseps=0.0)),
    "ep_multiclass": (lambda: gpclab.ep_multiclass(K, Y, max_sweeps=2),
                      lambda: gpclab.ep_multiclass(K, Y, tol=0.0, max_sweeps=10 ** 8)),
    "em_ep": (lambda: gpclab.em_ep(X, labels, kernel="kg_iso", max_iter=1),
              lambda: gpclab.em_ep(X, labels, kernel="kg_iso", max_iter=10 ** 8, tol=0.0, accelerate=False)),
    "ml2 (loop)": (lambda: gpclab.ml2(X, y, [0.0, 0.0], max_iter=2),
                   lambda: loop(lambda: gpclab.ml2(X, y, [0.0, 0.0]))),
    "GPClassifier.fit (restarts)": (
        lambda: gpclab.GPClassifier(max_iter=2).fit(X, labels),
        lambda: gpclab.GPClassifier(n_restarts=10 ** 7).fit(X, labels)),
    "cross_validate (loop)": (
        lambda: gpclab.cross_validate(X, labels, n_folds=2, max_iter=2),
        lambda: loop(lambda: gpclab.cross_validate(X, labels, n_folds=10))),
    "evidence_grid": (
        lambda: gpclab.evidence_grid(X, y, [0.0], [0.0], progress=False),
        lambda: gpclab.evidence_grid(X, y, np.linspace(-1, 1, 300), np.linspace(-1, 1, 300),
                                     progress=False)),
    "hmc_latent": (lambda: gpclab.hmc_latent(K, y, "probit", 5, 0.2, 5),
                   lambda: gpclab.hmc_latent(K, y, "probit", 5, 0.2, 5, thin=10 ** 9)),
    "elliptical_slice_latent": (lambda: gpclab.elliptical_slice_latent(K, y, "probit", 5),
                                lambda: gpclab.elliptical_slice_latent(K, y, "probit", 5, thin=10 ** 9)),
    "ais": (lambda: gpclab.ais(K, y, "probit", 40, 2, 0.2, 5),
            lambda: gpclab.ais(K, y, "probit", 10 ** 7, 2, 0.2, 5)),
    "hmc_latent (leapfrog)": (lambda: gpclab.hmc_latent(K, y, "probit", 5, 0.2, 5),
                              lambda: gpclab.hmc_latent(K, y, "probit", 1, 0.2, 10 ** 9)),
    "ais (leapfrog)": (lambda: gpclab.ais(K, y, "probit", 40, 2, 0.2, 5),
                       lambda: gpclab.ais(K, y, "probit", 40, 2, 0.2, 10 ** 8)),
    "mcmc_posterior": (
        lambda: gpclab.mcmc_posterior(X, y, [0.0, 0.5], n_samples=5, burn_in=0),
        lambda: gpclab.mcmc_posterior(X, y, [0.0, 0.5], n_samples=5, burn_in=0, thin=10 ** 9)),
    "ais_grid": (lambda: gpclab.ais_grid(X, y, [0.0], [0.5], T=40, R=2, progress=False),
                 lambda: gpclab.ais_grid(X, y, [0.0], [0.5], T=10 ** 7, R=2, progress=False)),
    "hmc_hyperparameters": (
        lambda: gpclab.hmc_hyperparameters(X, y, kernel="se", n_iter=2, n_leapfrog=2),
        lambda: gpclab.hmc_hyperparameters(X, y, kernel="se", n_iter=10 ** 6, n_leapfrog=2)),
    "truncated_gaussian_gibbs": (
        lambda: gpclab.truncated_gaussian_gibbs(K[:5, :5], 5),
        lambda: gpclab.truncated_gaussian_gibbs(K[:5, :5], 5, thin=10 ** 9)),
    "orthant_probability": (
        lambda: gpclab.orthant_probability(np.zeros(4), K[:4, :4], 100, 2),
        lambda: gpclab.orthant_probability(np.zeros(4), K[:4, :4], 10 ** 9, 2)),
    "kernel_matrix": (lambda: gpclab.kernel_matrix("se", Xbig[:5], Xbig[:5], [0.0, 0.0]),
                      lambda: gpclab.kernel_matrix("se", Xbig, Xbig, [0.0, 0.0])),
}
"""

DRIVER = r"""
import signal
signal.signal(signal.SIGINT, signal.default_int_handler)   # whatever the parent left us
""" + SETUP + r"""
print("READY", flush=True)
for line in sys.stdin:
    name = line.strip()
    short, long = CALLS[name]
    short()
    print("START", flush=True)
    try:
        long()
        print("RETURNED", flush=True)
    except KeyboardInterrupt:
        print("INTERRUPTED", flush=True)
    try:
        short()
        print("NEXT ok", flush=True)
    except Exception as e:
        print("NEXT failed", repr(e), flush=True)
"""

NAMES = ["laplace_mode (loop)", "ep", "laplace_mode_multiclass (loop)", "laplace_predict_multiclass",
         "ep_predict_multiclass", "ep_multiclass", "em_ep", "ml2 (loop)", "GPClassifier.fit (restarts)", "cross_validate (loop)",
         "evidence_grid",
         "hmc_latent", "hmc_latent (leapfrog)", "elliptical_slice_latent", "ais", "ais (leapfrog)",
         "mcmc_posterior", "ais_grid", "hmc_hyperparameters",
         "truncated_gaussian_gibbs", "orthant_probability", "kernel_matrix"]


class _Lines:
    def __init__(self, stream):
        self.q = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream):
        for line in stream:
            self.q.put(line.strip())
        self.q.put(None)

    def get(self, timeout):
        line = self.q.get(timeout=timeout)
        assert line is not None, "the process died"
        return line


def _ignore_sigint():
    """In the child before exec: SIGINT ignored, as a shell leaves it for a background job."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _start_driver():
    proc = subprocess.Popen([sys.executable, "-c", DRIVER], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, bufsize=1,
                            preexec_fn=_ignore_sigint if sys.platform != "win32" else None)
    try:
        lines = _Lines(proc.stdout)
        assert lines.get(timeout=900) == "READY"
    except BaseException:
        _stop(proc)
        raise
    return proc, lines


def _stop(proc):
    """End the driver: let it leave its loop, kill it if it does not (still in a long call)."""
    try:
        proc.stdin.close()
        proc.wait(timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        pass
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=60)


@pytest.fixture(scope="module")
def drivers():
    """The module's driver process, started again after a test that left it in an unknown state."""
    live = []
    try:
        yield live
    finally:
        for proc, _ in live:
            _stop(proc)


@pytest.fixture
def driver(drivers):
    if not drivers or drivers[-1][0].poll() is not None:
        drivers.append(_start_driver())
    return drivers[-1]


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to a child process is POSIX")
@pytest.mark.parametrize("name", NAMES)
def test_interrupt_ends_the_call_and_the_process_lives(driver, name):
    proc, lines = driver
    try:
        proc.stdin.write(name + "\n")
        proc.stdin.flush()
        assert lines.get(timeout=900) == "START"          # compiled, and the short call worked
        time.sleep(0.5)                                     # well inside the long call
        sent = time.perf_counter()
        proc.send_signal(signal.SIGINT)
        assert lines.get(timeout=300) == "INTERRUPTED"     # a bound on a hang: the latency is printed
        latency = time.perf_counter() - sent
        assert lines.get(timeout=600) == "NEXT ok"
        assert proc.poll() is None
    except BaseException:
        _stop(proc)               # maybe still in the long call: the next test starts a new driver
        raise
    print(f"{name}: interrupted after {latency:.3f} s")


def test_interrupt_in_a_jupyter_kernel():
    """The calls that killed the kernel: a loop of laplace_mode, and ep."""
    jupyter_client = pytest.importorskip("jupyter_client")
    km = jupyter_client.KernelManager(kernel_name="python3")
    km.start_kernel(env=dict(os.environ))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=600)                # a kernel's start on a loaded machine: minutes

        def run(code, interrupt_after=None, timeout=900):
            # an interrupted cell ends in an error; with stop_on_error the kernel then aborts the
            # requests that reach it until a timer it sets fires, and on a loaded machine the next
            # cell could arrive first ('aborted'): the cell to interrupt is sent without it
            msg_id = kc.execute(code, stop_on_error=interrupt_after is None)
            if interrupt_after is not None:
                busy = False
                while not busy:                        # the cell has started
                    msg = kc.get_iopub_msg(timeout=timeout)
                    busy = (msg["parent_header"].get("msg_id") == msg_id
                            and msg["msg_type"] == "status"
                            and msg["content"]["execution_state"] == "busy")
                time.sleep(interrupt_after)
                km.interrupt_kernel()
                timeout = 300                           # a bound on a hang, not a speed test (load 5 on 2 cores)
            while True:
                reply = kc.get_shell_msg(timeout=timeout)
                if reply["parent_header"].get("msg_id") == msg_id:
                    return reply["content"]

        setup = run(SETUP.split("Xbig")[0]
                    + "gpclab.ep(K3, y3, max_sweeps=2); gpclab.laplace_mode(K, y, 'logistic')")
        assert setup["status"] == "ok", setup
        for cell in ("for _ in range(10 ** 7):\n    gpclab.laplace_mode(K, y, 'logistic')",
                     "gpclab.ep(K3, y3, tol=0.0, max_sweeps=10 ** 8)"):
            reply = run(cell, interrupt_after=1.0)
            assert reply["status"] == "error" and reply["ename"] == "KeyboardInterrupt", reply
            assert km.is_alive()
            after = run("r = gpclab.ep(K3, y3); assert r.converged")
            assert after["status"] == "ok", after
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_an_interrupt_reported_through_several_numba_frames_is_a_keyboard_interrupt():
    """numba reports an interrupt that lands while it runs Python (typing a str, unpickling a
    constant) as SystemError("... returned a result with an exception set"), once per frame it
    passes through; the checked entry turns any such chain into KeyboardInterrupt, and leaves
    other SystemErrors alone."""
    def chained():
        try:
            try:
                raise KeyboardInterrupt
            except KeyboardInterrupt as e:
                raise SystemError("returned a result with an exception set") from e
        except SystemError as e:
            raise SystemError("returned a result with an exception set") from e

    def other():
        raise SystemError("something else")

    with pytest.raises(KeyboardInterrupt):
        gpclab.public()(chained)()
    with pytest.raises(SystemError, match="something else"):
        gpclab.public()(other)()
