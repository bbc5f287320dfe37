"""llama-server compatible command line (and LLAMA_ARG_* environment variables) -> Settings."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import re
import sys
import tempfile
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine.api import POOLING_TYPES
from engine.kv_types import cache_type
from engine.sampling import NUMBER_FIELDS, SamplingParams, parse_samplers
from engine.speculative import SPEC_TYPES, SpecParams
from engine.text.reasoning import REASONING_FORMATS, REASONING_MODES
from server.builtin_tools import BadContext, Runtime, parse_tool_names
from server.config.env_args import EnvError, env_arguments
from server.config.json_schema import check_schema
from server.config.limits import RequestLimits
from server.config.llama_server_flags import FLAGS, LlamaServerFlag
from server.config.print_and_exit import CacheList, CompletionBash
from server.config.replicas import replica_bounds
from server.mcp.config import McpConfigError, McpServerConfig, load_mcp_servers

# llama-server's flags that Llamba accepts but that have no effect here
# (`server/config/llama_server_flags.py`,
# the README's table, says why for each), and those it refuses with a reason. Context checkpoints, for
# one: Llamba's KV cache keeps every position, sliding-window layers included, so any cached prefix can
# be reused by truncation and no checkpoint is ever needed.
IGNORED_FLAGS: dict[str, LlamaServerFlag] = {
    form: flag for flag in FLAGS if flag.status == "ignored" for form in flag.forms
}
# Older llama-server names, no longer in its README, that launch scripts still carry.
IGNORED_FLAGS.update({"--no-mmap": LlamaServerFlag(("--no-mmap",), "", "", "ignored", "no effect in Llamba")})
_DRAFT_CTX = LlamaServerFlag(
    ("-cd", "--ctx-size-draft"), "N", "", "ignored", "the draft model's context is the target's"
)
IGNORED_FLAGS.update({form: _DRAFT_CTX for form in _DRAFT_CTX.forms})
# Switches for what Llamba always does: accepted without a word, since their meaning holds.
ALWAYS_ON: dict[str, str] = {
    "-cb": "always on: requests join and leave the batch at every step",
    "--cont-batching": "always on: requests join and leave the batch at every step",
    "--jinja": "always on: chat templates are rendered with Jinja",
}
NO_EFFECT = "accepted for llama-server compatibility, no effect here"


class Ignored(str):
    """A flag (or variable) accepted without effect: a str, its name, that also says why."""

    reason: str

    def __new__(cls, name: str, reason: str = NO_EFFECT) -> Ignored:
        ignored = super().__new__(cls, name)
        ignored.reason = reason
        return ignored


# llama-server's -lm/--load-mode. Llamba always reads the file through a memory map and repacks every
# weight into its own arrays (the map's pages are released after packing), so the modes differ only in
# whether the packed weights are locked in RAM.
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
LOCKING_LOAD_MODES = ("mlock", "mmap+mlock")


class Settings(BaseModel):
    model_config = ConfigDict(frozen=True)

    model: str | None = None
    alias: str | None = None
    tags: str | None = None
    ctx_size: int = 4096
    parallel: int = 1
    batch_size: int = 2048
    ubatch_size: int = 512
    threads: int | None = None
    adaptive_threads: bool = True  # --no-adaptive-threads: always -t threads, even on a busy machine
    n_predict: int = -1
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    sampling: SamplingParams = SamplingParams()  # the sampling flags: what a request's fields override
    chat_template: str | None = None
    reasoning_format: str = "auto"  # none | deepseek | auto (deepseek when the template has a thinking block)
    reasoning: str = "auto"  # on | off | auto: enable_thinking for the template (off also closes the block)
    reasoning_budget: int = -1  # model tokens in a reasoning block: -1 unlimited, 0 closes it at once
    reasoning_budget_message: str = ""
    slots: bool = True
    metrics: bool = False
    webui: bool = True
    timeout: int = 3600  # -to: seconds a request body may take to arrive, and a response write may block
    shutdown_timeout: float = 0.0  # seconds SIGTERM lets in-flight requests finish (0: cancel them at once)
    api_prefix: str = ""  # --api-prefix: every route under it (server/http/serving.py)
    props: bool = False  # --props: POST /props is served
    ignore_eos: bool = False  # --ignore-eos: the default of a request's `ignore_eos`
    reasoning_effort: str = "default"  # --reasoning-effort: the template's, under a request's own
    reverse_prompts: tuple[str, ...] = ()  # -r (repeatable): the stop strings of requests without any
    grammar: str | None = None  # --grammar/--grammar-file: the GBNF of requests without a constraint
    json_schema: dict[str, Any] | None = None  # -j/-jf: the same with a JSON schema
    chat_template_kwargs: dict[str, Any] = {}  # --chat-template-kwargs: under each request's own
    ssl_key_file: str | None = None  # --ssl-key-file/--ssl-cert-file: HTTPS (both or neither)
    ssl_cert_file: str | None = None
    verbose: bool = False
    log_format: str = "text"
    log_prompts_dir: Path | None = None
    slot_save_path: Path | None = None  # where POST /slots/<id>?action=save|restore puts slot files
    cache_ram: int = 8192  # MiB of host prompt cache: 0 off, -1 no limit
    slot_similarity: float = 0.1
    device: str = "cpu"
    context_shift: bool = False
    keep: int = 0
    cache_type_k: str = "f16"  # -ctk: the KV cache's key cells (engine/kv_types.py: f16, q8_0)
    cache_type_v: str = "f16"  # -ctv
    n_gpu_layers: int = -1  # 0 keeps the model on the CPU; any other value offloads all of it
    load_mode: str = "auto"  # one of LOAD_MODES
    stream_buffer_size: int = 4 * 1024 * 1024
    stream_ttl: float = 300.0
    stream_max_sessions: int = 256
    stream_max_sessions_per_client: int = 64
    stream_journal: Path | None = None  # --stream-journal: durable resumable streams
    spec: SpecParams = SpecParams()  # the default speculation of every request (none unless --spec-type)
    model_draft: str | None = None
    # Stored Responses API responses: how many are kept, and the folder that keeps them across restarts.
    responses_max: int = 1000
    responses_dir: Path | None = None
    # MCP servers, validated while parsing: a bad config stops the server before it ever answers.
    mcp_servers: tuple[McpServerConfig, ...] = ()
    # The server-side tool loop (server/agents/loop.py): rounds of MCP calls per request, seconds per call
    # (each server's own timeout_ms still applies when it is shorter), tokens a run generates (-1: any).
    tool_max_rounds: int = 8
    tool_timeout: float = 30.0
    tool_max_tokens: int = -1
    # The built-in tools (--tools; server/builtin_tools/), in their fixed order, and where
    # exec_shell_command runs without a request's x-tool-runtime (None: on this host).
    tools: tuple[str, ...] = ()
    tools_runtime: str | None = None
    ui_mcp_proxy: bool = False  # --ui-mcp-proxy: /cors-proxy for the web UI's MCP client
    # None is the default policy: any origin, but only localhost ones when tools run on this host.
    cors_origins: tuple[str, ...] | None = None
    # Embeddings (--embedding) and rerank (--reranking: pooling rank): the routes answer only with them;
    # pooling None is the model's own (its GGUF's pooling_type, else none, as llama.cpp decides).
    embedding: bool = False
    pooling: str | None = None
    embd_normalize: int = 2  # -1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean, >2 p-norm
    # Router mode (no -m): the catalogue's sources and policy (server/router/).
    models_dir: Path | None = None
    models_preset: Path | None = None
    models_max: int = 4  # loaded models at once; 0: no limit
    models_autoload: bool = True
    # Scale-out (server/cluster/): `ray`, `ray:ADDRESS` or `ray://HOST:PORT`; replicas of the model.
    cluster: str | None = None
    replicas: int = 1
    replicas_min: int | None = None  # autoscaling's bounds (server/cluster/autoscale.py); None: --replicas
    replicas_max: int | None = None
    scale_up_after: float = 10.0  # seconds of sustained queue before a replica is added
    scale_down_after: float = 60.0  # seconds of sustained low load before one is drained
    placement: str = "prefix"  # prefix (cache-aware, else least loaded), least-loaded, random (benchmarks)
    # Seconds without work before the model frees its weights and KV memory (-1: never); also per child.
    sleep_idle_seconds: float = -1
    # Request limits (server/http/limits.py says what each bounds and how it answers).
    max_body_size: int = RequestLimits.max_body_size
    max_json_depth: int = RequestLimits.max_json_depth
    max_messages: int = RequestLimits.max_messages
    max_stop_strings: int = RequestLimits.max_stop_strings
    max_stop_length: int = RequestLimits.max_stop_length
    max_queue: int = RequestLimits.max_queue
    header_timeout: float = RequestLimits.header_timeout
    max_header_size: int = RequestLimits.max_header_size

    @property
    def limits(self) -> RequestLimits:
        return RequestLimits(**{f.name: getattr(self, f.name) for f in fields(RequestLimits)})

    @property
    def mlock(self) -> bool:
        return self.load_mode in LOCKING_LOAD_MODES

    @property
    def aliases(self) -> list[str]:
        """-a/--alias, comma-separated (llama-server's): the first is the model's id in the API."""
        return [a.strip() for a in (self.alias or "").split(",") if a.strip()]

    @property
    def model_alias(self) -> str:
        if self.aliases:
            return self.aliases[0]
        return Path(self.model).name if self.model else "SmolLM2-135M-Instruct.Q4_1.gguf"

    @property
    def tag_list(self) -> list[str]:
        """--tags, comma-separated: informational, listed in /v1/models (not used for routing)."""
        return [t.strip() for t in (self.tags or "").split(",") if t.strip()]


REASONING_EFFORTS = ("default", "minimal", "low", "medium", "high", "xhigh", "max")


class _ListDevices(argparse.Action):
    """llama-server's --list-devices: the GPUs the CUDA backend can use, then exit 0."""

    def __call__(self, parser: argparse.ArgumentParser, *args: object) -> None:
        from engine.backend import list_devices

        print("Available devices:")
        for line in list_devices():
            print(line)
        parser.exit(0)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="llamba-server", description="An LLM server speaking llama-server's API.", add_help=False
    )
    p.add_argument("-h", "--help", "--usage", action="help", help="show this help and exit")
    p.add_argument("--version", action="version", version=f"llamba-server {_version()}")
    p.add_argument("-cl", "--cache-list", action=CacheList, help="list the models in the cache, then exit")
    p.add_argument("--completion-bash", action=CompletionBash, also=tuple(IGNORED_FLAGS),
                   help="print a bash completion script, then exit")  # fmt: skip
    for add_group in (
        _model_flags,
        _server_flags,
        _sampling_flags,
        _template_flags,
        _feature_flags,
        _spec_flags,
        _tool_flags,
        _router_flags,
        _limit_flags,
    ):
        add_group(p)
    return p


