"""The app's own translated navigation (Streamlit's automatic one shows English file names):

- `NAV`: every page, as (file, title key), in the order the sidebar lists them; a page whose file does not exist
  yet (still being built) is skipped, so adding one is its file and its locale strings;
- `nav_links()`: the sidebar's links; `link_to()`: a link from one page to another.
"""
from __future__ import annotations

from pathlib import Path

import streamlit as st

from kvviz.app.language import tr

ROOT = Path(__file__).resolve().parents[2]  # the app's folder: app.py and pages/

NAV = (
    ("app.py", "nav.home"),
    ("pages/1_Reusing_Past_KV.py", "nav.reuse"),
    ("pages/2_Prefill_and_Decode.py", "nav.prefill_decode"),
    ("pages/3_Memory_Footprint.py", "nav.memory"),
    ("pages/4_Latency_and_Capacity.py", "nav.latency"),
    ("pages/5_Training_Prefill_Decode.py", "nav.training"),
    ("pages/6_Check.py", "nav.check"),
    ("pages/7_Serving_Engine.py", "nav.serving"),
    ("pages/8_Compressing_the_Cache.py", "nav.compress"),
    ("pages/9_Paged_Blocks.py", "nav.paged"),
)


def nav_links() -> None:
    """The sidebar's link to every page that exists, in the session's language."""
    for path, key in NAV:
        if (ROOT / path).exists():
            st.page_link(path, label=tr(key))


def link_to(path: str) -> None:
    """A translated link to another page of the app, if that page exists."""
    labels = dict(NAV)
    if path in labels and (ROOT / path).exists():
        st.page_link(path, label=tr(labels[path]), icon=":material/arrow_forward:")
