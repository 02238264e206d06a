"""Settings: YAML with ${VAR} expansion, validated once at start-up (never on the hot path).

One module per concern: `loading` (YAML, the environment, error paths), `secrets` (masking),
`values` (HTTP value checks), `catalogue` (the provider names), `deployment` and `options`
(one upstream), `breaker` (one vocabulary for every breaker), `sections/` (one per section
of the file) and `settings` (the root). The names below are the public ones."""

from __future__ import annotations

from ballast.config.breaker import BreakerSettings, breaker_config
from ballast.config.catalogue import DEFAULT_URLS, PRESETS, PROVIDERS, Preset, ProviderName
from ballast.config.deployment import Deployment, DeploymentTls
from ballast.config.errors import ConfigError
from ballast.config.loading import expand_env, load_settings, parse_settings, yaml_problem
from ballast.config.options import AnthropicOptions, AwsSettings, AzureOptions, GoogleSettings
from ballast.config.secrets import MASK, is_secret_name, mask_url, masked, scrub, secret_values
from ballast.config.sections.budgets import BudgetSettings, ModelPrice
from ballast.config.sections.cache import CacheSettings
from ballast.config.sections.fleet import FleetSettings
from ballast.config.sections.jobs import JobBackendSettings, JobBreakerSettings, JobsSettings
from ballast.config.sections.mcp import McpServerSettings, McpSettings
from ballast.config.sections.models import ModelGroup
from ballast.config.sections.observe import ObserveSettings
from ballast.config.sections.routing import DeploymentBreakerSettings, RoutingSettings
from ballast.config.sections.server import ServerSettings
from ballast.config.sections.state import RedisBreakerSettings, StateSettings
from ballast.config.sections.upstream import UpstreamSettings
from ballast.config.settings import Settings
from ballast.config.timeouts import TimeoutOverrides, Timeouts

__all__ = [
    "DEFAULT_URLS",
    "MASK",
    "PRESETS",
    "PROVIDERS",
    "AnthropicOptions",
    "AwsSettings",
    "AzureOptions",
    "BreakerSettings",
    "BudgetSettings",
    "CacheSettings",
    "ConfigError",
    "Deployment",
    "DeploymentBreakerSettings",
    "DeploymentTls",
    "FleetSettings",
    "GoogleSettings",
    "JobBackendSettings",
    "JobBreakerSettings",
    "JobsSettings",
    "McpServerSettings",
    "McpSettings",
    "ModelGroup",
    "ModelPrice",
    "ObserveSettings",
    "Preset",
    "ProviderName",
    "RedisBreakerSettings",
    "RoutingSettings",
    "ServerSettings",
    "Settings",
    "StateSettings",
    "TimeoutOverrides",
    "Timeouts",
    "UpstreamSettings",
    "breaker_config",
    "expand_env",
    "is_secret_name",
    "load_settings",
    "mask_url",
    "masked",
    "parse_settings",
    "scrub",
    "secret_values",
    "yaml_problem",
]
