"""Each provider's own section of a deployment, checked against its `provider` there."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from ballast.config.base import Section


class AnthropicOptions(Section):
    """A deployment of `provider: anthropic` (the Messages API)."""

    version: str = Field("2023-06-01", min_length=1, description="the anthropic-version header")
    max_tokens: int = Field(
        4096, ge=1, description="sent when the client names no max_tokens (Messages needs one)"
    )
    beta: str | None = Field(None, description="the anthropic-beta header, when set")


class AzureOptions(Section):
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


class AwsSettings(Section):
    """A deployment of `provider: bedrock`: the region it signs for (SigV4) and the
    credentials it signs with, from the standard chain (environment, shared profile,
    container or instance role), refreshed ahead of expiry."""

    region: str | None = Field(
        None, min_length=1, description="e.g. us-east-1 (required); the URL follows from it"
    )
    profile: str | None = Field(None, description="a shared-config profile; unset: the chain")
    service: str = Field("bedrock", description="the SigV4 signing name")


class GoogleSettings(Section):
    """A deployment of `provider: vertex`: its project and location, and its OAuth2
    credentials, a service-account key file or the application default credentials."""

    project: str | None = Field(None, min_length=1, description="the Google Cloud project")
    location: str | None = Field(
        None, min_length=1, description="e.g. us-central1 (required); the URL follows from it"
    )
    credentials_file: str | None = Field(None, description="service-account JSON; unset: ADC")
