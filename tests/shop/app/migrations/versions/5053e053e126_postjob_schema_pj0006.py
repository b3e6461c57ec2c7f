"""postjob schema pj0006

Revision ID: 5053e053e126
Revises: 9a9e5cf938d9
Create Date: 2026-12-01 09:03:07.288320
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from postjob_sa import migrations

revision = '5053e053e126'
down_revision = '9a9e5cf938d9'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0006")


def downgrade() -> None:
    migrations.downgrade(to="pj0005")
