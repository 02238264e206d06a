"""Spend events keep the parts of their usage the provider bills apart: tokens read from its
prompt cache, written to it (all, and of those the hour-long ones), and reasoning tokens.

Revision ID: 0009
Revises: 0008
"""

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

COLUMNS = ("cached_tokens", "cache_write_tokens", "cache_write_1h_tokens", "reasoning_tokens")


def upgrade() -> None:
    for name in COLUMNS:
        op.add_column(
            "spend_events", sa.Column(name, sa.Integer, nullable=False, server_default="0")
        )


def downgrade() -> None:
    for name in reversed(COLUMNS):
        op.drop_column("spend_events", name)
