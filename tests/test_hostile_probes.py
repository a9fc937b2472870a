"""Last round's allowlist probes (issue 20, re-run in issue 29), on one real daemon over TCP with
CURVE confined to one root: every hello naming something outside it — a URL (the cloud metadata
address, a loopback store), `..`, `/proc/self/root`, `/proc/self/fd`, a link to a list or a pack
outside, a FIFO or `/dev/zero` as a list, a brace bomb, `num_classes` 2**62 — is answered with an
`error` that carries none of the outside files' content, no request reaches a store, and the
daemon then serves a legitimate hello.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
from daemon_helpers import DaemonPool, hello_fields, hello_reply, start_tcp_daemon

pytestmark = [pytest.mark.hostile, pytest.mark.timeout(120)]

SECRET = "never-shown-4b1d"


class _Counting(BaseHTTPRequestHandler):
    requests: ClassVar[list[str]] = []  # each subclass (one store) gets its own

    def do_GET(self) -> None:
        self.requests.append(self.path)
        self.send_response(200)
        self.end_headers()
        self.wfile.write(f"{SECRET} 0\n".encode())

    do_HEAD = do_GET

    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def store() -> Iterator[tuple[str, list[str]]]:
    """A loopback HTTP store that records every request it gets; (its base URL, the requests)."""
    handler = type("Store", (_Counting,), {"requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", handler.requests
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def _source(folder: Path, **source: Any) -> dict[str, Any]:
    """A hello of the source described by `source` (sent as written: no local checks first)."""
    named = str(source.get("path", source.get("paths", "")))
    return hello_fields(folder, dataset=named, source=json.dumps(source))


def test_last_rounds_probes_are_refused_without_content_and_the_daemon_serves_on(
    daemon_pool: DaemonPool, tmp_path: Path, image_folder: Path, store: tuple[str, list[str]]
) -> None:
    base, requests = store
    inside, outside = tmp_path / "inside", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir(mode=0o700)
    images = sorted(image_folder.glob("*/*.jpg"))[:2]
    for k, image in enumerate(images):
        (inside / f"{k}.jpg").write_bytes(image.read_bytes())
    (inside / "list.txt").write_text("0.jpg 0\n1.jpg 1\n")
    (outside / "secret.txt").write_text(f"/nowhere/{SECRET} 0\n")
    (outside / "pack").mkdir()
    (outside / "pack" / "manifest.json").write_text(json.dumps({"note": SECRET}))
    (inside / "list-link.txt").symlink_to(outside / "secret.txt")
    (inside / "pack-link").symlink_to(outside / "pack")
    os.mkfifo(inside / "fifo.txt")
    probes = {
        "the cloud metadata address": _source(
            inside, kind="file_list", path="http://169.254.169.254/latest/meta-data/"
        ),
        "a loopback store": _source(inside, kind="file_list", path=f"{base}/list.txt"),
        "a pack at a loopback store": _source(inside, kind="packed", path=f"{base}/pack"),
        "'..' out of the root": _source(inside, kind="file_list", path=f"{inside}/../outside/secret.txt"),
        "/proc/self/root": _source(inside, kind="file_list", path=f"/proc/self/root{outside}/secret.txt"),
        "/proc/self/fd": _source(inside, kind="file_list", path="/proc/self/fd/0"),
        "a list linked out": _source(inside, kind="file_list", path=str(inside / "list-link.txt")),
        "a pack linked out": _source(inside, kind="packed", path=str(inside / "pack-link")),
        "a FIFO as the list": _source(inside, kind="file_list", path=str(inside / "fifo.txt")),
        "/dev/zero as the list": _source(inside, kind="file_list", path="/dev/zero"),
        "a brace bomb": _source(inside, kind="tar", paths=f"{inside}/" + "{0..9999}" * 4 + ".tar"),
        "a folder outside": hello_fields(outside),
        "num_classes 2**62": _source(
            inside, kind="file_list", path=str(inside / "list.txt"), multi_label=True, num_classes=2**62
        ),
    }
    _, client_of = start_tcp_daemon(daemon_pool, tmp_path, roots=[str(inside)])
    with client_of() as client:
        for what, hello in probes.items():
            reply = hello_reply(client, hello, timeout_s=60)
            assert reply[0] == "error", (what, reply)
            message = str(reply[1]["message"])
            assert SECRET not in message, (what, message)
            if str(outside) not in json.dumps(hello):  # where a link led is never told
                assert str(outside) not in message, (what, message)
            assert not message.startswith("internal error"), (what, message)
        op, fields = hello_reply(client, _source(inside, kind="file_list", path=str(inside / "list.txt")))
        assert op == "welcome" and fields["num_samples"] == 2, fields
    assert requests == [], f"a probe reached the store: {requests}"