def _model_flags(p: argparse.ArgumentParser) -> None:
    """The model, its context and batch sizes, threads."""
    add = p.add_argument_group("model and context").add_argument
    add("-m", "--model", default=None, help="GGUF path or model name (smollm2, gemma3, qwen)")
    add("-a", "--alias", default=None, help="the model's API names, comma-separated (the first is its id)")
    add("--tags", default=None, help="the model's tags, comma-separated (listed in /v1/models)")
    add("-c", "--ctx-size", type=int, default=4096)
    add("-np", "--parallel", type=int, default=1)
    add("-b", "--batch-size", type=int, default=2048)
    add("-ub", "--ubatch-size", type=int, default=512)
    add("-t", "--threads", type=int, default=None)
    busy = "always compute on -t threads (by default a step runs on one while others take the cores)"
    add("--no-adaptive-threads", dest="adaptive_threads", action="store_false", help=busy)
    add("-n", "--predict", "--n-predict", dest="n_predict", type=int, default=-1)
    lock_help = "mlock, mmap+mlock: lock the weights in RAM"
    add("-lm", "--load-mode", choices=LOAD_MODES, default="auto", help=lock_help)
    add("--mlock", dest="load_mode", action="store_const", const="mlock", help="the same as -lm mlock")


def _server_flags(p: argparse.ArgumentParser) -> None:
    """Where it listens and who may call it."""
    add = p.add_argument_group("server").add_argument
    add("--host", default="127.0.0.1", help="an address, a unix socket (*.sock), or a comma list of them")
    add("--port", type=int, default=8080)
    add("--api-key", action="append", default=None, help="may be given several times (comma lists too)")
    add("--api-key-file", default=None)


