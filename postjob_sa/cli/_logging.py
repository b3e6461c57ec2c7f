"""Logging of the CLI: to stderr, with the process id (several workers may share a terminal)."""

from __future__ import annotations

import logging
import sys


def configure_logging(verbose: int) -> None:
    """The CLI's own notes always and the library's warnings; -v adds one line per job
    (INFO), -vv everything (DEBUG)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(
        logging.Formatter("%(asctime)s [%(process)d] %(levelname)s %(message)s", "%H:%M:%S")
    )
    root = logging.getLogger("postjob_sa")
    root.handlers[:] = [handler]
    root.propagate = False
    root.setLevel(logging.DEBUG if verbose >= 2 else logging.INFO if verbose else logging.WARNING)
    logging.getLogger("postjob_sa.cli").setLevel(logging.DEBUG if verbose >= 2 else logging.INFO)
