"""A live question in a room: ask_room (the lecturer's "Ask the room", the tally as it comes in, the reveal) and
answer_question (a follower's Check page: the question the lecturer opened, answered in the follower's language;
after the reveal, the room's counts, the answer and its explanation)."""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import streamlit as st

from kvviz.app.language import show_error, tr
from kvviz.app.navigation import Page
from kvviz.app.room.follow import elsewhere, read_view, unreachable
from kvviz.app.room.session import follower_id, follower_room, guarded, room_store
from kvviz.app.room.share import Sharing
from kvviz.errors import InputError

REDRAW_S = 1.0  # a live question (the projector's tally, a follower's answer box) is re-read and redrawn once a second


def _counts(counts: Mapping[str, int], labels: Mapping[str, str], answer: str | None, shown: bool = True) -> None:
    """The tally: how many answered and, when `shown` (the lecturer's choice, or revealed), the counts per option."""
    total = sum(counts.values())
    st.caption(tr("room.answers", n=total))
    if not shown:
        st.caption(tr("room.tally_hidden"))
        return
    for option, n in counts.items():
        mark = " ✓" if option == answer else ""
        st.progress(n / total if total else 0.0, text=f"{labels[option]}{mark} — {n}")


def ask_room(room: Sharing, question: str, options: Sequence[str], labels: Mapping[str, str], answer: str,
             explain: Callable[[], None]) -> None:
    """The lecturer's side of a live question in the open `room`: open it to the room, watch the tally, reveal the
    answer."""
    room_id, secret = room.room_id, room.secret
    tally = guarded(lambda: room_store().tally(room_id))
    if tally is None or tally.question != question:
        show = st.checkbox(tr("room.show_tally"), key=f"room_show_tally_{question}", help=tr("room.show_tally_help"))
        if st.button(tr("room.open_question"), key=f"room_ask_{question}", help=tr("room.open_question_help"),
                     icon=":material/campaign:"):
            guarded(lambda: room_store().open_question(room_id, secret, question, options, answer, show))
            st.rerun()
        return

    @st.fragment(run_every=REDRAW_S)
    def live() -> None:
        tally = guarded(lambda: room_store().tally(room_id))
        if tally is None or tally.question != question:
            return
        st.caption(tr("room.asked"))
        _counts(tally.counts, labels, answer if tally.revealed else None, tally.revealed or tally.show_tally)
        if not tally.revealed:
            st.button(tr("room.reveal_room"), key=f"room_reveal_{question}", type="primary",
                      on_click=lambda: guarded(lambda: room_store().reveal(room_id, secret), callback=True))
        else:
            st.success(tr("room.correct_was", answer=labels[answer]))
            explain()

    live()


def answer_question(labels: Callable[[str], Mapping[str, str]], answers: Callable[[str], str],
                    question_text: Callable[[str], str], explain: Callable[[str], None], own: Page) -> None:
    """A follower's Check page: the question the lecturer opened, answered here, in this session's language;
    after the reveal, the room's counts, the answer and the explanation."""
    room_id = follower_room()
    st.caption(tr("room.following"))

    @st.fragment(run_every=REDRAW_S)
    def live() -> None:
        try:
            room_store().hold_seat(room_id, follower_id())
            tally, (_, snapshot) = room_store().tally(room_id), room_store().read(room_id)
        except InputError as e:
            unreachable(e, own)
            return
        if elsewhere(read_view(snapshot), own):
            return
        if tally is None:
            st.info(tr("room.waiting"))
            return
        names = labels(tally.question)
        st.subheader(question_text(tally.question))
        key = f"room_answer_{tally.question}"

        def send() -> None:
            try:
                room_store().answer(room_id, tally.question, follower_id(), st.session_state[key])
            except InputError as e:
                show_error(e)

        st.radio(tr("room.your_answer"), list(tally.counts), index=None, key=key, format_func=names.get,
                 on_change=send, disabled=tally.revealed)
        st.caption(tr("room.anonymous"))
        if not tally.revealed:  # the counts as they come in if the lecturer chose so, else only at the reveal
            _counts(tally.counts, names, None, tally.show_tally)
        if tally.revealed:
            _counts(tally.counts, names, answers(tally.question))
            st.success(tr("room.correct_was", answer=names[answers(tally.question)]))
            explain(tally.question)
        elif st.session_state.get(key) is not None:
            st.caption(tr("room.answer_saved"))

    live()
