"""A Flask-SQLAlchemy + Flask-Migrate app: POST /signups stores a signup and enqueues its
welcome job in the request's own transaction (``JobQueue(db.session)``).

    flask --app examples.flask_sqlalchemy_app.app db upgrade   # its migrations, ours in them
    flask --app examples.flask_sqlalchemy_app.app run          # the web app
    flask --app examples.flask_sqlalchemy_app.app jobs work    # a worker (--drain: until idle)
"""

from __future__ import annotations

import os
from typing import Any

import click
from flask import Flask, request
from flask_migrate import Migrate
from sqlalchemy.exc import IntegrityError

from examples.flask_sqlalchemy_app.models import Signup, db
from examples.flask_sqlalchemy_app.workflows import send_welcome
from postjob_sa import JobQueue

DEFAULT_DATABASE_URL = "postgresql+psycopg:///postjob_example"
MIGRATIONS = os.path.join(os.path.dirname(__file__), "migrations")

# docs: begin queue
# One queue for the whole app: each call joins the transaction of the current db.session,
# the request's; a worker of it runs every job inside the app's context.
queue = JobQueue(db.session)
# docs: end queue


def create_app(config: dict[str, Any] | None = None) -> Flask:
    app = Flask(__name__)
    app.config.update(
        SQLALCHEMY_DATABASE_URI=os.environ.get("DATABASE_URL", DEFAULT_DATABASE_URL),
        WELCOME_FROM="welcome@example.com",
        **(config or {}),
    )
    db.init_app(app)
    Migrate(app, db, directory=MIGRATIONS)

    # docs: begin handler
    @app.post("/signups")
    def create_signup() -> tuple[dict[str, Any], int]:
        email = (request.get_json(silent=True) or {}).get("email")
        if not isinstance(email, str) or "@" not in email:
            return {"error": "an email address is required"}, 400
        signup = Signup(email=email)
        db.session.add(signup)
        try:
            db.session.flush()  # the signup's id, for the job
        except IntegrityError:
            db.session.rollback()
            return {"error": f"{email} has already signed up"}, 409
        # in the request's transaction: the job exists if and only if the signup commits
        signup.welcome_job_id = queue.enqueue(send_welcome, signup.id).id
        db.session.commit()
        return {"email": email, "welcome_job_id": signup.welcome_job_id}, 201
    # docs: end handler

    # docs: begin worker
    @app.cli.group()
    def jobs() -> None:
        """The app's background jobs."""

    @jobs.command("work")
    @click.option("--drain", is_flag=True, help="Exit when no job is due.")
    def work(drain: bool) -> None:
        """Run jobs, each inside this app's context, until SIGINT/SIGTERM."""
        worker = JobQueue(db.session, job_context=app.app_context)
        ran = worker.drain() if drain else worker.work()
        click.echo(f"ran {ran} jobs")
    # docs: end worker

    return app
