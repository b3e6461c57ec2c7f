"""The app's workflows. They use the app as any view does (``db.session``, ``current_app``):
the worker runs each job inside the app's context (``job_context=app.app_context``)."""

from __future__ import annotations

from flask import current_app
from sqlalchemy import func

import postjob_sa
from examples.flask_sqlalchemy_app.models import Signup, db


# docs: begin workflow
@postjob_sa.workflow(name="signups.welcome", max_attempts=3)
def send_welcome(signup_id: int) -> str:
    """Welcome a signup, as the app's configured sender. Outside an app context,
    db.session and current_app raise "Working outside of application context"."""
    signup = db.session.get_one(Signup, signup_id)
    if signup.welcomed_at is None:
        signup.welcomed_by = current_app.config["WELCOME_FROM"]  # a real app sends mail here
        signup.welcomed_at = func.now()
        db.session.commit()
    return signup.email
# docs: end workflow
