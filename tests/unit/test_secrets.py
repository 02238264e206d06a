"""No secret of any kind in what an operator reads: the masked config (`/admin/config`,
`check-config`), config errors (a YAML syntax error must not show the offending line) and
log lines at every level (query strings, bearer tokens); log fields escaped, so a client's
model name cannot forge a line; metric labels only ever configured names."""

from __future__ import annotations

import io
import logging
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from typer.testing import CliRunner

from ballast.cli import cli
from ballast.config import ConfigError, load_settings, masked, parse_settings, secret_values
from ballast.observe.logs import JsonFormatter, TextFormatter, hide, setup_logging, stop_logging
from ballast.observe.metrics import Metrics

SECRETS = (
    "goog-secret-1",
    "azure-secret-2",
    "proxy-auth-secret-3",
    "bearer-secret-4",
    "proxy-pass-5",
    "redis-pass-6",
    "pg-pass-7",
    "job-key-8",
    "job-body-secret-9",
    "url-token-10",
    "master-key-secret-11",
    "dash-token-12",
    "sk-dep-key-13",
)


def _config() -> dict[str, object]:
    return {
        "server": {"master_key": "master-key-secret-11", "dashboard_token": "dash-token-12"},
        "state": {
            "redis_url": "redis://default:redis-pass-6@redis:6379/0",
            "database_url": "postgresql+asyncpg://ballast:pg-pass-7@db/ballast",
        },
        "jobs": {
            "backends": {
                "gpu": {
                    "protocol": "runpod",
                    "url": "https://api.example.com/v2/x",
                    "api_key": "job-key-8",
                    "body": {"webhook_secret": "job-body-secret-9"},
                }
            }
        },
        "models": [
            {
                "name": "chat",
                "deployments": [
                    {
                        "id": "gemini",
                        "url": "https://gen.example.com/v1?key=url-token-10&alt=sse",
                        "api_key": "sk-dep-key-13",
                        "proxy": "http://user:proxy-pass-5@proxy.example.com:3128",
                        "headers": {
                            "x-goog-api-key": "goog-secret-1",
                            "api-key": "azure-secret-2",
                            "Proxy-Authorization": "Basic proxy-auth-secret-3",
                            "authorization": "Bearer bearer-secret-4",
                            "x-custom-thing": "also-hidden",
                        },
                    }
                ],
            }
        ],
    }


def test_masked_config_shows_no_secret_of_any_kind() -> None:
    text = yaml.safe_dump(masked(parse_settings(_config(), environ={})))
    for secret in (*SECRETS, "also-hidden"):
        assert secret not in text
    data = masked(parse_settings(_config(), environ={}))
    dep = data["models"][0]["deployments"][0]
    assert dep["headers"]["x-goog-api-key"] == "****"  # the header names stay readable
    assert dep["url"] == "https://gen.example.com/v1?key=****&alt=sse"
    assert data["state"]["redis_url"] == "redis://default:****@redis:6379/0"
    assert dep["id"] == "gemini" and data["server"]["port"] == 8080  # the rest is shown


def test_check_config_masks_headers(tmp_path: Path) -> None:
    path = tmp_path / "ballast.yaml"
    path.write_text(yaml.safe_dump(_config()))
    result = CliRunner().invoke(cli, ["check-config", str(path)])
    assert result.exit_code == 0, result.output
    assert "x-goog-api-key" in result.output
    for secret in SECRETS:
        assert secret not in result.output


def test_a_yaml_syntax_error_does_not_print_the_line(tmp_path: Path) -> None:
    path = tmp_path / "ballast.yaml"
    path.write_text(
        "models:\n  - name: chat\n    deployments:\n"
        '      - {id: a, url: "http://x", api_key: "sk-dep-key-13" headers: [}\n'
    )
    with pytest.raises(ConfigError) as caught:
        load_settings(path)
    message = str(caught.value)
    assert "sk-dep-key-13" not in message
    assert "line 4" in message
    result = CliRunner().invoke(cli, ["check-config", str(path)])
    assert result.exit_code == 2
    assert "sk-dep-key-13" not in result.output and "not valid YAML" in result.output


