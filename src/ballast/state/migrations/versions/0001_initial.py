"""Keys, spend events and service sessions.

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column("models", sa.Text, nullable=True),
        sa.Column("rpm", sa.Integer, nullable=True),
        sa.Column("tpm", sa.Integer, nullable=True),
        sa.Column("max_parallel", sa.Integer, nullable=True),
        sa.Column("budget", sa.Float, nullable=True),
        sa.Column("budget_period", sa.String(10), nullable=False, server_default="month"),
        sa.Column("expires_at", sa.Float, nullable=True),
        sa.Column("max_concurrent_jobs", sa.Integer, nullable=True),
        sa.Column("revoked", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_table(
        "spend_events",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("period", sa.String(10), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("deployment", sa.String(200), nullable=True),
        sa.Column("prompt_tokens", sa.Integer, nullable=False),
        sa.Column("completion_tokens", sa.Integer, nullable=False),
        sa.Column("cost", sa.Float, nullable=False),
        sa.Column("cached", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_spend_key_period", "spend_events", ["key_id", "period"])
    op.create_table(
        "service_sessions",
        sa.Column("credential", sa.String(64), primary_key=True),
        sa.Column("model", sa.String(200), primary_key=True),
        sa.Column("session_id", sa.String(80), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("service_sessions")
    op.drop_index("ix_spend_key_period", "spend_events")
    op.drop_table("spend_events")
    op.drop_table("api_keys")
