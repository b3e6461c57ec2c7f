"""postjob schema pj0007

Revision ID: fsqla0001
Revises: 
Create Date: 2026-12-01 21:58:41.494859

"""
from alembic import op
import sqlalchemy as sa
from postjob_sa import migrations

# revision identifiers, used by Alembic.
revision = 'fsqla0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    migrations.upgrade(to="pj0007")


def downgrade() -> None:
    migrations.downgrade(to=None)
