"""The app's workflows. Import this module wherever jobs are enqueued or run."""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.orm import Session

import postjob_sa
from examples.flask_app.models import Signup

log = logging.getLogger(__name__)


# docs: begin workflow
@postjob_sa.workflow(transactional=True, max_attempts=3)
def send_welcome(session: Session, email: str) -> str:
    """Welcome a new signup. Transactional: the worker passes its Session, and what we write
    here commits together with the job's completion (or not at all, if the job fails)."""
    signup = session.scalars(select(Signup).where(Signup.email == email)).one()
    if signup.welcomed_at is None:
        log.info("welcome, %s", email)  # a real app calls its mailer here
        signup.welcomed_at = func.now()
    return email
# docs: end workflow
