"""Prefixed names: `<server>__<tool>` and back, and a name past the clients' limit cut to it
with a hash that keeps it unique and routable."""

from __future__ import annotations

from ballast.mcp.catalog import Names, may_call, may_use_server, may_use_tools
from ballast.state.keys import KeyRecord


def test_a_name_is_prefixed_and_split_back() -> None:
    names = Names("__", 64)
    assert names.public("alpha", "echo") == "alpha__echo"
    assert names.split("alpha__echo") == ("alpha", "echo")
    assert names.split("alpha__ns__tool") == ("alpha", "ns__tool")
    assert names.split("echo") is None


def test_a_long_name_is_cut_to_the_limit_and_still_routes() -> None:
    names = Names("__", 40)
    long_a = names.public("alpha", "a" * 50)
    long_b = names.public("alpha", "a" * 49 + "b")
    assert len(long_a) == len(long_b) == 40 and long_a != long_b
    assert names.split(long_a) == ("alpha", "a" * 50)
    assert names.split(long_b) == ("alpha", "a" * 49 + "b")


def test_an_allowlist_denies_what_it_does_not_name() -> None:
    key = KeyRecord(id="k", name="k", mcp=("alpha/echo", "beta"))
    assert may_call(key, "alpha", "echo") and may_call(key, "beta", "anything")
    assert not may_call(key, "alpha", "add") and not may_call(key, "gamma", "echo")
    # One tool of alpha opens alpha's tool list, not its prompts and resources.
    assert may_use_tools(key, "alpha") and not may_use_server(key, "alpha")
    assert may_use_server(key, "beta") and not may_use_tools(key, "gamma")
    nothing = KeyRecord(id="n", name="n", mcp=())
    assert not may_call(nothing, "alpha", "echo")
    everything = KeyRecord(id="e", name="e")
    assert may_call(everything, "gamma", "x") and may_call(None, "gamma", "x")
