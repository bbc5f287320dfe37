"""Scale-out's pure parts, without a cluster: the prompt-cache summary's hashes, the placement policy,
the flags, and that nothing imports Ray unless `--cluster` is given (the cluster itself:
tests/test_cluster_server.py, slow)."""

from __future__ import annotations

import subprocess
import sys

import pytest

from server.cluster.placement import DOWN, READY, Replica, place
from server.config.parse import parse_settings
from server.model.prefixes import BLOCK_TOKENS, block_hashes, matched_blocks, summary_hashes


def test_block_hashes_chain_whole_blocks_only() -> None:
    system = list(range(3 * BLOCK_TOKENS))
    a = block_hashes(system + [1, 2, 3])
    b = block_hashes(system + list(range(5000, 5000 + BLOCK_TOKENS)))
    assert len(a) == 3 and len(b) == 4 and a == b[:3]  # the shared blocks hash alike, a partial one not
    changed = block_hashes([7] + system[1:])
    assert not set(changed) & set(a)  # a change in block 0 changes every later hash (they are chained)
    assert matched_blocks(b, summary_hashes([system])) == 3
    assert matched_blocks(changed, summary_hashes([system])) == 0
    assert block_hashes(system[: BLOCK_TOKENS - 1]) == []


def ready(index: int, hashes: set[str] | None = None, in_flight: int = 0, n_slots: int = 4) -> Replica:
    return Replica(index, status=READY, hashes=hashes or set(), in_flight=in_flight, n_slots=n_slots)


def test_placement_prefers_the_longest_cached_prefix_within_a_load_bound() -> None:
    prompt = block_hashes(range(4 * BLOCK_TOKENS))
    short, long = ready(0, set(prompt[:1])), ready(1, set(prompt[:3]), in_flight=2)
    chosen = place([short, long], prompt)
    assert chosen is not None and chosen.replica is long and chosen.matched_blocks == 3
    long.in_flight = 5  # more than a slot-count busier than replica 0: the prefix is not worth the queue
    chosen = place([short, long], prompt)
    assert chosen is not None and chosen.replica is short and chosen.matched_blocks == 1


def test_placement_without_a_hit_takes_the_least_loaded_ready_replica() -> None:
    busy, idle, dead = ready(0, in_flight=3), ready(1, in_flight=1), ready(2)
    dead.status = DOWN
    chosen = place([busy, idle, dead], block_hashes(range(2 * BLOCK_TOKENS)))
    assert chosen is not None and chosen.replica is idle and chosen.matched_blocks == 0
    busy.n_busy, busy.in_flight = 0, 0
    idle.n_busy, idle.n_waiting = 2, 3  # the replica's own report counts when it is higher
    assert place([busy, idle], []).replica is busy  # type: ignore[union-attr]
    dead_only = [dead]
    assert place(dead_only, []) is None


@pytest.mark.parametrize(
    "args, message",
    [
        (["--replicas", "2"], "--replicas: need --cluster"),
        (["--cluster", "kubernetes"], "--cluster must be ray"),
        (["--cluster", "ray", "--replicas", "0"], "--replicas must be >= 1"),
    ],
)
def test_bad_cluster_flags_exit_2_naming_why(args: list[str], message: str, capsys) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(SystemExit) as exc:
        parse_settings(args)
    assert exc.value.code == 2 and message in capsys.readouterr().err


def test_cluster_flags_parse() -> None:
    settings, _ = parse_settings(["--cluster", "ray:local", "--replicas", "3"])
    assert settings.cluster == "ray:local" and settings.replicas == 3


def test_nothing_imports_ray_without_the_cluster_flag() -> None:
    """The server, the router, and the cluster's Ray-free modules (the child's /slots/prefixes route
    imports one of them) load no Ray module."""
    code = (
        "import sys, server.__main__, server.app, server.router.app, server.cluster.app, "
        "server.cluster.fleet, server.cluster.replica; "
        "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
