"""The daemon's log: plain lines, or with `--log-format json` one JSON object a line.

The events an operator acts on carry a name and fields (`extra={"event": ..., "fields": {...}}`):
`session_start`, `session_end`, `worker_replaced`, `refusal`; in JSON they become keys of the
line (`{"time": ..., "level": "INFO", "event": "session_start", "session": 3, ...}`), so a log
pipeline filters them without parsing prose. Other lines keep their message and level.

NOTE [one record, one line]: a log reader (a person, a pipeline) takes each line for one record.
A message may quote what a peer chose (a dataset label, a source's name): in the text format its
control characters are escaped (`_labels.label`, unbounded here) and a traceback's lines after
the first are indented, so no peer's text can start a line that looks like a record of its own;
JSON escapes them itself. How long a peer's text may be is bounded where it is logged (`label`).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from fastload._errors import ConfigError
from fastload._labels import label

FORMATS = ("text", "json")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time (ISO 8601, UTC), level, logger, message, event fields."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, Any] = {
            "time": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        event = getattr(record, "event", None)
        if event is not None:
            line["event"] = event
            fields = getattr(record, "fields", {})
            line.update({k: v for k, v in fields.items() if k not in line})
        if record.exc_info:
            line["traceback"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str)


class TextFormatter(logging.Formatter):
    """Plain lines, one per record (NOTE [one record, one line])."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = label(record.message, limit=1 << 62)
        return super().formatMessage(record)

    def formatException(self, ei: Any) -> str:
        return _indented(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:
        return _indented(super().formatStack(stack_info))


def _indented(text: str) -> str:
    return "\n".join("    " + line for line in text.splitlines())


def event(name: str, **fields: Any) -> dict[str, Any]:
    """The `extra=` of a log call that records event `name` with `fields`."""
    return {"event": name, "fields": fields}


def configure(log_format: str) -> None:
    """The root handler of `fastload serve`: on stderr, in `log_format`."""
    if log_format not in FORMATS:
        raise ConfigError(f"log format must be one of {', '.join(FORMATS)}, got {log_format!r}")
    handler = logging.StreamHandler()
    if log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(TextFormatter("%(asctime)s fastload %(levelname)s %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler], force=True)
