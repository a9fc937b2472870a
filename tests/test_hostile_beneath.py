"""A sample under a daemon's dataset roots replaced by a link to a file outside them, after the
index was checked: a real daemon with `--root`, over TCP with CURVE, whose workers open samples
beneath the roots (`sources/_beneath`), so the batch of that sample fails with the refusal
(nothing of the outside file reaches the peer), for the session that was welcomed before the swap
and for a later hello served from the cached index; links that stay under the root still work.
The swap is made by another uid, which can write under the root but cannot read the outside file
itself. Then the opener alone (with openat2, and with its fallback forced), and each index that
opens files (a tar shard, an HDF5 file), and the opener's check of what it scanned.
"""

from __future__ import annotations

import dataclasses
import errno
import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from daemon_helpers import ConfinedTcpDaemon, RawClient, confined_tcp_daemon, hello_fields
from helpers import write_tar_shards

from fastload._daemon.confine import Refused, Roots, check_identities, check_index
from fastload._loading.link import daemon_link as wire
from fastload.sources import HDF5, FileList, TarShards
from fastload.sources._formats.hdf5_indexes import HDF5BytesIndex
from fastload.sources._indexes.sample_index import ReadFailure
from fastload.sources._storage import beneath as _beneath
from fastload.sources._storage.beneath import Beneath

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

ATTACKER_UID = 4242
REPLY_S = 60.0


@pytest.fixture(scope="module")
def tcp_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ConfinedTcpDaemon]:
    """One daemon confined to a root per test, listening on TCP with CURVE."""
    with confined_tcp_daemon(tmp_path_factory.mktemp("tcp"), rooms=2) as shared:
        yield shared


@pytest.fixture
def places(tcp_daemon: ConfinedTcpDaemon, image_folder: Path) -> tuple[Path, Path]:
    """(root, secret): a root of `tcp_daemon` holding a class folder `data/a` of 4 images (written
    to by the attacker's uid) and a file list of them; an image in a private folder outside."""
    room = tcp_daemon.room()
    root, outside = room / "root", room / "outside"
    images = sorted(image_folder.glob("*/*.jpg"))
    (root / "data" / "a").mkdir(parents=True)
    for k, image in enumerate(images[:4]):
        (root / "data" / "a" / f"{k}.jpg").write_bytes(image.read_bytes())
    (root / "data" / "a").chmod(0o777)  # the attacker may write there (no sticky bit)
    (root / "list.txt").write_text("".join(f"data/a/{k}.jpg {k}\n" for k in range(4)))
    outside.mkdir(mode=0o700)
    secret = outside / "secret.jpg"
    secret.write_bytes(images[5].read_bytes())
    return root, secret


