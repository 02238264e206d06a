"""Ballast's tables (SQLAlchemy Core). Changes go through a migration in migrations/versions."""

from __future__ import annotations

import sqlalchemy as sa

metadata = sa.MetaData()

api_keys = sa.Table(
    "api_keys",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("models", sa.Text, nullable=True),  # JSON list; null = every model
    sa.Column("rpm", sa.Integer, nullable=True),
    sa.Column("tpm", sa.Integer, nullable=True),
    sa.Column("max_parallel", sa.Integer, nullable=True),
    sa.Column("budget", sa.Float, nullable=True),
    sa.Column("budget_period", sa.String(10), nullable=False, server_default="month"),
    sa.Column("expires_at", sa.Float, nullable=True),
    sa.Column("max_concurrent_jobs", sa.Integer, nullable=True),
    sa.Column("revoked", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.Float, nullable=False),
    # A rotated key's old hash still authenticates until `previous_until` (a grace period).
    sa.Column("previous_hash", sa.String(64), nullable=True, index=True),
    sa.Column("previous_until", sa.Float, nullable=True),
    sa.Column("team_id", sa.String(40), nullable=True, index=True),
    sa.Column("model_budgets", sa.Text, nullable=True),  # JSON {model: dollars per period}
    sa.Column("mcp", sa.Text, nullable=True),  # JSON list of MCP servers/tools; null = all
)

# A named group of keys sharing a budget and limits.
teams = sa.Table(
    "teams",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("name", sa.String(200), nullable=False),
    sa.Column("rpm", sa.Integer, nullable=True),
    sa.Column("tpm", sa.Integer, nullable=True),
    sa.Column("max_parallel", sa.Integer, nullable=True),
    sa.Column("budget", sa.Float, nullable=True),
    sa.Column("budget_period", sa.String(10), nullable=False, server_default="month"),
    sa.Column("created_at", sa.Float, nullable=False),
)

spend_events = sa.Table(
    "spend_events",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),  # idempotent replays
    sa.Column("key_id", sa.String(40), nullable=False),
    sa.Column("period", sa.String(10), nullable=False),
    sa.Column("model", sa.String(200), nullable=False),
    sa.Column("deployment", sa.String(200), nullable=True),
    sa.Column("prompt_tokens", sa.Integer, nullable=False),
    sa.Column("completion_tokens", sa.Integer, nullable=False),
    sa.Column("cost", sa.Float, nullable=False),
    sa.Column("cached", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("created_at", sa.Float, nullable=False),
    # Ballast's estimate (a stream cut short before the upstream's usage came), not reported.
    sa.Column("estimated", sa.Boolean, nullable=False, server_default=sa.false()),
    # Parts of prompt_tokens and completion_tokens, as the upstream reported them.
    sa.Column("cached_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cache_write_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("cache_write_1h_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Column("reasoning_tokens", sa.Integer, nullable=False, server_default="0"),
    sa.Index("ix_spend_key_period", "key_id", "period"),
)

# What a budget check reads: the sum of `spend_events.cost` per key and period, updated in
# the same transaction as the events it counts.
spend_totals = sa.Table(
    "spend_totals",
    metadata,
    sa.Column("key_id", sa.String(40), primary_key=True),
    sa.Column("period", sa.String(10), primary_key=True),
    sa.Column("cost", sa.Float, nullable=False, server_default="0"),
)

service_sessions = sa.Table(
    "service_sessions",
    metadata,
    sa.Column("credential", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), primary_key=True),
    sa.Column("session_id", sa.String(80), nullable=False),
)

# Long-running jobs on serverless backends. `holds_slot` is the key's concurrency slot: it is
# cleared in the same conditional update that makes a job terminal, so slots are always the
# count of rows that hold one (nothing to recompute, nothing to leak).
jobs = sa.Table(
    "jobs",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("key_id", sa.String(40), nullable=False),
    sa.Column("backend", sa.String(200), nullable=False),
    sa.Column("input", sa.Text, nullable=False),  # JSON
    sa.Column("status", sa.String(16), nullable=False),
    sa.Column("cancel_requested", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("holds_slot", sa.Boolean, nullable=False, server_default=sa.false()),
    sa.Column("remote_id", sa.String(200), nullable=True),
    sa.Column("remote_status", sa.String(64), nullable=True),
    sa.Column("submissions", sa.Integer, nullable=False, server_default="0"),
    sa.Column("progress", sa.Float, nullable=True),
    sa.Column("output", sa.Text, nullable=True),  # JSON
    sa.Column("error", sa.Text, nullable=True),  # JSON {"message", "code"}
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("submitted_at", sa.Float, nullable=True),
    sa.Column("finished_at", sa.Float, nullable=True),
    sa.Column("last_contact_at", sa.Float, nullable=True),
    sa.Column("next_poll_at", sa.Float, nullable=False),
    sa.Column("polls", sa.Integer, nullable=False, server_default="0"),
    sa.Column("lease_owner", sa.String(80), nullable=True),
    sa.Column("lease_until", sa.Float, nullable=False, server_default="0"),
    sa.Index("ix_jobs_due", "status", "next_poll_at"),
    sa.Index("ix_jobs_key", "key_id", "created_at"),
)

# Admin actions for every worker and instance (api/fleet.py): the fallback when Redis
# pub/sub cannot carry them, read by polling `seq`.
admin_commands = sa.Table(
    "admin_commands",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("id", sa.String(40), nullable=False, unique=True),
    sa.Column("action", sa.String(40), nullable=False),
    sa.Column("args", sa.Text, nullable=False),
    sa.Column("created_at", sa.Float, nullable=False),
)

# Who changed what through the admin API, and when (state/audit.py). `actor` names the
# credential (the master key, the dashboard token), never its value; `detail` holds the
# fields an action set, never a key's secret.
admin_audit = sa.Table(
    "admin_audit",
    metadata,
    sa.Column("seq", sa.Integer, primary_key=True, autoincrement=True),
    sa.Column("created_at", sa.Float, nullable=False),
    sa.Column("actor", sa.String(40), nullable=False),
    sa.Column("action", sa.String(40), nullable=False),
    sa.Column("target", sa.String(200), nullable=True),
    sa.Column("detail", sa.Text, nullable=True),  # JSON
    sa.Index("ix_admin_audit_created", "created_at"),
)

# Budgets shared by every worker and instance (without Redis; see state/budget_ledger.py):
# per key and period what was spent, born from `spend_totals`, and the grants reserved
# against it, each lapsing at `expires_at` so a dead instance's grants free themselves.
budget_ledger = sa.Table(
    "budget_ledger",
    metadata,
    sa.Column("key_id", sa.String(40), primary_key=True),
    sa.Column("period", sa.String(10), primary_key=True),
    sa.Column("used", sa.Float, nullable=False, server_default="0"),
)

budget_reservations = sa.Table(
    "budget_reservations",
    metadata,
    sa.Column("id", sa.String(40), primary_key=True),
    sa.Column("key_id", sa.String(40), nullable=False),
    sa.Column("period", sa.String(10), nullable=False),
    sa.Column("amount", sa.Float, nullable=False),
    sa.Column("expires_at", sa.Float, nullable=False),
    sa.Index("ix_budget_reservations_key", "key_id", "period"),
)
