"""Settings: YAML with ${VAR} expansion, validated once at start-up (never on the hot path)."""

from __future__ import annotations

import fnmatch
import ipaddress
import os
import re
from pathlib import Path
from typing import Any, Literal, NamedTuple
from urllib.parse import urlsplit

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class ConfigError(Exception):
    """A config that cannot be used; `errors` holds one `path: message` line per problem."""

    def __init__(self, errors: list[str]) -> None:
        super().__init__("\n".join(errors))
        self.errors = errors


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Timeouts(_Strict):
    """Seconds. `first_token` and `inter_chunk` are the two stream clocks (seed 002)."""

    connect: float = Field(5.0, gt=0)
    pool: float = Field(2.0, gt=0, description="waiting for a free pooled connection")
    first_token: float = Field(30.0, gt=0)
    inter_chunk: float = Field(30.0, gt=0)
    answer: float = Field(300.0, gt=0, description="one deployment's whole non-streamed answer")
    request: float = Field(600.0, gt=0, description="a client request, all attempts included")


class TimeoutOverrides(_Strict):
    connect: float | None = Field(None, gt=0)
    pool: float | None = Field(None, gt=0)
    first_token: float | None = Field(None, gt=0)
    inter_chunk: float | None = Field(None, gt=0)
    answer: float | None = Field(None, gt=0)
    request: float | None = Field(None, gt=0)

    def apply(self, base: Timeouts) -> Timeouts:
        overrides = {k: v for k, v in self.model_dump().items() if v is not None}
        return base.model_copy(update=overrides) if overrides else base


