"""One house style for every plot, and small helpers that keep figures consistent across labs.

Roofline plots live in `common.kernels.roofline`, pipeline timelines in `common.parallel.pipeline` -- they use the style set here.
"""
from __future__ import annotations

import threading
import warnings

# matplotlib, FreeType and mathtext's parser are not thread-safe, and a kernel may run two widget callbacks at once
# when a learner moves controls quickly: one drawing at a time (seen without it: "FT_Load_Glyph ... invalid outline"
# and mathtext ParseExceptions on valid tick labels such as $\mathdefault{10^{0}}$)
DRAW_LOCK = threading.RLock()

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]


def use_house_style() -> None:
    """Set matplotlib defaults: readable sizes, a light grid, a fixed palette, no top/right spines."""
    import matplotlib as mpl
    from cycler import cycler
    mpl.rcParams.update({
        "figure.figsize": (7.5, 4.2),
        "figure.dpi": 90,
        "axes.grid": True,
        "grid.alpha": 0.3,
        "axes.spines.top": False,
        "axes.spines.right": False,
        "axes.prop_cycle": cycler(color=PALETTE),
        "axes.titlesize": 12,
        "axes.labelsize": 11,
        "legend.fontsize": 9,
        "legend.frameon": False,
        "svg.hashsalt": "workbook",  # deterministic SVG ids
    })


def figure(title: str = "", xlabel: str = "", ylabel: str = "", logx: bool = False, logy: bool = False,
           figsize=None):
    """A new (fig, ax) with labels and optional log axes, in the house style."""
    import matplotlib.pyplot as plt
    use_house_style()
    fig, ax = plt.subplots(figsize=figsize)
    if title:
        ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if logx:
        ax.set_xscale("log")
    if logy:
        ax.set_yscale("log")
    return fig, ax


def show(fig=None) -> None:
    """Display and close a figure (closing keeps memory flat in long notebooks and avoids duplicate output).

    In Jupyter the figure is rendered once, as a PNG, after tight_layout; the inline backend would render it a
    second time to crop it (bbox_inches="tight"), which doubles the time a widget takes to redraw."""
    import matplotlib.pyplot as plt
    with DRAW_LOCK:
        fig = fig or plt.gcf()
        try:
            _render(fig)
        except ValueError:  # a tick label's mathtext parse broken by a draw elsewhere: reset the parser, once more
            _reset_mathtext()
            _render(fig)
        finally:
            plt.close(fig)


def _render(fig) -> None:
    import matplotlib
    import matplotlib.pyplot as plt
    with warnings.catch_warnings():  # a layout that cannot fit every label is still drawn: no red text for it
        warnings.filterwarnings("ignore", message="Tight layout not applied")
        fig.tight_layout()
    if "inline" in matplotlib.get_backend():
        import io

        from IPython.display import Image, display
        buf = io.BytesIO()
        fig.savefig(buf, format="png")
        display(Image(data=buf.getvalue(), format="png"))
    else:
        plt.show()


def _reset_mathtext() -> None:
    import matplotlib.mathtext
    import pyparsing
    matplotlib.mathtext.MathTextParser._parser = None
    matplotlib.mathtext.MathTextParser._parse_cached.cache_clear()
    pyparsing.ParserElement.reset_cache()


def subplots(nrows: int = 1, ncols: int = 2, figsize=None):
    """(fig, axes) for side-by-side panels, in the house style."""
    import matplotlib.pyplot as plt
    use_house_style()
    return plt.subplots(nrows, ncols, figsize=figsize or (5 * ncols, 3.8 * nrows))
