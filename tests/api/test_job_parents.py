"""A child's parent, without a foreign key (pj0009): the insert trigger checks it and locks it
as a key's check would, and a job's children are removed with it."""

from __future__ import annotations

import pytest
from sqlalchemy import Engine, select, text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session

from postjob_sa import Job, JobQueue

pytestmark = pytest.mark.both_drivers


def _jobs(engine: Engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT count(*) FROM postjob.postjobs")).scalar_one())


def test_a_job_whose_parent_does_not_exist_is_refused(engine: Engine, session: Session) -> None:
    session.add(Job(workflow="orphan", parent_id=987654321))
    with pytest.raises(IntegrityError, match="no parent 987654321"):
        session.flush()
    session.rollback()
    assert _jobs(engine) == 0
    # ids given by the app do not skip the check
    session.add(Job(workflow="orphan", parent_id=987654321, root_id=1, full_id="1.2"))
    with pytest.raises(IntegrityError, match="no parent 987654321"):
        session.flush()
    session.rollback()
    assert _jobs(engine) == 0


def test_a_child_takes_its_ids_from_the_parent(session: Session, queue: JobQueue) -> None:
    root = queue.enqueue("tree.root")
    child = Job(workflow="tree.child", parent_id=root.id)
    session.add(child)
    session.flush()
    grandchild = Job(workflow="tree.leaf", parent_id=child.id)
    session.add(grandchild)
    session.commit()
    session.refresh(grandchild)
    assert grandchild.root_id == root.id
    assert grandchild.full_id == f"{root.id}.{child.id}.{grandchild.id}"


def test_a_jobs_children_go_with_it(engine: Engine, session: Session, queue: JobQueue) -> None:
    root = queue.enqueue("tree.root")
    child = queue.enqueue("tree.child", parent_id=root.id)
    leaf = queue.enqueue("tree.leaf", parent_id=child.id)
    other = queue.enqueue("tree.other")
    session.commit()
    ids = [root.id, child.id, leaf.id]
    session.execute(text("DELETE FROM postjob.postjobs WHERE id = :id"), {"id": root.id})
    session.commit()
    left = set(session.scalars(select(Job.id)))
    assert left == {other.id}
    with engine.connect() as conn:
        waiting = conn.execute(text("SELECT count(*) FROM postjob.unfinished WHERE job_id = ANY(:ids)"),
                               {"ids": ids}).scalar_one()
    assert waiting == 0


def test_a_parent_cannot_be_deleted_while_a_child_of_it_is_inserted(
    engine: Engine, session: Session, queue: JobQueue
) -> None:
    root = queue.enqueue("tree.root")
    session.commit()
    child = queue.enqueue("tree.child", parent_id=root.id)  # not committed: the parent is held
    with engine.connect() as other:
        other.execute(text("SET lock_timeout = '200ms'"))
        with pytest.raises(OperationalError, match="lock timeout"):
            other.execute(text("DELETE FROM postjob.postjobs WHERE id = :id"), {"id": root.id})
        other.rollback()
    session.commit()
    assert session.get(Job, child.id) is not None
