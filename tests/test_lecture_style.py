"""The lectures' figure style (gpclab.check_figure_style, called by lecture_setup's save): a compliant figure
passes, and each kind of offence raises an AssertionError that names the figure and the offence."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.colors import ListedColormap  # noqa: E402

import gpclab  # noqa: E402


@pytest.fixture(autouse=True)
def course_style():
    with matplotlib.rc_context():
        gpclab.lecture_setup(quick=True)
        yield
        plt.close("all")


def compliant():
    """A figure as the lectures draw them: 11 in wide, contours, bands, colour bars, legend, mathtext."""
    x = np.linspace(-1, 1, 30)
    Z = np.add.outer(x ** 2, x)
    fig, axes = plt.subplots(1, 3, figsize=(11, 3.5))
    gpclab.evidence_panel(axes[0], x, x, -Z, title="(a) evidence")
    gpclab.band_panel(axes[1], x, x, Z, [-1, -0.5, 0, 0.5, 1, 2], label="nats")
    axes[2].plot(x, x, "k-", label=r"$\tilde\tau_i$")
    axes[2].contour(x, x, Z, levels=[0, 1], colors="k")
    axes[2].imshow(Z, cmap="viridis_r", extent=(-1, 1, -1, 1))
    axes[2].legend()
    fig.suptitle(r"$\log \sigma_f$ against $\log \ell$")
    return fig


def test_a_compliant_figure_passes():
    gpclab.check_figure_style(compliant(), "ok")


def test_a_derived_listed_colormap_passes():
    fig, ax = plt.subplots(figsize=(5, 4))
    cmap = ListedColormap(plt.get_cmap("RdBu_r")(np.linspace(0.55, 0.95, 4)))
    cs = ax.contourf(np.random.default_rng(0).random((5, 5)), levels=4, cmap=cmap)
    fig.colorbar(cs)
    gpclab.check_figure_style(fig, "derived")


@pytest.mark.parametrize("spoil, offence", [
    (lambda fig: fig.set_size_inches(15, 4), "width 15 in > 12 in"),
    (lambda fig: fig.axes[2].tick_params(labelsize=7), "text below 9 pt"),
    (lambda fig: fig.axes[2].legend(fontsize=8), "text below 9 pt"),
    (lambda fig: fig.axes[-1].tick_params(labelsize=6), "text below 9 pt"),          # a colour bar's ticks
    (lambda fig: fig.axes[0].text(0, 0, "note", fontsize=7), "'note' at 7 pt"),
    (lambda fig: fig.axes[2].set_xlabel("tau~_i"), "ASCII where mathtext is meant: 'tau~_i'"),
    (lambda fig: fig.axes[2].set_ylabel("sigma_f"), "ASCII where mathtext is meant: 'sigma_f'"),
    (lambda fig: fig.axes[2].imshow(np.eye(3), cmap="jet"), "colour map 'jet'"),
    (lambda fig: fig.axes[2].contourf(np.eye(3), cmap="Purples"), "colour map 'Purples'"),
    (lambda fig: fig.axes[2].scatter([0, 1], [0, 1], c=[0, 1], cmap="magma_r"), "colour map 'magma_r'"),
    (lambda fig: fig.axes[2].contourf(np.eye(3), levels=[-0.5, 0.5, 1.5],
                                      colors=["#cfe2f3", "#f4cccc"]), "not taken from viridis or RdBu_r"),
])
def test_each_offence_is_named(spoil, offence):
    fig = compliant()
    spoil(fig)
    with pytest.raises(AssertionError, match="figure 'spoiled' breaks the lecture style") as info:
        gpclab.check_figure_style(fig, "spoiled")
    assert offence in str(info.value), str(info.value)


def test_save_checks_before_writing(tmp_path, monkeypatch):
    monkeypatch.setenv("GPCLAB_SAVE_FIGURES", str(tmp_path))
    _, save = gpclab.lecture_setup(quick=True)
    fig = compliant()
    save(fig, "good")
    assert (tmp_path / "good.png").exists()
    fig.set_size_inches(19, 4)
    with pytest.raises(AssertionError, match="figure 'wide' .*width 19 in"):
        save(fig, "wide")
    assert not (tmp_path / "wide.png").exists()


def test_lecture_setup_sets_the_style():
    assert plt.rcParams["image.cmap"] == "viridis"
    assert min(plt.rcParams[k] for k in ("font.size", "xtick.labelsize", "ytick.labelsize",
                                         "legend.fontsize")) >= 9


def test_band_panel_keeps_the_levels_that_occur():
    """Errors of 3 to 10 on bands of whole counts up to 10 and doubling beyond: the colour bar names 3 to 10."""
    fig, ax = plt.subplots(figsize=(5, 4))
    E = np.arange(3, 11).repeat(2).reshape(4, 4).astype(float)
    levels = np.concatenate([np.arange(-0.5, 11), [16.5, 32.5, 64.5]])
    labels = [str(int(v + 0.5)) for v in levels[:-1]]
    cb = gpclab.band_panel(ax, np.arange(4), np.arange(4), E, levels, cmap="viridis_r", tick_labels=labels)
    assert [t.get_text() for t in cb.ax.get_yticklabels()] == [str(k) for k in range(3, 11)]


def test_evidence_panel_draws_a_contour_around_a_lone_maximum():
    """On a coarse grid whose maximum is one point above -0.25 nats, the -0.25 contour is still drawn."""
    x = np.linspace(-2, 2, 9)
    Z = -np.add.outer(x ** 2, x ** 2)                       # maximum 0 at the centre; neighbours at -0.25
    fig, ax = plt.subplots(figsize=(5, 4))
    gpclab.evidence_panel(ax, x, x, Z, below=(0.25, 1, 4))
    cs = [c for c in ax.collections if hasattr(c, "allsegs")][0]
    assert len(cs.levels) == 3 and all(len(segs) for segs in cs.allsegs)
    r = np.hypot(*cs.allsegs[-1][0].T)                      # the -0.25 contour: a circle of radius 0.5
    assert np.abs(r - 0.5).max() < 0.05


def test_slider_readout_follows_the_slider(monkeypatch):
    """The readout under a slider figure is rewritten at every move (not left at the initial values), and the
    first figure is checked against the style."""
    widgets = pytest.importorskip("ipywidgets")
    import IPython.display

    shown = []                                  # what the notebook would show, in order, as text

    class Handle:
        def update(self, obj):
            shown.append(str(obj))

    def fake_display(obj, display_id=None):
        shown.append(str(obj))
        return Handle() if display_id else None

    monkeypatch.setattr(IPython.display, "display", fake_display)

    def draw(a):
        fig, ax = plt.subplots(figsize=(4, 3))
        ax.plot([0, 1], [0, a])
        return fig, 10 * a

    slider = widgets.FloatSlider(value=1.0, min=0.0, max=5.0)
    result, _, _ = gpclab.slider_figure(draw, {"a": slider}, readout=lambda r: f"ten times a: {r:.1f}")
    assert result == 10.0 and shown[-1] == "ten times a: 10.0"
    slider.value = 3.0
    assert shown[-1] == "ten times a: 30.0"

    def wide(a):
        fig, ax = plt.subplots(figsize=(15, 3))
        return fig, a

    with pytest.raises(AssertionError, match=r"slider figure \(wide\).*width 15 in"):
        gpclab.slider_figure(wide, {"a": widgets.FloatSlider(value=1.0)})
