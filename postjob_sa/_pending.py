"""The signal that unwinds a workflow that waits (its own module: the job context, the child
handles and the durable sleeps and waits raise it, and none of them imports another for it)."""

from __future__ import annotations


class Pending(BaseException):
    """Unwinds a workflow that waits (not an error: the job sleeps): for an unfinished child
    (``child_id``), or for a time or an event (``wake_in``: the seconds until it runs again
    whatever else wakes it; None: until it is woken).

    A BaseException, so ``except Exception`` in workflow code does not swallow it.
    """

    def __init__(self, child_id: int | None, wake_in: float | None = None):
        super().__init__(child_id)
        self.child_id = child_id
        self.wake_in = wake_in
