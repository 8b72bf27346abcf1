"""Text that fits in a matplotlib figure: titles wrapped to the figure's width, labels shortened to
a width in pixels, both measured with the figure's own renderer (a guess by characters clips wide
letters and wastes room on narrow ones)."""
from __future__ import annotations

import re
import textwrap

ELLIPSIS = "…"


def text_width(figure, text: str, fontsize: float, weight: str = "normal") -> float:
    """`text`'s width in pixels at `fontsize` points on `figure`'s canvas."""
    from matplotlib.font_manager import FontProperties
    renderer = figure.canvas.get_renderer()
    width, _, _ = renderer.get_text_width_height_descent(text, FontProperties(size=fontsize, weight=weight),
                                                          ismath=False)
    return width


def shorten(figure, text: str, width_px: float, fontsize: float, min_chars: int = 3,
            weight: str = "normal") -> str | None:
    """`text` as it is when it fits in `width_px`, else its longest head ending in an ellipsis
    that does; None when fewer than `min_chars` characters would be left."""
    if text_width(figure, text, fontsize, weight) <= width_px:
        return text
    low, high = 0, len(text) - 1  # the most characters kept: low fits (0 always does), high+1 doesn't
    while low < high:
        middle = (low + high + 1) // 2
        if text_width(figure, text[:middle].rstrip() + ELLIPSIS, fontsize, weight) <= width_px:
            low = middle
        else:
            high = middle - 1
    return text[:low].rstrip() + ELLIPSIS if low >= min_chars else None


def fit_title(figure, set_title, text: str, fontsize: float = 10, max_lines: int = 3,
              share: float = 0.95) -> None:
    """Calls `set_title(wrapped, fontsize=...)` (an Axes' set_title or a Figure's suptitle) with
    `text` wrapped so that its widest line is at most `share` of the figure's width."""
    width_px = share * figure.bbox.width
    chars = max(len(text), 1)
    while chars > 10:
        lines = textwrap.wrap(text, width=chars, max_lines=max_lines, placeholder=" " + ELLIPSIS,
                              break_long_words=True)
        if not lines or max(text_width(figure, line, fontsize) for line in lines) <= width_px:
            break
        chars = max(int(chars * 0.9), 10)
    set_title("\n".join(textwrap.wrap(text, width=chars, max_lines=max_lines, placeholder=" " + ELLIPSIS,
                                      break_long_words=True)), fontsize=fontsize)


def component_name(name: str, chars: int = 52) -> str:
    """A census component's name for a legend: a source file by its own name, not its folders
    (`allocated at examples/pruning/hessian.py:48 f` -> `allocated at hessian.py:48 f`), cut at `chars`."""
    name = re.sub(r"(?:[\w.-]*/)+(?=[\w.-]+\.py:)", "", name)
    return name if len(name) <= chars else name[:chars - 1] + ELLIPSIS
