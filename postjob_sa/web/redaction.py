"""What the pages show of the values a job carries (its args, its result, its durable steps'
results): everything by default, nothing with ``create_app(show_args=False)``, or what the
host's ``redact`` callable makes of each value. The database keeps them in clear either way."""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger("postjob_sa.web")


class Hidden(str):
    """Shown in place of a value the dashboard does not show (the templates test ``is hidden``)."""


HIDDEN = Hidden("hidden")


@dataclass(frozen=True)
class Redaction:
    show: bool = True
    redact: Callable[[Any], Any] | None = None

    @property
    def whole(self) -> bool:
        """Whether lists must read whole values (redact sees each one), not their start."""
        return self.show and self.redact is not None

    def value(self, value: Any) -> Any:
        """What to show for a stored value: itself, :data:`HIDDEN`, or what redact returns
        (a redact that raises hides the value: a failure must not show it)."""
        if not self.show:
            return HIDDEN
        if self.redact is None:
            return value
        try:
            return self.redact(value)
        except Exception as exc:
            log.warning("the dashboard's redact raised %s; the value is hidden", type(exc).__name__)
            return Hidden(f"hidden (redact raised {type(exc).__name__})")

    def text(self, stored: str | None, limit: int) -> str | None:
        """A list's short text of a value: ``stored`` is its JSON (whole when :attr:`whole`)."""
        if stored is None:
            return None
        if not self.show:
            return HIDDEN
        if self.redact is None:
            return stored[:limit]
        shown = self.value(json.loads(stored))
        if isinstance(shown, Hidden):
            return shown
        return json.dumps(shown, ensure_ascii=False, default=str)[:limit]

    def label(self, args: Any) -> str:
        """A manual step's label, its first arg."""
        shown = self.value(args)
        if isinstance(shown, Hidden):
            return "manual step"
        if isinstance(shown, list):
            return str(shown[0]) if shown else "manual step"
        return str(shown)


def checked(show_args: Any, redact: Any) -> Redaction:
    """The settings of ``create_app``; ValueError says what is wrong."""
    if redact is not None and not callable(redact):
        raise ValueError(f"redact must be a callable that takes a value and returns what to "
                         f"show, not {redact!r}")
    if redact is not None and not show_args:
        raise ValueError("give redact or show_args=False, not both: show_args=False shows no "
                         "value to redact")
    return Redaction(show=bool(show_args), redact=redact)
