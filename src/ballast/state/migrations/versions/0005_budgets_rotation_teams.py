"""Budgets shared by workers and instances (spent and reserved per key and period), key
rotation with a grace period, teams of keys, per-model budgets.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
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
    with op.batch_alter_table("api_keys") as batch:
        batch.add_column(sa.Column("previous_hash", sa.String(64), nullable=True))
        batch.add_column(sa.Column("previous_until", sa.Float, nullable=True))
        batch.add_column(sa.Column("team_id", sa.String(40), nullable=True))
        batch.add_column(sa.Column("model_budgets", sa.Text, nullable=True))
        batch.create_index("ix_api_keys_previous_hash", ["previous_hash"])
        batch.create_index("ix_api_keys_team_id", ["team_id"])
    op.create_table(
        "teams",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("max_parallel", sa.Integer, nullable=True),
        sa.Column("budget", sa.Float, nullable=True),
        sa.Column("budget_period", sa.String(10), nullable=False, server_default="month"),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("teams")
    with op.batch_alter_table("api_keys") as batch:
        batch.drop_index("ix_api_keys_team_id")
        batch.drop_index("ix_api_keys_previous_hash")
        for column in ("model_budgets", "team_id", "previous_until", "previous_hash"):
            batch.drop_column(column)
    op.drop_table("budget_reservations")
    op.drop_table("budget_ledger")