_TOKEN = re.compile(r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
# Controls a header value must not hold: C0 (tab aside) and DEL; CR, LF and NUL among them.
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")
# A host name, or an IPv6 literal in brackets (checked again below), then an optional port.
_URL = re.compile(r"^https?://(?:[^/\s:\[\]]+|\[([0-9A-Fa-f:.]+)\])(?::\d+)?(?:/\S*)?$")


def _value_problem(text: str) -> str | None:
    """What makes a configured header value unusable, if anything.

    Configured values must be printable ASCII (space and tab allowed): the YAML is read as
    UTF-8 but a header goes out as Latin-1 bytes, so anything past ASCII would reach the
    upstream as different bytes than the operator typed (a pasted curly quote or a
    non-breaking space in a key turns into a 401 much later). Refused here, it is a clear
    start-up error instead."""
    if _CONTROL.search(text):
        return "a control character"
    if not text.isascii():
        return "a non-ASCII character"
    return None


def _readable(path: str) -> str | None:
    """Why a file cannot be read, or None when it can (read now, so a typo stops start-up)."""
    try:
        with open(path, "rb") as handle:
            handle.read(1)
    except OSError as exc:
        return exc.strerror or type(exc).__name__
    return None


class DeploymentTls(_Strict):
    """TLS to one deployment. `ca_file` replaces the system trust store for it (as curl's
    --cacert does): a private CA is trusted there and nowhere else."""

    ca_file: str | None = None
    client_cert: str | None = Field(None, description="PEM certificate (mTLS); may hold the key")
    client_key: str | None = Field(None, description="PEM key, unencrypted, if not in the cert")
    verify: bool = Field(True, description="false: any certificate is accepted (a lab only)")


# --- Native providers and OpenAI-compatible presets -----------------------------------


class Preset(NamedTuple):
    """An OpenAI-compatible provider known by name: its base URL and its quirks."""

    url: str
    stream_options: bool = True  # False: the provider refuses `stream_options`


PRESETS: dict[str, Preset] = {
    "mistral": Preset("https://api.mistral.ai/v1", stream_options=False),
    "groq": Preset("https://api.groq.com/openai/v1"),
    "deepseek": Preset("https://api.deepseek.com/v1"),
    "together": Preset("https://api.together.xyz/v1"),
    "fireworks": Preset("https://api.fireworks.ai/inference/v1"),
    "openrouter": Preset("https://openrouter.ai/api/v1"),
    "xai": Preset("https://api.x.ai/v1"),
    "ollama": Preset("http://localhost:11434/v1"),
    "perplexity": Preset("https://api.perplexity.ai", stream_options=False),
    "cerebras": Preset("https://api.cerebras.ai/v1"),
    "nvidia": Preset("https://integrate.api.nvidia.com/v1"),
}
# Every name `provider` takes: the native protocols, then the presets above.
ProviderName = Literal[
    "openai",
    "vllm",
    "sglang",
    "actor",
    "anthropic",
    "azure",
    "gemini",
    "vertex",
    "bedrock",
    "mistral",
    "groq",
    "deepseek",
    "together",
    "fireworks",
    "openrouter",
    "xai",
    "ollama",
    "perplexity",
    "cerebras",
    "nvidia",
]
DEFAULT_URLS = {
    "anthropic": "https://api.anthropic.com",
    "gemini": "https://generativelanguage.googleapis.com",
    **{k: p.url for k, p in PRESETS.items()},
}


class AnthropicOptions(_Strict):
    """A deployment of `provider: anthropic` (the Messages API)."""

    version: str = Field("2023-06-01", min_length=1, description="the anthropic-version header")
    max_tokens: int = Field(
        4096, ge=1, description="sent when the client names no max_tokens (Messages needs one)"
    )
    beta: str | None = Field(None, description="the anthropic-beta header, when set")


class AzureOptions(_Strict):
    """A deployment of `provider: azure`. `style: deployments` is the classic
    `/openai/deployments/{deployment}/...?api-version=` URL (api_version required);
    `style: v1` is the `/openai/v1/` API, where the model is named in the body."""

    style: Literal["deployments", "v1"] = Field(
        "deployments",
        description="deployments: the classic /openai/deployments/{deployment}/ URLs; v1: the"
        " /openai/v1/ API",
    )
    api_version: str | None = Field(
        None, min_length=1, description="the api-version query value (required by deployments)"
    )
    deployment: str | None = Field(
        None, min_length=1, description="the Azure deployment name; unset: the model's name"
    )
    auth: Literal["api-key", "bearer"] = Field(
        "api-key", description="api_key sent as the api-key header, or as a bearer token"
    )


class AwsSettings(_Strict):
    """A deployment of `provider: bedrock`: the region it signs for (SigV4) and the
    credentials it signs with, from the standard chain (environment, shared profile,
    container or instance role), refreshed ahead of expiry."""

    region: str | None = Field(
        None, min_length=1, description="e.g. us-east-1 (required); the URL follows from it"
    )
    profile: str | None = Field(None, description="a shared-config profile; unset: the chain")
    service: str = Field("bedrock", description="the SigV4 signing name")


class GoogleSettings(_Strict):
    """A deployment of `provider: vertex`: its project and location, and its OAuth2
    credentials, a service-account key file or the application default credentials."""

    project: str | None = Field(None, min_length=1, description="the Google Cloud project")
    location: str | None = Field(
        None, min_length=1, description="e.g. us-central1 (required); the URL follows from it"
    )
    credentials_file: str | None = Field(None, description="service-account JSON; unset: ADC")


class Deployment(_Strict):
    # A rejected api_key or header must never be echoed back in an error.
    model_config = ConfigDict(extra="forbid", frozen=True, hide_input_in_errors=True)

    id: str = Field(min_length=1)
    url: str
    api_key: SecretStr | None = None
    model: str | None = Field(None, description="upstream model name; unset forwards the client's")
    provider: ProviderName = "openai"
    weight: float = Field(1.0, ge=0)
    timeouts: TimeoutOverrides = TimeoutOverrides()
    pool_size: int | None = Field(None, ge=1)
    max_response_bytes: int | None = Field(
        None, ge=1024, description="this deployment's limit on a whole answer (upstream's)"
    )
    supports_prefill: bool = False
    answers_as_streams: bool | None = Field(
        None,
        description="this deployment's own routing.answers_as_streams (false for an upstream"
        " that streams badly, or where the assembling cost matters more); unset: the routing"
        " setting",
    )
    probe: Literal["auto", "models", "completion", "none"] = Field(
        "auto",
        description="how an open deployment is probed in the background: a one-token"
        " completion, GET /models, or not at all; auto: a completion when the deployment"
        " names its model, else the model list",
    )
    headers: dict[str, str] = {}
    proxy: SecretStr | None = Field(
        None,
        description="http://[user:pass@]host:port; 'none' or empty: no proxy; unset: the"
        " HTTPS_PROXY/HTTP_PROXY/NO_PROXY environment",
    )
    tls: DeploymentTls | None = None
    responses: Literal["native", "bridge"] | None = Field(
        None,
        description="how /v1/responses is served: native forwards it to the deployment's own"
        " /responses; bridge turns it into a chat completion; unset: native for OpenAI's and"
        " Azure OpenAI's own APIs, bridge for everything else",
    )

    @property
    def responses_mode(self) -> Literal["native", "bridge"]:
        if self.responses is not None:
            return self.responses
        host = urlsplit(self.url).hostname or ""
        native = self.provider == "openai" and (
            host == "api.openai.com" or host.endswith(".openai.azure.com")
        )
        return "native" if native else "bridge"

    @field_validator("responses")
    @classmethod
    def _responses(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value == "native" and info.data.get("provider") == "actor":
            raise ValueError(f"deployment {_name(info)}: the sampling actor has no /responses")
        return value

    anthropic: AnthropicOptions | None = None
    azure: AzureOptions | None = None
    aws: AwsSettings | None = None  # provider bedrock
    google: GoogleSettings | None = None  # provider vertex

    @model_validator(mode="before")
    @classmethod
    def _default_url(cls, data: Any) -> Any:
        """A known provider's URL is filled in; an explicit `url` wins."""
        if isinstance(data, dict) and not data.get("url"):
            default = DEFAULT_URLS.get(str(data.get("provider")))
            if default is not None:
                data = {**data, "url": default}
        url = data.get("url") if isinstance(data, dict) else None
        if isinstance(url, str) and data.get("provider") == "azure":
            # The resource's endpoint: the URL style decides the path after it.
            for tail in ("/openai/v1", "/openai"):
                if url.rstrip("/").endswith(tail):
                    data = {**data, "url": url.rstrip("/")[: -len(tail)]}
                    break
        return data

    @model_validator(mode="after")
    def _provider_options(self) -> Deployment:
        """Each provider's own section, checked against the provider it belongs to."""
        name = repr(self.id)
        for section in ("anthropic", "azure"):
            if getattr(self, section) is not None and self.provider != section:
                raise ValueError(
                    f"deployment {name}: the {section} section needs provider: {section}"
                )
        if self.provider == "azure":
            azure = self.azure or AzureOptions()
            if azure.style == "deployments" and azure.api_version is None:
                raise ValueError(
                    f"deployment {name}: azure.api_version is required for the classic"
                    " /openai/deployments URL style (or set azure.style: v1)"
                )
            if azure.style == "deployments" and azure.deployment is None:
                if self.model is None or self.model == "*":
                    raise ValueError(
                        f"deployment {name}: azure.deployment (or model) is required for the"
                        " classic /openai/deployments URL style"
                    )
        return self

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        match = _URL.match(value)
        if not match:
            raise ValueError("not a URL")
        if match.group(1) is not None:
            try:
                ipaddress.IPv6Address(match.group(1))
            except ValueError:
                raise ValueError("not a URL (bad IPv6 literal)") from None
        return value.rstrip("/")

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None:
            problem = _value_problem(value.get_secret_value())
            if problem is not None:
                raise ValueError(f"deployment {_name(info)}: api_key has {problem} in it")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for name, text in value.items():
            if not _TOKEN.match(name):
                raise ValueError(
                    f"deployment {_name(info)}: header name {name!r} is not an HTTP token"
                )
            problem = _value_problem(text)
            if problem is not None:
                raise ValueError(
                    f"deployment {_name(info)}: header {name!r} has {problem} in its value"
                )
        return value

    @field_validator("proxy", mode="before")
    @classmethod
    def _proxy(cls, value: Any, info: ValidationInfo) -> SecretStr:
        """Given at all, the setting wins over the environment: `none`, empty or a bare
        `proxy:` mean direct connections."""
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if value is None or (isinstance(value, str) and value.strip().lower() in ("", "none")):
            return SecretStr("")
        if not isinstance(value, str):
            raise ValueError(f"deployment {_name(info)}: proxy must be a URL or 'none'")
        text = value.strip()
        # The URL may hold a password: the messages below never show it.
        try:
            parts = urlsplit(text)
            parts.port  # noqa: B018 - raises for a port that is not a number in range
        except ValueError:
            raise ValueError(f"deployment {_name(info)}: proxy is not a URL") from None
        if parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
            raise ValueError(
                f"deployment {_name(info)}: proxy must be http://[user:pass@]host:port or 'none'"
            )
        return SecretStr(text)

    @field_validator("tls")
    @classmethod
    def _tls(cls, value: DeploymentTls | None, info: ValidationInfo) -> DeploymentTls | None:
        if value is None:
            return None
        if value.client_key is not None and value.client_cert is None:
            raise ValueError(f"deployment {_name(info)}: tls.client_key needs tls.client_cert")
        for field in ("ca_file", "client_cert", "client_key"):
            path = getattr(value, field)
            if path is not None:
                problem = _readable(path)
                if problem is not None:
                    raise ValueError(
                        f"deployment {_name(info)}: tls.{field}: cannot read {path} ({problem})"
                    )
        return value

    @model_validator(mode="before")
    @classmethod
    def _cloud_url(cls, data: Any) -> Any:
        """Bedrock's and Vertex's URL follow from the region or location; `url` wins."""
        if not isinstance(data, dict) or data.get("url"):
            return data
        section = data.get("aws") if data.get("provider") == "bedrock" else data.get("google")
        place = None
        if isinstance(section, dict):
            place = section.get("region" if data.get("provider") == "bedrock" else "location")
        if isinstance(place, str) and re.fullmatch(r"[a-z0-9-]+", place):
            if data.get("provider") == "bedrock":
                return {**data, "url": f"https://bedrock-runtime.{place}.amazonaws.com"}
            if data.get("provider") == "vertex":
                host = "aiplatform" if place == "global" else f"{place}-aiplatform"
                return {**data, "url": f"https://{host}.googleapis.com"}
        return data

    @model_validator(mode="after")
    def _cloud(self) -> Deployment:
        problem = _cloud_problem(self)
        if problem is not None:
            raise ValueError(f"deployment {self.id!r}: {problem}")
        return self


def _cloud_problem(dep: Deployment) -> str | None:
    """What a Bedrock or Vertex deployment lacks, naming the setting (checked at load, so a
    missing region or an unreadable key file stops start-up instead of failing requests)."""
    for section, owner in (("aws", "bedrock"), ("google", "vertex")):
        if getattr(dep, section) is not None and dep.provider != owner:
            return f"the {section} section needs provider: {owner}"
    if dep.provider == "bedrock" and (dep.aws is None or dep.aws.region is None):
        return "provider bedrock needs aws.region"
    if dep.provider == "vertex":
        google = dep.google or GoogleSettings()
        for field in ("project", "location"):
            if getattr(google, field) is None:
                return f"provider vertex needs google.{field}"
        if google.credentials_file is not None:
            problem = _readable(google.credentials_file)
            if problem is not None:
                return f"google.credentials_file: cannot read {google.credentials_file} ({problem})"
    if dep.provider == "gemini" and dep.api_key is None:
        return "provider gemini needs api_key"
    return None


def _name(info: ValidationInfo) -> str:
    """The deployment being validated, for an error message (its id is checked first)."""
    return repr(info.data.get("id", "?"))


class CacheSettings(_Strict):
    """A model group's response cache (off unless the group has a `cache` section)."""

    ttl: float = Field(300.0, gt=0, description="seconds an answer is kept")
    coalesce: bool = Field(False, description="identical concurrent misses make one call")
    coalesce_wait: float = Field(30.0, gt=0, description="longest wait for that one call")
    scope: Literal["key", "global"] = Field("key", description="entries per API key, or shared")
    max_entry_bytes: int = Field(256 * 1024, ge=1, description="larger answers are not kept")


class ModelGroup(_Strict):
    name: str = Field(min_length=1)
    deployments: list[Deployment] = Field(min_length=1)
    fallbacks: list[str] = []
    context_fallbacks: list[str] = []
    strategy: Literal["health", "ordered", "weighted"] = "health"
    cache: CacheSettings | None = None

    @property
    def is_wildcard(self) -> bool:
        return any(ch in self.name for ch in "*?[")


class ServerSettings(_Strict):
    host: str = "127.0.0.1"
    port: int = Field(8080, ge=0, le=65535)
    max_body_bytes: int = Field(10 * 1024 * 1024, ge=1024)
    master_key: SecretStr | None = Field(None, description="admin API; also a full-access key")
    dashboard_token: SecretStr | None = Field(None, description="read-only dashboard access")
    max_in_flight: int = Field(
        1024, ge=1, description="proxied requests per worker; past it, 503 at once (shed)"
    )
    body_timeout: float = Field(30.0, gt=0, description="to receive a request's whole body")
    header_timeout: float = Field(10.0, gt=0, description="to receive a request's headers")
    max_header_bytes: int = Field(64 * 1024, ge=1024, description="a request's header block")
    keepalive_timeout: float = Field(30.0, gt=0, description="an idle client connection")
    client_write_timeout: float = Field(
        30.0,
        gt=0,
        description="a stream's write to a client that stopped reading; past it the stream"
        " is cut and its upstream connection released (counted as client_gone)",
    )
    shutdown_grace: float = Field(30.0, ge=0, description="SIGTERM: time to finish requests")
    accept_batch: int = Field(
        128,
        ge=1,
        description="new client connections accepted at once when the listening socket is"
        " ready (server/accept.py); a burst waits fewer turns of a busy event loop",
    )
    gc_young_threshold: int = Field(
        10_000,
        ge=0,
        description="new objects between young garbage collections once started (heap.py);"
        " 0 keeps Python's defaults",
    )


class UpstreamSettings(_Strict):
    pool_size: int = Field(256, ge=1, description="connections per deployment (a bulkhead)")
    keepalive_timeout: float = Field(60.0, gt=0)
    warm_connections: int = Field(1, ge=0, description="connections opened per deployment at start")
    max_response_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="a whole (non-streamed) answer, decoded; past it: 502, the connection"
        " dropped. A deployment's own setting replaces it (for embeddings too)",
    )
    max_embeddings_response_bytes: int = Field(
        160 * 1024 * 1024,
        ge=1024,
        description="a whole embeddings answer (thousands of vectors as JSON floats)",
    )
    max_event_bytes: int = Field(
        4 * 1024 * 1024, ge=1024, description="one server-sent event of a streamed answer"
    )
    max_kept_chars: int = Field(
        1_000_000,
        ge=0,
        description="text of a stream kept for continuation (content, reasoning, tool"
        " arguments); a longer stream is relayed whole but not continued",
    )
    expose_headers: list[str] = Field(
        ["openai-processing-ms", "openai-version"],
        description="upstream answer headers a client may see (a trailing * matches a prefix);"
        " every other upstream header stays with Ballast",
    )


class ModelPrice(_Strict):
    """Dollars per million tokens."""

    input: float = Field(0.0, ge=0)
    output: float = Field(0.0, ge=0)
    cached_input: float | None = Field(
        None, ge=0, description="cached prompt tokens; unset: the input price"
    )
    max_output_tokens: int | None = Field(
        None, ge=1, description="the model's longest answer: a budget's worst case"
    )


class BudgetSettings(_Strict):
    """Budgets reserve a request's worst-case cost before it goes upstream."""

    default_max_output_tokens: int = Field(
        4096, ge=1, description="worst case of a request without max_tokens, model unknown"
    )
    grant_divisor: float = Field(
        8.0, ge=1, description="a grant takes up to what is left of a budget / this"
    )
    grant_accept_for: float = Field(30.0, gt=0, description="seconds a grant takes requests")
    built_in_prices: bool = Field(True, description="price known models from the built-in table")


class BreakerSettings(_Strict):
    failure_threshold: int = Field(10, ge=1)
    failure_rate: float | None = Field(0.5, gt=0, le=1)
    min_calls: int = Field(20, ge=1)
    window: float = Field(30.0, gt=0)
    open_time: float = Field(5.0, gt=0)
    max_open_time: float = Field(300.0, gt=0)
    probe_timeout: float = Field(10.0, gt=0)
    half_open_probes: int = Field(1, ge=1)
    open_multiplier: float = Field(
        2.0, ge=1, description="growth of the open time at each failed half-open probe"
    )
    probe_interval: float = Field(
        2.0, gt=0, description="an open deployment is probed in the background this often"
    )
    max_probe_interval: float = Field(
        10.0, gt=0, description="failed background probes back off up to this interval"
    )
    probe_backoff_after: float = Field(
        30.0,
        ge=0,
        description="probes keep to probe_interval for this long into an outage before"
        " backing off, so a short outage is noticed to end within an interval",
    )


class RoutingSettings(_Strict):
    """The attempt loop's bounds. Retries are capped per request and, across requests, by a
    budget, so an outage cannot multiply upstream load (Envoy, Finagle)."""

    max_attempts: int = Field(5, ge=1)
    backoff_base: float = Field(0.05, ge=0)
    backoff_cap: float = Field(1.0, ge=0)
    retry_budget_ratio: float = Field(0.5, ge=0)
    retry_budget_min_per_second: float = Field(10.0, ge=0)
    rate_limit_cooldown: float = Field(5.0, gt=0, description="429 without Retry-After")
    auth_cooldown: float = Field(300.0, gt=0, description="our upstream key was refused")
    max_retry_after_wait: float = Field(5.0, ge=0)
    health_window: float = Field(60.0, gt=0)
    continuation: bool = True
    stream_keepalive: float | None = Field(
        15.0,
        gt=0,
        description="seconds without a first token before a stream's headers and an SSE"
        " comment go out (then one comment per interval); null: wait silently",
    )
    answers_as_streams: bool = Field(
        True,
        description="ask an upstream for a stream even when the client wants a whole answer,"
        " and assemble it, so the first-token and inter-chunk clocks guard it too",
    )
    whole_answer_share: float = Field(
        0.5,
        gt=0,
        le=1,
        description="a whole answer not guarded by the stream clocks (not asked for as a"
        " stream) may take this share of the request's time left, when another deployment or"
        " a fallback could still answer: so a silent upstream leaves time for a failover",
    )
    stream_headers_at_once: bool = Field(
        False, description="start every stream's response at once, before its first token"
    )
    handle_refresh_margin: float = Field(
        60.0, ge=0, description="renew a remote run's token this long before it expires"
    )
    hedge_after: float | None = Field(
        None, gt=0, description="start a second stream after this long without a first token"
    )
    hedge_on_p95: bool = Field(False, description="hedge after the deployment's p95 TTFT")
    breaker: BreakerSettings = BreakerSettings()


class RedisBreakerSettings(_Strict):
    """Seed 003: a slow Redis is worse than a dead one. After `failure_threshold` failed
    calls every use takes its local fallback at once; one probe after `recovery_timeout`."""

    failure_threshold: int = Field(5, ge=1)
    recovery_timeout: float = Field(60.0, gt=0)
    probe_timeout: float = Field(5.0, gt=0)


class StateSettings(_Strict):
    redis_url: str | None = None
    database_url: str = "sqlite+aiosqlite:///ballast.db"
    redis_timeout: float = Field(0.05, gt=0, description="per Redis call")
    redis_breaker: RedisBreakerSettings = RedisBreakerSettings()
    database_timeout: float = Field(5.0, gt=0)
    key_cache_ttl: float = Field(30.0, ge=0, description="how long a looked-up key is trusted")
    instances: int = Field(1, ge=1, description="gateways sharing the limits (local fallback)")
    ratelimit_release_delay: float = Field(
        0.05, ge=0, description="longest a finished request's Redis release waits to be sent"
    )
    spend_flush_interval: float = Field(1.0, gt=0)
    spend_journal: str = "ballast-spend.journal"
    shared_limits: bool = Field(
        True,
        description="`serve --workers N` shares rate limits (a file next to the journal)",
    )
    cache_prefix: str = Field("ballast:cache:", description="Redis key prefix of the cache")
    cache_local_bytes: int = Field(
        64 * 1024 * 1024, ge=0, description="in-process response cache size without Redis"
    )


class ObserveSettings(_Strict):
    tracing: bool = Field(
        False,
        description="OpenTelemetry spans, exported over OTLP/HTTP (needs the tracing extra);"
        " also on when OTEL_EXPORTER_OTLP_ENDPOINT is set",
    )
    per_key_metrics: bool = Field(
        True, description="token, cost and budget series per key id (never the key itself)"
    )
    max_key_series: int = Field(
        1000, ge=0, description="distinct key ids labelled per worker; later keys are 'other'"
    )


class FleetSettings(_Strict):
    """How admin actions (drain, enable, reload, key changes) reach every worker and
    instance: at once over local sockets and Redis pub/sub; by polling the database's
    command log as the fallback."""

    fallback_poll: float = Field(
        0.25,
        gt=0,
        description="command log polling while Redis is down or not configured (an action"
        " then takes up to this, plus its own time, to reach another instance)",
    )
    safety_poll: float = Field(
        5.0, gt=0, description="command log polling while Redis pub/sub carries commands"
    )
    heartbeat: float = Field(
        1.0, gt=0, description="each worker's summary written to Redis for the fleet view"
    )
    peer_timeout: float = Field(0.5, gt=0, description="asking another worker of this instance")


class JobBreakerSettings(_Strict):
    """Counts submission and infrastructure failures of one job backend, never a job that
    is still running. The half-open trial frees itself after `probe_timeout`."""

    failure_threshold: int = Field(3, ge=1)
    open_time: float = Field(30.0, gt=0)
    max_open_time: float = Field(600.0, gt=0)
    probe_timeout: float = Field(600.0, gt=0, description="a trial without a verdict frees")


class JobBackendSettings(_Strict):
    """One serverless job backend. The remote owns the execution timeout; Ballast only gives
    up on a job after losing contact for longer than `lost_contact_timeout`."""

    protocol: Literal["runpod", "replicate", "http"]
    url: str
    api_key: SecretStr | None = None
    execution_timeout: float | None = Field(600.0, gt=0, description="passed to the remote")
    typical_duration: float = Field(120.0, gt=0, description="for the progress estimate")
    poll_interval: float = Field(2.0, gt=0)
    max_poll_interval: float = Field(30.0, gt=0)
    request_timeout: float = Field(10.0, gt=0, description="one call to the backend")
    lost_contact_timeout: float = Field(600.0, gt=0)
    retention: float = Field(1800.0, gt=0, description="how long the remote keeps results")
    max_queued: int = Field(1000, ge=0, description="jobs held while the breaker is open")
    breaker: JobBreakerSettings = JobBreakerSettings()
    body: dict[str, Any] = Field(default_factory=dict, description="extra submission fields")
    # The generic `http` protocol: where things are and what its statuses mean.
    submit_path: str = "/jobs"
    status_path: str = "/jobs/{id}"
    cancel_path: str = "/jobs/{id}/cancel"
    status_map: dict[str, Literal["queued", "running", "succeeded", "failed", "cancelled"]] = {}

    @field_validator("url")
    @classmethod
    def _url(cls, value: str) -> str:
        if not re.match(r"^https?://[^/\s:]+(:\d+)?(/\S*)?$", value):
            raise ValueError("not a URL")
        return value.rstrip("/")


class JobsSettings(_Strict):
    backends: dict[str, JobBackendSettings] = {}
    lease_time: float = Field(30.0, gt=0, description="a dead instance's jobs move after this")
    claim_interval: float = Field(0.5, gt=0)
    max_in_flight: int = Field(64, ge=1, description="backend calls at once per instance")
    max_wait: float = Field(60.0, ge=0, description="longest GET /v1/jobs/{id}?wait=")


class Settings(_Strict):
    server: ServerSettings = ServerSettings()
    timeouts: Timeouts = Timeouts()
    upstream: UpstreamSettings = UpstreamSettings()
    routing: RoutingSettings = RoutingSettings()
    state: StateSettings = StateSettings()
    observe: ObserveSettings = ObserveSettings()
    fleet: FleetSettings = FleetSettings()
    jobs: JobsSettings = JobsSettings()
    budgets: BudgetSettings = BudgetSettings()
    prices: dict[str, ModelPrice] = Field(
        default_factory=dict, description="per model name as upstreams report it"
    )
    models: list[ModelGroup] = Field(min_length=1)

    @field_validator("models")
    @classmethod
    def _unique(cls, groups: list[ModelGroup]) -> list[ModelGroup]:
        names = [g.name for g in groups]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"duplicate model names: {', '.join(dupes)}")
        ids = [d.id for g in groups for d in g.deployments]
        dupes = sorted({i for i in ids if ids.count(i) > 1})
        if dupes:
            raise ValueError(f"duplicate deployment ids: {', '.join(dupes)}")
        known = set(names)
        for group in groups:
            for other in [*group.fallbacks, *group.context_fallbacks]:
                if other not in known and not any(fnmatch.fnmatchcase(other, n) for n in names):
                    raise ValueError(f"model {group.name!r} falls back to unknown model {other!r}")
        return groups

    def timeouts_for(self, deployment: Deployment) -> Timeouts:
        return deployment.timeouts.apply(self.timeouts)


