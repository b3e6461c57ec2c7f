"""A FastAPI app (sync SQLAlchemy Session) that enqueues a welcome workflow in the same
transaction as a signup."""
