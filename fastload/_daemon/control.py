"""`fastload serve`, `status`, `stop` and `keys`: the daemon's command-line side.

`serve` reads its settings from flags or a TOML file; `status` and `stop` send one request to
the daemon's local socket and exit non-zero when no daemon answers.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
import tomllib
from typing import Any, TextIO

import zmq

from fastload._errors import ConfigError, DaemonError
from fastload._labels import label
from fastload._loading.link import daemon_link as wire
from fastload._loading.link.daemon_addresses import default_address, no_daemon_at, resolve_address
from fastload._machine import SHM_DIR, usable_cores
from fastload._sizes import format_size, parse_size, shown


def default_budget() -> int:
    """Half of /dev/shm: room for the daemon's rings while leaving the rest to others."""
    st = os.statvfs(SHM_DIR)
    return st.f_blocks * st.f_frsize // 2


def _number(
    table: dict[str, Any], key: str, default: Any, kind: type[int] | type[float], or_word: str = ""
) -> Any:
    """The setting `key` as an int (or a float: a number of seconds); a ConfigError naming it when
    the file gives something else (a word, a list, true), and `or_word`, a word the caller takes
    instead (`"auto"`), among what is accepted."""
    value = table.get(key, default)
    if value is None:
        return None
    whole = isinstance(value, int) and not isinstance(value, bool)
    if whole or (kind is float and isinstance(value, float)):
        return kind(value)
    accepted = "a whole number" if kind is int else "a number of seconds"
    if or_word:
        accepted += f" or {or_word}"
    raise ConfigError(f"daemon setting {key} must be {accepted}, got {shown(value)}")