def _sampling_flags(p: argparse.ArgumentParser) -> None:
    """The default sampler chain (a request's fields override it); llama-server's names."""
    add = p.add_argument_group("sampling").add_argument
    add("--temp", "--temperature", dest="temp", type=float, default=0.8)
    add("--dynatemp-range", type=float, default=0.0, help="dynamic temperature: temp +- this (0: off)")
    add(
        "--dynatemp-exp",
        dest="dynatemp_exponent",
        type=float,
        default=1.0,
        help="how entropy maps to the dynamic temperature",
    )
    add("--top-k", type=int, default=40)
    add("--top-p", type=float, default=0.95)
    add("--min-p", type=float, default=0.05)
    add("--typical", "--typical-p", dest="typical_p", type=float, default=1.0, help="1.0: off")
    add("--top-nsigma", "--top-n-sigma", dest="top_n_sigma", type=float, default=-1.0, help="<= 0: off")
    add("--min-keep", type=int, default=0, help="the truncating samplers keep at least this many tokens")
    add("--xtc-probability", type=float, default=0.0, help="0: off")
    add("--xtc-threshold", type=float, default=0.1, help="> 0.5: off")
    add("-s", "--seed", type=int, default=-1)
    add("--repeat-penalty", type=float, default=1.0)
    add("--repeat-last-n", type=int, default=64)
    add("--presence-penalty", type=float, default=0.0)
    add("--frequency-penalty", type=float, default=0.0)
    add("--dry-multiplier", type=float, default=0.0, help="0: off")
    add("--dry-base", type=float, default=1.75)
    add("--dry-allowed-length", type=int, default=2)
    add("--dry-penalty-last-n", type=int, default=64, help="0: off, -1: the whole context")
    add("--dry-sequence-breaker", action="append", default=None, help="replaces the defaults; repeat; none")
    add("--mirostat", type=int, default=0, choices=[0, 1, 2])
    add("--mirostat-lr", dest="mirostat_eta", type=float, default=0.1)
    add("--mirostat-ent", dest="mirostat_tau", type=float, default=5.0)
    add("-l", "--logit-bias", action="append", default=None, help="TOKEN_ID(+/-)BIAS, e.g. 15043+1; repeat")
    add("--samplers", default=None, help="the chain's order, names separated by ';'")
    add("--sampler-seq", "--sampling-seq", dest="sampler_seq", default=None, help="the order as letters")


def _template_flags(p: argparse.ArgumentParser) -> None:
    """How chats become prompts, and reasoning blocks (always with Jinja: --jinja is ALWAYS_ON)."""
    add = p.add_argument_group("chat template and reasoning").add_argument
    add("--chat-template", default=None)
    add("--chat-template-file", default=None)
    add("--reasoning-format", choices=REASONING_FORMATS, default="auto")
    add("-rea", "--reasoning", choices=REASONING_MODES, default="auto")
    add("--reasoning-budget", type=int, default=-1)
    add("--reasoning-budget-message", default="")


