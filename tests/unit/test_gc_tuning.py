"""The collector settings for a server: start-up's objects are frozen, and what a retired
config generation leaves in reference cycles is still collected. Each case runs in a fresh
interpreter: freezing is process-wide."""

from __future__ import annotations

import subprocess
import sys
import textwrap

CASE = """
import gc, weakref
from ballast.gc_tuning import settle_after_retire, settle_after_startup

class Node:
    other = back = None

generation = Node()  # made at start-up, dropped when a reload retires it
generation.other = Node()
generation.other.back = generation
retired = weakref.ref(generation)
settle_after_startup({threshold})
del generation
assert gc.get_threshold()[0] == {expected_threshold}
assert gc.get_freeze_count() {frozen}
gc.collect()
print("after collect", retired() is None)
settle_after_retire()
print("after retire", retired() is None)
"""


def run(threshold: int, expected_threshold: int, frozen: str) -> list[str]:
    code = CASE.format(threshold=threshold, expected_threshold=expected_threshold, frozen=frozen)
    done = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_start_up_objects_are_frozen_and_a_retired_generations_cycles_still_go() -> None:
    assert run(10_000, 10_000, "> 0") == ["after collect False", "after retire True"]


def test_zero_leaves_the_collector_as_python_has_it() -> None:
    assert run(0, 700, "== 0") == ["after collect True", "after retire True"]


def test_a_recorded_failure_lets_go_of_the_answer_it_failed_on() -> None:
    """`raise ... from None` hides the context but keeps it: orjson's error holds the whole
    document, and the failing frame its locals. Both go once the failure is recorded."""
    import orjson

    from ballast.resilience import failures
    from ballast.resilience.failures import Failure

    def parse(data: bytes) -> None:
        try:
            orjson.loads(data)
        except orjson.JSONDecodeError:
            raise Failure(failures.BAD_RESPONSE, "not JSON") from None

    try:
        parse(b"x" * 100_000)
    except Failure as caught:
        failure = caught
    assert failure.__traceback__ is not None and failure.__traceback__.tb_next is not None
    frame = failure.__traceback__.tb_next.tb_frame  # parse's
    assert len(frame.f_locals["data"]) == 100_000
    assert len(failure.__context__.doc) == 100_000  # type: ignore[union-attr]
    failures.drop_references(failure)
    assert "data" not in frame.f_locals
    assert failure.__context__ is None
