"""POST /signups stores a signup and enqueues its welcome job in one transaction; the
postjob dashboard is mounted at /admin/jobs, behind HTTP Basic authentication.

    ADMIN_PASSWORD=... uvicorn examples.fastapi_app.app:app
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

import postjob_sa.web
from examples.admin_guard import basic_auth
from examples.fastapi_app.config import admin_password, database_url
from examples.fastapi_app.models import Signup
from examples.fastapi_app.workflows import send_welcome
from postjob_sa import JobQueue


class SignupIn(BaseModel):
    email: str


class SignupOut(BaseModel):
    email: str
    welcome_job_id: int


def get_session(request: Request) -> Iterator[Session]:
    """One Session per request; closing it rolls back whatever was not committed."""
    with Session(request.app.state.engine) as session:
        yield session


DbSession = Annotated[Session, Depends(get_session)]


def create_app(engine: Engine | None = None) -> FastAPI:
    app = FastAPI()
    app.state.engine = engine or create_engine(database_url())

    # docs: begin handler
    @app.post("/signups", status_code=201)
    def create_signup(body: SignupIn, session: DbSession) -> SignupOut:
        if "@" not in body.email:
            raise HTTPException(400, "an email address is required")
        # the job and the signup commit together, or neither does
        job = JobQueue(session).enqueue(send_welcome, body.email)
        session.add(Signup(email=body.email, welcome_job_id=job.id))
        try:
            session.commit()
        except IntegrityError:
            raise HTTPException(409, f"{body.email} has already signed up") from None
        return SignupOut(email=body.email, welcome_job_id=job.id)
    # docs: end handler

    # docs: begin dashboard
    # The dashboard is a WSGI app: as_asgi() adapts it, and this app's authentication guards it.
    dashboard = postjob_sa.web.create_app(app.state.engine)
    app.mount("/admin/jobs", postjob_sa.web.as_asgi(basic_auth(dashboard, admin_password())))
    # docs: end dashboard

    return app


app = create_app()
