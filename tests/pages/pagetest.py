"""What the page tests share: a page opened headless (AppTest) in a language, a Plotly chart found by title, and the
HTML a page drew."""
import json
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "app.py")


def open_page(page: str, lang: str = "en", **query: str) -> AppTest:
    """The page run once through the app (its sidebar and navigation included), with no exception."""
    at = AppTest.from_file(APP, default_timeout=300)
    at.query_params["lang"] = lang
    for key, value in query.items():
        at.query_params[key] = value
    at.switch_page(page).run()
    assert not at.exception
    return at


def chart(at: AppTest, title: str) -> dict:
    """A chart's figure JSON, by its title."""
    return next(s for s in (json.loads(c.proto.spec) for c in at.get("plotly_chart"))
                if s["layout"]["title"]["text"] == title)


def html_bodies(at: AppTest) -> list[str]:
    """The HTML a page drew: st.html's, then kvviz's own (kvviz.app.widgets.own_html: the token strip, the grids)."""
    return [h.proto.body for h in at.get("html")] + [
        json.loads(c.proto.json)[0] for c in at.get("bidi_component") if c.proto.component_name == "kvviz_own_html"]


def grid_html(at: AppTest) -> list[str]:
    """The cache grids a page drew (kvviz.charts.decode.cache_grid_html), in order."""
    return [body for body in html_bodies(at) if 'class="kv-grid"' in body]
