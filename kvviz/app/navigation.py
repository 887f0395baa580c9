"""The app's own translated navigation (Streamlit's automatic one shows English file names), grouped into the
sections a lecture follows:

- `Page` and `Section`: a page's record, held once: its file, its one short name and whether a lecture room follows
  it. The name is the page's everywhere: its locale section `<name>.toml` (its title `<name>.title`, also its name
  in the sidebar, and its line on Home's map `<name>.summary`), its session keys `<name>_...`, its view module
  `views/<name>.py`, and the name its room view is published and followed under. A section's name
  (`nav.section_<name>`) and pages, in order;
- `HOME`, `SECTIONS` and `PAGES` (Home, then every section's pages): the one registry of pages. A page whose file
  does not exist yet (still being built) is skipped everywhere, so adding one is its file and its locale strings;
  `FOLLOWED`: the pages a lecture room follows, derived from it; `page_of()`: a page file's own record (a page never
  types its name), `page_named()`: a page by its name, `page_at()`: by its file;
- `nav_links()`: the sidebar's links by section; `page_map()`: the same sections and pages on Home, each page with
  its line; `link_to()`: a link from one page to another.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import streamlit as st

from kvviz.app.language import tr

ROOT = Path(__file__).resolve().parents[2]  # the app's folder: app.py and pages/


@dataclass(frozen=True)
class Page:
    path: str  # from the app's folder
    name: str  # the one short name: locale section, session prefix, view module, tests, room name
    followed: bool = True  # a lecture room follows it: it publishes what it draws, a follower draws it read-only
    label: str = "title"  # the key of its section that names it in the sidebar (Home's title is the whole app's)

    @property
    def title_key(self) -> str:
        return f"{self.name}.{self.label}"

    @property
    def summary_key(self) -> str:
        return f"{self.name}.summary"

    @property
    def built(self) -> bool:
        return (ROOT / self.path).exists()


@dataclass(frozen=True)
class Section:
    name: str
    pages: tuple[Page, ...]

    @property
    def title_key(self) -> str:
        return f"nav.section_{self.name}"

    def built(self) -> list[Page]:
        return [p for p in self.pages if p.built]


# Home has no room view (followers are told where the lecturer is); its title is the app's, its sidebar name `nav`
HOME = Page("app.py", "home", followed=False, label="nav")
# The order a lecture goes: how the cache works, what it does to time, to memory, then engines serving many users.
SECTIONS = (
    Section("mechanism", (Page("pages/1_Reusing_Past_KV.py", "reuse"),
                          Page("pages/5_Training_Prefill_Decode.py", "training"),
                          Page("pages/12_Attention_Patterns.py", "heads"))),
    Section("time", (Page("pages/2_Prefill_and_Decode.py", "prefill"),
                     Page("pages/4_Latency_and_Capacity.py", "latency"))),
    Section("memory", (Page("pages/3_Memory_Footprint.py", "memory"), Page("pages/9_Paged_Blocks.py", "paged"),
                       Page("pages/8_Compressing_the_Cache.py", "compression"))),
    Section("serving", (Page("pages/7_Serving_Engine.py", "serving"),
                        Page("pages/10_Speculative_Decoding.py", "spec"),
                        Page("pages/11_Moving_the_Cache.py", "moving"))),
    Section("check", (Page("pages/6_Check.py", "check"),)),
)
PAGES = (HOME, *(page for section in SECTIONS for page in section.pages))
FOLLOWED = tuple(page for page in PAGES if page.followed)


def page_named(name: str) -> Page:
    """The registered page called `name`; KeyError for a name no page has."""
    for page in PAGES:
        if page.name == name:
            return page
    raise KeyError(f"no page is named {name!r} (pages: {[p.name for p in PAGES]})")


def page_at(path: str) -> Page | None:
    """The registered page whose file is `path` (from the app's folder), or None."""
    return next((p for p in PAGES if p.path == path), None)


def page_of(file: str) -> Page:
    """A page file's own record, from its `__file__`: the page's name is never typed in the page."""
    path = Path(file).resolve().relative_to(ROOT).as_posix()
    page = page_at(path)
    if page is None:
        raise KeyError(f"{path} is not registered in kvviz/app/navigation.py")
    return page


def nav_links() -> None:
    """The sidebar's links: Home, then each section's title and its built pages, in the session's language."""
    st.page_link(HOME.path, label=tr(HOME.title_key))
    for section in SECTIONS:
        if pages := section.built():
            st.caption(tr(section.title_key))
            for page in pages:
                st.page_link(page.path, label=tr(page.title_key))


def page_map(*, compact: bool = False) -> None:
    """Home's map of the app: the sidebar's sections and pages, each page with its line. `compact` (lecture mode):
    the sections side by side, each page's line in its link's tooltip, so the whole map fits one screen."""
    sections = [(s, pages) for s in SECTIONS if (pages := s.built())]
    columns = st.columns(len(sections)) if compact else [st.container() for _ in sections]
    for column, (section, pages) in zip(columns, sections, strict=True):
        with column:
            st.markdown(f"**{tr(section.title_key)}**")
            for page in pages:
                st.page_link(page.path, label=tr(page.title_key), help=tr(page.summary_key) if compact else None)
                if not compact:
                    st.caption(tr(page.summary_key))


def link_to(path: str) -> None:
    """A translated link to another page of the app, if that page exists."""
    page = page_at(path)
    if page is not None and page.built:
        st.page_link(path, label=tr(page.title_key), icon=":material/arrow_forward:")
