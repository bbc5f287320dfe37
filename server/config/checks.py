"""The checks of the parsed flags that have no single flag's type: bounds, pairs that go together,
flags that need another, and values the engine must accept. Each failure exits 2 with a one-line reason
naming the flag (argparse's `parser.error`), before anything is loaded.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from engine.memory.kv_types import cache_type
from server.config.replicas import replica_bounds


def check_tls(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--ssl-key-file and --ssl-cert-file: both or neither, each an existing file."""
    if bool(args.ssl_key_file) != bool(args.ssl_cert_file):
        parser.error("--ssl-key-file and --ssl-cert-file go together")
    for flag, path in (("--ssl-key-file", args.ssl_key_file), ("--ssl-cert-file", args.ssl_cert_file)):
        if path and not Path(path).is_file():
            parser.error(f"{flag}: no such file: {path}")


def check_bounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Numbers below their least meaningful value exit 2 naming the flag."""
    for name, value, low in (
        ("ctx-size", args.ctx_size, 0),
        ("parallel", args.parallel, 1),
        ("port", args.port, 0),
        ("stream-buffer-size", args.stream_buffer_size, 1),
        ("stream-ttl", args.stream_ttl, 0),
        ("stream-max-sessions", args.stream_max_sessions, 1),
        ("stream-max-sessions-per-client", args.stream_max_sessions_per_client, 1),
        ("reasoning-budget", args.reasoning_budget, -1),
        ("cache-ram", args.cache_ram, -1),
        ("ctx-checkpoints", args.ctx_checkpoints, 0),
        ("checkpoint-min-step", args.checkpoint_min_step, 0),
        ("responses-max", args.responses_max, 1),
        ("tool-max-rounds", args.tool_max_rounds, 1),
        ("tool-max-tokens", args.tool_max_tokens, -1),
        ("models-max", args.models_max, 0),
        ("timeout", args.timeout, 1),
        ("shutdown-timeout", args.shutdown_timeout, 0),
        ("replicas", args.replicas, 1),
        ("replicas-min", 1 if args.replicas_min is None else args.replicas_min, 1),
        ("replicas-max", 1 if args.replicas_max is None else args.replicas_max, 1),
    ):
        if value < low:
            parser.error(f"--{name} must be >= {low}, got {value}")
    if not args.tool_timeout > 0:
        parser.error(f"--tool-timeout must be > 0 seconds, got {args.tool_timeout}")
    if not args.tools_regex_timeout > 0:
        parser.error(f"--tools-regex-timeout must be > 0 seconds, got {args.tools_regex_timeout}")
    if args.ubatch_size < 1 or args.batch_size < 1:
        parser.error("--batch-size and --ubatch-size must be >= 1")


def check_draft_device(parser: argparse.ArgumentParser, args: argparse.Namespace, device: str) -> None:
    """-devd/-ngld: the draft model runs on the target's device (its tokens feed the target's batch);
    asking for another exits 2 rather than being ignored."""
    wanted = "cpu" if args.gpu_layers_draft == 0 else args.device_draft
    if wanted is not None and wanted != device:
        parser.error(f"the draft model runs on the target's device ({device}) in Llamba, not on {wanted}")


def check_cluster(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The scale-out flags need --cluster, positive windows and replica bounds that hold."""
    cluster_flags = {
        "--replicas": args.replicas != 1,
        "--replicas-min": args.replicas_min is not None,
        "--replicas-max": args.replicas_max is not None,
        "--scale-up-after": args.scale_up_after != 10.0,
        "--scale-down-after": args.scale_down_after != 60.0,
        "--placement": args.placement != "prefix",
    }
    given = [flag for flag, changed in cluster_flags.items() if changed]
    if given and args.cluster is None:
        parser.error(f"{', '.join(given)}: need --cluster")
    if not (args.scale_up_after > 0 and args.scale_down_after > 0):
        parser.error("--scale-up-after and --scale-down-after must be > 0 seconds")
    try:
        replica_bounds(args.replicas, args.replicas_min, args.replicas_max)
    except ValueError as exc:
        parser.error(str(exc))
    if args.cluster is not None and not (args.cluster == "ray" or args.cluster.startswith("ray:")):
        parser.error(f"--cluster must be ray, ray:ADDRESS or ray://HOST:PORT, got {args.cluster!r}")


def check_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The request limits' least meaningful values (server/config/limits.py)."""
    for name, value, low in (
        ("max-body-size", args.max_body_size, 1),
        ("max-json-depth", args.max_json_depth, 1),
        ("max-messages", args.max_messages, 1),
        ("max-stop-strings", args.max_stop_strings, 0),
        ("max-stop-length", args.max_stop_length, 1),
        ("max-queue", args.max_queue, -1),
        ("max-header-size", args.max_header_size, 1024),
    ):
        if value < low:
            parser.error(f"--{name} must be >= {low}, got {value}")
    if not args.header_timeout > 0:
        parser.error(f"--header-timeout must be > 0 seconds, got {args.header_timeout}")


def check_cache_types(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """-ctk/-ctv: f16 or q8_0; llama-server's other types exit 2 naming the supported ones."""
    for flag, name in (("--cache-type-k", args.cache_type_k), ("--cache-type-v", args.cache_type_v)):
        try:
            cache_type(name)
        except ValueError as exc:
            parser.error(f"{flag}: {exc}")


def check_sleep_idle(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--sleep-idle-seconds: a positive time, or -1 for never."""
    if not (args.sleep_idle_seconds > 0 or args.sleep_idle_seconds == -1):
        parser.error(f"--sleep-idle-seconds must be > 0 or -1, got {args.sleep_idle_seconds}")


def check_embd_normalize(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """--embd-normalize: -1 (none) or a norm's number."""
    if args.embd_normalize < -1:
        parser.error(f"--embd-normalize must be >= -1, got {args.embd_normalize}")
