"""The app's own tables. They live in the app's metadata, not in postjob_sa's."""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import BigInteger, DateTime, ForeignKey, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import postjob_sa


class Base(DeclarativeBase):
    pass


# docs: begin signup
class Signup(Base):
    __tablename__ = "signups"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    welcomed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    # The job that welcomes this signup. Reference the column object: postjob_sa's tables
    # are in a MetaData of their own, so the string "postjob.postjobs.id" would not resolve.
    # SET NULL lets you prune old jobs without touching signups.
    welcome_job_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey(postjob_sa.Job.id, ondelete="SET NULL")
    )
# docs: end signup
