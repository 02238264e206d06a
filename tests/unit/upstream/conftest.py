"""Fixtures of the transport's tests."""

from __future__ import annotations

import pytest

from tests.tls_upstream import Pki, make_pki


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """The CAs and certificates of `tests/tls_upstream.py`, made once per module."""
    return make_pki(tmp_path_factory.mktemp("pki"))
