"""Boundary maps drawn with matplotlib (Agg): PNG files and image arrays (for TensorBoard).

Characters sit on a fixed grid (East Asian wide characters take two cells), each cell filled with the colour of
its boundary probability, a red bar at the left edge of drawn boundaries. Glyphs come from the first installed
font that has them: DejaVu Sans Mono, then CJK fonts (Noto Sans CJK, WenQuanYi, ...), then monochrome emoji /
symbol fonts (Noto Emoji, Symbola). Characters no installed font can draw become "□", with a one-line notice.
Colour-bitmap emoji fonts (Noto Color Emoji) cannot be scaled by matplotlib's FreeType renderer and are skipped.
"""

from __future__ import annotations

import functools
import io
import unicodedata
from pathlib import Path

import numpy as np

from learntok.errors import MissingDependency
from learntok.viz.cells import BoundaryMap
from learntok.viz.render import BOUNDARY_RED, dark, rgb

FONT_CANDIDATES = (
    "DejaVu Sans Mono",
    "Noto Sans Mono CJK JP", "Noto Sans CJK JP", "Noto Sans CJK SC", "Source Han Sans", "WenQuanYi Zen Hei",
    "WenQuanYi Micro Hei", "Droid Sans Fallback", "AR PL UMing CN",
    "Noto Emoji", "Symbola", "Noto Sans Symbols2", "Noto Sans Symbols", "DejaVu Sans",
)
FONT_FILES = ("notosanscjk", "notosansmonocjk", "wqy", "droidsansfallback", "symbola", "notoemoji",
              "notosanssymbols")