def load_config(path: str | None, overrides: dict[str, Any]) -> tuple[Any, list[str]]:
    """The DaemonConfig and datasets to warm, from a TOML file's [daemon] table plus flags."""
    from fastload._daemon.config import DaemonConfig
    from fastload._daemon.confine import check_roots
    from fastload._daemon.indexes import IndexLimits
    from fastload._daemon.listeners import check_tcp_config
    from fastload._daemon.plugins import plugin_settings
    from fastload.sources._storage.remote import is_url

    table: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                table = tomllib.load(f).get("daemon", {})
        except (OSError, tomllib.TOMLDecodeError) as e:
            raise ConfigError(f"cannot read daemon configuration {path}: {e}") from e
    table.update({k: v for k, v in overrides.items() if v is not None})
    known = {
        "workers",
        "memory_budget",
        "socket_dir",
        "listen",
        "curve_secret_key",
        "curve_public_key",
        "curve_clients",
        "max_sessions",
        "max_sessions_per_peer",
        "hang_timeout",
        "index_max_files",
        "index_timeout",
        "index_idle",
        "index_memory",
        "index_parallel",
        "datasets",
        "roots",
        "ipc_any_path",
        "metrics",
        "log_format",
        "cache_dir",
        "cache_limit",
        "plugins",
    }
    unknown = set(table) - known
    if unknown:
        raise ConfigError(f"unknown daemon settings: {', '.join(sorted(unknown))}")
    listen = table.get("listen")
    if listen is not None and not str(listen).startswith("tcp://"):
        raise ConfigError(f"listen must be tcp://HOST:PORT, got {listen!r}")
    roots_value = table.get("roots")
    if roots_value is not None and (
        not isinstance(roots_value, list | tuple) or not all(isinstance(r, str) for r in roots_value)
    ):
        raise ConfigError(f"roots must be a list of directories or URL prefixes, got {roots_value!r}")
    roots = None if roots_value is None else tuple(
        r if is_url(r) else os.path.abspath(r) for r in roots_value
    )
    cache_dir = table.get("cache_dir")  # NOTE [the daemon's cache] in `sessions`
    if cache_dir is not None and (not isinstance(cache_dir, str) or not os.path.isabs(cache_dir)):
        raise ConfigError(f"cache_dir (the remote data's cache) must be an absolute path, got {cache_dir!r}")
    cache_limit = table.get("cache_limit")
    if not isinstance(table.get("ipc_any_path", False), bool):
        raise ConfigError("ipc_any_path must be true or false")
    if listen is not None:  # the keys first, then the roots: what a TCP listener needs, in order
        check_tcp_config(
            table.get("curve_secret_key"),
            table.get("curve_public_key"),
            tuple(table.get("curve_clients", ())),
        )
    check_roots(listen, roots)
    metrics = table.get("metrics")
    if metrics is not None:
        from fastload._metrics_seam import parse_address

        metrics = parse_address(metrics)
    auto_workers = table.get("workers") == "auto"  # NOTE [a pool that follows need]
    config = DaemonConfig(
        workers=usable_cores() if auto_workers else _number(table, "workers", usable_cores(), int, '"auto"'),
        tune_workers=auto_workers,
        memory_budget_bytes=parse_size(
            table.get("memory_budget", default_budget()), "memory_budget (--memory-budget)", minimum=1
        ),
        socket_dir=table.get("socket_dir"),
        listen=listen,
        curve_secret_key=table.get("curve_secret_key"),
        curve_public_key=table.get("curve_public_key"),
        curve_clients=tuple(table.get("curve_clients", ())),
        max_sessions=_number(table, "max_sessions", 64, int),
        max_sessions_per_peer=_number(table, "max_sessions_per_peer", 8, int),
        hang_timeout_s=_number(table, "hang_timeout", None, float),
        index=IndexLimits(
            max_files=_number(table, "index_max_files", IndexLimits.max_files, int),
            timeout_s=_number(table, "index_timeout", IndexLimits.timeout_s, float),
            memory_bytes=parse_size(
                table.get("index_memory", IndexLimits.memory_bytes), "index_memory", minimum=64 << 20
            ),
            parallel=_number(table, "index_parallel", IndexLimits.parallel, int),
        ),
        roots=roots,
        ipc_any_path=bool(table.get("ipc_any_path", False)),
        index_idle_s=_number(table, "index_idle", 60.0, float),
        metrics=metrics,
        cache_dir=cache_dir,
        cache_limit=None if cache_limit is None else parse_size(cache_limit, "cache_limit", minimum=1),
        plugins=plugin_settings(table.get("plugins", [])),
    )
    if config.workers < 1:
        raise ConfigError("the daemon needs at least one worker")
    if config.max_sessions < 1 or config.max_sessions_per_peer < 1:
        raise ConfigError("max_sessions and max_sessions_per_peer must be at least 1")
    if config.hang_timeout_s is not None and not 0 <= config.hang_timeout_s < float("inf"):
        raise ConfigError(
            f"hang_timeout must be a number of seconds >= 0 (0: off), got {config.hang_timeout_s}"
        )
    if config.index.max_files < 1 or not 0 < config.index.timeout_s < float("inf") or config.index_idle_s < 0:
        raise ConfigError("index_max_files and index_timeout must be positive, index_idle >= 0")
    if config.index.parallel < 1:
        raise ConfigError("index_parallel must be at least 1")
    return config, [str(d) for d in table.get("datasets", ())]


def serve(config_path: str | None, overrides: dict[str, Any]) -> int:
    """Run the daemon in the foreground until SIGTERM/SIGINT or `fastload stop`."""
    from fastload._daemon.logs import configure
    from fastload._daemon.server import Daemon

    log_format = overrides.get("log_format")
    configure(log_format or "text")  # the flag's format from the first line; the file's once read
    config, datasets = load_config(config_path, overrides)
    if log_format is None and config_path is not None:
        with open(config_path, "rb") as f:
            configure(str(tomllib.load(f).get("daemon", {}).get("log_format", "text")))
    daemon = Daemon(config)
    if config.roots is None:
        logging.getLogger("fastload.daemon").warning(
            "no dataset roots: local sessions may name any file this user can read "
            "(set `roots`, or --root DIR)"
        )
    try:
        for path in datasets:
            entry = daemon.warm(path)
            logging.getLogger("fastload.daemon").info("warmed %s: %d images", path, len(entry.index))
    except BaseException:
        daemon.close()
        raise
    daemon.serve_forever()
    return 0


