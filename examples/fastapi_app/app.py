"""POST /signups stores a signup and enqueues its welcome job in one transaction, through an
AsyncSession; the postjob dashboard is mounted at /admin/jobs, behind HTTP Basic
authentication.

    ADMIN_PASSWORD=... uvicorn examples.fastapi_app.app:app
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated

from fastapi import Depends, FastAPI, HTTPException, Request
from pydantic import BaseModel
from sqlalchemy import Engine, create_engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine

import postjob_sa.web
from examples.admin_guard import basic_auth
from examples.fastapi_app.config import admin_password, async_url, database_url
from examples.fastapi_app.models import Signup
from examples.fastapi_app.workflows import send_welcome
from postjob_sa import AsyncJobQueue


class SignupIn(BaseModel):
    email: str


class SignupOut(BaseModel):
    email: str
    welcome_job_id: int


async def get_session(request: Request) -> AsyncIterator[AsyncSession]:
    """One AsyncSession per request; closing it rolls back whatever was not committed."""
    async with AsyncSession(request.app.state.async_engine) as session:
        yield session


DbSession = Annotated[AsyncSession, Depends(get_session)]


def create_app(engine: Engine | None = None) -> FastAPI:
    """The app; ``engine`` (sync, for the dashboard) defaults to one from DATABASE_URL, and
    requests use an async engine on the same database."""
    sync_engine = engine or create_engine(database_url())
    async_engine = create_async_engine(async_url(sync_engine.url))

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        yield
        await async_engine.dispose()  # its connections belong to this event loop

    app = FastAPI(lifespan=lifespan)
    app.state.engine = sync_engine
    app.state.async_engine = async_engine

    # docs: begin handler
    @app.post("/signups", status_code=201)
    async def create_signup(body: SignupIn, session: DbSession) -> SignupOut:
        if "@" not in body.email:
            raise HTTPException(400, "an email address is required")
        # the job and the signup commit together, or neither does
        job = await AsyncJobQueue(session).enqueue(send_welcome, body.email)
        job_id = job.id
        session.add(Signup(email=body.email, welcome_job_id=job_id))
        try:
            await session.commit()
        except IntegrityError:
            raise HTTPException(409, f"{body.email} has already signed up") from None
        return SignupOut(email=body.email, welcome_job_id=job_id)
    # docs: end handler

    # docs: begin dashboard
    # The dashboard is a WSGI app: as_asgi() adapts it, and this app's authentication guards it.
    dashboard = postjob_sa.web.create_app(app.state.engine)
    app.mount("/admin/jobs", postjob_sa.web.as_asgi(basic_auth(dashboard, admin_password())))
    # docs: end dashboard

    return app


app = create_app()
