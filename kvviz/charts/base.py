"""Layout every kvviz figure shares: a stable uirevision (zoom survives live updates) and lecture sizing."""
from __future__ import annotations

from functools import cache

import plotly.graph_objects as go
import plotly.io as pio


@cache
def _template() -> go.layout.Template:
    # plotly_white's layout only, validated once: assigning the full template costs ~0.1 s per figure,
    # which a page redrawing six charts per decode step cannot afford.
    return go.layout.Template(layout=pio.templates["plotly_white"].layout)


def style(fig: go.Figure, *, title: str | None = None, lecture: bool = False, height: int = 360) -> go.Figure:
    """Apply the shared look. `lecture` enlarges type and plot for projection."""
    size = 20 if lecture else 13
    fig.update_layout(
        # The title sits below Plotly's toolbar (pages keep it visible for PNG export), above any legend.
        title=dict(text=title, y=1, yref="container", yanchor="top", pad=dict(t=34), font=dict(size=size + 3))
        if title else None,
        uirevision="kvviz",  # keeps the user's zoom/pan when the data changes
        height=int(height * (1.4 if lecture else 1.0)),
        font=dict(size=size),
        margin=dict(l=50, r=20, t=(115 if lecture else 90) if title else 30, b=40),
        template=_template(),
    )
    return fig
