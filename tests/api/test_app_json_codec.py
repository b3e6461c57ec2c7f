"""An application's own asyncpg ``jsonb`` codec: postjob's JSON never reaches it, and what
postjob stores reads back through it.

The codec is the one Advanced Alchemy's asyncpg recipe and the litestar-fullstack template
register in an engine ``connect`` event: binary, its encoder handed the bytes the app's JSON
serializer made (an encoder given a ``str`` fails with ``can't concat str to bytes``). A
``json`` codec of the app's is set too, and must never be handed anything.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import pytest
from sqlalchemy import URL, Engine, event, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

import postjob_sa
from postjob_sa import AsyncJobQueue, Job, Registry, Status

reg = Registry()
T = TypeVar("T")

#: every value the app's codec was asked to encode
ENCODED: list[Any] = []


@postjob_sa.workflow(name="codec.parent", registry=reg)
def parent(x: int) -> int:
    return x


@postjob_sa.workflow(name="codec.failing", registry=reg)
def failing(x: str) -> str:
    raise RuntimeError(x)


def _encode(value: bytes) -> bytes:
    ENCODED.append(value)
    return b"\x01" + value  # the app's serializer gives bytes (orjson.dumps)


def _encode_json(value: Any) -> str:
    ENCODED.append(value)
    raise TypeError("the app's json codec was handed a parameter")


def _decode(data: bytes) -> Any:
    return json.loads(data[1:])


def _dumps(value: Any) -> bytes:
    return json.dumps(value).encode()


def app_engine(db_url: URL) -> AsyncEngine:
    """An asyncpg engine set up as such an app sets up its own."""
    engine = create_async_engine(db_url.set(drivername="postgresql+asyncpg"),
                                 json_serializer=_dumps)

    @event.listens_for(engine.sync_engine, "connect")
    def _codec(dbapi_connection: Any, _record: Any) -> None:
        async def codecs(conn: Any) -> None:
            await conn.set_type_codec("jsonb", encoder=_encode, decoder=_decode,
                                      schema="pg_catalog", format="binary")
            await conn.set_type_codec("json", encoder=_encode_json, decoder=json.loads,
                                      schema="pg_catalog")

        dbapi_connection.run_async(codecs)

    return engine


class Base(DeclarativeBase):
    pass


class Note(Base):
    """A table of the app's own, with a jsonb column its codec writes."""

    __tablename__ = "codec_notes"
    id: Mapped[int] = mapped_column(primary_key=True)
    body: Mapped[Any] = mapped_column(JSONB)


def _run(db_url: URL, body: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    async def main() -> T:
        engine = app_engine(db_url)
        try:
            return await body(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


def _rows(engine: Engine, sql: str, **params: Any) -> list[Any]:
    with engine.connect() as conn:
        return list(conn.execute(text(sql), params))


@pytest.fixture
def notes(engine: Engine, clean: None) -> Engine:
    Base.metadata.create_all(engine)
    with engine.begin() as conn:
        conn.execute(text("TRUNCATE codec_notes"))
    ENCODED.clear()
    return engine


def test_the_apps_codec_is_the_one_that_writes_its_own_jsonb(db_url: URL, notes: Engine) -> None:
    """The setup itself: the app's rows go through its codec (and a str would not)."""
    async def body(engine: AsyncEngine) -> Any:
        async with AsyncSession(engine) as s:
            s.add(Note(id=1, body={"a": [1, 2]}))
            await s.commit()
            note = await s.get(Note, 1)
            assert note is not None
            return note.body

    assert _run(db_url, body) == {"a": [1, 2]}
    assert ENCODED == [b'{"a": [1, 2]}']
    with pytest.raises(TypeError, match="can't concat str to bytes"):
        _encode("[1]")  # type: ignore[arg-type]


def test_enqueue_and_enqueue_many_bind_nothing_the_apps_codec_sees(
    db_url: URL, notes: Engine
) -> None:
    async def body(engine: AsyncEngine) -> tuple[int, int, list[int], int]:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg)
            root = await q.enqueue(parent, 1, tags={"team": "é", "n": 1})
            await s.flush()
            child = await q.enqueue("codec.child", {"k": ["v", None]}, parent_id=root.id)
            again = await q.enqueue("codec.child", {"k": ["v", None]}, parent_id=root.id)
            assert again.id == child.id  # found by its args: the same child
            keyed = await q.enqueue("codec.keyed", [1.5], unique_key="only-one")
            assert (await q.enqueue("codec.keyed", [1.5], unique_key="only-one")).id == keyed.id
            many = await q.enqueue_many("codec.many", [[1], [{"a": True}], []], tags={"b": "2"})
            ids = root.id, child.id, many, keyed.id
            s.add(Note(id=2, body=[root.id]))  # the app's own write in the same transaction
            await s.commit()
            return ids

    root, child, many, keyed = _run(db_url, body)
    assert ENCODED == [f"[{root}]".encode()]  # the app's note only
    rows = _rows(notes, "SELECT id, args, tags FROM postjob.postjobs ORDER BY id")
    assert [(r.args, r.tags) for r in rows] == [
        ([1], {"team": "é", "n": 1}), ([{"k": ["v", None]}], None), ([[1.5]], None),
        ([1], {"b": "2"}), ([{"a": True}], {"b": "2"}), ([], {"b": "2"})]
    assert [r.id for r in rows] == [root, child, keyed, *many]


def test_what_postjob_stored_reads_back_through_the_apps_codec(
    db_url: URL, notes: Engine
) -> None:
    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg, fast_mode=True)
            job = await q.enqueue(parent, 7, tags={"t": "x"})
            other_job = await q.enqueue(failing, "a")
            ids = job.id, other_job.id
            await s.commit()
            (taken,) = await q.checkout(workflows=["codec.parent"])
            assert taken.id == ids[0] and taken.args == [7]
            await q.complete(taken, {"answer": [42, "ü"]})
            (other,) = await q.checkout(workflows=["codec.failing"])
            await q.fail(other, RuntimeError("nope"), retry=False)
            await s.commit()
        async with AsyncSession(engine) as s:
            done = await s.get(Job, ids[0])
            assert done is not None and done.status is Status.ok
            assert done.args == [7] and done.tags == {"t": "x"}
            assert done.result() == {"answer": [42, "ü"]}
            failed = await s.get(Job, ids[1])
            assert failed is not None and failed.status is Status.failed
            assert failed.error_message == "nope" and failed.args == ["a"]

    _run(db_url, body)
    assert ENCODED == []


def test_events_and_resolved_results_bind_nothing_the_apps_codec_sees(
    db_url: URL, notes: Engine
) -> None:
    with notes.begin() as conn:
        manual = conn.execute(text(
            "INSERT INTO postjob.postjobs (workflow, status) VALUES ('__manual__', 'ready') "
            "RETURNING id")).scalar_one()
        token = conn.execute(text("SELECT postjob.manual_token(:i)::text"),
                             {"i": manual}).scalar_one()

    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as s:
            q = AsyncJobQueue(s, registry=reg)
            await q.emit_event("codec.key", {"paid": [1, 2], "by": "ü"})
            await q.emit_event("codec.none")
            assert await q.resolve(token, {"approved": True}) == manual
            await s.commit()
            got = await s.get(Job, manual)
            assert got is not None and got.result() == {"approved": True}

    _run(db_url, body)
    assert ENCODED == []
    assert [r.payload for r in _rows(notes, "SELECT payload FROM postjob.events ORDER BY id")] == [
        {"paid": [1, 2], "by": "ü"}, None]
