"""Where a daemon is: this user's default socket, an address as a loader names it, and whether a
local socket has a daemon behind it. Kept apart from the client (which imports torch through the
batch layout) so that `fastload status` and `stop` start in a fraction of a second.
"""

from __future__ import annotations

import os
import socket

from fastload._errors import DaemonError
from fastload._paths import daemon_dir_candidates

__all__ = ["default_address", "no_daemon_at", "resolve_address"]


def no_daemon_at(address: str) -> bool:
    """True when `address` is a local socket nothing listens on: missing, or left behind by a
    daemon killed with SIGKILL (connecting to it is refused). Says nothing about TCP addresses."""
    if not address.startswith("ipc://"):
        return False
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1.0)
        try:
            probe.connect(address[len("ipc://") :])
        except (FileNotFoundError, ConnectionRefusedError):
            return True
        except OSError:  # e.g. no permission: the real connection will say what is wrong
            return False
    return False


def default_address() -> str:
    """This user's daemon socket: in the standard runtime directory, or in the private fallback
    directory a daemon used because someone else held the standard one (see `_paths`)."""
    candidates = daemon_dir_candidates()
    for directory in candidates:
        path = os.path.join(directory, "daemon.sock")
        if os.path.exists(path):
            return f"ipc://{path}"
    return f"ipc://{os.path.join(candidates[0], 'daemon.sock')}"


def resolve_address(daemon: str) -> str:
    """ "default" -> this user's local socket; ipc://... and tcp://... are taken as given."""
    if daemon == "default":
        return default_address()
    if daemon.startswith(("ipc://", "tcp://")):
        return daemon
    raise DaemonError(f"daemon address {daemon!r} is not 'default', ipc://PATH or tcp://HOST:PORT")
