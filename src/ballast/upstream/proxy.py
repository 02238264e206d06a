"""Outbound proxies: which one a connection to an origin goes through, and the CONNECT
handshake that opens a tunnel through it.

Why here and decided once: the choice depends only on the deployment's `proxy` setting,
the environment at start-up and the origin, so each origin's answer is worked out on its
first connection and kept; a request never reads the environment or matches NO_PROXY.

The rules are the common ones (curl, requests): HTTPS_PROXY for https origins, HTTP_PROXY
for http ones, NO_PROXY a comma-separated list of hosts (`example.com` and `.example.com`
both match it and its subdomains, `*` matches everything, `host:port` only that port, IP
literals and CIDR networks match addresses); a lower-case variable, when set, wins over
its upper-case twin, even set empty. A deployment's own `proxy` setting wins over all of
them. https origins are reached through a CONNECT tunnel with TLS to the origin inside;
plain http requests go to the proxy in absolute form. Only http:// proxies are spoken.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import ssl
from collections.abc import Mapping
from typing import NamedTuple
from urllib.parse import unquote, urlsplit

from pydantic import SecretStr

from ballast.config import ConfigError
from ballast.upstream.http_common import MAX_HEAD, ConnectFailed, Origin

_CACHE_LIMIT = 1024  # origins remembered per deployment (per-run endpoints add some)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class Forward(NamedTuple):
    """What a plain-http request sent to a forward proxy carries: the origin to put before
    its target (absolute form) and the proxy's credentials line (or b"")."""

    prefix: bytes
    authorization: bytes


class Proxy(NamedTuple):
    host: str
    port: int
    authorization: bytes  # the `proxy-authorization` header line, or b""

    async def tunnel(
        self, origin: Origin, context: ssl.SSLContext, protocol: asyncio.Protocol
    ) -> asyncio.Transport:
        """A TLS connection to `origin` through this proxy, delivering to `protocol`.
        OSError or ssl.SSLError as a direct connection would raise them; ConnectFailed when
        the proxy refuses the tunnel."""
        loop = asyncio.get_running_loop()
        raw, reply = await loop.create_connection(_TunnelReply, self.host, self.port)
        try:
            authority = _authority(origin)
            raw.write(
                b"CONNECT %s HTTP/1.1\r\nhost: %s\r\n%s\r\n"
                % (authority, authority, self.authorization)
            )
            status = _status(await reply.answer)
            if not 200 <= status < 300:
                hint = " (proxy authentication required)" if status == 407 else ""
                raise ConnectFailed(f"the proxy answered CONNECT with {status}{hint}")
            transport = await loop.start_tls(raw, protocol, context, server_hostname=origin.host)
        except BaseException:
            raw.abort()
            raise
        if transport is None:
            raise ConnectFailed("the tunnel closed during the TLS handshake")
        return transport


