"""postjob schema pj0008

Revision ID: fsqla0003
Revises: fsqla0002
Create Date: 2026-12-01 23:20:14.435026

"""
from alembic import op
import sqlalchemy as sa
from postjob_sa import migrations

# revision identifiers, used by Alembic.
revision = 'fsqla0003'
down_revision = 'fsqla0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0008")


def downgrade() -> None:
    migrations.downgrade(to="pj0007")
