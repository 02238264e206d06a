"""The end-to-end tests leave the SDK clients they build to the collector, which closes
their sockets with a ResourceWarning in whichever test it runs during. Until every client is
closed by the test that made it, that one warning is shown rather than raised, here only."""

from __future__ import annotations

import pytest

UNCLOSED_SOCKET = pytest.mark.filterwarnings(
    "default:Exception ignored in. <socket.socket:pytest.PytestUnraisableExceptionWarning",
    "default:unclosed <socket.socket:ResourceWarning",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(UNCLOSED_SOCKET)
