"""Opening a source is isolated: a real daemon opens each source in a child process, so a hang
(an HDF5 file whose labels live in external storage that is a FIFO: h5py blocks in the daemon's
opening process), a crash there (that child killed with SIGSEGV, as a segfault in h5py), or a
source that would need gigabytes to open fails only its own hello, while the daemon answers
`status` and serves another trainer, and SIGTERM during a hanging open exits at once.
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import psutil
import pytest
from daemon_helpers import (
    RESIZE,
    DaemonPool,
    DaemonProcess,
    RawClient,
    hello_fields,
    hello_reply,
    local_epoch,
    opening_children,
    take,
)
from helpers import wait_until

from fastload import FastLoader
from fastload._loading.link import daemon_link as wire
from fastload.sources import HDF5

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(150)]


def _hanging_hdf5(tmp_path: Path) -> Path:
    """An HDF5 file whose labels' external storage is a FIFO nobody writes: reading them blocks."""
    path, fifo = tmp_path / "hang.h5", tmp_path / "labels.fifo"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.array([b"x" * 16] * 4, "S16"))
        f.create_dataset("labels", shape=(4,), dtype="<i8", external=[(str(fifo), 0, 32)])
    os.mkfifo(fifo, 0o600)
    return path


def _hello_of(source: HDF5) -> dict[str, Any]:
    return hello_fields(Path(source.where), source=json.dumps(source.resolved().to_config()))


