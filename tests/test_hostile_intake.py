"""What a peer may make the daemon hold and do (issue 29, items 4, 5 and 10), each attack made
on a real daemon:

- an allowed TCP peer flooding tasks on its own slot: a session has at most as many tasks queued
  or running as its slots allow (NOTE [tasks bounded by slots]); the rest are refused naming the
  bound, the daemon's memory stays flat, and a real trainer's epoch is unaffected;
- tar patterns whose names number tens of millions in all: refused before any name is made or
  walked (`MAX_SHARDS` counts every pattern of a source together);
- hellos whose opens hang, their clients gone: their opens are stopped, so a legitimate hello
  is welcomed within seconds instead of waiting for `index_timeout`;
- hello fields of the wrong type or content (a list for a path, a NUL, a lone surrogate,
  /proc/1/cwd): a clean `error` naming the field, never "internal error"; and the benchmark's
  `fuzz-hellos` phase, at a small scale, answers every fuzzed hello without one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
import time
from collections.abc import Iterator
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
    assert_same_batches,
    hello_fields,
    hello_reply,
    local_epoch,
    opening_children,
    start_tcp_daemon,
    take,
)
from helpers import wait_until

from fastload import FastLoader
from fastload._loading.link import daemon_link as wire

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(150)]

TOOLS = Path(__file__).resolve().parent.parent / "tools" / "bench"


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[DaemonProcess, Any]]:
    """A daemon (2 workers) on loopback TCP with CURVE, serving the tests' data (roots: their
    temporary directories), and a function that makes a client with its one allowed key."""
    base = tmp_path_factory.mktemp("tcp")
    pool = DaemonPool(base)
    roots = [str(tmp_path_factory.getbasetemp())]
    yield start_tcp_daemon(pool, base, workers=2, roots=roots, index_timeout=5)
    problems = pool.close()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


def _rss(daemon: DaemonProcess) -> int:
    return int(psutil.Process(daemon.pid).memory_info().rss)


# -- item 4: a session's tasks are bounded by its slots -------------------------------------------


def test_a_peer_flooding_tasks_on_its_own_slot_is_refused_and_the_daemon_stays_flat(
    tcp_daemon: tuple[DaemonProcess, Any], image_folder: Path
) -> None:
    daemon, connect = tcp_daemon
    batch = 4096  # a task of a whole batch: 32 KiB of sample indices
    with connect() as attacker:
        fields = hello_fields(image_folder, batch_size=batch, prefetch=1,
                              transforms=[{"type": "Resize", "size": [2, 2]}])
        op, welcome = hello_reply_kept(attacker, fields)
        assert op == "welcome", welcome
        slot, slots = welcome["slots"][0], len(welcome["slots"])
        daemon.signal_workers(signal.SIGSTOP)  # nothing is decoded: every task accepted stays held
        try:
            before = _rss(daemon)
            indices = (np.arange(batch, dtype="<i8") % 24).tobytes()
            refusals: list[str] = []
            for start in range(0, 3000, 100):  # 3,000 tasks: 94 MiB of indices if all were kept
                for seq in range(start, start + 100):
                    attacker.send(
                        wire.encode("task", seq=seq, epoch=0, batch_index=seq, slot=slot, row=0), indices
                    )
                refusals += _errors_until_pong(attacker)
            grown = _rss(daemon) - before
            kept = 3000 - len(refusals)
            assert grown < 24 << 20, f"the daemon grew by {grown >> 20} MiB ({kept} tasks kept)"
            assert kept <= slots, f"{kept} whole batches were queued for a session of {slots} slots"
            assert refusals and f"exceed its {slots} slots of {batch}" in refusals[0], refusals[:1]
        finally:
            daemon.signal_workers(signal.SIGCONT)
        _dones(attacker, kept)  # the session lives on: its tasks are done, and more accepted
        daemon.signal_workers(signal.SIGSTOP)
        try:  # tasks of one sample each: at most one per slot and worker
            for seq in range(100):
                task = wire.encode("task", seq=seq, epoch=1, batch_index=seq, slot=slot, row=seq % batch)
                attacker.send(task, indices[:8])
            refusals = _errors_until_pong(attacker)
            assert 100 - len(refusals) == slots * 2, len(refusals)
            assert f"the most its {slots} slots allow (2 per slot" in refusals[0], refusals[0]
        finally:
            daemon.signal_workers(signal.SIGCONT)
        _dones(attacker, slots * 2)
        attacker.send(wire.encode("bye"))
    # A real trainer, whose batches are split in two (2 workers, batches of 8) and whose window
    # fills every slot, gets its whole epoch: it never meets the bound.
    kwargs: dict[str, Any] = {
        "batch_size": 8, "shuffle": True, "seed": 4, "transform": RESIZE, "device": "cpu",
    }
    with FastLoader(image_folder, daemon=daemon.address, prefetch=6, **kwargs) as loader:
        assert_same_batches(take(loader), local_epoch(image_folder, **kwargs))
    assert "Traceback" not in daemon.log(), daemon.log()


def _dones(client: RawClient, count: int) -> None:
    for _ in range(count):
        reply = client.reply()
        assert reply is not None and reply[0] == "done", reply


def hello_reply_kept(client: RawClient, fields: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """A hello's answer, past `indexing` notes; a welcome is kept (no `bye`)."""
    client.send(wire.encode("hello", **fields))
    while True:
        reply = client.reply()
        assert reply is not None, "no answer to the hello"
        if reply[0] != "indexing":
            return reply


