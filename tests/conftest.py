from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.stack import Stack


@pytest.fixture
def stack() -> Iterator[Stack]:
    running = Stack()
    try:
        yield running
    finally:
        running.close()