def _daemon(daemon_pool: DaemonPool, tmp_path: Path, **table: Any) -> DaemonProcess:
    config = tmp_path / "daemon.toml"
    config.write_text("[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    return daemon_pool.start(workers=1, extra=["--config", str(config)])


class _Hello(threading.Thread):
    """A hello on its own connection, answered in the background; `cancel()` stops the wait."""

    def __init__(self, address: str, fields: dict[str, Any], timeout_s: float) -> None:
        super().__init__(daemon=True)
        self.address, self.fields, self.timeout_s = address, fields, timeout_s
        self.reply: tuple[str, dict[str, Any]] | None = None
        self.unanswered: AssertionError | None = None  # no reply within timeout_s (or cancelled)
        self.seconds = 0.0
        self._cancelled = threading.Event()
        self.start()

    def cancel(self) -> None:
        """Stop waiting (the daemon is gone: no answer can come); what has arrived is still read."""
        self._cancelled.set()

    def run(self) -> None:
        started = time.monotonic()
        deadline = started + self.timeout_s
        with RawClient(self.address) as client:
            client.send(wire.encode("hello", **self.fields))
            while True:
                cancelled = self._cancelled.is_set()
                reply = client.reply(timeout_s=0.1)
                if reply is not None and reply[0] != "indexing":
                    if reply[0] == "welcome":
                        client.send(wire.encode("bye"))
                    self.reply = reply
                    break
                if reply is None and (cancelled or time.monotonic() > deadline):
                    # kept for the test to look at, never raised in this thread
                    self.unanswered = AssertionError(f"no answer to a hello within {self.timeout_s:g} s")
                    break
        self.seconds = time.monotonic() - started


def _in_the_fork_server(tmp_path: Path, code: str) -> dict[str, str]:
    """An environment for a daemon whose fork server (only it: not the daemon, not its workers)
    runs `code` as it starts, from a sitecustomize on PYTHONPATH; the children it forks inherit
    what the code did."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(
        "with open('/proc/self/cmdline', 'rb') as f:\n"
        "    if b'multiprocessing.forkserver' in f.read():\n"
        + textwrap.indent(textwrap.dedent(code), " " * 8)
    )
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path}


def _served_while(daemon: DaemonProcess, image_folder: Path) -> None:
    """Another trainer gets a whole correct epoch, and `status` answers, right now."""
    assert daemon.status(timeout_s=5.0)["pid"] == daemon.pid
    kw: dict[str, Any] = {"batch_size": 4, "transform": RESIZE, "device": "cpu", "seed": 3}
    with FastLoader(image_folder, daemon=daemon.address, **kw) as loader:
        got = take(loader)
    expected = local_epoch(image_folder, **kw)
    assert len(got) == len(expected)
    assert all((a[0] == b[0]).all() for a, b in zip(got, expected, strict=True))


def test_a_hanging_open_fails_its_hello_and_the_daemon_serves_on(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    daemon = _daemon(daemon_pool, tmp_path, index_timeout=6)
    hello = _Hello(daemon.address, _hello_of(HDF5(str(_hanging_hdf5(tmp_path)))), timeout_s=60)
    assert wait_until(lambda: opening_children(daemon), 30), "no opening process started"
    _served_while(daemon, image_folder)  # while the open hangs
    hello.join(60)
    assert hello.reply is not None
    op, fields = hello.reply
    assert op == "error" and "took longer than 6 s" in fields["message"], hello.reply
    assert wait_until(lambda: not opening_children(daemon), 10), "the hung opening process was not killed"
    _served_while(daemon, image_folder)


def test_a_crash_while_opening_fails_only_that_hello(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    daemon = _daemon(daemon_pool, tmp_path, index_timeout=60)
    hello = _Hello(daemon.address, _hello_of(HDF5(str(_hanging_hdf5(tmp_path)))), timeout_s=60)
    assert wait_until(lambda: opening_children(daemon), 30), "no opening process started"
    for pid in opening_children(daemon):
        os.kill(pid, signal.SIGSEGV)  # what a segfault in h5py's open does to its process
    hello.join(30)
    assert hello.reply is not None, (hello.unanswered, opening_children(daemon), daemon.log())
    op, fields = hello.reply
    assert op == "error" and "crashed" in fields["message"] and "SIGSEGV" in fields["message"], hello.reply
    assert hello.seconds < 30
    _served_while(daemon, image_folder)


def test_sigterm_during_a_hanging_open_exits_promptly(daemon_pool: DaemonPool, tmp_path: Path) -> None:
    daemon = _daemon(daemon_pool, tmp_path, index_timeout=600)
    # The hello goes unanswered (the daemon exits): its thread is cancelled and ends here, not in a
    # later test (it gives up after 15 s on its own).
    hello = _Hello(daemon.address, _hello_of(HDF5(str(_hanging_hdf5(tmp_path)))), timeout_s=15)
    assert wait_until(lambda: opening_children(daemon), 30), "no opening process started"
    children = opening_children(daemon)
    started = time.monotonic()
    assert daemon.terminate(timeout_s=20) == 0
    assert time.monotonic() - started < 20
    assert wait_until(lambda: not any(psutil.pid_exists(p) for p in children), 10)
    assert not daemon.segments()
    hello.cancel()  # the daemon is gone: stop waiting for an answer (one already sent is still read)
    hello.join(30)
    assert not hello.is_alive() and hello.reply is None


def test_an_open_that_needs_gigabytes_is_refused_and_the_daemon_stays_small(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    """Labels that declare 2**29 rows (4 GiB once read) in a file of a few KiB."""
    path = tmp_path / "huge.h5"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", shape=(2**29,), dtype="S8", chunks=(1024,))
        f.create_dataset("labels", shape=(2**29,), dtype="<i8", chunks=(1024,))
    daemon = _daemon(daemon_pool, tmp_path, index_timeout=60, index_memory="512MiB")
    with RawClient(daemon.address) as client:
        op, fields = hello_reply(client, _hello_of(HDF5(str(path))), timeout_s=90)
    assert op == "error", fields
    assert psutil.Process(daemon.pid).memory_info().rss < 1 << 30
    _served_while(daemon, image_folder)


def test_index_memory_bounds_what_an_open_allocates_not_what_libraries_map(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    """The smallest budget (64MiB) opens a small folder while the opening process maps 8 GiB it
    never writes, as a library that reserves address space does (a CUDA build of torch maps
    3.8 GB before any work: every open failed on a GPU machine), and numpy, h5py and their
    threads' buffers are loaded; an open that needs gigabytes is still refused."""
    env = _in_the_fork_server(tmp_path, """
        import mmap
        import fastload.sources._formats.folder as folder
        scan, reserved = folder.scan_image_folder, []
        def reserving(*args, **kwargs):
            reserved.append(mmap.mmap(-1, 8 << 30, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, mmap.PROT_READ))
            return scan(*args, **kwargs)
        folder.scan_image_folder = reserving
    """)
    config = tmp_path / "daemon.toml"
    config.write_text('[daemon]\nindex_timeout = 60\nindex_memory = "64MiB"\n')
    daemon = daemon_pool.start(workers=1, env=env, extra=["--config", str(config)])
    _served_while(daemon, image_folder)
    path = tmp_path / "big.h5"  # labels of 2**24 rows: 128 MiB once read, within the source bounds
    with h5py.File(path, "w") as f:
        f.create_dataset("images", shape=(2**24,), dtype="S8", chunks=(1024,))
        f.create_dataset("labels", shape=(2**24,), dtype="<i8", chunks=(1024,))
    with RawClient(daemon.address) as client:
        op, fields = hello_reply(client, _hello_of(HDF5(str(path))), timeout_s=90)
    assert op == "error" and "64 MiB (index_memory)" in fields["message"], fields


def test_an_opening_process_that_dies_says_why(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    """A library that prints its complaint and exits (OpenBLAS does, when it cannot start its
    threads): the hello's error gives the exit status and the last lines the process wrote."""
    env = _in_the_fork_server(tmp_path, """
        import os, sys
        import fastload.sources._formats.folder as folder
        def dying(*args, **kwargs):
            print("libexample: cannot start thread 5 of 16: out of resources", file=sys.stderr)
            sys.stderr.flush()
            os._exit(1)
        folder.scan_image_folder = dying
    """)
    daemon = daemon_pool.start(workers=1, env=env)
    with RawClient(daemon.address) as client:
        op, fields = hello_reply(client, hello_fields(image_folder), timeout_s=60)
    assert op == "error", fields
    assert "exit status 1" in fields["message"] and "libexample: cannot start thread 5" in fields["message"]
    assert daemon.status()["pid"] == daemon.pid


def test_a_slow_fork_server_does_not_stall_the_daemon(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    """The fork server's start takes 10 s here (its imports of torch and CUDA's libraries took
    over 5 s on a busy GPU machine, and every hello there timed out): `status` answers meanwhile,
    and a trainer's hello is told `indexing` until its index is made, then welcomed."""
    env = _in_the_fork_server(tmp_path, "import time\ntime.sleep(10)\n")
    daemon = daemon_pool.start(workers=1, env=env)
    hello = _Hello(daemon.address, hello_fields(image_folder), timeout_s=60)
    assert wait_until(lambda: daemon.status(timeout_s=5.0)["pid"] == daemon.pid, 15)
    started = time.monotonic()  # a loop stalled by the fork server would answer in 10 s
    assert daemon.status(timeout_s=5.0)["pid"] == daemon.pid
    assert time.monotonic() - started < 5.0, "the daemon's loop is stalled by the fork server"
    _served_while(daemon, image_folder)  # FastLoader's own hello, which gives up after 5 s of silence
    hello.join(60)
    assert hello.reply is not None and hello.reply[0] == "welcome", hello.reply or hello.unanswered
