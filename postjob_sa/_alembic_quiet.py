"""Import Alembic without its import-time chatter.

Alembic logs the set-up of its plugins at INFO the first time it is imported; an app that logs
at INFO would see those lines whenever it imports postjob_sa. The package imports this module
first, so Alembic is imported here once, with that logger quieted for the moment.
"""

from __future__ import annotations

import logging

_plugins = logging.getLogger("alembic.runtime.plugins")
_level = _plugins.level
_plugins.setLevel(logging.WARNING)
try:
    import alembic  # noqa: F401
finally:
    _plugins.setLevel(_level)
