"""A shop app whose Alembic history is older than its use of postjob_sa."""
