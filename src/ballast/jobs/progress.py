"""Progress: the backend's own figure when it reports one; otherwise the elapsed time
against the backend's typical duration, capped at 98 % until the job has succeeded."""

from __future__ import annotations

CAP = 0.98


def estimate(
    reported: float | None,
    status: str,
    submitted_at: float | None,
    now: float,
    typical_duration: float,
    previous: float | None = None,
) -> float:
    if status == "succeeded":
        return 1.0
    if reported is not None:
        value = min(CAP, max(0.0, reported))
    elif status != "running" or submitted_at is None:
        value = 0.0
    else:
        value = min(CAP, max(0.0, (now - submitted_at) / typical_duration))
    # Never move backwards on screen (a remote's coarse figure may lag our estimate).
    return round(max(value, previous or 0.0), 4)
