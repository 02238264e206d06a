"""Throwaway certificates (made with the openssl command in a temporary directory, never
kept) and a small loopback upstream that answers every request with a fixed JSON body."""

from __future__ import annotations

import asyncio
import shutil
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'


@dataclass(frozen=True)
class Pki:
    """A private CA and a server certificate for 127.0.0.1 it signed; a second CA and a
    client certificate it signed (for mTLS)."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_ca: Path
    client_cert: Path
    client_key: Path

    def server_context(self, require_client: bool = False) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.server_cert, self.server_key)
        if require_client:
            context.verify_mode = ssl.CERT_REQUIRED
            context.load_verify_locations(cafile=str(self.client_ca))
        return context


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(directory: Path, name: str) -> tuple[Path, Path]:
    cert, key = directory / f"{name}.pem", directory / f"{name}.key"
    _openssl(
        *("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"),
        *("-nodes", "-days", "1", "-keyout", str(key), "-out", str(cert)),
        *("-subj", f"/CN=Ballast test {name}"),
        *("-addext", "basicConstraints=critical,CA:TRUE"),
        *("-addext", "keyUsage=critical,keyCertSign,cRLSign"),
    )
    return cert, key


def _leaf(directory: Path, name: str, ca: tuple[Path, Path], extensions: str) -> tuple[Path, Path]:
    cert, key, csr = (directory / f"{name}{ext}" for ext in (".pem", ".key", ".csr"))
    ext = directory / f"{name}.ext"
    ext.write_text(
        "basicConstraints=CA:FALSE\nsubjectKeyIdentifier=hash\n"
        "authorityKeyIdentifier=keyid,issuer\n" + extensions
    )
    _openssl(
        *("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"),
        *("-keyout", str(key), "-out", str(csr), "-subj", f"/CN={name}"),
    )
    _openssl(
        *("x509", "-req", "-in", str(csr), "-CA", str(ca[0]), "-CAkey", str(ca[1])),
        *("-CAcreateserial", "-days", "1", "-out", str(cert), "-extfile", str(ext)),
    )
    return cert, key


def make_pki(directory: Path) -> Pki:
    if shutil.which("openssl") is None:
        pytest.skip("needs the openssl command")
    server_ca = _ca(directory, "server-ca")
    client_ca = _ca(directory, "client-ca")
    server = _leaf(
        directory,
        "127.0.0.1",
        server_ca,
        "subjectAltName=IP:127.0.0.1,IP:::1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    )
    client = _leaf(directory, "ballast-client", client_ca, "extendedKeyUsage=clientAuth\n")
    return Pki(server_ca[0], server[0], server[1], client_ca[0], client[0], client[1])


@dataclass
class OkServer:
    """Answers each request with OK, keeping the connection; records what it saw."""

    connections: int = 0
    requests: list[bytes] = field(default_factory=list)
    peer_subjects: list[str] = field(default_factory=list)
    server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        peer = writer.get_extra_info("peercert")
        if peer:
            self.peer_subjects.append(dict(item[0] for item in peer["subject"])["commonName"])
        try:
            for _ in range(100):
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n"):
                    if line.lower().startswith(b"content-length:"):
                        length = int(line.split(b":", 1)[1])
                self.requests.append(head + await reader.readexactly(length))
                writer.write(OK)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ssl.SSLError):
            pass
        finally:
            writer.close()

    async def start(self, context: ssl.SSLContext | None = None, host: str = "127.0.0.1") -> int:
        self.server = await asyncio.start_server(self._serve, host, 0, ssl=context)
        return int(self.server.sockets[0].getsockname()[1])

    def stop(self) -> None:
        if self.server is not None:
            self.server.close()
