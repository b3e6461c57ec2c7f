"""postjob schema pj0009

Revision ID: fsqla0004
Revises: fsqla0003
Create Date: 2026-12-02 08:23:44.384954

"""
from alembic import op
import sqlalchemy as sa
from postjob_sa import migrations

# revision identifiers, used by Alembic.
revision = 'fsqla0004'
down_revision = 'fsqla0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0009")


def downgrade() -> None:
    migrations.downgrade(to="pj0008")