class _TunnelReply(asyncio.Protocol):
    """Reads the proxy's answer to CONNECT. Nothing may follow it before our TLS hello."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()
        self._buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        if self.answer.done():
            return
        self._buffer += data
        end = self._buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self._buffer) > MAX_HEAD:
                self.answer.set_exception(ConnectFailed("the proxy's answer is too large"))
        elif end + 4 < len(self._buffer):
            self.answer.set_exception(ConnectFailed("the proxy sent bytes past its answer"))
        else:
            self.answer.set_result(bytes(self._buffer[:end]))

    def connection_lost(self, exc: Exception | None) -> None:
        if not self.answer.done():
            self.answer.set_exception(ConnectFailed("the proxy closed before answering CONNECT"))


def _status(head: bytes) -> int:
    line = head.split(b"\r\n", 1)[0]
    parts = line.split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ConnectFailed("the proxy's answer to CONNECT is not HTTP")
    return int(parts[1])


def _authority(origin: Origin) -> bytes:
    """host:port of an origin, as CONNECT names it (the port always, IPv6 in brackets)."""
    host = origin.host.encode("idna") if not origin.host.isascii() else origin.host.encode()
    if b":" in host:
        host = b"[" + host + b"]"
    return b"%s:%d" % (host, origin.port)


def parse_proxy(url: str) -> Proxy:
    """A proxy URL (`http://[user:pass@]host[:port]`; no scheme means http). ValueError,
    never showing the URL (it may hold a password), for anything else."""
    text = url.strip()
    if "://" not in text:
        text = "http://" + text
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme != "http" or not parts.hostname or parts.path not in ("", "/"):
        raise ValueError("not an http://[user:pass@]host:port proxy")
    authorization = b""
    if parts.username is not None:
        pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
        authorization = b"proxy-authorization: Basic " + base64.b64encode(pair) + b"\r\n"
    return Proxy(parts.hostname, port or 80, authorization)


class NoProxy:
    """A NO_PROXY list, parsed once."""

    __slots__ = ("_everything", "_names", "_networks")

    def __init__(self, spec: str) -> None:
        self._everything = False
        self._names: list[tuple[str, int | None]] = []
        self._networks: list[tuple[Network, int | None]] = []
        for raw in spec.split(","):
            entry = raw.strip().lower()
            if entry == "*":
                self._everything = True
            elif entry:
                self._add(entry)

    def _add(self, entry: str) -> None:
        host, port = _host_and_port(entry)
        try:
            self._networks.append((ipaddress.ip_network(host, strict=False), port))
        except ValueError:
            name = host.lstrip("*").strip(".")
            if name:
                self._names.append((name, port))

    def bypasses(self, host: str, port: int) -> bool:
        """Whether a connection to host:port goes direct."""
        if self._everything:
            return True
        host = host.lower().rstrip(".")
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return any(
                (want is None or want == port) and (host == name or host.endswith("." + name))
                for name, want in self._names
            )
        return any(
            (want is None or want == port) and address in network
            for network, want in self._networks
        )


def _host_and_port(entry: str) -> tuple[str, int | None]:
    """Split `host:port`, `[v6]:port`, a bare IPv6 address or CIDR (no port) and the like."""
    if entry.startswith("["):
        host, _, rest = entry[1:].partition("]")
        return host, _port(rest[1:]) if rest.startswith(":") else None
    if entry.count(":") == 1:
        host, _, text = entry.partition(":")
        port = _port(text)
        return (host, port) if port is not None else (entry, None)
    return entry, None


def _port(text: str) -> int | None:
    return int(text) if text.isdigit() and 0 < int(text) < 65536 else None


class ProxyPolicy:
    """One deployment's proxies, and which (if any) each origin's connections go through."""

    __slots__ = ("_chosen", "_forwards", "_http", "_https", "_no_proxy")

    def __init__(
        self, http: Proxy | None, https: Proxy | None, no_proxy: NoProxy | None = None
    ) -> None:
        self._http = http
        self._https = https
        self._no_proxy = no_proxy
        self._chosen: dict[Origin, Proxy | None] = {}
        self._forwards: dict[Origin, Forward | None] = {}

    def for_origin(self, origin: Origin) -> Proxy | None:
        """The proxy a new connection to `origin` goes through; None: direct."""
        try:
            return self._chosen[origin]
        except KeyError:
            pass
        proxy = self._https if origin.tls else self._http
        if proxy is not None and self._no_proxy is not None:
            if self._no_proxy.bypasses(origin.host, origin.port):
                proxy = None
        if len(self._chosen) >= _CACHE_LIMIT:
            self._chosen.clear()
        self._chosen[origin] = proxy
        return proxy

    def forward(self, origin: Origin) -> Forward | None:
        """For a plain-http origin behind a proxy, what its requests carry; None otherwise."""
        try:
            return self._forwards[origin]
        except KeyError:
            pass
        proxy = None if origin.tls else self.for_origin(origin)
        found = None
        if proxy is not None:
            authority = origin.host_header[len(b"host: ") : -2]
            found = Forward(b"http://" + authority, proxy.authorization)
        if len(self._forwards) >= _CACHE_LIMIT:
            self._forwards.clear()
        self._forwards[origin] = found
        return found


def _env(environ: Mapping[str, str], name: str) -> str:
    """A variable, the lower-case spelling first (set, even empty, it wins)."""
    lower = name.lower()
    return environ[lower] if lower in environ else environ.get(name.upper(), "")


def policy_for(
    deployment_id: str, setting: SecretStr | None, environ: Mapping[str, str]
) -> ProxyPolicy | None:
    """A deployment's proxy policy: its own `proxy` setting when given (empty: direct), else
    the environment's. None when every connection goes direct, so requests pay nothing.
    ConfigError, naming the deployment or the variable, for a proxy URL that is unusable."""
    if setting is not None:
        url = setting.get_secret_value()
        if not url:
            return None
        try:
            proxy = parse_proxy(url)
        except ValueError as exc:
            raise ConfigError([f"deployment {deployment_id!r}: proxy: {exc}"]) from None
        return ProxyPolicy(proxy, proxy)
    found: dict[str, Proxy | None] = {}
    for name in ("HTTP_PROXY", "HTTPS_PROXY"):
        url = _env(environ, name)
        try:
            found[name] = parse_proxy(url) if url.strip() else None
        except ValueError as exc:
            raise ConfigError([f"{name} (environment): {exc}"]) from None
    if found["HTTP_PROXY"] is None and found["HTTPS_PROXY"] is None:
        return None
    no_proxy = _env(environ, "NO_PROXY")
    return ProxyPolicy(
        found["HTTP_PROXY"], found["HTTPS_PROXY"], NoProxy(no_proxy) if no_proxy else None
    )
