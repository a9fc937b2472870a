"""HDF5 files that try to leave a daemon's dataset roots (issue 29, items 1 and 5): a real daemon
with `--root`, over TCP with CURVE, refuses an HDF5 file that reaches a file outside its roots in
two hops, through a missing absolute name that HDF5 then looks up by its base name in the
daemon's working directory, or that names a FIFO under a root; files whose links, virtual
sources and external storage stay under the roots are served, and read the same locally.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
from daemon_helpers import (
    REPLY_TIMEOUT_S,
    ConfinedTcpDaemon,
    RawClient,
    confined_tcp_daemon,
    hello_fields,
    hello_reply,
)

from fastload._daemon.confine import Refused, Roots, check_before_open
from fastload._loading.link import daemon_link as wire
from fastload.sources import HDF5
from fastload.sources._formats.hdf5_indexes import HDF5BytesIndex

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

_WIDTH = 4096  # bytes per image in the fixed-length datasets (JPEGs padded with zeros)


@pytest.fixture
def images(image_folder: Path) -> list[bytes]:
    return [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))[:2]]


@pytest.fixture
def places(tmp_path: Path) -> tuple[Path, Path]:
    """(inside, outside): the daemon's root and a private folder next to it."""
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir(mode=0o700)
    return inside, outside


def _fixed(images: list[bytes]) -> np.ndarray:
    assert all(len(i) <= _WIDTH for i in images)
    return np.array(images, f"S{_WIDTH}")


def _raw(path: Path, images: list[bytes]) -> Path:
    path.write_bytes(_fixed(images).tobytes())
    return path


def _h5(path: Path, images: Any = None, labels: Any = None, data: Any = None, **more: Any) -> Path:
    """An HDF5 file with `images` (encoded, fixed-length) or `data` at /images: a link, or
    ("virtual", file, count), or ("storage", file, count[, dtype]) (`labels` too); `more` by name."""
    placed = {"images": data, **more}
    if isinstance(labels, tuple):
        placed["labels"], labels = labels, None
    with h5py.File(path, "w") as f:
        if images is not None:
            f["images"] = _fixed(images)
        for name, value in placed.items():
            kind = value[0] if isinstance(value, tuple) else None
            if value is None:
                continue
            if kind == "storage":
                dtype = np.dtype(value[3] if len(value) > 3 else f"S{_WIDTH}")
                extent = [(str(value[1]), 0, value[2] * dtype.itemsize)]
                f.create_dataset(name, shape=(value[2],), dtype=dtype, external=extent)
            elif kind == "virtual":
                layout = h5py.VirtualLayout(shape=(value[2],), dtype=f"S{_WIDTH}")
                layout[:] = h5py.VirtualSource(str(value[1]), "images", shape=(value[2],))
                f.create_virtual_dataset(name, layout)
            else:
                f[name] = value
        if labels is not None:
            f["labels"] = np.asarray(labels, np.int64)
    return path


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory, image_folder: Path) -> Iterator[ConfinedTcpDaemon]:
    """One daemon confined to a root per test (`inside`), on TCP with CURVE; its working directory
    (outside every root, private) holds `secret.h5`, which HDF5 would open for a missing absolute
    target by its base name."""
    base = tmp_path_factory.mktemp("tcp")
    workdir = base / "workdir"
    workdir.mkdir(mode=0o700)
    _h5(workdir / "secret.h5", [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))[:2]])
    with confined_tcp_daemon(base, rooms=4, root_name="inside", cwd=workdir) as shared:
        yield shared


@pytest.fixture
def tcp_places(tcp_daemon: ConfinedTcpDaemon) -> tuple[Path, Path]:
    """(inside, outside) in a room of `tcp_daemon`: its root and a private folder next to it."""
    room = tcp_daemon.room()
    (room / "outside").mkdir(mode=0o700)
    return room / "inside", room / "outside"


def _hello(path: Path) -> dict[str, Any]:
    source = HDF5(str(path))
    return hello_fields(path, source=json.dumps(source.resolved().to_config()))


def _assert_refused(reply: tuple[str, dict[str, Any]], *absent: str) -> str:
    op, fields = reply
    assert op == "error", reply
    message = str(fields["message"])
    assert "dataset roots" in message or "regular file" in message, message
    for text in absent:
        assert text not in message, message
    return message


def _assert_welcome(reply: tuple[str, dict[str, Any]], count: int) -> None:
    op, fields = reply
    assert op == "welcome" and fields["num_samples"] == count, reply


