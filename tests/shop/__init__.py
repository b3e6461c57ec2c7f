"""An app whose Alembic history predates postjob_sa, adopting it both ways."""
