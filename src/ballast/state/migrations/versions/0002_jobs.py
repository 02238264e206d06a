"""Long-running jobs.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "jobs",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("key_id", sa.String(40), nullable=False),
        sa.Column("backend", sa.String(200), nullable=False),
        sa.Column("input", sa.Text, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("holds_slot", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("remote_id", sa.String(200), nullable=True),
        sa.Column("remote_status", sa.String(64), nullable=True),
        sa.Column("submissions", sa.Integer, nullable=False, server_default="0"),
        sa.Column("progress", sa.Float, nullable=True),
        sa.Column("output", sa.Text, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("submitted_at", sa.Float, nullable=True),
        sa.Column("finished_at", sa.Float, nullable=True),
        sa.Column("last_contact_at", sa.Float, nullable=True),
        sa.Column("next_poll_at", sa.Float, nullable=False),
        sa.Column("polls", sa.Integer, nullable=False, server_default="0"),
        sa.Column("lease_owner", sa.String(80), nullable=True),
        sa.Column("lease_until", sa.Float, nullable=False, server_default="0"),
    )
    op.create_index("ix_jobs_due", "jobs", ["status", "next_poll_at"])
    op.create_index("ix_jobs_key", "jobs", ["key_id", "created_at"])


def downgrade() -> None:
    op.drop_index("ix_jobs_key", "jobs")
    op.drop_index("ix_jobs_due", "jobs")
    op.drop_table("jobs")
