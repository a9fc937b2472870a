"""A daemon's admission: from a trainer's `hello` to its session, within the memory budget.

`Admission` checks a hello (the daemon's limits, `sessions.check_hello`, the roots), has its
source indexed off the loop and keeps it waiting meanwhile (`pending`, told `indexing` every
second), then opens the session: its ring is sized (NOTE [the session's ring]) and counted against
the budget, idle indexes evicted for it if that is what it takes, its job handed to the workers,
and the trainer welcomed. It owns the waiting hellos and the budget's arithmetic (`used_bytes`,
`new_slot` for a trainer's `grow`); the daemon's loop owns the sessions it registers them in.
"""

from __future__ import annotations

import itertools
import logging
import os
import time
from collections.abc import Callable
from typing import Any, Protocol

from fastload._daemon.config import DaemonConfig
from fastload._daemon.indexes import DatasetIndexes, IndexEntry
from fastload._daemon.logs import event as log_event
from fastload._daemon.peers import Peer
from fastload._daemon.sessions import PendingHello, Session, check_hello
from fastload._errors import DaemonError, FastloadError
from fastload._labels import label
from fastload._loading.jobs.image_job import ImageJob
from fastload._loading.order.read_ahead import task_read_ahead
from fastload._loading.order.sampling import RepeatCopies
from fastload._loading.running.engine import Engine
from fastload._loading.slots.ring_plan import plan_ring
from fastload._shm import Segment
from fastload._sizes import format_size
from fastload.transforms import TransformPlan

log = logging.getLogger("fastload.daemon")

MAX_SLOTS_PER_SESSION = 256
_PROGRESS_EVERY_S = 1.0  # an `indexing` note to each hello waiting for its folder's index

Reply = Callable[..., None]  # (sock, identity, op, *frames, **fields): a reply to one client


class Refused(Protocol):
    """The daemon's count and log line of a refused request."""

    def __call__(self, message: str, local: bool, peer: str | None, request: str) -> None: ...


