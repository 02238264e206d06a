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
    sa.Index("ix_spend_key_period", "key_id", "period"),
)

service_sessions = sa.Table(
    "service_sessions",
    metadata,
    sa.Column("credential", sa.String(64), primary_key=True),
    sa.Column("model", sa.String(200), primary_key=True),
    sa.Column("session_id", sa.String(80), nullable=False),
)
