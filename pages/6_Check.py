"""Check: the study questions and five misconceptions, each predicted first and then revealed."""
import streamlit as st

from kvviz.app.language import tr
from kvviz.app.lecture import ideas
from kvviz.app.navigation import link_to, page_of
from kvviz.app.room.questions import answer_question, ask_room
from kvviz.app.room.session import follower_room
from kvviz.app.room.share import share_box, sharing
from kvviz.app.shell import page_setup
from kvviz.app.views.check import labels_of
from kvviz.app.widgets import number_in_range
from kvviz.lessons import quiz

PAGE = page_of(__file__)
settings = page_setup("check.title")
# On a projector "Share with the room" and the count of answers revealed sit in the title's row: rows of their own
# pushed a question past 720 px.
title_at, share_at, progress_at = (st.columns([1, 1, 1], vertical_alignment="center") if settings.lecture
                                   else (st, None, None))
title_at.title(tr("check.title"))
if not settings.lecture:  # on the projector the presenter says it: the question gets the screen
    st.write(tr("check.intro"))
values = quiz.explain_values()


def explain(q: quiz.Question) -> None:
    st.markdown(tr(f"check.{q.id}_explain", **values))
    link_to(q.page)


if follower_room():  # a follower of a lecture: the question the lecturer opened, answered on this device
    answer_question(lambda i: labels_of(quiz.question(i)), lambda i: quiz.question(i).answer,
                    lambda i: tr(f"check.{i}_q", **values), lambda i: explain(quiz.question(i)), PAGE)
    st.stop()
if settings.lecture:
    # The button in the title's row; an open room's link and QR code full width, large enough to scan.
    with share_at if sharing(PAGE) is None else st.container():
        share_box()
room = sharing(PAGE) if settings.lecture else None
if room is not None:
    room.publish({})  # the page itself is the view: followers answer here, those on another page get a link


def reset(q: quiz.Question) -> None:
    st.session_state[f"kv_revealed_{q.id}"] = False
    # Assigned, not popped: only an assigned value is sent to the browser, which otherwise keeps showing the old
    # answer while the server has none (Reveal then stays locked until a different answer is picked).
    st.session_state[f"predict_{q.id}"] = None
    st.session_state.pop(f"_valid_predict_{q.id}", None)  # and the last valid estimate with it


def ask(n: int, q: quiz.Question) -> None:
    revealed = st.session_state.get(f"kv_revealed_{q.id}", False)
    with st.container(border=True):
        st.subheader(f"{n}. {tr(f'check.{q.id}_q', **values)}")
        if q.kind is quiz.Kind.NUMBER:
            prediction = number_in_range(st, tr("check.estimate_gib"), 0.0, quiz.MAX_ESTIMATE_GIB, None,
                                         f"predict_{q.id}", whole=False, step=1.0, format="%.2f",
                                         disabled=revealed, placeholder=tr("check.type_number"))
        else:
            labels = labels_of(q)
            if room is not None:  # the room answers on its devices; the projector shows the tally
                ask_room(room, q.id, q.options, labels, q.answer, lambda: explain(q))
            prediction = st.radio(tr("check.your_prediction"), q.options, index=None, key=f"predict_{q.id}",
                                  format_func=labels.get, disabled=revealed)
        b1, b2 = st.columns([1, 4])
        if b1.button(tr("check.reveal"), key=f"reveal_{q.id}", disabled=prediction is None or revealed, type="primary"):
            st.session_state[f"kv_revealed_{q.id}"] = revealed = True
            st.rerun()  # redraw the prediction as locked
        if prediction is None and not revealed:
            b2.caption(tr("check.predict_first"))
        if not revealed:
            return
        b2.button(tr("check.try_again"), key=f"again_{q.id}", on_click=reset, args=(q,))
        if q.kind is quiz.Kind.NUMBER:
            verdict = quiz.check_number(prediction)
            message = tr(f"check.number_{verdict.value}", value=f"{prediction:g}", **values)
            (st.success if verdict is quiz.Verdict.CORRECT else st.error)(message)
        elif quiz.check_choice(q, prediction):
            st.success(tr("check.correct"))
        else:
            st.error(tr("check.incorrect", answer=labels[q.answer]))
        explain(q)


revealed = [q for q in quiz.QUESTIONS if st.session_state.get(f"kv_revealed_{q.id}")]
progress = tr("check.progress", revealed=len(revealed), total=len(quiz.QUESTIONS))
if not settings.lecture:
    st.caption(progress)
titles = [tr(f"check.{q.id}_short") for q in quiz.QUESTIONS]
show = ideas(titles, "check")
n_questions = sum(q.kind is not quiz.Kind.TRUTH for q in quiz.QUESTIONS)
for i, q in enumerate(quiz.QUESTIONS):
    if i not in show:
        continue
    if i == 0 and len(show) > 1:
        st.header(tr("check.questions"))
    if i == n_questions and len(show) > 1:
        st.header(tr("check.misconceptions"))
        st.write(tr("check.misconceptions_intro"))
    ask(i + 1, q)
if settings.lecture:
    progress_at.caption(progress)
