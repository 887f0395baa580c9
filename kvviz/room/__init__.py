"""Lecture rooms: what a lecturer's run publishes and the room's live answers, in-process or in Redis (store.py).
No streamlit, no torch: the app's room (kvviz/app/room/) draws them."""
