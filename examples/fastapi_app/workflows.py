"""The app's workflows. Import this module wherever jobs are enqueued or run."""

from __future__ import annotations

import logging

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

import postjob_sa
from examples.fastapi_app.models import Signup

log = logging.getLogger(__name__)


@postjob_sa.workflow(transactional=True, max_attempts=3)
async def send_welcome(session: AsyncSession, email: str) -> str:
    """Welcome a new signup. Transactional: the worker passes its AsyncSession, and what we
    write here commits together with the job's completion (or not at all, if the job fails)."""
    signup = (await session.scalars(select(Signup).where(Signup.email == email))).one()
    if signup.welcomed_at is None:
        log.info("welcome, %s", email)  # a real app calls its mailer here
        signup.welcomed_at = func.now()
    return email
