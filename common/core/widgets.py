"""Interactive controls that degrade to a static plot when no one is looking (papermill, nbval, CI).

`explore(fn, n=(1, 64, 1), gpu=["H100-SXM", "B200"], ...)` shows the controls and calls `fn(**values)` whenever a
control moves; it returns None, so a cell ending in `explore(...)` shows the widget once. Headless,
or without ipywidgets, it calls `fn` once with each control's default (the value given by `defaults`, else the
first option, else the middle of a slider's range) and says so, so the committed output is a plain figure.
"""
from __future__ import annotations

from typing import Callable

from common.core.env import is_headless
from common.core.plots import DRAW_LOCK



def _default(spec):
    if isinstance(spec, (list, tuple)) and len(spec) in (2, 3) and all(isinstance(v, (int, float)) for v in spec):
        lo, hi = spec[0], spec[1]
        step = spec[2] if len(spec) == 3 else (1 if isinstance(lo, int) and isinstance(hi, int) else None)
        mid = (lo + hi) / 2
        if step:
            mid = lo + round((mid - lo) / step) * step
        return type(lo)(mid) if isinstance(lo, int) and isinstance(step, int) else mid
    if isinstance(spec, (list, tuple)):
        first = spec[0]
        return first[1] if isinstance(first, tuple) and len(first) == 2 else first
    return spec  # a fixed value or a ready-made widget's value


def static_values(controls: dict, defaults: dict | None = None) -> dict:
    """The values a static rendering uses: `defaults` where given, else each control's default."""
    defaults = defaults or {}
    unknown = set(defaults) - set(controls)
    if unknown:
        raise ValueError(f"defaults name {sorted(unknown)}, which are not controls; controls: {sorted(controls)}")
    out = {}
    for name, spec in controls.items():
        if name in defaults:
            out[name] = defaults[name]
        elif hasattr(spec, "value"):
            out[name] = spec.value
        else:
            out[name] = _default(spec)
    return out


def explore(fn: Callable, defaults: dict | None = None, **controls):
    """Interactive `fn` with ipywidgets.interact when a front end is there; a single static call otherwise."""
    values = static_values(controls, defaults)
    if not is_headless():
        try:
            widget = interactive_widget(fn, controls, values)
        except ImportError:
            widget = None
        if widget is not None:
            from IPython.display import display
            display(widget)
            return None  # displayed once: returning the widget would show it again as the cell's value
    print("Static view (no interactive front end): " + ", ".join(f"{k}={v!r}" for k, v in values.items()))
    fn(**values)
    return None


def interactive_widget(fn: Callable, controls: dict, values: dict):
    """The ipywidgets.interactive for `fn`, its controls set to `values`, labels shown in full.

    Sliders update when released (continuous_update=False), so dragging redraws once, not at every pixel."""
    import ipywidgets

    class OneAtATime(ipywidgets.interactive):
        def update(self, *args):
            # the whole redraw under the lock: ipywidgets also draws every open figure (show_inline_matplotlib_plots)
            # before and after fn, and unlocked it drew the figure another callback was building (plots.DRAW_LOCK)
            with DRAW_LOCK:
                super().update(*args)

    widget = OneAtATime(fn, **controls)
    for child in widget.children:
        name = getattr(child, "description", None)
        if name is None or isinstance(child, ipywidgets.Output):
            continue
        if name in values:
            try:
                child.value = values[name]
            except Exception:
                pass
        child.style.description_width = "initial"  # never cut a long label ("bandwidt...")
        child.layout.width = "auto" if isinstance(child, ipywidgets.Checkbox) else "32em"
        if hasattr(child, "continuous_update"):
            child.continuous_update = False
    return widget
