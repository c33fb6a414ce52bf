"""What the link sweeps (``domino_sweep.py``, ``tp_overlap_sweep.py``) share: their two-panel
figure against the communication fraction (the share hidden on the left, the step relative to
the no-communication optimum on the right), and the files they write.
"""
from __future__ import annotations

import json
from pathlib import Path


def two_panels(ratio_title: str):
    """The empty figure: "Share of communication hidden" beside ``ratio_title``."""
    from plotly.subplots import make_subplots
    return make_subplots(rows=1, cols=2, subplot_titles=(
        "Share of communication hidden (from the traces)", ratio_title))


def label(fig, x_title: str, title: str, height: int, width: int):
    """The axes of ``two_panels`` and the figure's title and size."""
    fig.update_xaxes(title_text=x_title)
    fig.update_yaxes(title_text="% hidden", row=1, col=1)
    fig.update_yaxes(title_text="x no-comm optimum", row=1, col=2)
    fig.update_layout(title=title, height=height, width=width)
    return fig


def write(out, fig, data, png: bool = False) -> None:
    """``out`` (a standalone HTML figure), the raw numbers ``data`` as JSON beside it, and with
    ``png`` a PNG too where kaleido is installed."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.write_html(str(out), include_plotlyjs=True)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2))
    if png:
        try:
            fig.write_image(str(out.with_suffix(".png")))
        except Exception as exc:        # noqa: BLE001 - kaleido is optional: the HTML is the figure
            print(f"(no PNG: {type(exc).__name__}; the HTML is the figure)")
    print(f"figure written to {out}")