def _spec_flags(p: argparse.ArgumentParser) -> None:
    """Speculative decoding (llama-server's names, old and new)."""
    add = p.add_argument_group("speculative decoding").add_argument
    add(
        "--spec-type",
        action="append",
        default=None,
        help="none, " + ", ".join(SPEC_TYPES) + " (a chain: repeat)",
    )
    add(
        "--draft-max",
        "--draft",
        "--draft-n",
        "--spec-draft-n-max",
        dest="draft_max",
        type=int,
        default=16,
    )
    add(
        "--draft-min",
        "--draft-n-min",
        "--spec-draft-n-min",
        dest="draft_min",
        type=int,
        default=0,
    )
    add(
        "--draft-p-min",
        "--spec-draft-p-min",
        dest="draft_p_min",
        type=float,
        default=0.75,
    )
    add("--spec-ngram-size-n", type=int, default=12)
    add("--spec-ngram-size-m", type=int, default=48)
    add("--spec-ngram-min-hits", type=int, default=1)
    add(
        "-md",
        "--model-draft",
        "--spec-draft-model",
        dest="model_draft",
        default=None,
        help="a draft model (GGUF path or name)",
    )
    draft_device = ("-devd", "--device-draft", "--spec-draft-device")
    add(*draft_device, dest="device_draft", default=None, choices=["auto", "cpu", "cuda"],
        help="the draft's device: only the target's (the draft runs beside it)")  # fmt: skip
    draft_layers = ("-ngld", "--gpu-layers-draft", "--n-gpu-layers-draft", "--spec-draft-ngl")
    add(*draft_layers, dest="gpu_layers_draft", type=int, default=-1)


def _feature_flags(p: argparse.ArgumentParser) -> None:
    """Endpoints, logging, caches, context shift and devices."""
    add = p.add_argument_group("features").add_argument
    add("--slots", dest="slots", action="store_true", default=True)
    add("--no-slots", dest="slots", action="store_false")
    add("--metrics", action="store_true", default=False)
    add("--props", action="store_true", default=False, help="accept POST /props (no property changes yet)")
    add("--ui", "--webui", dest="webui", action="store_true", default=True)
    add("--no-webui", "--no-ui", dest="webui", action="store_false")
    add("-to", "--timeout", type=int, default=3600, help="seconds a request body may take, a write may block")
    add("--api-prefix", default="", help="serve every route under this path (e.g. /llm)")
    add("--ssl-key-file", default=None, help="PEM private key: serve HTTPS (with --ssl-cert-file)")
    add("--ssl-cert-file", default=None, help="PEM certificate: serve HTTPS (with --ssl-key-file)")
    add("--shutdown-timeout", type=float, default=0.0,
        help="on SIGTERM, seconds in-flight requests may take to finish (new ones get 503); 0: cancel "
        "them at once; a second SIGTERM cancels them")  # fmt: skip
    add("-v", "--verbose", "--log-verbose", dest="verbose", action="store_true")
    add("--log-format", choices=["text", "json"], default="text")
    add("--log-prompts-dir", default=None)
    add(
        "-cram",
        "--cache-ram",
        type=int,
        default=8192,
        help="MiB; 0 off, -1 no limit",
    )
    add("--slot-save-path", default=None, help="directory for slot save/restore files")
    add("--slot-prompt-similarity", "-sps", type=float, default=0.1)
    add("--context-shift", dest="context_shift", action="store_true", default=False)
    add("--no-context-shift", dest="context_shift", action="store_false")
    add("--keep", type=int, default=0, help="tokens kept by a context shift (-1: all)")
    for short, long in (("-ctk", "--cache-type-k"), ("-ctv", "--cache-type-v")):
        add(short, long, default="f16", help="KV cell type: f16 or q8_0")
    add("-dev", "--device", default="cpu", choices=["auto", "cpu", "cuda"])
    add(
        "-ngl",
        "--gpu-layers",
        "--n-gpu-layers",
        dest="n_gpu_layers",
        type=int,
        default=-1,
        help="0: the CPU",
    )
    add("--list-devices", action=_ListDevices, nargs=0, help="print the available GPUs and exit")
    # Resumable stream sessions (X-Conversation-Id): ring buffer bytes each, seconds kept once done, count
    # in all and per client (an API key, else a remote address).
    add("--stream-buffer-size", type=int, default=4 * 1024 * 1024)
    add("--stream-ttl", type=float, default=300.0)
    add("--stream-max-sessions", type=int, default=256)
    add("--stream-max-sessions-per-client", type=int, default=64)
    add("--stream-journal", metavar="DIR", default=None,
        help="journal resumable streams in DIR (created if missing): they survive a restart")  # fmt: skip
    _request_default_flags(p)
    _embedding_flags(p)


