"""postjob schema pj0010

Revision ID: fsqla0005
Revises: fsqla0004
Create Date: 2026-12-02 10:45:00.000000

"""
from alembic import op
import sqlalchemy as sa
from postjob_sa import migrations

# revision identifiers, used by Alembic.
revision = 'fsqla0005'
down_revision = 'fsqla0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0010")


def downgrade() -> None:
    migrations.downgrade(to="pj0009")
