"""POST /signups stores a signup and enqueues its welcome job in one transaction; the
postjob dashboard is mounted at /admin/jobs, behind HTTP Basic authentication.

    ADMIN_PASSWORD=... flask --app examples.flask_app.app run
"""

from __future__ import annotations

from typing import Any

from flask import Flask, request
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session
from werkzeug.middleware.dispatcher import DispatcherMiddleware

import postjob_sa.web
from examples.admin_guard import basic_auth
from examples.flask_app.config import admin_password, database_url
from examples.flask_app.models import Signup
from examples.flask_app.workflows import send_welcome
from postjob_sa import JobQueue


def create_app(engine: Engine | None = None) -> Flask:
    app = Flask(__name__)
    app.extensions["engine"] = engine or create_engine(database_url())

    # docs: begin handler
    @app.post("/signups")
    def create_signup() -> tuple[dict[str, Any], int]:
        email = (request.get_json(silent=True) or {}).get("email")
        if not isinstance(email, str) or "@" not in email:
            return {"error": "an email address is required"}, 400
        with Session(app.extensions["engine"]) as session:
            # Both INSERTs run in this one transaction: the job exists if and only if
            # the signup commits. A duplicate email fails the commit and takes the job
            # back out with it; no worker ever sees it.
            job = JobQueue(session).enqueue(send_welcome, email)
            session.add(Signup(email=email, welcome_job_id=job.id))
            try:
                session.commit()
            except IntegrityError:
                return {"error": f"{email} has already signed up"}, 409
            return {"email": email, "welcome_job_id": job.id}, 201
    # docs: end handler

    # docs: begin dashboard
    # The dashboard is a WSGI app of its own: mounted under /admin/jobs, behind this app's
    # authentication (it has none of its own when mounted).
    dashboard = postjob_sa.web.create_app(app.extensions["engine"])
    app.wsgi_app = DispatcherMiddleware(  # type: ignore[method-assign]
        app.wsgi_app, {"/admin/jobs": basic_auth(dashboard, admin_password())}
    )
    # docs: end dashboard

    return app