def _request_default_flags(p: argparse.ArgumentParser) -> None:
    """What a request gets unless it says otherwise (llama-server's `params_base`)."""
    add = p.add_argument_group("request defaults").add_argument
    add("--ignore-eos", action="store_true", default=False, help="requests' default: generate past EOS")
    add("-r", "--reverse-prompt", dest="reverse_prompts", action="append", default=[],
        help="a stop string for requests that give none (repeat the flag for more)")  # fmt: skip
    add("--reasoning-effort", default="default", choices=REASONING_EFFORTS,
        help="reasoning_effort given to the chat template; a request's own wins")  # fmt: skip
    add("--grammar", default=None, help="GBNF that constrains requests without their own constraint")
    add("--grammar-file", default=None, help="--grammar from a file")
    add("-j", "--json-schema", default=None, help="a JSON schema that constrains requests without their own")
    add("-jf", "--json-schema-file", default=None, help="-j from a file")
    add("--chat-template-kwargs", default=None, metavar="JSON",
        help="a JSON object of chat template variables; a request's own win")  # fmt: skip


def _embedding_flags(p: argparse.ArgumentParser) -> None:
    """Embeddings and rerank (llama-server's flags and variables)."""
    add = p.add_argument_group("embeddings and rerank").add_argument
    on = {"action": "store_true"}
    add("--embedding", "--embeddings", dest="embedding", default=False, **on,
        help="serve /embedding and /v1/embeddings")  # fmt: skip
    add("--rerank", "--reranking", dest="reranking", default=False, **on,
        help="serve /rerank (embeddings with pooling rank: the model's classifier head)")  # fmt: skip
    add("--pooling", choices=POOLING_TYPES, default=None, help="the model's own when not given")
    add("--embd-normalize", type=int, default=2,
        help="-1 none, 0 max absolute int16, 1 taxicab, 2 euclidean, >2 p-norm")  # fmt: skip


def _tool_flags(p: argparse.ArgumentParser) -> None:
    """MCP servers, CORS and stored responses."""
    add = p.add_argument_group("streams and tools").add_argument
    add("--mcp-servers-config", default=None, help='JSON file {"mcpServers": {...}}')
    add("--mcp-servers-json", default=None, help="the same JSON, inline")
    add("--cors-origins", default=None, help="comma-separated allowed origins, or *")
    add("--tools", default=None, metavar="TOOL1,TOOL2,...",
        help="built-in tools served at /tools: all, or names (read_file, file_glob_search, "
        "grep_search, exec_shell_command, write_file, edit_file); confined to x-tool-cwd, "
        "else the server's cwd")  # fmt: skip
    add("--tools-runtime", default=None, metavar="OPTION",
        help="where exec_shell_command runs by default: docker-container:ID, "
        "podman-container:ID or ssh:TARGET")  # fmt: skip
    add("--ui-mcp-proxy", "--webui-mcp-proxy", dest="ui_mcp_proxy", action="store_true", default=False,
        help="serve /cors-proxy?url= for the web UI's MCP client "
        "(only x-llama-server-proxy-header-* headers are sent)")  # fmt: skip
    add("--no-ui-mcp-proxy", "--no-webui-mcp-proxy", dest="ui_mcp_proxy", action="store_false")
    add("-ag", "--agent", dest="agent", action="store_true", default=False,
        help="--tools all and --ui-mcp-proxy")  # fmt: skip
    add("-no-ag", "--no-agent", dest="agent", action="store_false")
    add("--responses-dir", default=None, help="keep stored /v1/responses as files here (survive restarts)")
    add("--responses-max", type=int, default=1000, help="stored /v1/responses kept (the oldest go first)")
    add("--tool-max-rounds", type=int, default=8,
        help="rounds of MCP tool calls the server runs for one request (mcp tools)")  # fmt: skip
    add("--tool-timeout", type=float, default=30.0,
        help="seconds one MCP tool call of the tool loop may take")  # fmt: skip
    add("--tool-max-tokens", type=int, default=-1,
        help="tokens one tool-loop run may generate over all its rounds; -1: no limit")  # fmt: skip


def _router_flags(p: argparse.ArgumentParser) -> None:
    """Router mode (no -m) and sleeping when idle."""
    add = p.add_argument_group("router and sleep").add_argument
    add("--models-dir", default=None, help="router: serve every GGUF in this directory")
    add("--models-preset", default=None, help="router: an INI file, one section per model")
    add("--models-max", type=int, default=4, help="router: loaded models (0: any)")
    add("--models-autoload", dest="models_autoload", action="store_true", default=True)
    add("--no-models-autoload", dest="models_autoload", action="store_false",
        help="router: a request for an unloaded model is a 400 until POST /models/load")  # fmt: skip
    add("--cluster", default=None, metavar="ray[:ADDRESS|://HOST:PORT]",
        help="place the model's servers as Ray actors: `ray` (the running local cluster, or a new one), "
        "`ray:ADDRESS` (ray.init's address, e.g. `ray:local`, `ray:10.0.0.1:6379`), `ray://HOST:PORT` "
        "(Ray Client)")  # fmt: skip
    add("--replicas", type=int, default=1,
        help="cluster: replicas of each model (a preset section's `replicas = N` overrides it)")  # fmt: skip
    add("--replicas-min", type=int, default=None,
        help="cluster: autoscaling's fewest replicas per model (default: --replicas)")  # fmt: skip
    add("--replicas-max", type=int, default=None,
        help="cluster: autoscaling's most replicas per model (default: --replicas)")  # fmt: skip
    add("--scale-up-after", type=float, default=10.0, metavar="SECONDS",
        help="cluster: add a replica after this long with a queue of >= 1 request per replica")  # fmt: skip
    add("--scale-down-after", type=float, default=60.0, metavar="SECONDS",
        help="cluster: drain a replica after this long with at most 1/4 of the slots used")  # fmt: skip
    add("--placement", default="prefix", choices=["prefix", "least-loaded", "random"],
        help="cluster: where a new request goes (random: a baseline for benchmarks)")  # fmt: skip
    add("--sleep-idle-seconds", type=float, default=-1,
        help="free the model's memory after this many idle seconds; -1: never")  # fmt: skip