def _record(msg: str, args: tuple[object, ...] = (), **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("uvicorn.access", logging.DEBUG, "", 0, msg, args, None)
    if fields:
        record.fields = fields
    return record


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_log_lines_mask_query_tokens_and_bearer_tokens(formatter: logging.Formatter) -> None:
    access = _record(
        '%s - "%s %s HTTP/%s" %d',
        ("127.0.0.1:5000", "GET", "/dashboard?token=dash-token-12&x=1", "1.1", 200),
    )
    line = formatter.format(access)
    assert "dash-token-12" not in line and "/dashboard?token=****&x=1" in line
    bearer = _record("upstream said: Authorization: Bearer bearer-secret-4 refused")
    assert "bearer-secret-4" not in formatter.format(bearer)
    url = _record("connecting to redis://default:redis-pass-6@redis:6379")
    assert "redis-pass-6" not in formatter.format(url)


def test_text_log_fields_are_escaped() -> None:
    forged = "gpt-4o\n2026-01-01 00:00:00 ERROR ballast.admin master key rotated"
    line = TextFormatter().format(_record("request", model=forged, status=200))
    assert "\n" not in line
    assert 'model="gpt-4o\\n2026' in line and "status=200" in line
    assert "\n" not in TextFormatter().format(_record("bad %s", ("a\nb",)))


class _Group:
    def __init__(self, name: str, fallbacks: list[str]) -> None:
        self.name = name
        self.fallbacks = fallbacks
        self.context_fallbacks: list[str] = []


class _Target:
    def __init__(self, dep: str, group: _Group) -> None:
        self.id = dep
        self.group = group


def test_metric_labels_take_only_configured_model_names() -> None:
    metrics = Metrics()
    metrics.deployments(
        [_Target("a", _Group("chat", ["backup"])), _Target("b", _Group("gpt-*", ["chat"]))]
    )
    for i in range(300):
        metrics.event("fallback", {"from": f"gpt-client-{i}", "to": "chat"})
        metrics.event("fallback", {"from": f"made-up-{i}\nx", "to": "backup"})
    out = io.StringIO(metrics.render().decode())
    labels = {
        (s.labels["from_model"], s.labels["to_model"]): s.value
        for family in text_string_to_metric_families(out.read())
        if family.name == "ballast_fallbacks"
        for s in family.samples
        if s.name == "ballast_fallbacks_total"
    }
    assert labels == {("gpt-*", "chat"): 300.0, ("other", "backup"): 300.0}


def test_secret_values_are_every_configured_secret() -> None:
    found = secret_values(parse_settings(_config(), environ={}))
    assert {*SECRETS, "also-hidden"} <= found
    assert (
        "gemini" not in found and "https://gen.example.com/v1?key=url-token-10&alt=sse" not in found
    )


@pytest.mark.parametrize("formatter", [JsonFormatter(), TextFormatter()])
def test_log_fields_are_masked_like_messages(formatter: logging.Formatter) -> None:
    key = "sk-bl-" + "A1b2C3d4" * 5
    for given in (f"Bearer {key}", key, f"x?token={key}"):
        line = formatter.format(_record("request", request_id=given, status=401))
        assert "A1b2C3d4" not in line and "401" in line
    hide(["configured-secret-value-1"])
    line = formatter.format(_record("request", request_id="configured-secret-value-1"))
    assert "configured-secret-value-1" not in line


def test_debug_lets_ballasts_own_lines_through_and_no_other_librarys() -> None:
    out = io.StringIO()
    root = logging.getLogger()
    before = root.level, logging.getLogger("ballast").level, logging.getLogger("uvicorn").level
    setup_logging("debug", "text", out)
    try:
        logging.getLogger("ballast.keys").debug("ballast-debug-line")
        logging.getLogger("aiosqlite").debug("executing SELECT with the key hash")
        logging.getLogger("sqlalchemy.engine").debug("parameters: secret")
        logging.getLogger("aiosqlite").warning("aiosqlite-warning-line")
    finally:
        stop_logging()
        root.setLevel(before[0])
        logging.getLogger("ballast").setLevel(before[1])
        logging.getLogger("uvicorn").setLevel(before[2])
    text = out.getvalue()
    assert "ballast-debug-line" in text and "aiosqlite-warning-line" in text
    assert "key hash" not in text and "parameters" not in text
