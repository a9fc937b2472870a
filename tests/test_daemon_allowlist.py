"""The daemon's allowlist (`roots`): a real daemon, over TCP with CURVE and over ipc, serves only
files under its dataset roots, links followed and every file a source names checked (a file
list's samples, HDF5 external storage, external links and virtual sources), and its refusals
carry no content of the files it refused.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest
import zmq
from daemon_helpers import (
    ConfinedTcpDaemon,
    DaemonPool,
    RawClient,
    confined_tcp_daemon,
    free_port,
    hello_fields,
    hello_reply,
    refused_serve,
    serve_command,
)

from fastload._daemon.confine import Roots
from fastload.sources import HDF5, FileList, Source

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

SECRET = "PRIVATE-LINE-7f3a9c"


def _config(path: Path, **table: Any) -> Path:
    path.write_text("[daemon]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items()))
    return path


def _source_hello(source: Source) -> dict[str, Any]:
    return hello_fields(Path(source.where), source=json.dumps(source.resolved().to_config()))


def _fill(inside: Path, outside: Path, image_folder: Path) -> tuple[Path, Path]:
    """(inside, outside): the daemon's root, with a copy of two images, and a private folder."""
    outside.mkdir(mode=0o700)
    for k, image in enumerate(sorted(image_folder.glob("*/*.jpg"))[:2]):
        (inside / f"{k}.jpg").write_bytes(image.read_bytes())
    # A private text file that, read as a file list, would show its lines in errors.
    (outside / "secret.txt").write_text(f"/nowhere/{SECRET} 0\n{SECRET}-second 1\n")
    return inside, outside


@pytest.fixture
def places(tmp_path: Path, image_folder: Path) -> tuple[Path, Path]:
    """(inside, outside) for the tests that start no TCP daemon (or one of their own)."""
    (tmp_path / "inside").mkdir()
    return _fill(tmp_path / "inside", tmp_path / "outside", image_folder)


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfinedTcpDaemon]:
    """One daemon over TCP with CURVE for the module's tests that only send it hellos: each has a
    room of its own, `inside` (its root) and `outside` (beside it, under no root)."""
    with confined_tcp_daemon(tmp_path_factory.mktemp("tcp"), rooms=5, root_name="inside") as shared:
        yield shared


@pytest.fixture
def tcp_places(tcp_daemon: ConfinedTcpDaemon, image_folder: Path) -> tuple[Path, Path]:
    """(inside, outside) in a room of `tcp_daemon`: its root, with two images, and a private folder."""
    room = tcp_daemon.room()
    return _fill(room / "inside", room / "outside", image_folder)


def _assert_refused(reply: tuple[str, dict[str, Any]], *absent: str) -> str:
    op, fields = reply
    assert op == "error", reply
    message = str(fields["message"])
    assert "outside the daemon's dataset roots" in message or "could not" in message or "cannot" in message
    for text in (SECRET, *absent):
        assert text not in message, message
    return message


def test_tcp_peer_cannot_read_a_file_outside_the_roots(
    tcp_daemon: ConfinedTcpDaemon, tcp_places: tuple[Path, Path]
) -> None:
    inside, outside = tcp_places
    listing = inside / "list.txt"
    listing.write_text("".join(f"{p.name} 0\n" for p in sorted(inside.glob("*.jpg"))))
    daemon, client = tcp_daemon.daemon, tcp_daemon.client()
    with client:
        secret = FileList(str(outside / "secret.txt"))
        message = _assert_refused(hello_reply(client, _source_hello(secret)))
        assert "outside the daemon's dataset roots" in message and str(outside / "secret.txt") in message
        # A link inside the roots to it: resolved, refused the same way.
        (inside / "link.txt").symlink_to(outside / "secret.txt")
        _assert_refused(hello_reply(client, _source_hello(FileList(str(inside / "link.txt")))))
        # An image folder outside, and the roots' parent by '..'.
        _assert_refused(hello_reply(client, hello_fields(outside)))
        _assert_refused(hello_reply(client, hello_fields(Path(f"{inside}/../outside"))))
        # What is inside is served.
        op, fields = hello_reply(client, _source_hello(FileList(str(listing))))
        assert op == "welcome" and fields["num_samples"] == 2, fields
    assert daemon.status()["pid"] == daemon.pid


def test_dot_dot_after_a_link_is_resolved_as_the_kernel_does(places: tuple[Path, Path]) -> None:
    """`inside/dirlink/../secret.txt`, dirlink leading to `outside/sub`: the kernel opens
    `outside/secret.txt` (`..` taken after the link); as text it was `inside/secret.txt`, which
    the roots allowed. And a link the daemon may not read (EACCES) is allowed nowhere."""
    inside, outside = places
    (outside / "sub").mkdir()
    (inside / "dirlink").symlink_to(outside / "sub")
    (inside / "secret.txt").write_text("a decoy the text resolution found\n")
    sneaky = f"{inside}/dirlink/../secret.txt"
    assert Path(sneaky).read_text() == (outside / "secret.txt").read_text()
    roots = Roots((str(inside),))
    assert not roots.allows(sneaky)
    assert roots.allows(f"{inside}/dirlink/../../{inside.name}/0.jpg")  # out and back in: inside
    assert roots.allows(f"{inside}/./0.jpg") and roots.allows(f"{inside}/x/../0.jpg")
    assert not roots.allows("/proc/1/cwd/0.jpg")  # unreadable link (EACCES) or another place


