"""What the page tests share: a page opened headless (AppTest) in a language, and a Plotly chart found by title."""
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