def _limit_flags(p: argparse.ArgumentParser) -> None:
    """What one request may ask (server/http/limits.py): each over-limit request gets a clear 4xx."""
    add = p.add_argument_group("request limits").add_argument
    d = RequestLimits()
    add("--max-body-size", type=int, default=d.max_body_size, help="bytes of a request body (413 above)")
    add("--max-json-depth", type=int, default=d.max_json_depth, help="nested JSON arrays/objects in a body")
    add("--max-messages", type=int, default=d.max_messages, help="messages (or input items) in a request")
    add("--max-stop-strings", type=int, default=d.max_stop_strings, help="stop strings in a request")
    add("--max-stop-length", type=int, default=d.max_stop_length, help="characters of one stop string")
    add("--max-queue", type=int, default=d.max_queue,
        help="requests waiting for a slot; more are a 503 with Retry-After; -1: no limit")  # fmt: skip
    add("--header-timeout", type=float, default=d.header_timeout,
        help="seconds a client may take to send its request's headers (idle keep-alive too)")  # fmt: skip
    add("--max-header-size", type=int, default=d.max_header_size, help="bytes of a request line + headers")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llamba")
    except PackageNotFoundError:
        return "unknown"


def _command_line(
    parser: argparse.ArgumentParser, argv: list[str], environ: Mapping[str, str]
) -> tuple[list[str], list[Ignored]]:
    """The arguments to parse: the variables' first, then the command line's (which wins: a variable
    whose flag the command line gives is not read, and is reported); and what is ignored."""
    try:
        from_env = env_arguments(environ, argv)
    except EnvError as exc:
        parser.error(str(exc))
    kept: list[str] = []
    ignored: list[Ignored] = []
    for var in from_env.read:
        var_kept, var_ignored = _split_ignored(list(var.args))
        kept += var_kept
        ignored += [Ignored(f"{var.env} ({flag})", flag.reason) for flag in var_ignored]
    for env, flag in from_env.overridden:
        ignored.append(Ignored(env, f"the command line's {flag} wins over the variable"))
    cli_kept, cli_ignored = _split_ignored(argv)
    return kept + cli_kept, ignored + cli_ignored


def _split_ignored(argv: list[str]) -> tuple[list[str], list[Ignored]]:
    """Take out the llama-server flags that have no effect here, so they warn instead of failing, and
    the always-on switches."""
    kept: list[str] = []
    ignored: list[Ignored] = []
    i = 0
    while i < len(argv):
        flag = argv[i].split("=", 1)[0]
        if flag in ALWAYS_ON and "=" not in argv[i]:
            i += 1
            continue
        if flag in IGNORED_FLAGS:
            row = IGNORED_FLAGS[flag]
            ignored.append(Ignored(flag, NO_EFFECT if row.note == "no effect in Llamba" else row.note))
            i += 1 + _value_count(row, argv[i], argv[i + 1 : i + 2])
            continue
        kept.append(argv[i])
        i += 1
    return kept, ignored


def _value_count(flag: LlamaServerFlag, arg: str, rest: list[str]) -> int:
    """How many of the next arguments are this ignored flag's value: none for a switch or `--f=v`, the
    next one for a value, and for an optional value (`[on|off]`) the next one unless it is a flag."""
    if not flag.value or "=" in arg or not rest:
        return 0
    if flag.value.startswith("[") and rest[0].startswith("-"):
        return 0
    return 1