def _swap_as_attacker(directory: Path, name: str, target: Path) -> None:
    """Replace `directory/name` by a link to `target`, atomically, as ATTACKER_UID (in a forked
    child, through a descriptor of the directory: the attacker cannot reach it by path)."""
    dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 1
            try:
                os.setgroups([])
                os.setgid(ATTACKER_UID)
                os.setuid(ATTACKER_UID)
                try:
                    os.close(os.open(target, os.O_RDONLY))
                    code = 3  # the attacker could read it itself: no attack to show
                except PermissionError:
                    os.symlink(target, f".{name}.swap", dir_fd=dir_fd)
                    os.replace(f".{name}.swap", name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
                    code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
    finally:
        os.close(dir_fd)
    assert os.path.islink(directory / name) and os.stat(directory / name).st_ino == target.stat().st_ino


def _welcome(client: RawClient, fields: dict[str, Any]) -> dict[str, Any]:
    """Send a hello and return the welcome's fields (the session stays open)."""
    reply = client.call(wire.encode("hello", **fields), timeout_s=REPLY_S)
    while reply is not None and reply[0] == "indexing":
        reply = client.reply(REPLY_S)
    assert reply is not None and reply[0] == "welcome", reply
    return reply[1]


def _load(client: RawClient, welcome: dict[str, Any], seq: int, index: int) -> tuple[str, dict[str, Any]]:
    """Ask for a batch of the one sample `index`; its `done` or `failed` reply."""
    header = wire.encode("task", seq=seq, epoch=0, batch_index=seq, slot=welcome["slots"][0], row=0)
    reply = client.call(header, np.array([index], "<i8").tobytes(), timeout_s=REPLY_S)
    assert reply is not None and reply[0] in ("done", "failed"), reply
    return reply


def _assert_refused(reply: tuple[str, dict[str, Any]], secret: Path) -> None:
    op, fields = reply
    assert op == "failed", reply
    assert "outside the daemon's dataset roots" in fields["message"], fields
    for text in (fields["message"], fields["path"], fields["traceback"]):
        assert str(secret) not in text and "outside" + os.sep not in text, fields


@pytest.mark.parametrize("kind", ["file_list", "folder"])
def test_a_sample_swapped_for_a_link_outside_after_the_hello_is_refused(
    tcp_daemon: ConfinedTcpDaemon, places: tuple[Path, Path], kind: str
) -> None:
    root, secret = places
    if kind == "file_list":
        source = FileList(str(root / "list.txt")).resolved().to_config()
        fields = hello_fields(root / "list.txt", source=json.dumps(source))
    else:
        fields = hello_fields(root / "data")
    swapped = 1  # the index is sorted the same way for both: data/a/1.jpg is sample 1
    with tcp_daemon.client() as client:
        welcome = _welcome(client, fields)
        assert welcome["num_samples"] == 4
        assert _load(client, welcome, 1, swapped)[0] == "done"  # read before the swap
        _swap_as_attacker(root / "data" / "a", f"{swapped}.jpg", secret)
        _assert_refused(_load(client, welcome, 2, swapped), secret)
        assert _load(client, welcome, 3, 0)[0] == "done"  # the others are still served
        client.send(wire.encode("bye"))
    # A later hello is served from the index made (and checked) before the swap: no race needed.
    # Links that stay under the root are still followed, relative or absolute.
    folder = root / "data" / "a"
    (folder / "2.jpg").unlink()
    (folder / "2.jpg").symlink_to("0.jpg")
    (folder / "3.jpg").unlink()
    (folder / "3.jpg").symlink_to(folder / "0.jpg")
    with tcp_daemon.client() as client:
        welcome = _welcome(client, fields)
        _assert_refused(_load(client, welcome, 1, swapped), secret)
        for seq, index in enumerate((0, 2, 3), 2):
            assert _load(client, welcome, seq, index)[0] == "done"
        client.send(wire.encode("bye"))


# -- the opener itself, and each index that opens files, without a daemon ------------------------


@pytest.fixture
def tree(tmp_path: Path) -> tuple[Path, Path]:
    """(root, outside): a root with a file, links of every kind, and a private file outside."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    (root / "sub" / "a.bin").write_bytes(b"inside")
    (outside / "secret.bin").write_bytes(b"SECRET")
    (root / "rel_in").symlink_to("sub/a.bin")
    (root / "abs_in").symlink_to(root / "sub" / "a.bin")
    (root / "abs_out").symlink_to(outside / "secret.bin")
    (root / "rel_out").symlink_to("../outside/secret.bin")
    (root / "dir_out").symlink_to(outside)
    return root, outside


def _forced_fallback(monkeypatch: pytest.MonkeyPatch) -> None:
    """A kernel (or seccomp filter) without openat2: every call fails with ENOSYS."""

    def missing(*args: object) -> int:
        raise OSError(errno.ENOSYS, os.strerror(errno.ENOSYS))

    monkeypatch.setattr(_beneath, "_openat2", missing)


@pytest.mark.parametrize("how", ["openat2", "fallback"])
def test_beneath_opens_only_files_under_the_roots(
    tree: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch, how: str
) -> None:
    root, outside = tree
    if how == "fallback":
        _forced_fallback(monkeypatch)
    beneath = Beneath((str(root),))
    try:
        for name in ("sub/a.bin", "rel_in", "abs_in", "sub/../rel_in"):
            fd = beneath.open(str(root / name))
            assert os.read(fd, 100) == b"inside"
            os.close(fd)
        assert beneath._openat2 is (how == "openat2")
        for name in ("abs_out", "rel_out", "dir_out/secret.bin", "sub/../../outside/secret.bin"):
            with pytest.raises(OSError) as refused:
                beneath.open(str(root / name))
            assert refused.value.errno == errno.EXDEV
            assert "outside the daemon's dataset roots" in str(refused.value)
            assert str(outside) not in str(refused.value)
        with pytest.raises(OSError) as refused:
            beneath.open(str(outside / "secret.bin"))  # not under the roots at all
        assert refused.value.errno == errno.EXDEV
        with pytest.raises(FileNotFoundError, match="missing"):
            beneath.open(str(root / "sub" / "missing"))
    finally:
        beneath.close()


def test_beneath_travels_without_its_descriptors(tree: tuple[Path, Path]) -> None:
    root, _ = tree
    beneath = Beneath((str(root), "s3://bucket/data/"))
    os.close(beneath.open(str(root / "sub" / "a.bin")))
    copy = pickle.loads(pickle.dumps(beneath))
    assert copy.roots == (str(root.resolve()),)  # a URL root holds no local file
    os.close(copy.open(str(root / "abs_in")))
    for b in (beneath, copy):
        b.close()


def test_a_shard_swapped_for_a_link_outside_is_refused(image_folder: Path, tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (shard,) = write_tar_shards(image_folder, root, per_shard=24)
    outside.mkdir()
    elsewhere = outside / "other.tar"
    elsewhere.write_bytes(shard.read_bytes())
    index = dataclasses.replace(TarShards(str(shard)).open(), beneath=Beneath((str(root),)))
    assert len(index.read(np.array([0, 5]))) == 2
    index.close()
    shard.unlink()
    shard.symlink_to(elsewhere)
    with pytest.raises(ReadFailure) as failed:
        index.read(np.array([3]))
    assert failed.value.cause.errno == errno.EXDEV  # type: ignore[attr-defined]
    assert str(outside) not in str(failed.value.cause)
    index.close()


def test_an_hdf5_file_swapped_for_a_link_outside_is_refused(image_folder: Path, tmp_path: Path) -> None:
    h5py = pytest.importorskip("h5py")
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    blobs = [p.read_bytes() for p in sorted(image_folder.glob("*/*.jpg"))[:3]]
    for path in (root / "data.h5", outside / "other.h5"):
        with h5py.File(path, "w") as f:
            images = f.create_dataset("images", (3,), dtype=h5py.vlen_dtype(np.uint8))
            for k, blob in enumerate(blobs):
                images[k] = np.frombuffer(blob, np.uint8)
            f.create_dataset("labels", data=np.arange(3, dtype=np.int64))
    index = HDF5(str(root / "data.h5")).open()
    assert isinstance(index, HDF5BytesIndex)
    index = dataclasses.replace(index, beneath=Beneath((str(root),)))
    assert bytes(index.read(np.array([1]))[0]) == blobs[1]
    index.close()
    (root / "data.h5").unlink()
    (root / "data.h5").symlink_to(outside / "other.h5")
    with pytest.raises(ReadFailure) as failed:
        index.read(np.array([1]))
    assert failed.value.cause.errno == errno.EXDEV  # type: ignore[attr-defined]
    # What HDF5 opened by path is checked too (a link swapped in after the open beneath).
    beneath = Beneath((str(root),))
    fd = os.open(outside / "other.h5", os.O_RDONLY)
    try:
        with pytest.raises(OSError, match="outside the daemon's dataset roots"):
            beneath.check_opened(fd, str(root / "data.h5"))
    finally:
        os.close(fd)
    index.close()


def test_a_shard_scanned_through_a_link_outside_is_refused_when_checked(
    image_folder: Path, tmp_path: Path
) -> None:
    """The daemon's opener scans a shard that was swapped for a link out after `check_before_open`
    and swapped back before `check_index`: the identity of what it scanned gives it away."""
    root, outside = tmp_path / "root", tmp_path / "outside"
    (shard,) = write_tar_shards(image_folder, root, per_shard=24)
    outside.mkdir()
    elsewhere = outside / "other.tar"
    elsewhere.write_bytes(shard.read_bytes())
    roots = Roots((str(root),))
    kept = root / "kept.tar"
    shard.rename(kept)
    shard.symlink_to(elsewhere)  # swapped in for the scan
    index = TarShards(str(shard)).open()
    shard.unlink()
    kept.rename(shard)  # and back before the check
    with pytest.raises(Refused, match="data file 0 changed while it was indexed") as refused:
        check_index(index, roots, "tar source")
    assert str(outside) not in str(refused.value)
    # Left a link out, it is refused as outside (by the path check, and beneath).
    shard.unlink()
    shard.symlink_to(elsewhere)
    with pytest.raises(Refused, match="outside"):
        check_index(index, roots, "tar source")
    with pytest.raises(Refused, match="outside"):
        check_identities(index.files, index.file_identities, roots, "tar source")
    # As it is, it is served.
    shard.unlink()
    kept = root / "other.tar"
    kept.write_bytes(elsewhere.read_bytes())
    shard.symlink_to("other.tar")  # a link inside is fine
    check_index(TarShards(str(shard)).open(), roots, "tar source")


def test_a_root_that_is_gone_holds_nothing_and_the_others_still_open(
    tree: tuple[Path, Path], tmp_path: Path
) -> None:
    root, _ = tree
    gone = tmp_path / "gone"
    beneath = Beneath((str(gone), str(root)))
    try:
        os.close(beneath.open(str(root / "abs_in")))
        with pytest.raises(FileNotFoundError) as missing:
            beneath.open(str(gone / "a.bin"))
        assert missing.value.filename == str(gone / "a.bin")
    finally:
        beneath.close()