def expand_env(value: Any, environ: dict[str, str], path: str = "") -> Any:
    """Expand ${VAR} and ${VAR:-default} in every string of a parsed YAML tree."""
    if isinstance(value, dict):
        return {k: expand_env(v, environ, _join(path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [expand_env(v, environ, f"{path}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, str) and "${" in value:
        missing: list[str] = []

        def substitute(match: re.Match[str]) -> str:
            name, default = match.group(1), match.group(2)
            if name in environ and environ[name] != "":
                return environ[name]
            if default is not None:
                return default
            missing.append(name)
            return ""

        expanded = _ENV_PATTERN.sub(substitute, value)
        if missing:
            raise ConfigError([f"{path}: environment variable {missing[0]} is not set"])
        return expanded
    return value


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _format_loc(loc: tuple[int | str, ...]) -> str:
    out = ""
    for part in loc:
        out += f"[{part}]" if isinstance(part, int) else _join_dot(out, part)
    return out or "(root)"


def _join_dot(out: str, part: str) -> str:
    return f".{part}" if out else part


_ENV_OVERRIDES = {
    "BALLAST_REDIS_BREAKER_FAILURE_THRESHOLD": ("state", "redis_breaker", "failure_threshold"),
    "BALLAST_REDIS_BREAKER_RECOVERY_TIMEOUT": ("state", "redis_breaker", "recovery_timeout"),
    "BALLAST_REDIS_URL": ("state", "redis_url"),
    "BALLAST_DATABASE_URL": ("state", "database_url"),
}


def _apply_env_overrides(data: dict[str, Any], environ: dict[str, str]) -> None:
    for name, path in _ENV_OVERRIDES.items():
        value = environ.get(name)
        if not value:
            continue
        node = data
        for part in path[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[path[-1]] = value


def parse_settings(data: Any, environ: dict[str, str] | None = None) -> Settings:
    """Validate a parsed YAML tree; every problem is reported with its path."""
    if not isinstance(data, dict):
        raise ConfigError(["(root): expected a mapping with at least a 'models' list"])
    env = dict(os.environ) if environ is None else environ
    expanded = expand_env(data, env)
    _apply_env_overrides(expanded, env)
    try:
        return Settings.model_validate(expanded)
    except ValidationError as exc:
        lines = []
        for err in exc.errors():
            message = str(err["msg"]).removeprefix("Value error, ")
            lines.append(f"{_format_loc(tuple(err['loc']))}: {message}")
        raise ConfigError(lines) from None


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What is wrong and where, never the text around it: the offending line may hold a
    secret, and this message reaches the terminal and, on a reload, the log."""
    if isinstance(exc, yaml.MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        return f"not valid YAML{where}: {problem}"
    return f"not valid YAML ({type(exc).__name__})"


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read ({exc.strerror})"]) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError([f"{path}: {yaml_problem(exc)}"]) from None
    return parse_settings(data, environ)


MASK = "****"
# A field is secret when its name says so, wherever it sits (provider credentials included).
_SECRET_NAME = re.compile(
    r"(^|[_-])(api[_-]?key|key|secret|token|password|passwd|credentials?|authorization|auth"
    r"|cookie|signature|sig|private[_-]?key|session[_-]?token|access[_-]?key(_id)?)$",
    re.IGNORECASE,
)
# Secret values inside a URL: its user:password and query parameters named like secrets.
_URL_USERINFO = re.compile(r"(://[^:/@\s]*):[^@/\s]*@")
_URL_QUERY_SECRET = re.compile(
    r"([?&](?:[a-z0-9_-]*(?:key|token|secret|password|sig|signature|auth)[a-z0-9_-]*)=)[^&#\s]*",
    re.IGNORECASE,
)


def mask_url(text: str) -> str:
    """A URL (or any text holding one) with its password and secret query values masked."""
    if "://" in text:
        text = _URL_USERINFO.sub(rf"\1:{MASK}@", text)
    if "=" in text:
        text = _URL_QUERY_SECRET.sub(rf"\1{MASK}", text)
    return text


def is_secret_name(name: str) -> bool:
    return bool(_SECRET_NAME.search(name))


def _mask_tree(value: Any, name: str = "") -> Any:
    if isinstance(value, dict):
        if name == "headers":
            # Custom headers carry credentials under any name (x-goog-api-key, api-key,
            # proxy-authorization, ...): none of their values is shown.
            return {k: MASK for k in value}
        return {k: _mask_tree(v, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [_mask_tree(v, name) for v in value]
    if isinstance(value, str) and value:
        if is_secret_name(name) or name == "proxy":
            return MASK
        return mask_url(value)
    return value


def masked(settings: Settings) -> dict[str, Any]:
    """The resolved config as plain data, with every secret replaced by a mask: fields named
    like secrets, every custom header's value, and passwords and secret query parameters in
    URLs, wherever they are."""
    data: dict[str, Any] = _mask_tree(settings.model_dump(mode="json"))
    return data