def parse_settings(
    argv: list[str] | None = None, environ: Mapping[str, str] | None = None
) -> tuple[Settings, list[Ignored]]:
    """Settings from the command line and `LLAMA_ARG_*` variables (`environ`, else the process's),
    and the ignored flags to warn about. Bad input exits 2 with a one-line reason."""
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    kept, ignored = _command_line(parser, argv, os.environ if environ is None else environ)
    args = parser.parse_args(kept)
    keys = _api_keys(parser, args)
    _check_bounds(parser, args)
    _check_limits(parser, args)
    template = args.chat_template
    if args.chat_template_file:
        try:
            template = Path(args.chat_template_file).read_text()
        except OSError as exc:
            parser.error(f"cannot read --chat-template-file: {exc}")
    values = {k: v for k, v in vars(args).items() if k in Settings.model_fields}
    values.update(api_keys=keys, chat_template=template, slot_similarity=args.slot_prompt_similarity)
    try:
        values["mcp_servers"] = load_mcp_servers(args.mcp_servers_config, args.mcp_servers_json)
    except McpConfigError as exc:
        parser.error(str(exc))
    values["cors_origins"] = _cors_origins(args.cors_origins)
    values.update(_tool_settings(parser, args))
    values["api_prefix"] = _api_prefix(parser, args.api_prefix)
    values["chat_template_kwargs"] = _json_object(parser, "--chat-template-kwargs", args.chat_template_kwargs)
    values.update(_default_constraint(parser, args))
    values["reverse_prompts"] = tuple(p for p in args.reverse_prompts if p)
    _check_tls(parser, args)
    values["spec"] = _spec_params(parser, args)
    values["sampling"] = _sampling_params(parser, args)
    if args.log_prompts_dir:
        values["log_prompts_dir"] = Path(args.log_prompts_dir)
    values["slot_save_path"] = Path(args.slot_save_path) if args.slot_save_path else None
    values["responses_dir"] = Path(args.responses_dir) if args.responses_dir else None
    values["stream_journal"] = _stream_journal(parser, args.stream_journal)
    values["models_dir"] = Path(args.models_dir) if args.models_dir else None
    values["models_preset"] = Path(args.models_preset) if args.models_preset else None
    _check_cluster(parser, args)
    if not (args.sleep_idle_seconds > 0 or args.sleep_idle_seconds == -1):
        parser.error(f"--sleep-idle-seconds must be > 0 or -1, got {args.sleep_idle_seconds}")
    if args.n_gpu_layers == 0:
        values["device"] = "cpu"
    _check_draft_device(parser, args, values.get("device", args.device))
    if args.reranking:  # as llama-server: --reranking is --embedding with pooling rank
        values.update(embedding=True, pooling="rank")
    if args.embd_normalize < -1:
        parser.error(f"--embd-normalize must be >= -1, got {args.embd_normalize}")
    _check_cache_types(parser, args)
    return Settings(**values), ignored