class Admission:
    """Hellos waiting for their index, and the opening of sessions within the budget."""

    def __init__(
        self,
        config: DaemonConfig,
        engine: Engine,
        indexes: DatasetIndexes,
        sessions: dict[int, Session],
        by_identity: dict[tuple[int, bytes], Session],
        totals: dict[str, int],
        reply: Reply,
        refused: Refused,
        draining: Callable[[], bool],
    ) -> None:
        """`sessions` and `by_identity` are the daemon's, which an opened session joins; `totals`
        the daemon's counts, of which this counts `sessions`; `draining` whether it is stopping."""
        self.config = config
        self._engine = engine
        self._indexes = indexes
        self._sessions = sessions
        self._by_identity = by_identity
        self._totals = totals
        self._reply = reply
        self._refused = refused
        self._draining = draining
        self._ids = itertools.count(1)
        self.pending: dict[tuple[int, bytes], PendingHello] = {}  # (socket id, identity) -> hello

    def hello(self, sock: Any, identity: bytes, local: bool, f: dict[str, Any], peer: Peer) -> None:
        """Admit a validated `hello`: its session opens now if its source's index is made, else
        the index is requested and the hello waits for it (`resume`); DaemonError if refused."""
        if self._draining():
            raise DaemonError("the daemon is shutting down and accepts no new sessions")
        if len(self._sessions) + len(self.pending) >= self.config.max_sessions:
            raise DaemonError(f"the daemon already serves {self.config.max_sessions} sessions")
        held = sum(s.peer == peer.name for s in self._sessions.values()) + sum(
            p.peer.name == peer.name for p in self.pending.values()
        )
        if held >= self.config.max_sessions_per_peer:
            raise DaemonError(
                f"{peer.name} already holds {held} sessions, the most one trainer may hold "
                f"(max_sessions_per_peer): close loaders you no longer use"
            )
        plan, source = check_hello(f, self.config.memory_budget_bytes)
        confined = self.confined(local)
        if not local and not confined:  # check_roots forbids it; never serve TCP unconfined
            raise DaemonError("this daemon has no dataset roots: it serves no source over TCP")
        key = self._indexes.key(source, confined)  # NOTE [no resolution before the roots]
        # NOTE [two policies]: with roots and ipc_any_path, an index opened unchecked for a local
        # session is keyed apart, so that a TCP session of the same source opens (and checks) its own.
        if self.config.roots is not None and not confined:
            key = f"any path: {key}"
        entry = self._indexes.get(key)
        if entry is not None:
            self._open_session(sock, identity, local, f, plan, peer, entry)
            return
        # NOTE [indexing off the loop]: a folder is scanned on a background thread; the hello
        # waits (told `indexing` every second) while the daemon goes on serving everyone else.
        # What it may take: the budget less what is in use, idle indexes counted free (they are
        # evicted, longest idle first, once it is made and only if its memory is wanted).
        left = self.config.memory_budget_bytes - self.used_bytes() + self._indexes.idle_memory
        self._indexes.request(key, source, max(0, left), confined=confined)
        self.pending[(id(sock), identity)] = PendingHello(sock, identity, local, f, plan, peer, key)

    def resume(self) -> None:
        """Answer the hellos whose index is now ready (or failed); tell the others to wait on."""
        for key, outcome in self._indexes.finished():
            for where, hello in list(self.pending.items()):
                if hello.key != key:
                    continue
                del self.pending[where]
                try:
                    if isinstance(outcome, Exception):
                        raise outcome
                    self._open_session(
                        hello.sock, hello.identity, hello.local, hello.fields, hello.plan, hello.peer, outcome
                    )
                except FastloadError as e:
                    # NOTE [refusals carry no content]: a TCP peer gets the open's public text.
                    message = str(e) if hello.local else getattr(e, "public", str(e))
                    self._refused(message, hello.local, peer=hello.peer.name, request="hello")
                    self._reply(hello.sock, hello.identity, "error", message=message)
                except Exception as e:
                    log.exception("error while opening a session")
                    self._reply(hello.sock, hello.identity, "error", message=internal_error(e, hello.local))
        # An index just made may have taken the memory of idle ones: back within the budget.
        self._indexes.evict_for(self.used_bytes() - self.config.memory_budget_bytes)
        now = time.monotonic()
        for hello in self.pending.values():
            if now - hello.progress_at >= _PROGRESS_EVERY_S:
                hello.progress_at = now
                seconds = self._indexes.scanning(hello.key) or 0.0
                # The dataset as the client named it: never where its links lead (a peer naming
                # /proc/1/cwd would learn that process's directory).
                path = hello.fields["dataset"]
                self._reply(hello.sock, hello.identity, "indexing", path=path, seconds=round(seconds, 1))

    def _open_session(
        self,
        sock: Any,
        identity: bytes,
        local: bool,
        f: dict[str, Any],
        plan: TransformPlan,
        peer: Peer,
        entry: IndexEntry,
    ) -> None:
        if self._draining():
            raise DaemonError("the daemon is shutting down and accepts no new sessions")
        session_id = next(self._ids)
        batch_size = f["batch_size"]
        on_error = f.get("on_error", "raise")  # NOTE [bad samples]
        job = ImageJob(entry.index, plan, f["backend"], f["seed"], batch_size, on_error=on_error)
        if "repeats" in f:  # NOTE [augmentation of repeats]
            job.copies = RepeatCopies(f["repeats"], f["rank"], f["world_size"], batch_size, len(entry.index))
        assert job.layout is not None
        # The session's ring, from the one ring plan (`slots/ring_plan.py`): a trainer that did not
        # choose gets what a local loader of this daemon's pool would.
        ring = plan_ring(job.layout.slot_bytes, self.config.workers, f["prefetch"])
        slots, need = ring.slots, ring.total_bytes
        over = self.used_bytes() + need - self.config.memory_budget_bytes
        if 0 < over <= self._indexes.evictable(keep=entry.path):  # a session refused anyway evicts nothing
            self._indexes.evict_for(over, keep=entry.path)
        used = self.used_bytes()
        if used + need > self.config.memory_budget_bytes:
            raise DaemonError(
                f"this session's ring needs {format_size(need)} but only "
                f"{format_size(self.config.memory_budget_bytes - used)} of the daemon's "
                f"{format_size(self.config.memory_budget_bytes)} budget is left: lower batch_size or "
                "prefetch, or start the daemon with a larger --memory-budget"
            )
        ring.check()
        # The kernel's word for who the trainer is; the hello's own claim only where there is none.
        pid = peer.pid if peer.pid is not None else f["pid"]
        session = Session(
            id=session_id,
            identity=identity,
            sock=sock,
            local=local,
            pid=pid,
            rank=f["rank"],
            world_size=f["world_size"],
            dataset=f["dataset"],
            num_samples=len(entry.index),
            segments={},
            slot_bytes=job.layout.slot_bytes,
            batch_size=batch_size,
            connection=peer.connection,
            peer=peer.name,
            key=peer.key,
            index_key=entry.path,
            layout=job.layout,
            priority=float(f.get("priority", 1.0)),
        )
        try:
            for _ in range(slots):
                segment = Segment.create(session.slot_bytes)
                session.segments[segment.name] = segment
        except BaseException:
            for segment in session.segments.values():
                segment.close()
            raise
        session.read_ahead = task_read_ahead(entry.index)
        self._sessions[session_id] = session
        self._by_identity[(id(sock), identity)] = session
        self._indexes.acquire(entry)
        # Its workers open samples only beneath the roots (`sources/_beneath`): a file the index
        # named, checked when it was made, may since have been replaced by a link leading out.
        roots = self.config.roots if self.confined(local) else None
        self._engine.add_job(session_id, job.to_config(entry.segment.name, roots))
        self._totals["sessions"] += 1
        log.info(
            "session %d: %s rank %d/%d, %s, %d slots of %d KiB",
            session_id,
            peer.name,
            session.rank,
            session.world_size,
            label(f["dataset"]),
            slots,
            session.slot_bytes >> 10,
            extra=log_event(
                "session_start", session=session_id, peer=peer.name, pid=pid, local=local, rank=session.rank,
                world_size=session.world_size, dataset=label(f["dataset"]), batch_size=batch_size,
                slots=slots, slot_bytes=session.slot_bytes,
            ),
        )
        self._reply(
            sock,
            identity,
            "welcome",
            session=session_id,
            daemon_pid=os.getpid(),
            slots=list(session.segments),
            slot_bytes=session.slot_bytes,
            layout=job.layout.to_json(),
            num_samples=len(entry.index),
            classes=list(entry.classes),
            workers=self.config.workers,
        )

    def confined(self, local: bool) -> bool:
        """Whether a session on this socket is held to the roots (NOTE [two policies])."""
        return self.config.roots is not None and not (local and self.config.ipc_any_path)

    def warm(self, path: str) -> IndexEntry:
        """Index a dataset now (at start-up) and keep it, so that its sessions start fast."""
        left = max(0, self.config.memory_budget_bytes - self.used_bytes())
        return self._indexes.warm(path, left, confined=self.config.roots is not None)

    def used_bytes(self) -> int:
        return sum(s.memory for s in self._sessions.values()) + self._indexes.memory

    def new_slot(self, session: Session) -> Segment:
        if len(session.segments) >= MAX_SLOTS_PER_SESSION:
            raise DaemonError(f"a session may hold at most {MAX_SLOTS_PER_SESSION} slots")
        if self.used_bytes() + session.slot_bytes > self.config.memory_budget_bytes:
            raise DaemonError(
                "no memory left in the daemon's budget for another slot: stop holding every batch "
                "(e.g. list(loader)), or raise --memory-budget"
            )
        segment = Segment.create(session.slot_bytes)
        session.segments[segment.name] = segment
        return segment

    def forget(self, hellos: list[tuple[int, bytes]]) -> None:
        """Forget waiting hellos whose peer is gone (or said bye), and stop the opens that no
        hello waits for any more: a peer that leaves holds no opening slot (`index_parallel`)."""
        keys = {self.pending.pop(where).key for where in hellos if where in self.pending}
        for key in keys - {hello.key for hello in self.pending.values()}:
            self._indexes.cancel(key)


def internal_error(e: Exception, local: bool) -> str:
    """The reply to a request that hit a bug (the daemon's log has the traceback): its text only
    to a local peer (NOTE [refusals carry no content]: it may quote a path or a file's content)."""
    if local:
        return f"internal error: {type(e).__name__}: {e}"
    return f"internal error ({type(e).__name__}): the daemon's log says more"
