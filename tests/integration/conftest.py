"""Real services for integration tests: `eval "$(scripts/services.sh start)"` exports
their URLs. Without them a test is skipped locally, but fails on CI (where `CI` is set),
so a CI job that forgot to start them cannot pass by skipping everything."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator

import pytest

from ballast.state.db import Database


def _service_url(variable: str) -> str:
    url = os.environ.get(variable)
    if url:
        return url
    message = f'{variable} is not set; run eval "$(scripts/services.sh start)" first'
    if os.environ.get("CI") is not None:
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


@pytest.fixture(scope="session")
def redis_url() -> str:
    return _service_url("BALLAST_TEST_REDIS_URL")


@pytest.fixture(scope="session")
def database_url() -> str:
    return _service_url("BALLAST_TEST_DATABASE_URL")


@pytest.fixture
async def database(database_url: str) -> AsyncIterator[Database]:
    """The PostgreSQL database, upgraded to the current schema."""
    db = Database(database_url)
    await db.upgrade()
    yield db
    await db.close()
