"""The shop's models, as they stand after adopting postjob_sa: an order remembers the job
that fulfils it."""

from __future__ import annotations

from decimal import Decimal

from sqlalchemy import BigInteger, ForeignKey, MetaData, Numeric, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import postjob_sa


# docs: begin base
class Base(DeclarativeBase):
    # Foreign keys get names, so autogenerate writes a downgrade that can drop them (an
    # unnamed one comes out as drop_constraint(None, ...)). The names are the ones PostgreSQL
    # gives an unnamed single-column foreign key: those already in the database match.
    metadata = MetaData(naming_convention={"fk": "%(table_name)s_%(column_0_name)s_fkey"})
# docs: end base


class Customer(Base):
    __tablename__ = "customers"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    email: Mapped[str] = mapped_column(String(320), unique=True)


# docs: begin order
class Order(Base):
    __tablename__ = "orders"

    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    customer_id: Mapped[int] = mapped_column(BigInteger, ForeignKey(Customer.id))
    total: Mapped[Decimal] = mapped_column(Numeric(10, 2))
    status: Mapped[str] = mapped_column(String(20), server_default="new")
    # the job that fulfils the order; the column object, since postjob_sa's tables are in a
    # MetaData of their own (the string "postjob.postjobs.id" would not resolve)
    fulfil_job_id: Mapped[int | None] = mapped_column(
        BigInteger, ForeignKey(postjob_sa.Job.id, ondelete="SET NULL")
    )
# docs: end order
