"""Spend events say whether their usage is Ballast's estimate (a stream cut short before the
upstream's usage came) rather than what the upstream reported.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "spend_events",
        sa.Column("estimated", sa.Boolean, nullable=False, server_default=sa.false()),
    )


def downgrade() -> None:
    op.drop_column("spend_events", "estimated")
