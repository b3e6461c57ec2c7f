"""The package's Alembic environment and revisions (branch label ``postjob``)."""
