"""The worker, a management command of the app:

    python -m examples.flask_app.worker           # run jobs until SIGINT/SIGTERM
    python -m examples.flask_app.worker --drain   # run what is due now, then exit (cron)
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence

from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from examples.flask_app import workflows  # noqa: F401  (registers the app's workflows)
from examples.flask_app.config import database_url
from postjob_sa import JobQueue


# docs: begin main
def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Run the app's postjob_sa jobs.")
    parser.add_argument("--drain", action="store_true", help="exit when no job is due")
    opts = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    engine = create_engine(database_url())
    try:
        with Session(engine) as session:
            queue = JobQueue(session)
            ran = queue.drain() if opts.drain else queue.work()
    finally:
        engine.dispose()
    logging.info("ran %d jobs", ran)
    return ran
# docs: end main


if __name__ == "__main__":
    main()
