"""The app's Flask-SQLAlchemy models. postjob_sa's tables stay in its own metadata."""

from __future__ import annotations

from datetime import datetime

from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import BigInteger, DateTime, ForeignKey, MetaData, String, func
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import postjob_sa


class Base(DeclarativeBase):
    # named foreign keys (as PostgreSQL names them), so a later downgrade can drop them
    metadata = MetaData(naming_convention={"fk": "%(table_name)s_%(column_0_name)s_fkey"})


db = SQLAlchemy(model_class=Base)


class Signup(db.Model):  # type: ignore[name-defined, misc]
    __tablename__ = "signups"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    welcomed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    welcomed_by: Mapped[str | None] = mapped_column(String(320))
    # the column object: postjob_sa's tables are in a MetaData of their own
    welcome_job_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey(postjob_sa.Job.id, ondelete="SET NULL")
    )