def test_a_second_hop_out_of_the_roots_is_refused(
    tcp_daemon: ConfinedTcpDaemon, tcp_places: tuple[Path, Path], images: list[bytes]
) -> None:
    """inside/a.h5 links to inside/b.h5, which reaches outside (a link, a virtual source, external
    storage): the daemon read only a.h5's links, and its worker followed b.h5's."""
    inside, outside = tcp_places
    secret = _h5(outside / "secret.h5", images)
    second_hops = {
        "link": h5py.ExternalLink(str(secret), "/images"),
        "virtual": ("virtual", secret, 2),
        "storage": ("storage", _raw(outside / "private.bin", images), 2),
    }
    with tcp_daemon.client() as client:
        for how, hop in second_hops.items():
            _h5(inside / f"b-{how}.h5", data=hop)
            first = _h5(
                inside / f"a-{how}.h5",
                labels=[0, 1],
                data=h5py.ExternalLink(str(inside / f"b-{how}.h5"), "/images"),
            )
            message = _assert_refused(hello_reply(client, _hello(first)), str(outside))
            assert "outside the daemon's dataset roots" in message and f"b-{how}.h5" in message, message
        # A chain that stays inside is served.
        _h5(inside / "b-ok.h5", images)
        fine = _h5(inside / "a-ok.h5", labels=[0, 1], data=h5py.ExternalLink("b-ok.h5", "/images"))
        _assert_welcome(hello_reply(client, _hello(fine)), 2)


def test_a_missing_absolute_target_is_not_looked_up_by_its_base_name(
    tcp_daemon: ConfinedTcpDaemon, tmp_path: Path, tcp_places: tuple[Path, Path], images: list[bytes]
) -> None:
    """A link (or a virtual source) to an absolute path that does not exist: HDF5 then opens its
    base name in the daemon's working directory, which holds secret.h5."""
    inside, _ = tcp_places
    workdir = tcp_daemon.cwd
    assert workdir is not None and (workdir / "secret.h5").is_file()
    assert Path(os.readlink(f"/proc/{tcp_daemon.daemon.pid}/cwd")) == workdir
    missing_inside = inside / "gone" / "secret.h5"
    missing_outside = tmp_path / "nowhere" / "secret.h5"
    sources = {
        "link, under the roots": h5py.ExternalLink(str(missing_inside), "/images"),
        "virtual source, under the roots": ("virtual", missing_inside, 2),
        "link, outside": h5py.ExternalLink(str(missing_outside), "/images"),
    }
    with tcp_daemon.client() as client:
        for k, hop in enumerate(sources.values()):
            path = _h5(inside / f"missing-{k}.h5", labels=[0, 1], data=hop)
            _assert_refused(hello_reply(client, _hello(path)), str(workdir), str(missing_outside))
        _assert_welcome(hello_reply(client, _hello(_h5(inside / "fine.h5", images, labels=[0, 1]))), 2)


def test_a_fifo_under_a_root_is_refused_at_once(
    tcp_daemon: ConfinedTcpDaemon, tcp_places: tuple[Path, Path], images: list[bytes]
) -> None:
    """HDF5 files whose labels' or images' external storage, link or virtual source is a FIFO under
    the root held an opening slot until index_timeout (600 s); meanwhile a legitimate hello is
    welcomed."""
    inside, _ = tcp_places
    fifo = inside / "pipe.h5"
    os.mkfifo(fifo)
    hostile = [
        _h5(inside / "labels.h5", images, labels=("storage", fifo, 2, "<i8")),
        _h5(inside / "link.h5", labels=[0, 1], data=h5py.ExternalLink(str(fifo), "/images")),
        _h5(inside / "virtual.h5", labels=[0, 1], data=("virtual", fifo, 2)),
        _h5(inside / "storage.h5", labels=[0, 1], data=("storage", fifo, 2)),
    ]
    fine = _h5(inside / "fine.h5", images, labels=[0, 1])
    clients = tcp_daemon.client
    peers = [clients() for _ in hostile]
    try:
        started = time.monotonic()
        for peer, path in zip(peers, hostile, strict=True):
            peer.send(wire.encode("hello", **_hello(path)))
        with clients() as legit:
            _assert_welcome(hello_reply(legit, _hello(fine)), 2)
        for peer, path in zip(peers, hostile, strict=True):
            assert "not a regular file" in _assert_refused(_next_answer(peer)), path
        assert time.monotonic() - started < REPLY_TIMEOUT_S * 2
    finally:
        for peer in peers:
            peer.close()


def _next_answer(client: RawClient) -> tuple[str, dict[str, Any]]:
    """The answer to a hello sent earlier, past `indexing` notes (seconds, never index_timeout)."""
    deadline = time.monotonic() + REPLY_TIMEOUT_S
    while time.monotonic() < deadline:
        reply = client.reply(timeout_s=max(0.01, deadline - time.monotonic()))
        if reply is not None and reply[0] != "indexing":
            return reply
    raise AssertionError(f"no answer to the hello within {REPLY_TIMEOUT_S:g} s")


