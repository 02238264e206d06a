"""Spend totals per key and period, kept with the events, so a budget check reads one row
instead of summing every event of the period.

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "spend_totals",
        sa.Column("key_id", sa.String(40), primary_key=True),
        sa.Column("period", sa.String(10), primary_key=True),
        sa.Column("cost", sa.Float, nullable=False, server_default="0"),
    )
    op.execute(
        "INSERT INTO spend_totals (key_id, period, cost) "
        "SELECT key_id, period, SUM(cost) FROM spend_events GROUP BY key_id, period"
    )


def downgrade() -> None:
    op.drop_table("spend_totals")
