"""The listening sockets of `ballast serve --workers N`: one SO_REUSEPORT group on a port
nothing else listens on, over which the kernel spreads connections."""

from __future__ import annotations

import errno
import socket

import pytest

from ballast.server.serving import balances_reuse_port, claim, listeners

pytestmark = pytest.mark.skipif(not balances_reuse_port(), reason="needs Linux SO_REUSEPORT")


def accepted_by_each(sockets: list[socket.socket], connections: int) -> list[int]:
    port = sockets[0].getsockname()[1]
    clients = [socket.create_connection(("127.0.0.1", port), timeout=5) for _ in range(connections)]
    counts = []
    try:
        for sock in sockets:
            sock.setblocking(False)
            count = 0
            while True:
                try:
                    conn, _ = sock.accept()
                except BlockingIOError:
                    break
                conn.close()
                count += 1
            counts.append(count)
    finally:
        for client in clients:
            client.close()
    return counts


def test_the_group_shares_one_port_and_the_kernel_spreads_connections_over_it() -> None:
    group = claim("127.0.0.1", 0, 3)
    try:
        assert len({sock.getsockname()[1] for sock in group}) == 1
        for sock in group:
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
            assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN) == 1
        counts = accepted_by_each(group, 60)
        assert sum(counts) == 60  # every connection waited in some socket's queue
        assert all(count > 0 for count in counts), counts  # 3 empty: about 1 in 10**10
    finally:
        for sock in group:
            sock.close()


def test_a_port_something_listens_on_is_refused_even_when_it_would_let_us_join() -> None:
    with socket.socket() as plain:
        plain.bind(("127.0.0.1", 0))
        plain.listen()
        with pytest.raises(OSError) as refused:
            claim("127.0.0.1", plain.getsockname()[1], 2)
        assert refused.value.errno == errno.EADDRINUSE

    first = claim("127.0.0.1", 0, 2)  # a gateway already serving, also SO_REUSEPORT
    try:
        port = first[0].getsockname()[1]
        with pytest.raises(OSError) as refused:
            claim("127.0.0.1", port, 2)  # a second one started by mistake
        assert refused.value.errno == errno.EADDRINUSE
        # The supervisor itself may add a socket to its own group (SIGTTIN).
        more = listeners("127.0.0.1", port, 1)
        assert more[0].getsockname()[1] == port
        more[0].close()
    finally:
        for sock in first:
            sock.close()
