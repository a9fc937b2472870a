"""What `fastload serve` runs with: `DaemonConfig` (command line or `--config fastload.toml`,
read by `control`), and the node cache settings it puts in the environment of its processes."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from fastload._daemon.indexes import IndexLimits


@dataclass(frozen=True)
class DaemonConfig:
    """What `fastload serve` runs with (command line or `--config fastload.toml`)."""

    workers: int  # the pool's size; with `tune_workers`, its start and most
    memory_budget_bytes: int
    socket_dir: str | None = None  # default: runtime_dir()
    listen: str | None = None  # tcp://HOST:PORT, only when asked for
    curve_secret_key: str | None = None  # Z85; required with `listen`
    curve_public_key: str | None = None
    curve_clients: tuple[str, ...] = ()  # Z85 public keys allowed over TCP
    max_sessions: int = 64
    max_sessions_per_peer: int = 8  # per trainer process (local) or CURVE key (TCP)
    hang_timeout_s: float | None = None  # floor of the workers' hang bound (None: default; 0: off)
    index: IndexLimits = field(default_factory=IndexLimits)
    index_idle_s: float = 60.0  # an index no session used for this long is dropped
    # The allowlist (`confine`): directories whose files the daemon may serve. None: any path the
    # daemon's user can read, over ipc only (a TCP listener requires roots); with roots,
    # `ipc_any_path` lifts them for the local socket (whose peers run as the daemon's user).
    roots: tuple[str, ...] | None = None
    ipc_any_path: bool = False
    # Prometheus metrics (`_diagnostics.metrics`) served on (host, port), only when asked for.
    metrics: tuple[str, int] | None = None
    # The daemon's caches (NOTE [the daemon's cache] in `sessions`): the directory they live in (as
    # FASTLOAD_CACHE_DIR: remote chunks, tar scans) and the node cache's limit in bytes; None:
    # the environment's. A peer's source never sets them.
    cache_dir: str | None = None
    cache_limit: int | None = None
    # Modules and .py files imported at start, before the workers fork (`plugins`): the source
    # kinds and transforms they declare are served. The administrator's only (NOTE [plugins are
    # the administrator's]).
    plugins: tuple[str, ...] = ()
    # `workers = "auto"`: the pool sized by the sessions' need (NOTE [a pool that follows need]).
    tune_workers: bool = False


def use_cache_settings(config: DaemonConfig) -> None:
    """The daemon's node cache settings as every process of it will read them: the environment,
    which its workers and its fork server (started later) inherit (NOTE [the daemon's cache])."""
    if config.cache_dir is not None:
        os.environ["FASTLOAD_CACHE_DIR"] = config.cache_dir
    if config.cache_limit is not None:
        os.environ["FASTLOAD_CACHE_LIMIT"] = str(config.cache_limit)