def test_links_sources_and_storage_under_the_roots_are_served_and_read_locally(
    tcp_daemon: ConfinedTcpDaemon, tcp_places: tuple[Path, Path], images: list[bytes]
) -> None:
    """Relative links and virtual sources beside the file, external storage under the root: the
    daemon (its working directory outside the roots) serves them; read locally, unchanged."""
    inside, _ = tcp_places
    parts = inside / "parts"
    parts.mkdir()
    _h5(parts / "b.h5", images)
    _h5(parts / "src.h5", images)
    files = [
        _h5(inside / "linked.h5", labels=[0, 1], data=h5py.ExternalLink("parts/b.h5", "/images")),
        _h5(inside / "virtual.h5", labels=[0, 1], data=("virtual", "parts/src.h5", 2)),
        _h5(inside / "stored.h5", labels=[0, 1], data=("storage", _raw(parts / "raw.bin", images), 2)),
    ]
    # A cycle of links (a.h5 -> c.h5 -> a.h5) is walked once.
    _h5(inside / "c.h5", images, back=h5py.ExternalLink("cycle.h5", "/images"))
    files.append(_h5(inside / "cycle.h5", labels=[0, 1], data=h5py.ExternalLink("c.h5", "/images")))
    for path in files:
        index = HDF5(str(path)).open()
        try:
            assert [index.read_sample(i) for i in range(2)] == images, path
        finally:
            index.close()
    with tcp_daemon.client() as client:  # its working directory is outside the roots
        for path in files:
            _assert_welcome(hello_reply(client, _hello(path)), 2)


def test_the_walk_is_bounded_and_checks_links_out_of_a_root_by_a_link(
    tmp_path: Path, places: tuple[Path, Path], images: list[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    inside, outside = places
    roots = Roots((str(inside),))
    # A symbolic link under the root to a file outside, named by a second hop.
    secret = _h5(outside / "secret.h5", images)
    (inside / "alias.h5").symlink_to(secret)
    _h5(inside / "b.h5", data=h5py.ExternalLink("alias.h5", "/images"))
    first = _h5(inside / "a.h5", labels=[0, 1], data=h5py.ExternalLink("b.h5", "/images"))
    with pytest.raises(Refused, match="outside the daemon's dataset roots") as refused:
        check_before_open(HDF5(str(first)), roots)
    assert str(outside) not in str(refused.value) and str(secret) in refused.value.detail
    # A fan of files past the bound is refused, naming the bound.
    for k in range(4):
        _h5(
            inside / f"fan-{k}.h5",
            images,
            **{f"to{j}": h5py.ExternalLink(f"fan-{j}.h5", "/images") for j in range(4)},
        )
    import fastload.sources._formats.hdf5_reach as reach

    monkeypatch.setattr(reach, "MAX_FILES", 3)
    with pytest.raises(Refused, match="more than 3 HDF5 files"):
        check_before_open(HDF5(str(inside / "fan-0.h5")), roots)
    monkeypatch.setattr(reach, "MAX_FILES", 4)
    check_before_open(HDF5(str(inside / "fan-0.h5")), roots)


def test_a_daemon_worker_reads_where_the_checked_open_found_the_data_and_follows_no_link(
    places: tuple[Path, Path], images: list[bytes]
) -> None:
    """A daemon's worker (an index from the opener's segment) reads the file that holds the data,
    as the checked open found it, and follows no external link: once the file is replaced by one
    whose dataset links outside (after the check), reading fails instead of following it."""
    inside, outside = places
    _h5(inside / "b.h5", images)
    first = _h5(inside / "a.h5", labels=[0, 1], data=h5py.ExternalLink("b.h5", "/images"))
    index = HDF5(str(first)).open()
    segment = index.to_segment()
    try:
        worker = HDF5BytesIndex.from_segment(segment)
        assert (worker.root, worker.dataset) == (str(inside / "b.h5"), "/images")
        assert [worker.read_sample(i) for i in range(2)] == images
        worker.close()
        # b.h5 swapped for a link outside, after the check: the worker does not follow it.
        secret = _h5(outside / "secret.h5", images[::-1])
        (inside / "b.h5").unlink()
        _h5(inside / "b.h5", data=h5py.ExternalLink(str(secret), "/images"))
        with pytest.raises(OSError, match="external link"):
            worker.read_sample(0)
        worker.close()
        del worker
    finally:
        segment.close()
        index.close()
    # Locally (no daemon), links are followed as HDF5 follows them: nothing changed there.
    local = HDF5(str(first)).open()
    try:
        assert local.read_sample(0) == images[1]
    finally:
        local.close()