def test_a_file_list_inside_naming_a_file_outside_is_refused(
    tcp_daemon: ConfinedTcpDaemon, tcp_places: tuple[Path, Path]
) -> None:
    inside, outside = tcp_places
    private = outside / "photo.jpg"
    private.write_bytes((inside / "0.jpg").read_bytes())
    listing = inside / "list.txt"
    listing.write_text(f"0.jpg 0\n{private} 1\n")
    daemon, client = tcp_daemon.daemon, tcp_daemon.client()
    with client:
        message = _assert_refused(hello_reply(client, _source_hello(FileList(str(listing)))), str(private))
        assert "sample 1's file is outside" in message, message
    # Over ipc too, when the roots are not lifted for local sessions.
    with RawClient(daemon.address) as local:
        _assert_refused(hello_reply(local, _source_hello(FileList(str(listing)))))


def _hdf5_pointing_outside(inside: Path, outside: Path, how: str) -> Path:
    """An HDF5 file under the roots whose `images` read bytes of a file outside them."""
    data = outside / "private.bin"
    data.write_bytes(SECRET.encode().ljust(64, b"\0") * 2)
    path = inside / f"{how}.h5"
    if how == "virtual":
        with h5py.File(outside / "source.h5", "w") as src:
            src.create_dataset("images", data=np.frombuffer(data.read_bytes(), "S64"))
    with h5py.File(path, "w") as f:
        if how == "external storage":
            f.create_dataset("images", shape=(2,), dtype="S64", external=[(str(data), 0, 128)])
        elif how == "external link":
            with h5py.File(outside / "linked.h5", "w") as linked:
                linked.create_dataset("images", data=np.frombuffer(data.read_bytes(), "S64"))
            f["images"] = h5py.ExternalLink(str(outside / "linked.h5"), "/images")
        else:
            layout = h5py.VirtualLayout(shape=(2,), dtype="S64")
            layout[:] = h5py.VirtualSource(str(outside / "source.h5"), "images", shape=(2,))
            f.create_virtual_dataset("images", layout)
        f.create_dataset("labels", data=np.array([0, 1], np.int64))
    return path


@pytest.mark.parametrize("how", ["external storage", "external link", "virtual"])
def test_an_hdf5_file_reaching_outside_the_roots_is_refused(
    tcp_daemon: ConfinedTcpDaemon, tcp_places: tuple[Path, Path], how: str
) -> None:
    inside, outside = tcp_places
    path = _hdf5_pointing_outside(inside, outside, how)
    daemon, client = tcp_daemon.daemon, tcp_daemon.client()
    with client:
        message = _assert_refused(hello_reply(client, _source_hello(HDF5(str(path)))), str(outside))
        assert "outside the daemon's dataset roots" in message, message
    assert daemon.status()["pid"] == daemon.pid


def test_ipc_any_path_lifts_the_roots_for_local_sessions_only(
    daemon_pool: DaemonPool, tmp_path: Path, places: tuple[Path, Path], image_folder: Path
) -> None:
    inside, _ = places
    daemon = daemon_pool.start(workers=1, extra=["--root", str(inside)])
    with RawClient(daemon.address) as local:
        _assert_refused(hello_reply(local, hello_fields(image_folder)))
    daemon.terminate()
    daemon = daemon_pool.start(tmp_path / "s-any", workers=1, extra=["--root", str(inside), "--ipc-any-path"])
    with RawClient(daemon.address) as local:
        op, fields = hello_reply(local, hello_fields(image_folder))
        assert op == "welcome", fields


def test_a_tcp_listener_needs_roots(tmp_path: Path) -> None:
    public, secret = zmq.curve_keypair()
    config = _config(
        tmp_path / "tcp.toml",
        curve_public_key=public.decode(),
        curve_secret_key=secret.decode(),
        curve_clients=[zmq.curve_keypair()[0].decode()],
    )
    sock_dir = tmp_path / "sock"
    sock_dir.mkdir(mode=0o700)
    extra = ["--listen", f"tcp://127.0.0.1:{free_port()}", "--config", str(config)]
    code, stderr = refused_serve(serve_command(sock_dir, workers=1, extra=extra))
    assert code == 1
    assert "needs dataset roots" in stderr and "Traceback" not in stderr, stderr
    assert list(sock_dir.iterdir()) == []
    for bad in ([str(tmp_path / "missing")], ["relative"], []):
        config = _config(tmp_path / "bad.toml", roots=bad)
        code, stderr = refused_serve(serve_command(sock_dir, workers=1, extra=["--config", str(config)]))
        assert code == 1 and "root" in stderr, stderr
