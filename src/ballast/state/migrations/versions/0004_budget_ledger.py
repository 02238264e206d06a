"""Budgets shared by workers and instances: spent and reserved per key and period.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "budget_ledger",
        sa.Column("key_id", sa.String(40), primary_key=True),
        sa.Column("period", sa.String(10), primary_key=True),
        sa.Column("used", sa.Float, nullable=False, server_default="0"),
    )
    op.create_table(
        "budget_reservations",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("period", sa.String(10), nullable=False),
        sa.Column("amount", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )
    op.create_index("ix_budget_reservations_key", "budget_reservations", ["key_id", "period"])


def downgrade() -> None:
    op.drop_table("budget_reservations")
    op.drop_table("budget_ledger")