def _errors_until_pong(client: RawClient) -> list[str]:
    """Send a ping and read every reply before its pong: the error messages among them (the
    daemon answers a connection's messages in order, so all sent before the ping are handled)."""
    client.send(wire.encode("ping"))
    errors = []
    while True:
        reply = client.reply()
        assert reply is not None, "the daemon stopped answering"
        if reply[0] == "pong":
            return errors
        assert reply[0] == "error", reply
        errors.append(str(reply[1]["message"]))


# -- item 5: names bounded before any walk; opens of departed hellos stopped -----------------------


def test_tar_patterns_are_bounded_all_together_before_any_walk(
    tcp_daemon: tuple[DaemonProcess, Any], tmp_path: Path
) -> None:
    daemon, connect = tcp_daemon
    for patterns, named in (
        (["s-{0..999999}.tar"] * 64, "1,048,576 shard names"),  # each pattern within the bound
        (["s-{0..99999}-*.tar"], "4,096 wildcard patterns"),  # each a directory to list
    ):
        paths = [str(tmp_path / p) for p in patterns]
        fields = hello_fields(tmp_path, source=json.dumps({"kind": "tar", "paths": paths}))
        started = time.monotonic()
        with connect() as client:
            op, reply = hello_reply(client, fields, timeout_s=20)
        assert op == "error" and named in reply["message"], reply
        assert time.monotonic() - started < 10
        assert not opening_children(daemon), "an opening process was started for it"


def _hanging_hdf5(where: Path) -> Path:
    """An HDF5 file whose labels' external storage is a FIFO nobody writes: opening it hangs."""
    where.mkdir()
    path, fifo = where / "hang.h5", where / "labels.fifo"
    with h5py.File(path, "w") as f:
        f.create_dataset("images", data=np.array([b"x" * 16] * 4, "S16"))
        f.create_dataset("labels", shape=(4,), dtype="<i8", external=[(str(fifo), 0, 32)])
    os.mkfifo(fifo, 0o600)
    return path


def test_opens_whose_hellos_are_gone_are_stopped_and_free_their_slots(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path
) -> None:
    config = tmp_path / "daemon.toml"
    config.write_text("[daemon]\nindex_timeout = 600\nindex_parallel = 2\n")
    daemon = daemon_pool.start(workers=1, extra=["--config", str(config)])
    hostile = [RawClient(daemon.address) for _ in range(2)]
    for k, client in enumerate(hostile):  # two opens that hang, holding both opening slots
        path = _hanging_hdf5(tmp_path / f"h{k}")
        source = json.dumps({"kind": "hdf5", "path": str(path)})
        client.send(wire.encode("hello", **hello_fields(path, source=source)))
    assert wait_until(lambda: len(opening_children(daemon)) == 2, 30), opening_children(daemon)
    hung = opening_children(daemon)
    for client in hostile:
        client.close()
    started = time.monotonic()
    with RawClient(daemon.address) as client:
        op, reply = hello_reply(client, hello_fields(image_folder), timeout_s=30)
    assert op == "welcome", reply
    assert time.monotonic() - started < 20
    assert wait_until(lambda: not any(psutil.pid_exists(p) for p in hung), 10), "the hung opens live on"
    assert "stopped opening hdf5 source" in daemon.log()


