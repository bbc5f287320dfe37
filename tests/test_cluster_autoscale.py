"""Autoscaling's policy without Ray (server/cluster/autoscale.py): given polled load over time, add a
replica, drain one, or hold, with hysteresis and cool-downs; and the replica-count flags and preset
lines (the cluster itself: tests/test_cluster_server.py, slow)."""

from __future__ import annotations

from pathlib import Path

import pytest

from server.cluster.autoscale import DOWN, HOLD, UP, ReplicaLoad, Sample, ScalePolicy
from server.config.parse import parse_settings
from server.config.replicas import replica_bounds
from server.router.catalogue import CatalogueError, build_catalogue

POLICY = ScalePolicy(min_replicas=1, max_replicas=3, up_after_s=10, down_after_s=30)


def load(busy: int, queued: int = 0, slots: int = 4) -> ReplicaLoad:
    return ReplicaLoad(busy, queued, slots)


def history(start: float, end: float, *loads: ReplicaLoad, starting: int = 0) -> list[Sample]:
    """One sample a second from `start` to `end` with the same loads."""
    return [Sample(float(t), loads, starting) for t in range(int(start), int(end) + 1)]


def test_a_queue_sustained_for_the_up_window_adds_a_replica() -> None:
    queued = history(0, 12, load(4, 2))
    decision = POLICY.decide(queued, current=1, last_change=None, now=12)
    assert decision.action == UP and decision.desired == 2
    assert decision.figures == {"queue": 2.0, "utilisation": 1.5}
    # The same queue for less than the window: not yet.
    assert POLICY.decide(queued[-5:], current=1, last_change=None, now=12).action == HOLD
    # One sample in the window without a queue breaks "sustained".
    broken = [*history(0, 6, load(4, 2)), Sample(7.0, (load(4, 0),)), *history(8, 12, load(4, 2))]
    assert POLICY.decide(broken, current=1, last_change=None, now=12).action == HOLD


def test_the_queue_is_per_ready_replica_and_the_maximum_bounds_it() -> None:
    # 1 queued request over two replicas: 0.5 each, below the threshold of 1.
    assert POLICY.decide(history(0, 12, load(4, 1), load(4)), 2, None, 12).action == HOLD
    assert POLICY.decide(history(0, 12, load(4, 2), load(4, 2)), 2, None, 12).action == UP
    full = POLICY.decide(history(0, 12, *[load(4, 5)] * 3), 3, None, 12)
    assert full.action == HOLD and full.desired == 3  # already at --replicas-max


def test_low_utilisation_sustained_for_the_down_window_drains_one() -> None:
    quiet = history(0, 31, load(1), load(0))  # 1 of 8 slots
    decision = POLICY.decide(quiet, current=2, last_change=None, now=31)
    assert decision.action == DOWN and decision.desired == 1
    assert POLICY.decide(quiet[-20:], 2, None, 31).action == HOLD  # not for the whole window yet
    assert POLICY.decide(history(0, 31, load(1)), 1, None, 31).action == HOLD  # at --replicas-min
    # Hysteresis: a load between the thresholds (half the slots, no queue) neither grows nor shrinks.
    assert POLICY.decide(history(0, 31, load(2), load(2)), 2, None, 31).action == HOLD


def test_cool_downs_follow_a_change_and_a_starting_replica_holds() -> None:
    queued = history(0, 12, load(4, 3))
    decision = POLICY.decide(queued, current=2, last_change=5, now=12)
    assert decision.action == HOLD and "cooling down" in decision.reason
    assert POLICY.decide(queued, current=2, last_change=1, now=12).action == UP  # 11 s >= 10 s
    quiet = history(0, 31, load(0), load(0))
    assert POLICY.decide(quiet, current=2, last_change=10, now=31).action == HOLD  # 21 s < 30 s
    starting = history(0, 12, load(4, 3), starting=1)
    decision = POLICY.decide(starting, current=2, last_change=None, now=12)
    assert decision.action == HOLD and decision.reason == "a replica is starting"


def test_bounds_outside_the_count_are_restored_first() -> None:
    assert POLICY.decide([], current=0, last_change=None, now=0).action == UP
    assert POLICY.decide([], current=4, last_change=None, now=0).action == DOWN
    assert POLICY.decide([], current=2, last_change=None, now=0).action == HOLD


def test_replica_bounds_default_to_the_count_and_clamp_it() -> None:
    assert replica_bounds(2, None, None) == (2, 2, 2)
    assert replica_bounds(1, 1, 4) == (1, 1, 4)
    assert replica_bounds(1, 2, None) == (2, 2, 2)  # the minimum raises the start
    assert replica_bounds(5, None, 3) == (3, 3, 3)
    with pytest.raises(ValueError, match=r"--replicas-min \(3\) must be <= --replicas-max \(2\)"):
        replica_bounds(1, 3, 2)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas-max", "2"], "--replicas-max: need --cluster"),
        (["--cluster", "ray", "--replicas-min", "3", "--replicas-max", "2"], "must be <= --replicas-max"),
        (["--cluster", "ray", "--replicas-min", "0"], "--replicas-min must be >= 1"),
        (["--cluster", "ray", "--scale-up-after", "0"], "must be > 0 seconds"),
    ],
)
def test_bad_scaling_flags_exit_2_naming_why(args: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        parse_settings(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_a_preset_section_sets_its_replicas(tmp_path: Path) -> None:
    preset = tmp_path / "models.ini"
    preset.write_text("[smollm2]\nreplicas = 2\nreplicas-max = 4\nc = 2048\n\n[gemma3]\nreplicas = 1\n")
    catalogue = build_catalogue(None, preset)
    smollm2 = catalogue.entries["smollm2"]
    assert smollm2.replicas == (2, None, 4) and smollm2.args == ("-c", "2048")  # not a child flag
    assert catalogue.entries["gemma3"].replicas == (1, None, None)
    assert catalogue.entries["qwen2.5-coder"].replicas == (None, None, None)
    preset.write_text("[smollm2]\nreplicas = two\n")
    with pytest.raises(CatalogueError, match=r"\[smollm2\] replicas must be an integer >= 1"):
        build_catalogue(None, preset)
