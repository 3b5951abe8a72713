"""What the model learned, made visible: boundary maps (HTML / PNG / terminal), training curves, run reports and
the training preview hook. Commands: `learntok show`, `learntok plot`, `learntok report` (learntok.cli.viz).

Importing this package loads neither torch nor matplotlib; the names below are resolved on first use.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "BoundaryMap": "cells", "Cell": "cells", "from_arrays": "cells",
    "compute_map": "boundary_map", "validation_maps": "boundary_map", "preview_sample": "boundary_map",
    "sequence_map": "boundary_map", "preview_hook": "boundary_map", "preview_map": "render",
    "preview_line": "render", "render_ansi": "render", "render_html": "render",
    "save_map_png": "mpl", "map_image": "mpl",
    "load_metrics": "curves", "save_figures": "curves",
    "build_report": "report", "write_report": "report",
    "plot_rate_sweeps": "rates", "save_rate_plot": "rates",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'learntok.viz' has no attribute {name!r}")
    return getattr(importlib.import_module(f"learntok.viz.{_EXPORTS[name]}"), name)
