"""Host applications that use postjob_sa: a Flask app and a FastAPI app (see README.md)."""
