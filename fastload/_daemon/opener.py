"""Opening a source for the daemon in a child process: scans, parsing and h5py never run in the
daemon's own process.

One child per open (at most `OpenLimits.parallel` at a time, the rest queued by `indexes`), with a
wall-clock deadline, RLIMIT_DATA (NOTE [what index_memory bounds]) and no core dumps. The child
checks the allowlist (`confine`), opens the source, writes its index into a shared-memory
segment and sends back, as bounded JSON, the segment's name and what the daemon reports
(samples, classes); the daemon renames the segment to one of its own (so it is never taken for
the orphan of a dead process) before the child may exit. A crash (a signal), a hang (past the
deadline: SIGKILL), memory exhaustion or any error there fails that open with a DatasetError
that says why (a child that dies without a reply: its exit status and the last lines it wrote
to stderr); the daemon keeps serving.

NOTE [forkserver for opening]: children come from multiprocessing's fork server, a fresh
interpreter started (on the first open) from the daemon's executable with `_PRELOAD` imported.
`fork` from the daemon would copy a process with ZMQ's I/O threads, every session's state and the
CURVE secret key into code that parses hostile files; `spawn` would pay an interpreter start and
the imports (numpy, h5py, the sources) on every hello. The fork server is single threaded, holds
nothing of the daemon's, has imported what an open needs (`_PRELOAD`), and forks a ready child in
milliseconds.
NOTE [what index_memory bounds]: the child's private writable memory (RLIMIT_DATA: since Linux
4.7 every private writable mapping, the heap and anonymous mmaps where numpy's arrays, h5py's
reads and malloc land, thread stacks too), above what it holds when the open starts. Not its
address space (RLIMIT_AS, as before): that counts what libraries map or reserve and never write
(library text: a CUDA build of torch maps 3.8 GB; allocators' and CUDA's reservations; glibc's
64 MiB arena per thread), so in a process with such libraries every open failed, whatever it
needed. Shared mappings are not counted: the index's segment is bounded by `max_bytes` instead.

NOTE [JSON from the child]: the child parses hostile input, so what it sends is treated as
hostile too: JSON (never pickle), bounded, and a segment name the daemon checks (this child's
pid, fastload's pattern, a regular file of ours) before renaming it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import multiprocessing
import multiprocessing.forkserver
import os
import re
import resource
import secrets
import signal
import stat
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastload._errors import DatasetError, FastloadError
from fastload._labels import label
from fastload._machine import SHM_DIR
from fastload._shm import PREFIX, Segment, own_segments, unlink
from fastload._sizes import format_size

log = logging.getLogger("fastload.daemon")

_MAX_REPLY_BYTES = 16 << 20  # a result: the classes of ImageNet-21k take ~0.3 MiB
_ACK_WAIT_S = 30.0
_KILL_WAIT_S = 5.0
_STDERR_TAIL_BYTES = 4096  # of a child's stderr, kept to say why it died
# What an open imports, imported once in the fork server (a missing one, h5py, is skipped there).
_PRELOAD = [__name__, "fastload.sources", "fastload._daemon.confine", "h5py"]


@dataclass(frozen=True)
class OpenLimits:
    """Bounds on one open: files a folder may hold, wall time, memory it may allocate, how many at once."""

    max_files: int = 20_000_000
    timeout_s: float = 600.0
    memory_bytes: int = 4 << 30
    parallel: int = 2


class OpenFailed(DatasetError):
    """An open failed; `public` is what a TCP peer is told (no content of any file)."""

    def __init__(self, message: str, public: str) -> None:
        super().__init__(message)
        self.public = public


@dataclass
class Opened:
    """What a child made: the segment (now the daemon's), the index type, its root, classes, count."""

    segment: Segment
    index_type: str
    root: str
    classes: tuple[str, ...]
    count: int


class Opening:
    """One child opening one source."""

    def __init__(
        self,
        ctx: Any,
        key: str,
        source: Any,
        roots: tuple[str, ...] | None,
        limits: OpenLimits,
        max_bytes: int,
        plugins: tuple[str, ...] = (),
    ) -> None:
        self.key = key
        self.name = f"{source.kind} source {source.where}"
        self.started_at = time.monotonic()
        self.deadline = self.started_at + limits.timeout_s
        self._limits = limits
        request = {
            "source": source.to_config(),
            "roots": None if roots is None else list(roots),
            "max_files": limits.max_files,
            "timeout_s": limits.timeout_s,
            "memory_bytes": limits.memory_bytes,
            "max_bytes": max_bytes,
            "daemon_pid": os.getpid(),
            "plugins": list(plugins),
        }
        self._conn, child_conn = ctx.Pipe(duplex=True)
        self._stderr, child_stderr = ctx.Pipe(duplex=False)  # the child's fd 2, read as it comes
        os.set_blocking(self._stderr.fileno(), False)
        self._stderr_tail = b""
        self.process = ctx.Process(
            target=child_main,
            args=(child_conn, json.dumps(request), child_stderr),
            name="fastload-open",
            daemon=True,
        )
        self.result: Opened | Exception | None = None
        self._start_error: BaseException | None = None
        # NOTE [starting off the loop]: Process.start() waits for the fork server to fork, and a
        # fork server still importing its preload (torch and CUDA's libraries: over 5 s seen on a
        # busy GPU machine) would stall the daemon's loop: no `indexing` notes, every client's
        # hello timed out. The start runs on a thread; `poll` waits for it.
        self._starter = threading.Thread(
            target=self._start_child, args=(child_conn, child_stderr), name="fastload-open-start", daemon=True
        )
        self._starter.start()

    @property
    def starting(self) -> bool:
        """Its process is still being started (NOTE [starting off the loop]): not yet one to kill."""
        return self._starter.is_alive()

    def _start_child(self, child_conn: Any, child_stderr: Any) -> None:
        try:
            self.process.start()
        except BaseException as e:  # kept for poll, which fails the open with it
            self._start_error = e
        finally:
            child_conn.close()
            child_stderr.close()

    def poll(self) -> bool:
        """True once the open is over (`result` set): a reply, an exit without one, or the deadline."""
        if self.result is not None:
            return True
        if self._starter.is_alive():
            if time.monotonic() <= self.deadline:
                return False
            message = f"no process could be started to open {self.name} within {self._limits.timeout_s:g} s"
            self.result = OpenFailed(message, message)
            self.close()
            return True
        if self._start_error is not None:
            message = f"cannot start a process to open {self.name}: {self._start_error}"
            self.result = OpenFailed(message, message)
            self.close()
            return True
        self._read_stderr()
        try:
            if self._conn.poll():
                self.result = self._receive()
        except (EOFError, OSError):
            pass  # the child is gone without a word: its exit status says why
        if self.result is None and self.process.exitcode is not None:
            self._read_stderr()
            self.result = self._died(self.process.exitcode)
        elif self.result is None and time.monotonic() > self.deadline:
            self.kill()
            seconds = self._limits.timeout_s
            self.result = OpenFailed(
                f"opening {self.name} took longer than {seconds:g} s (index_timeout): a hang, or a source "
                "too large to index in that time; stopped",
                f"opening {self.name} took longer than {seconds:g} s and was stopped",
            )
        if self.result is not None:
            self.close()
        return self.result is not None

    def _died(self, code: int) -> OpenFailed:
        if code < 0:
            try:
                what = f"signal {signal.Signals(-code).name}"
            except ValueError:
                what = f"signal {-code}"
            hint = " (killed: out of memory?)" if code == -signal.SIGKILL else ""
            public = (
                f"opening {self.name} crashed the daemon's opening process ({what}{hint}): a damaged file?"
            )
        else:
            public = f"opening {self.name} ended without a result (exit status {code})"
        said = self._stderr_tail.decode("utf-8", "replace").strip().splitlines()[-5:]
        if not said:
            return OpenFailed(public, public)
        log.warning(
            "opening %s: its process died (%s), last writing: %s", label(self.name), code,
            " | ".join(label(line, limit=500) for line in said),
        )
        # NOTE [refusals carry no content]: what it wrote may quote a file: local peers only.
        return OpenFailed(f"{public}; it last wrote: " + " | ".join(line.strip() for line in said), public)

    def _read_stderr(self) -> None:
        """Take what the child wrote to stderr since the last look, keeping the tail."""
        with contextlib.suppress(OSError):
            while chunk := os.read(self._stderr.fileno(), 65536):
                self._stderr_tail = (self._stderr_tail + chunk)[-_STDERR_TAIL_BYTES:]

    def _receive(self) -> Opened | Exception:
        reply = json.loads(self._conn.recv_bytes(_MAX_REPLY_BYTES))
        if reply.get("ok") is not True:
            message, public = str(reply.get("message", ""))[:2000], str(reply.get("public", ""))[:2000]
            kind = str(reply.get("type", "error"))[:100]
            detail = str(reply.get("detail", ""))
            log.warning(
                "opening %s failed: %s %s", label(self.name), label(message, 1000), label(detail, 1000)
            )
            if not message.startswith((self.name, f"cannot open {self.name}")):
                message = f"cannot open {self.name}: {message}"
            if public and not public.startswith(self.name):
                public = f"cannot open {self.name}: {public}"
            if not public:  # NOTE [refusals carry no content]: the details stay in the daemon's log
                public = f"cannot open {self.name}: {kind} (the daemon's log says why)"
            return OpenFailed(message, public)
        segment = self._adopt(str(reply["segment"]))
        self._conn.send_bytes(b"taken")
        return Opened(
            segment,
            str(reply["index_type"]),
            str(reply["root"]),
            tuple(str(c) for c in reply["classes"]),
            int(reply["count"]),
        )

    def _adopt(self, name: str) -> Segment:
        """Rename the child's segment to one of this process (NOTE [JSON from the child])."""
        pid = self.process.pid
        if not re.fullmatch(rf"{PREFIX}{pid}_[0-9a-f]{{32}}", name):
            raise DatasetError(f"opening {self.name}: the opening process named no segment of its own")
        old = os.path.join(SHM_DIR, name)
        info = os.lstat(old)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid():
            raise DatasetError(f"opening {self.name}: the opening process's segment is not a file of ours")
        mine = f"{PREFIX}{os.getpid()}_{secrets.token_hex(16)}"
        os.rename(old, os.path.join(SHM_DIR, mine))
        attached = Segment.attach(mine)
        return Segment(attached.name, attached.size, attached.buf, owner=True)

    def kill(self) -> None:
        if self.process.pid is not None and self.process.exitcode is None:
            with contextlib.suppress(OSError):
                self.process.kill()

    def close(self) -> None:
        """Reap the child (killing it if needed) and unlink any segment it left."""
        self._starter.join(_KILL_WAIT_S)
        if self._starter.is_alive() or self.process.pid is None:
            for conn in (self._conn, self._stderr):
                with contextlib.suppress(OSError):
                    conn.close()
            return  # never started, or the fork server is stuck: nothing of ours to reap
        self.kill()
        self.process.join(_KILL_WAIT_S)
        pid = self.process.pid
        for entry, owner in own_segments():
            if owner == pid:
                unlink(entry.name)
        for conn in (self._conn, self._stderr):
            with contextlib.suppress(OSError):
                conn.close()
        with contextlib.suppress(ValueError):
            self.process.close()


class Opener:
    """Starts opening children from a fork server (NOTE [forkserver for opening])."""

    def __init__(
        self, roots: tuple[str, ...] | None, limits: OpenLimits, plugins: tuple[str, ...] = ()
    ) -> None:
        self.roots = roots
        self.limits = limits
        self.plugins = plugins  # imported by each child before it reads a source (`plugins`)
        self._ctx = multiprocessing.get_context("forkserver")
        # A plugin module is imported once, there; a plugin file in each child (`import_plugins`).
        self._ctx.set_forkserver_preload(_PRELOAD + [p for p in plugins if not p.endswith(".py")])
        # Started now (its imports run beside the daemon's start), not on the first hello.
        multiprocessing.forkserver.ensure_running()

    def start(self, key: str, source: Any, confined: bool, max_bytes: int) -> Opening:
        return Opening(
            self._ctx, key, source, self.roots if confined else None, self.limits, max_bytes, self.plugins
        )


# -- the child -------------------------------------------------------------------------------


def _limit_self(memory_bytes: int, timeout_s: float, daemon_pid: int) -> None:
    """No core files; SIGALRM (which kills) past the deadline, and exit when the daemon is gone,
    in case nobody reaps us; then private writable memory bounded at what the child holds now
    plus `memory_bytes` (NOTE [what index_memory bounds])."""
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    signal.alarm(max(1, int(timeout_s) + 5))

    def watch() -> None:
        while True:
            time.sleep(1.0)
            try:
                os.kill(daemon_pid, 0)
            except ProcessLookupError:
                os._exit(3)
            except PermissionError:
                pass

    threading.Thread(target=watch, daemon=True).start()
    _, hard = resource.getrlimit(resource.RLIMIT_DATA)
    want = _data_bytes() + memory_bytes
    if hard == resource.RLIM_INFINITY or want < hard:
        resource.setrlimit(resource.RLIMIT_DATA, (want, hard))


def _data_bytes() -> int:
    """This process's private writable memory now (VmData: what RLIMIT_DATA counts)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    raise OSError("/proc/self/status has no VmData line")


def _index_bytes(index: Any) -> int:
    """What the index's arrays take, its declared fields' extents too (its segment is about this size)."""
    import numpy as np

    from fastload.sources._indexes.sample_index import declared_fields

    declaring = declared_fields(index)
    fields, members = (declaring.fields if declaring is not None else None), 0
    if fields is not None:
        cells = 0 if fields.blob is None else int(fields.blob.nbytes)
        members = int(fields.offsets.nbytes + fields.sizes.nbytes) + cells
    return members + sum(int(v.nbytes) for v in vars(index).values() if isinstance(v, np.ndarray))


def _open(request: dict[str, Any]) -> dict[str, Any]:
    from fastload._daemon.confine import Roots, check_before_open, check_index, source_name
    from fastload._daemon.plugins import import_plugins
    from fastload.sources import source_from_config
    from fastload.sources._base import OpenBounds
    from fastload.sources._indexes.arrays import ArrayIndex
    from fastload.sources._shared_indexes import shared_name
    from fastload.sources._storage import remote as _remote

    import_plugins(tuple(request["plugins"]))  # the kinds they declare (the daemon's own setting)
    source = source_from_config(request["source"])
    name = source_name(source)
    roots = None if request["roots"] is None else Roots(tuple(request["roots"]))
    if roots is not None:
        check_before_open(source, roots)
        checked = roots  # NOTE [confined requests] in `sources/_storage/remote.py`
        _remote.confine(lambda url: checked.check(url, name, "an object it names"))
    max_bytes = int(request["max_bytes"])
    bounds = OpenBounds(int(request["max_files"]), max_bytes, time.monotonic() + float(request["timeout_s"]))
    try:
        index: Any = source.open_bounded(bounds)  # a folder's scan stops at them (a tree of any size)
    except FastloadError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # a peer's odd description
        raise DatasetError(f"cannot open {name}: {type(e).__name__}: {e}"[:1000]) from e
    if isinstance(index, ArrayIndex):  # its batches are arrays, not images to decode
        raise DatasetError(f"{source.where} holds arrays: a daemon serves encoded images")
    if roots is not None:
        check_index(index, roots, name)
    need = _index_bytes(index)
    if need > max_bytes:
        raise DatasetError(
            f"the index of {name} needs {format_size(need)}, more than the "
            f"{format_size(max_bytes)} left of the daemon's memory budget"
        )
    index_type = shared_name(index)
    segment = index.to_segment()
    return {
        "ok": True,
        "segment": segment.name,
        "index_type": index_type,
        "root": str(index.root),
        "classes": list(index.classes),
        "count": len(index),
    }


def child_main(conn: Any, request_text: str, stderr: Any) -> None:
    """The opening process: limits, open, reply, wait for the daemon to take the segment, exit.
    Its stderr goes to the daemon, which says the last lines if it dies without a reply."""
    os.dup2(stderr.fileno(), 2)
    stderr.close()
    request = json.loads(request_text)
    reply: dict[str, Any]
    try:
        _limit_self(int(request["memory_bytes"]), float(request["timeout_s"]), int(request["daemon_pid"]))
        reply = _open(request)
    except MemoryError:
        text = f"opening it needed more than {format_size(int(request['memory_bytes']))} (index_memory)"
        reply = {"ok": False, "type": "MemoryError", "message": text, "public": text}
    except FastloadError as e:
        detail = getattr(e, "detail", None)  # a refusal of the allowlist: content-free by design
        reply = {
            "ok": False,
            "type": type(e).__name__,
            "message": str(e)[:2000],
            "public": str(e) if detail is not None else "",
            "detail": detail or "",
        }
    except BaseException as e:  # everything becomes a refusal of this one source
        reply = {
            "ok": False,
            "type": type(e).__name__,
            "message": f"{type(e).__name__}: {e}"[:2000],
            "public": "",
        }
    try:
        conn.send_bytes(json.dumps(reply).encode())
        if reply["ok"] and not conn.poll(_ACK_WAIT_S):
            unlink(reply["segment"])  # nobody took it
    finally:
        os._exit(0)
