"""One deployment: an upstream, its credentials, its transport and its provider's options,
checked at load with errors that name the deployment and the setting."""

from __future__ import annotations

import re
from typing import Any, Literal
from urllib.parse import urlsplit

from pydantic import (
    ConfigDict,
    Field,
    SecretStr,
    ValidationInfo,
    field_validator,
    model_validator,
)

from ballast.config.base import Section
from ballast.config.catalogue import DEFAULT_URLS, ProviderName
from ballast.config.options import AnthropicOptions, AwsSettings, AzureOptions, GoogleSettings
from ballast.config.timeouts import TimeoutOverrides
from ballast.config.values import header_problem, http_url, readable, value_problem


class DeploymentTls(Section):
    """TLS to one deployment. `ca_file` replaces the system trust store for it (as curl's
    --cacert does): a private CA is trusted there and nowhere else."""

    ca_file: str | None = None
    client_cert: str | None = Field(None, description="PEM certificate (mTLS); may hold the key")
    client_key: str | None = Field(None, description="PEM key, unencrypted, if not in the cert")
    verify: bool = Field(True, description="false: any certificate is accepted (a lab only)")


class Deployment(Section):
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
    supports_prefill: bool | None = Field(
        None,
        description="it continues an assistant prefill, so a cut stream goes on from the text"
        " so far (false: its model refuses one, and a cut answer is regenerated and checked);"
        " unset: yes for provider anthropic, no for the others. Never with reasoning on",
    )
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
    headers: dict[str, str] = Field(default_factory=dict)
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

    messages: Literal["native", "bridge"] | None = Field(
        None,
        description="how /v1/messages is served: native forwards the client's body and"
        " headers to the deployment's own /v1/messages and its events back untouched; bridge"
        " turns it into a chat completion; unset: native for provider anthropic, bridge for"
        " everything else",
    )

    @property
    def messages_mode(self) -> Literal["native", "bridge"]:
        if self.messages is not None:
            return self.messages
        return "native" if self.provider == "anthropic" else "bridge"

    @field_validator("messages")
    @classmethod
    def _messages(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value == "native" and info.data.get("provider") != "anthropic":
            raise ValueError(
                f"deployment {_name(info)}: messages: native needs provider: anthropic"
            )
        return value

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
        return http_url(value)

    @field_validator("api_key")
    @classmethod
    def _api_key(cls, value: SecretStr | None, info: ValidationInfo) -> SecretStr | None:
        if value is not None:
            problem = value_problem(value.get_secret_value())
            if problem is not None:
                raise ValueError(f"deployment {_name(info)}: api_key has {problem} in it")
        return value

    @field_validator("headers")
    @classmethod
    def _headers(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        for name, text in value.items():
            problem = header_problem(name, text)
            if problem is not None:
                raise ValueError(f"deployment {_name(info)}: {problem}")
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
                problem = readable(path)
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
            problem = readable(google.credentials_file)
            if problem is not None:
                return f"google.credentials_file: cannot read {google.credentials_file} ({problem})"
    if dep.provider == "gemini" and dep.api_key is None:
        return "provider gemini needs api_key"
    return None


def _name(info: ValidationInfo) -> str:
    """The deployment being validated, for an error message (its id is checked first)."""
    return repr(info.data.get("id", "?"))
