"""A cluster's replica bounds from --replicas, --replicas-min and --replicas-max.

Checked while parsing the flags (`server/config/checks.py`) and applied per model by
`server/cluster/main.py`, where a preset section's `replicas = N` replaces --replicas.
"""

from __future__ import annotations


def replica_bounds(replicas: int, minimum: int | None, maximum: int | None) -> tuple[int, int, int]:
    """(initial, min, max): unset bounds default to the replica count (the minimum to at most the
    given maximum, the maximum to at least the minimum), and the initial count is clamped into them.
    ValueError naming the flags when min > max."""
    default_low = replicas if maximum is None else min(replicas, maximum)
    low = default_low if minimum is None else minimum
    high = max(replicas, low) if maximum is None else maximum
    if low > high:
        raise ValueError(f"--replicas-min ({low}) must be <= --replicas-max ({high})")
    return min(max(replicas, low), high), low, high