"""File-name fragments of candidate fonts, for fonts installed after matplotlib built its font cache."""
MISSING = "\u25a1"  # □, in DejaVu
FONT_HINT = "install fonts-noto-cjk (CJK) and fonts-symbola (emoji) to draw them"


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed), with a clear error if matplotlib is absent."""
    try:
        import matplotlib
    except ImportError as e:
        raise MissingDependency("plots need matplotlib: pip install 'learntok[viz]' (or pip install matplotlib)") from e
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path, dpi: int | None = 130, **savefig):
    """Write `fig` to `path` (a file name, its folder made, or a binary buffer), with savefig's other keywords, and
    close it, even if writing fails; returns `path`. Every figure learntok writes goes through here. `dpi=None`:
    matplotlib's default (the figure's own)."""
    if isinstance(path, (str, Path)):
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fig.savefig(path, dpi=dpi, **savefig)
    finally:
        pyplot().close(fig)
    return path


@functools.lru_cache(maxsize=1)
def fonts() -> tuple[tuple[str, frozenset[int]], ...]:
    """(family, code points it covers) for each installed candidate font, in fallback order."""
    pyplot()
    from matplotlib import font_manager as fm
    from matplotlib.ft2font import FT2Font

    installed = {f.name for f in fm.fontManager.ttflist}
    if not installed.issuperset(FONT_CANDIDATES):
        # matplotlib caches its font list once; fonts installed later are found by file name and added.
        for path in fm.findSystemFonts():
            name = Path(path).name.lower()
            if any(k in name for k in FONT_FILES) and "color" not in name:
                try:
                    fm.fontManager.addfont(path)
                except (RuntimeError, OSError, ValueError):
                    continue
        installed = {f.name for f in fm.fontManager.ttflist}
    out = []
    for name in FONT_CANDIDATES:
        if name not in installed:
            continue
        try:
            path = fm.findfont(fm.FontProperties(family=name), fallback_to_default=False)
            out.append((name, frozenset(FT2Font(path).get_charmap())))
        except (ValueError, RuntimeError, OSError):
            continue
    return tuple(out)


def drawable(text: str) -> bool:
    """Whether every code point of `text` has a glyph in some installed candidate font."""
    covered = fonts()
    return all(any(ord(ch) in cps for _, cps in covered) for ch in text)


def _columns(text: str) -> int:
    return 2 if any(unicodedata.east_asian_width(ch) in ("W", "F") for ch in text) else 1


def map_figure(bmap: BoundaryMap, width: int = 100, max_chars: int = 4000, dpi: int = 110):
    """(figure, notices) of the map: wrapped at `width` columns and at newlines; at most `max_chars`
    characters are drawn. Notices (one line each) say what could not be drawn as asked."""
    plt = pyplot()
    from matplotlib.collections import LineCollection, PatchCollection
    from matplotlib.colors import ListedColormap, Normalize
    from matplotlib.patches import Rectangle

    notices = []
    cells = bmap.cells()
    if len(cells) > max_chars:
        notices.append(f"the image shows the first {max_chars} of {len(cells)} characters")
        cells = cells[:max_chars]
    missing = sorted({c.text for c in cells if not drawable(c.text)})
    if missing:
        notices.append(f"no installed font can draw {len(missing)} character(s) ({''.join(missing[:8])}"
                       f"{'...' if len(missing) > 8 else ''}); drawn as {MISSING}; {FONT_HINT}")
    # Lay cells out on a grid: x in columns, y in rows (row 0 at the top).
    place, x, y = [], 0, 0
    for c in cells:
        w = _columns(c.text)
        if x + w > width:
            x, y = 0, y + 1
        place.append((x, y, w))
        x += w
        if c.newline:
            x, y = 0, y + 1
    rows = max(1, (place[-1][1] + 1) if place else 1)
    cols = max(20, min(width, max((px + w for px, _, w in place), default=1)))
    cw, rh = 0.105, 0.24  # inches per column / row at 11 pt
    fw, fh = cols * cw + 0.4, rows * rh + 1.0  # figure size in inches

    def box(left: float, bottom: float, w: float, h: float) -> tuple[float, float, float, float]:
        return left / fw, bottom / fh, w / fw, h / fh  # inches -> figure fractions

    fig = plt.figure(figsize=(fw, fh), dpi=dpi)
    ax = fig.add_axes(box(0.2, 0.75, cols * cw, rows * rh))
    ax.set_xlim(0, cols)
    ax.set_ylim(rows, 0)
    ax.axis("off")
    rects = [Rectangle((px, py), w, 1) for px, py, w in place]
    colours = [tuple(v / 255 for v in rgb(c.p)) for c in cells]
    ax.add_collection(PatchCollection(rects, facecolors=colours, edgecolors="none"))
    bars = [[(px + 0.05, py + 0.02), (px + 0.05, py + 0.98)] for (px, py, _), c in zip(place, cells) if c.boundary]
    if bars:
        ax.add_collection(LineCollection(bars, colors=BOUNDARY_RED, linewidths=1.6))
    family = [name for name, _ in fonts()] or ["monospace"]
    for (px, py, w), c in zip(place, cells):
        text = c.text if drawable(c.text) else MISSING
        if text.strip():
            ax.text(px + w / 2, py + 0.55, text, ha="center", va="center", fontsize=11, family=family,
                    color="white" if dark(c.p) else "black")
    # Colour bar of the ramp the cells use, and the caption.
    cax = fig.add_axes(box(0.2, 0.22, min(3.0, cols * cw), 0.12))
    ramp = ListedColormap([tuple(v / 255 for v in rgb(p)) for p in np.linspace(0, 1, 256)])
    fig.colorbar(plt.cm.ScalarMappable(norm=Normalize(0, 1), cmap=ramp), cax=cax, orientation="horizontal")
    cax.tick_params(labelsize=7)
    cax.set_title("boundary probability p (red bar: drawn boundary)", fontsize=7, loc="left")
    fig.suptitle(bmap.label, fontsize=8, x=0.2 / fw, y=1 - 0.08 / fh, ha="left", va="top", family=family)
    return fig, notices


IMAGE_FORMATS = ("png", "pdf", "svg")
"""File types a boundary map can be written as, chosen by the file name's suffix."""


def save_map_png(bmap: BoundaryMap, path, width: int = 100, max_chars: int = 4000) -> list[str]:
    """Write the map as an image whose type follows the suffix (.png, .pdf or .svg; anything else is a
    ValueError, not a PNG under another name), cropped to what was drawn so a short text's title and colour bar
    are not cut off; returns the notices (see map_figure)."""
    fmt = Path(path).suffix.lower().lstrip(".")
    if fmt not in IMAGE_FORMATS:
        raise ValueError(f"{path}: a boundary map is written as .png, .pdf or .svg (by the file name's suffix)")
    fig, notices = map_figure(bmap, width=width, max_chars=max_chars)
    save(fig, path, dpi=None, format=fmt, bbox_inches="tight", pad_inches=0.08)
    return notices


def map_image(bmap: BoundaryMap, width: int = 100, max_chars: int = 2000) -> np.ndarray:
    """The map rendered to an (H,W,3) uint8 array (e.g. for TensorBoard's add_image)."""
    plt = pyplot()
    fig, _ = map_figure(bmap, width=width, max_chars=max_chars)
    try:
        fig.canvas.draw()
        return np.asarray(fig.canvas.buffer_rgba())[..., :3].copy()  # (H,W,3)
    finally:
        plt.close(fig)


def figure_png(fig, dpi: int = 100) -> bytes:
    """PNG bytes of a figure (closed afterwards), for embedding as a data: URI."""
    return save(fig, io.BytesIO(), dpi=dpi, format="png").getvalue()