# -- item 10: every field of a hello validated -----------------------------------------------------


def _field_cases(data: Path, listing: Path) -> list[tuple[dict[str, Any], str]]:
    """(hello fields replaced, what the error must name)."""
    folder = {"kind": "folder", "root": str(data)}
    files = {"kind": "file_list", "path": str(listing)}
    return [
        ({"source": json.dumps({"kind": "hdf5", "path": [str(listing), str(listing)]})}, "field path"),
        ({"source": json.dumps({**files, "root": "/a\x00b"})}, "field root holds a NUL"),
        ({"source": json.dumps({**folder, "root": "/\ud800/x"})}, "not a valid file name"),
        ({"source": json.dumps({**folder, "root": "/" + "a/" * 3000})}, "over the limit"),
        ({"source": json.dumps({"kind": "tar", "paths": [[str(listing)]]})}, "field paths"),
        ({"source": json.dumps({**files, "classes": [1, 2]})}, "field classes"),
        ({"source": json.dumps({**folder, "allow_empty": "yes"})}, "field allow_empty"),
        ({"source": json.dumps({"kind": "hdf5", "path": str(listing), "cache_mb": "x"})}, "field cache_mb"),
        ({"source": json.dumps({**files, "num_classes": True})}, "field num_classes"),
        ({"source": json.dumps({"kind": ["folder"]})}, "unknown source kind"),
        ({"source": json.dumps({**folder, "evil": 1})}, "no field"),
        ({"dataset": "/\ud800"}, "dataset is not a valid file name"),
        ({"dataset": "/proc/1/cwd"}, ""),
        ({"source": json.dumps({"kind": "folder", "root": "/proc/1/cwd"})}, ""),
    ]


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_hello_fields_of_the_wrong_type_or_content_get_a_clean_error(
    daemon_pool: DaemonPool, tcp_daemon: tuple[DaemonProcess, Any], tmp_path: Path, image_folder: Path,
    transport: str,
) -> None:
    listing = tmp_path / "list.txt"
    listing.write_text("".join(f"{p} {k % 3}\n" for k, p in enumerate(sorted(image_folder.glob("*/*")))))
    if transport == "tcp":
        daemon, connect = tcp_daemon
    else:  # no roots: /proc/1/cwd may be walked, for index_timeout
        config = tmp_path / "daemon.toml"
        config.write_text("[daemon]\nindex_timeout = 5\n")
        daemon = daemon_pool.start(workers=1, extra=["--config", str(config)])
        connect = lambda: RawClient(daemon.address)  # noqa: E731
    problems = []
    for overrides, named in _field_cases(image_folder, listing):
        with connect() as client:
            client.send(wire.encode("hello", **hello_fields(image_folder, **overrides)))
            notes = []
            reply = client.reply()
            while reply is not None and reply[0] == "indexing":
                notes.append(reply[1]["path"])
                reply = client.reply()
        what = f"{str(overrides)[:80]}: {reply}"
        message = "" if reply is None or reply[0] != "error" else str(reply[1]["message"])
        if not message or named not in message or message.startswith("internal error"):
            problems.append(what)
        # An `indexing` note names the dataset as the client did, never where its links lead.
        if any(note != hello_fields(image_folder, **overrides)["dataset"] for note in notes):
            problems.append(f"{what}: told {notes}")
    assert not problems, "\n".join(problems)
    assert "Traceback" not in daemon.log(), daemon.log()
    assert daemon.status()["pid"] == daemon.pid


def test_the_fuzz_hellos_phase_gets_no_internal_error_and_no_hang(tmp_path: Path, image_folder: Path) -> None:
    """The benchmark's `fuzz-hellos` phase (`tools/bench/fuzz_hellos.py`), on a small scale."""
    spec = importlib.util.spec_from_file_location("fuzz_hellos", TOOLS / "fuzz_hellos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fuzz_hellos"] = module
    spec.loader.exec_module(module)
    for tcp in (False, True):
        result = module.fuzz_hellos(str(image_folder), tmp_path, 120, tcp=tcp, open_deadline_s=3)
        assert result["hellos"] == 120, result
        assert result["internal_errors"] == 0 and result["hangs"] == 0, result
        assert result["daemon_alive"] and result["tracebacks_in_log"] == 0, result
        assert result["replies"].get("welcome", 0) > 0, result  # valid hellos among them
