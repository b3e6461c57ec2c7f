"""The host application's own models."""

from __future__ import annotations

from sqlalchemy import BigInteger, ForeignKey, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from postjob_sa import Job


class HostBase(DeclarativeBase):
    pass


class Widget(HostBase):
    __tablename__ = "widgets"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    name: Mapped[str] = mapped_column(String(100), nullable=False)
    # the job that builds this widget: host tables may reference ours (by column object:
    # postjob_sa's tables live in a MetaData of their own)
    job_id: Mapped[int | None] = mapped_column(BigInteger, ForeignKey(Job.id, ondelete="SET NULL"))
