"""Link: the trainer's side of the daemon — where a daemon is, the wire format of a session, and
the client that speaks it as an executor, and what that client tells the daemon of its trainer's
waits (`need_report`).

May import foundations and the `slots` and `jobs` rooms (the executor contract it implements);
the daemon's own package (`fastload._daemon`) imports this room, never the other way.
"""
