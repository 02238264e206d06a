"""The `mcp:` section: server names that can prefix a tool, unique, and credentials kept as
secrets (masked, and scrubbed from what Ballast writes)."""

from __future__ import annotations

from typing import Any

import pytest

from ballast.config import ConfigError, parse_settings, secret_values

MODELS = [{"name": "m", "deployments": [{"id": "d", "url": "http://127.0.0.1:9"}]}]


def settings(**mcp: Any) -> Any:
    return parse_settings({"models": MODELS, "mcp": mcp})


def test_servers_with_their_credentials() -> None:
    found = settings(
        servers=[
            {
                "name": "github",
                "url": "https://mcp.example.com/mcp/",
                "headers": {"Authorization": "Bearer ghp-secret-token"},
                "tool_timeouts": {"search": 60},
            }
        ]
    )
    server = found.mcp.servers[0]
    assert server.url == "https://mcp.example.com/mcp"
    assert server.timeout_for("search") == 60 and server.timeout_for("other") == 30
    assert "ghp-secret-token" in secret_values(found)
    assert "ghp-secret-token" not in repr(found)


@pytest.mark.parametrize(
    ("servers", "separator", "problem"),
    [
        ([{"name": "a b", "url": "http://x"}], "__", "letters, digits"),
        ([{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}], "__", "duplicate"),
        ([{"name": "my-srv", "url": "http://x"}], "-", "separator"),
        ([{"name": "a", "url": "ftp://x"}], "__", "URL"),
        ([{"name": "a", "url": "http://x", "headers": {"x": "a\nb"}}], "__", "control"),
    ],
)
def test_bad_servers_are_refused(servers: Any, separator: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem):
        settings(servers=servers, separator=separator)
