"""The lecture room in the app, in parts named for their jobs (the only streamlit part of kvviz.room):

- session.py: this session's place in a room (ROOM's keys, the process's store, the room a `?room=` link follows);
- view.py: RoomView, the record a lecturer's page publishes and a follower's page draws;
- share.py: the lecturer's side: "Share with the room" (link, QR code), an open room's Sharing (publish), the beat;
- follow.py: the follower's page drawn from the room, read-only, and room_part (a followed page's room, under its
  title: the follower's page, or the lecturer's Sharing);
- explore.py: a follower's "Explore from here" (the lecturer's settings and step taken into this session) and
  "Follow again";
- questions.py: a live question: the lecturer's tally and reveal, a follower's answer.
"""
