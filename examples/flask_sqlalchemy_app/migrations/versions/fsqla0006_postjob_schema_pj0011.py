"""postjob schema pj0011

Revision ID: fsqla0006
Revises: fsqla0005
Create Date: 2026-12-07 05:01:59.307260

"""
from alembic import op
import sqlalchemy as sa
from postjob_sa import migrations

# revision identifiers, used by Alembic.
revision = 'fsqla0006'
down_revision = 'fsqla0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0011")


def downgrade() -> None:
    migrations.downgrade(to="pj0010")
