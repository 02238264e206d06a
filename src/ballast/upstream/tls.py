"""The SSL context of one deployment, from its `tls` settings.

Why once, at start-up: loading a trust store or a key pair reads and parses files (the
system store takes milliseconds), so each deployment's context is built when its pool is
made and every connection reuses it. A deployment without `tls` settings shares the
process-wide default context.
"""

from __future__ import annotations

import logging
import ssl

from ballast.config import ConfigError, DeploymentTls

log = logging.getLogger("ballast.upstream")


def _no_password() -> bytes:
    """An encrypted key would make OpenSSL prompt on the terminal and hang start-up."""
    raise ValueError("the key is encrypted; give an unencrypted key file")


def context_for(deployment_id: str, settings: DeploymentTls | None) -> ssl.SSLContext | None:
    """The deployment's own context, or None when the default one serves it. ConfigError,
    naming the deployment and the field, for a file that is not a usable PEM."""
    if settings is None or (
        settings.verify and settings.ca_file is None and settings.client_cert is None
    ):
        return None
    field = "ca_file"
    try:
        if settings.verify:
            context = ssl.create_default_context(cafile=settings.ca_file)
        else:
            log.warning(
                "deployment %s: TLS certificates are not verified (tls.verify: false)",
                deployment_id,
            )
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        if settings.client_cert is not None:
            field = "client_cert" if settings.client_key is None else "client_cert/client_key"
            context.load_cert_chain(settings.client_cert, settings.client_key, _no_password)
    except (OSError, ssl.SSLError, ValueError) as exc:
        reason = getattr(exc, "reason", None) or getattr(exc, "strerror", None) or str(exc)
        raise ConfigError(
            [f"deployment {deployment_id!r}: tls.{field}: cannot load ({reason})"]
        ) from None
    return context