def _default_constraint(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """--grammar/--grammar-file or -j/-jf (at most one): the constraint of requests without their own."""
    given = [f for f, v in (("--grammar", args.grammar), ("--grammar-file", args.grammar_file),
             ("-j", args.json_schema), ("-jf", args.json_schema_file)) if v is not None]  # fmt: skip
    if len(given) > 1:
        parser.error(f"{' and '.join(given)}: give one default constraint")
    if args.grammar_file is not None:
        return {"grammar": _read(parser, "--grammar-file", args.grammar_file)}
    schema_text = args.json_schema
    if args.json_schema_file is not None:
        schema_text = _read(parser, "-jf", args.json_schema_file)
    if schema_text is None:
        return {"grammar": args.grammar}
    schema = _json_object(parser, given[0], schema_text)
    try:
        return {"json_schema": check_schema(schema)}
    except ValueError as exc:
        parser.error(f"{given[0]}: {exc}")


def _read(parser: argparse.ArgumentParser, flag: str, path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        parser.error(f"cannot read {flag}: {exc}")


def _json_object(parser: argparse.ArgumentParser, flag: str, text: str | None) -> dict[str, Any]:
    if text is None:
        return {}
    try:
        value = json.loads(text)
    except ValueError as exc:
        parser.error(f"{flag} must be a JSON object: {exc}")
    if not isinstance(value, dict):
        parser.error(f"{flag} must be a JSON object, got {text!r}")
    return value


def _stream_journal(parser: argparse.ArgumentParser, value: str | None) -> Path | None:
    """--stream-journal DIR: created if missing; a file, or a folder this process cannot write in,
    exits 2 naming it."""
    if value is None:
        return None
    path = Path(value)
    if path.exists() and not path.is_dir():
        parser.error(f"--stream-journal: {value} is not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path):  # writable (root ignores mode bits, not a read-only mount)
            pass
    except OSError as exc:
        parser.error(f"--stream-journal: cannot write in {value}: {exc.strerror or exc}")
    return path


def _api_prefix(parser: argparse.ArgumentParser, prefix: str) -> str:
    """`/llm`, `llm/` and `/llm/` all mean /llm; "/" or "" none."""
    cleaned = "/" + prefix.strip("/") if prefix.strip("/") else ""
    if any(c in cleaned for c in "?#% ") or "//" in cleaned:
        parser.error(f"--api-prefix must be a plain path like /llm, got {prefix!r}")
    return cleaned


def _check_tls(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if bool(args.ssl_key_file) != bool(args.ssl_cert_file):
        parser.error("--ssl-key-file and --ssl-cert-file go together")
    for flag, path in (("--ssl-key-file", args.ssl_key_file), ("--ssl-cert-file", args.ssl_cert_file)):
        if path and not Path(path).is_file():
            parser.error(f"{flag}: no such file: {path}")


def _check_bounds(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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
    if args.ubatch_size < 1 or args.batch_size < 1:
        parser.error("--batch-size and --ubatch-size must be >= 1")


def _check_draft_device(parser: argparse.ArgumentParser, args: argparse.Namespace, device: str) -> None:
    """-devd/-ngld: the draft model runs on the target's device (its tokens feed the target's batch);
    asking for another exits 2 rather than being ignored."""
    wanted = "cpu" if args.gpu_layers_draft == 0 else args.device_draft
    if wanted is not None and wanted != device:
        parser.error(f"the draft model runs on the target's device ({device}) in Llamba, not on {wanted}")


def _check_cluster(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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


def _check_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
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


def _check_cache_types(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """-ctk/-ctv: f16 or q8_0; llama-server's other types exit 2 naming the supported ones."""
    for flag, name in (("--cache-type-k", args.cache_type_k), ("--cache-type-v", args.cache_type_v)):
        try:
            cache_type(name)
        except ValueError as exc:
            parser.error(f"{flag}: {exc}")


def _spec_params(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SpecParams:
    """--spec-type (comma lists and repeats; `none` clears) and the draft flags; -md alone means
    draft-simple, as in llama-server."""
    types = [t.strip() for v in args.spec_type or () for t in v.split(",") if t.strip()]
    types = [] if "none" in types else types
    unknown = [t for t in types if t not in SPEC_TYPES]
    if unknown:
        parser.error(f"--spec-type {unknown[0]!r} is not supported (known: none, {', '.join(SPEC_TYPES)})")
    if args.model_draft and not args.spec_type:
        types = ["draft-simple"]
    if "draft-simple" in types and not args.model_draft:
        parser.error("--spec-type draft-simple needs a draft model: -md/--model-draft FILE")
    try:
        return SpecParams(
            tuple(dict.fromkeys(types)),
            n_max=args.draft_max,
            n_min=args.draft_min,
            p_min=args.draft_p_min,
            ngram_n=args.spec_ngram_size_n,
            ngram_m=args.spec_ngram_size_m,
            min_hits=args.spec_ngram_min_hits,
        )
    except ValueError as exc:
        parser.error(str(exc))


def _sampling_params(parser: argparse.ArgumentParser, args: argparse.Namespace) -> SamplingParams:
    """The sampling flags as SamplingParams; a bad value exits 2 naming it."""
    try:
        samplers = parse_samplers(args.samplers.split(";")) if args.samplers else None
        if args.sampler_seq:
            samplers = parse_samplers(args.sampler_seq)
        return SamplingParams(
            temperature=max(args.temp, 0.0),  # llama-server clamps a negative --temp to 0
            **{name: getattr(args, name) for name in NUMBER_FIELDS if name != "temperature"},
            dry_sequence_breakers=_breaker_flags(args.dry_sequence_breaker),
            logit_bias=_logit_bias_flags(args.logit_bias or []),
            **({"samplers": samplers} if samplers is not None else {}),
        )
    except ValueError as exc:
        parser.error(f"sampling: {exc}")


def _breaker_flags(values: list[str] | None) -> tuple[str, ...]:
    """--dry-sequence-breaker: given ones replace the defaults; "none" leaves no breakers at all."""
    if values is None:
        return SamplingParams().dry_sequence_breakers
    return () if "none" in values else tuple(values)


def _logit_bias_flags(values: list[str]) -> dict[int, float]:
    """llama-server's -l TOKEN_ID(+|-)BIAS, e.g. 15043+1 or 15043-inf."""
    bias: dict[int, float] = {}
    for value in values:
        match = re.fullmatch(r"\s*(\d+)\s*([+-])\s*(\S+)\s*", value)
        try:
            amount = float(match.group(3)) if match else math.nan
        except ValueError:
            amount = math.nan
        if match is None or math.isnan(amount):
            raise ValueError(f"--logit-bias {value!r}: expected TOKEN_ID(+/-)BIAS, e.g. 15043+1")
        token = int(match.group(1))
        bias[token] = bias.get(token, 0.0) + (-amount if match.group(2) == "-" else amount)
    return bias


def _tool_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> dict[str, Any]:
    """--tools, --tools-runtime, --ui-mcp-proxy, and --agent (the first and the last at once)."""
    asked = "all" if args.agent else args.tools
    try:
        tools = parse_tool_names(asked) if asked is not None else ()
        if args.tools_runtime:
            Runtime.parse(args.tools_runtime)
    except (ValueError, BadContext) as exc:
        parser.error(str(exc))
    return {"tools": tools, "ui_mcp_proxy": args.ui_mcp_proxy or args.agent}


def _cors_origins(value: str | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    return tuple(o.strip().rstrip("/") for o in value.split(",") if o.strip())


def _api_keys(parser: argparse.ArgumentParser, args: argparse.Namespace) -> tuple[str, ...]:
    """llama-server's key sources: each --api-key a comma-separated list (CSV quoting, so a key may
    hold a comma in quotes), and --api-key-file, one key per line, lines starting with # comments."""
    keys = [k for value in args.api_key or [] for row in csv.reader([value]) for k in row if k]
    if args.api_key_file:
        try:
            lines = Path(args.api_key_file).read_text().splitlines()
        except OSError as exc:
            parser.error(f"cannot read --api-key-file: {exc}")
        keys += [line.strip() for line in lines if line.strip() and not line.startswith("#")]
    return tuple(dict.fromkeys(keys))
