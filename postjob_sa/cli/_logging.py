"""Logging of the CLI: to stderr, with the process id (several workers may share a terminal);
as text, or as one JSON object per line (``postjob run --log-format json``)."""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime

#: The structured fields of a job's log line (see postjob_sa.worker.recorder.job_fields).
JOB_FIELDS = ("job_id", "workflow", "attempt", "duration", "outcome", "status")


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, pid, logger, message and the job's fields."""

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(
                timespec="milliseconds"),
            "level": record.levelname, "pid": record.process, "logger": record.name,
            "message": record.getMessage(),
        }
        for name in JOB_FIELDS:
            value = getattr(record, name, None)
            if value is not None:
                out[name] = value
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, default=str)


def configure_logging(verbose: int, log_format: str = "text") -> None:
    """The CLI's own notes always and the library's warnings; -v adds one line per job
    (INFO), -vv everything (DEBUG)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        JsonFormatter() if log_format == "json" else
        logging.Formatter("%(asctime)s [%(process)d] %(levelname)s %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger("postjob_sa")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.WARNING)
    logging.getLogger("postjob_sa.cli").setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
