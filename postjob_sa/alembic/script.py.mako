"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}
"""

from __future__ import annotations

from alembic import op

from postjob_sa.alembic._steps import sends_scripts_whole

revision = ${repr(up_revision)}
down_revision = ${repr(down_revision)}
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}


# a script of many statements through op.execute() goes whole on asyncpg (the steps in _steps
# do it for what they run)
@sends_scripts_whole
def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


@sends_scripts_whole
def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
