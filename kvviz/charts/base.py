"""Layout every kvviz figure shares: a stable uirevision (zoom survives live updates) and lecture sizing."""
from __future__ import annotations

import plotly.graph_objects as go


def style(fig: go.Figure, *, title: str | None = None, lecture: bool = False, height: int = 360) -> go.Figure:
    """Apply the shared look. `lecture` enlarges type and plot for projection."""
    fig.update_layout(
        title=title,
        uirevision="kvviz",  # keeps the user's zoom/pan when the data changes
        height=int(height * (1.4 if lecture else 1.0)),
        font=dict(size=20 if lecture else 13),
        # Room above the title for Plotly's toolbar, which pages keep always visible (PNG export).
        margin=dict(l=50, r=20, t=(90 if lecture else 75) if title else 30, b=40),
        template="plotly_white",
    )
    return fig
