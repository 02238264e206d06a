"""A key's MCP allowlist: the servers and tools it may call through /mcp.

Revision ID: 0008
Revises: 0007
"""

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("api_keys", sa.Column("mcp", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("api_keys", "mcp")
