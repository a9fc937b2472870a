"""Fixtures: small photo-like image folders, and the leak guards every test runs under.

Leak guards (autouse; they run at teardown, so also after a test that failed):
- after each test, no `/dev/shm/fastload_<this pid>_*` segment and no engine socket directory
  of this process is left, and no child process of pytest is still alive: every loader a test
  makes must be closed (`with FastLoader(...)`);
- at the end of the session, no segment created during the run is left behind, by this process
  or by any process that has since died (the subprocess tests), and no child process is alive.
A leak is reported as an error, which fails the session; it is then cleaned up so that later
tests are not blamed for it.

Under pytest-xdist (`-n 8`) each worker is a session of its own, and one that ends early would
take the segments of another worker's subprocess, killed mid-test and not yet reaped, for its
leak (and unlink them under that test): a worker checks its own segments and children, and the
segments of dead processes are checked once every worker has ended, by the controller.

Daemon fixtures (`daemon_pool`, `shared_daemon`) run `fastload serve` subprocesses on private
socket directories and stop them at teardown, checking that each left nothing behind; a module
whose tests only send hellos shares one (`shared_daemon`, or daemon_helpers' `confined_tcp_daemon`
over TCP with a root per test) rather than paying a daemon start (~1.7 s of CPU) per test.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from daemon_helpers import DaemonPool, DaemonProcess
from helpers import (
    build_folder,
    engine_socket_dirs,
    fastload_segments,
    kill_pids,
    live_children,
    pid_alive,
    segment_owner,
    unlink_segments,
    wait_children_gone,
)

# How long a test's child processes may take to exit after it: a bound for a leak, not a speed
# limit (the wait returns as soon as they are gone; a busy machine can take seconds).
CHILD_GRACE_S = 20.0


def _xdist_worker(config: pytest.Config) -> bool:
    """Whether this session is a pytest-xdist worker's, one of several running at once."""
    return hasattr(config, "workerinput")


def _xdist_controller(config: pytest.Config) -> bool:
    """Whether this session hands its tests to pytest-xdist workers and runs none itself."""
    return not _xdist_worker(config) and config.getoption("dist", "no") != "no"


def _leaked_segments(before: set[str], dead_owners: bool) -> set[str]:
    """Segments made since `before` by this process, and by processes now dead if `dead_owners`.
    Those of unrelated live processes (a demo running beside the tests) are theirs to free."""
    return {
        name
        for name in fastload_segments() - before
        if segment_owner(name) == os.getpid() or (dead_owners and not pid_alive(segment_owner(name)))
    }


@pytest.fixture(scope="session", autouse=True)
def _no_leaks_at_session_end(request: pytest.FixtureRequest) -> Iterator[None]:
    segments_before = fastload_segments()
    children_before = set(live_children())
    yield
    problems = []
    children = wait_children_gone(children_before, CHILD_GRACE_S)
    if children:
        problems.append(f"child processes still alive at the end of the session: {children}")
        kill_pids(children)
    # Ours, and those of processes now dead (our subprocesses), must all be gone; under xdist the
    # dead processes' are the controller's to check (pytest_sessionfinish).
    leaked = _leaked_segments(segments_before, dead_owners=not _xdist_worker(request.config))
    if leaked:
        problems.append(f"shared-memory segments left in /dev/shm: {sorted(leaked)}")
        unlink_segments(leaked)
    if problems:
        pytest.fail("the test session leaked resources:\n" + "\n".join(problems), pytrace=False)


_SEGMENTS_BEFORE = pytest.StashKey[set[str]]()


def pytest_sessionstart(session: pytest.Session) -> None:
    if _xdist_controller(session.config):
        session.config.stash[_SEGMENTS_BEFORE] = fastload_segments()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Under xdist, after every worker has ended: no segment of a dead process is left."""
    if not _xdist_controller(session.config) or _SEGMENTS_BEFORE not in session.config.stash:
        return
    leaked = _leaked_segments(session.config.stash[_SEGMENTS_BEFORE], dead_owners=True)
    if leaked:
        unlink_segments(leaked)
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        message = f"the test session leaked shared-memory segments of dead processes: {sorted(leaked)}"
        if reporter is not None:
            reporter.write_line(message, red=True)
        else:
            print(message, file=sys.stderr)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.fixture(autouse=True)
def _no_leaks_per_test() -> Iterator[None]:
    children_before = set(live_children())
    yield
    problems = []
    leaked = fastload_segments(os.getpid())
    if leaked:
        problems.append(
            f"segments of this process left after the test (loader not closed?): {sorted(leaked)}"
        )
        unlink_segments(leaked)
    sockets = engine_socket_dirs(os.getpid())
    if sockets:
        problems.append(f"engine socket directories left after the test: {sorted(sockets)}")
        for path in sockets:
            shutil.rmtree(path, ignore_errors=True)
    children = wait_children_gone(children_before, CHILD_GRACE_S)
    if children:
        problems.append(f"child processes still alive after the test: {children}")
        kill_pids(children)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="session", autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Caches the suite makes (tar shard scans) go to a temporary directory, not the user's."""
    before = os.environ.get("FASTLOAD_CACHE_DIR")
    os.environ["FASTLOAD_CACHE_DIR"] = str(tmp_path_factory.mktemp("cache"))
    yield
    if before is None:
        del os.environ["FASTLOAD_CACHE_DIR"]
    else:
        os.environ["FASTLOAD_CACHE_DIR"] = before


@pytest.fixture(scope="session")
def image_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """3 classes x 8 images (24), mixed sizes incl. portrait, grayscale JPEGs and one PNG."""
    return build_folder(tmp_path_factory.mktemp("image_folder"))


@pytest.fixture
def make_folder(tmp_path: Path) -> Callable[..., Path]:
    """Build a fresh folder (which the test may then damage) under the test's tmp_path."""

    def make(classes: int = 3, per_class: int = 4, seed: int = 1, name: str = "data") -> Path:
        return build_folder(tmp_path / name, classes, per_class, seed)

    return make


@pytest.fixture
def daemon_pool(tmp_path: Path) -> Iterator[DaemonPool]:
    """Start daemons for one test (`daemon_pool.start(...)`); all are stopped and checked after it."""
    pool = DaemonPool(tmp_path)
    yield pool
    problems = pool.close()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(scope="module")
def shared_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DaemonProcess]:
    """One daemon (2 workers, 64 MiB budget) for the tests of a module that leave it running."""
    pool = DaemonPool(tmp_path_factory.mktemp("daemon"))
    yield pool.start(workers=2, budget="64MiB")
    problems = pool.close()
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)