def request(address: str, op: str, timeout_s: float = 3.0) -> dict[str, Any]:
    """Send one request to a daemon and return the reply's fields (DaemonError if none)."""
    if no_daemon_at(address):
        raise DaemonError(f"no fastload daemon is running at {address}")
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(address)
        sock.send(wire.encode(op))
        if not sock.poll(int(timeout_s * 1000)):
            raise DaemonError(f"no fastload daemon answers at {address}")
        reply_op, fields = wire.decode(sock.recv_multipart()[0])
        if reply_op == "error":
            raise DaemonError(fields["message"])
        return fields
    finally:
        sock.close(0)
        ctx.term()


def status(address: str | None, out: TextIO | None = None, as_json: bool = False) -> int:
    """Print the daemon's sessions (to `out`, default sys.stdout), or with `as_json` its whole status
    as one JSON object with `healthy` (and `reason` when not).

    The exit status is what a container's health check reads: 0 while the daemon answers and
    serves, 1 when none answers (within 3 s) or it is draining to exit."""
    out = out or sys.stdout
    target = resolve_address(address) if address else default_address()
    try:
        s = request(target, "status")
    except DaemonError as e:
        if not as_json:
            raise
        out.write(json.dumps({"healthy": False, "reason": str(e), "address": target}) + "\n")
        return 1
    healthy = not s["draining"]
    if as_json:
        reason = {} if healthy else {"reason": "draining: finishing its last batches before it exits"}
        out.write(json.dumps({"healthy": healthy, **reason, "address": target, **s}) + "\n")
        return 0 if healthy else 1
    out.write(
        f"fastload daemon pid {s['pid']}: {s['workers']} workers, "
        f"memory {format_size(s['used_bytes'])} of {format_size(s['budget_bytes'])}"
        f"{', draining' if s['draining'] else ''}, {len(s['sessions'])} session(s)\n"
    )
    deaths = s["worker_deaths"]
    if any(deaths.values()):
        out.write(
            f"workers replaced: {deaths.get('crash', 0)} crashed, {deaths.get('hang', 0)} hung, "
            f"{deaths.get('external', 0)} killed from outside\n"
        )
    for d in s["datasets"]:
        out.write(
            f"dataset {label(d['path'])}: {d['state']}, {d['images']} images, {format_size(d['bytes'])}, "
            f"{d['sessions']} session(s)\n"
        )
    if s["sessions"]:
        out.write(
            f"{'session':>7} {'pid':>7} {'rank':>7} {'epoch.batch':>11} {'images':>9} {'img/s':>8} "
            f"{'MiB':>6} {'weight':>6} {'need':>5} {'share':>5}  dataset\n"
        )
        for x in s["sessions"]:
            position = f"{x['epoch']}.{x['batch']}" if x["batch"] >= 0 else "-"
            out.write(
                f"{x['session']:>7} {x['pid']:>7} {x['rank']:>3}/{x['world_size']:<3} {position:>11} "
                f"{x['images']:>9} {x['images_per_s']:>8.0f} {x['memory_bytes'] / 2**20:>6.0f} "
                f"{_share_columns(x)}  {label(x['dataset'])}\n"
            )
    return 0 if healthy else 1


def _share_columns(row: dict[str, Any]) -> str:
    """A session's weight, need (`*`: inferred from its slots, no report from its trainer yet) and
    share of the pool over the last interval (NOTE [shares by need]); dashes from an older daemon."""
    if "weight" not in row:
        return f"{'-':>6} {'-':>5} {'-':>5}"
    need = f"{row['need']:.1f}{'*' if row.get('need_from') == 'slots' else ''}"
    return f"{row['weight']:>6.2f} {need:>5} {row['share']:>5.0%}"


def stop(address: str | None, wait_s: float = 40.0) -> int:
    """Ask the local daemon to drain and exit; wait until its socket is gone."""
    target = resolve_address(address) if address else default_address()
    request(target, "stop")
    path = target[len("ipc://") :] if target.startswith("ipc://") else None
    deadline = time.monotonic() + wait_s
    while path and os.path.exists(path) and time.monotonic() < deadline:
        time.sleep(0.05)
    return 0


def keys(out: TextIO | None = None) -> int:
    """Print a new CURVE key pair (Z85) for a TCP daemon or one of its clients."""
    out = out or sys.stdout
    public, secret = zmq.curve_keypair()
    out.write(f'public_key = "{public.decode()}"\nsecret_key = "{secret.decode()}"\n')
    return 0
