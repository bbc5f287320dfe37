"""The server's settings: one frozen pydantic model that every part of the server reads.

`server/config/parse.py` fills it from llama-server's flags and `LLAMA_ARG_*` variables; modules that
only read settings import `Settings` from here, never the argparse side. The fields are grouped by what
they configure: the model, its chat template, the server, streams, request defaults, tools and agents,
router mode, the cluster, request limits.
"""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine.sampling import SamplingParams
from engine.speculative import SpecParams
from server.config.limits import RequestLimits
from server.mcp.config import McpServerConfig

# llama-server's -lm/--load-mode. Llamba always reads the file through a memory map and repacks every
# weight into its own arrays (the map's pages are released after packing), so the modes differ only in
# whether the packed weights are locked in RAM.
LOAD_MODES = ("auto", "none", "mmap", "mlock", "mmap+mlock", "dio")
LOCKING_LOAD_MODES = ("mlock", "mmap+mlock")
REASONING_EFFORTS = ("default", "minimal", "low", "medium", "high", "xhigh", "max")


class Settings(BaseModel):
    """Every setting, flat and frozen: one value per flag (or derived from several), read as `settings.x`."""

    model_config = ConfigDict(frozen=True)

    # -- the model: its file, device, memory, batch and context ---------------------------------------
    model: str | None = None
    alias: str | None = None
    tags: str | None = None
    device: str = "cpu"
    n_gpu_layers: int = -1  # 0 keeps the model on the CPU; any other value offloads all of it
    load_mode: str = "auto"  # one of LOAD_MODES
    threads: int | None = None
    adaptive_threads: bool = True  # --no-adaptive-threads: always -t threads, even on a busy machine
    ctx_size: int = 4096
    parallel: int = 1
    batch_size: int = 2048
    ubatch_size: int = 512
    cache_type_k: str = "f16"  # -ctk: the KV cache's key cells (engine/memory/kv_types.py: f16, q8_0)
    cache_type_v: str = "f16"  # -ctv
    cache_ram: int = 8192  # MiB of host prompt cache: 0 off, -1 no limit
    ctx_checkpoints: int = 32  # recurrent-state checkpoints per slot (engine/memory/checkpoints.py)
    checkpoint_min_step: int = 8192  # least spacing of message-end checkpoints
    slot_similarity: float = 0.1
    context_shift: bool = False
    keep: int = 0
    kv_unified: bool = False  # each slot may use all of --ctx-size, the slots' cells together at most that
    cache_idle_slots: bool = True  # with kv_unified: a starting request moves idle slots to the host cache
    spec: SpecParams = SpecParams()  # the default speculation of every request (none unless --spec-type)
    model_draft: str | None = None
    # Media (engine/media/): the projector GGUF that makes images into embeddings, and the one folder
    # file:// media URLs may read (llama-server's --media-path; none: file:// is refused).
    mmproj: str | None = None
    media_path: str | None = None
    # LoRA adapters (--lora, --lora-scaled; engine/lora.py): (path, initial global scale) in flag order,
    # their ids; --lora-init-without-apply loads them all at scale 0.
    lora: tuple[tuple[str, float], ...] = ()
    lora_init_without_apply: bool = False  # (already applied to `lora`'s scales)
    # Adapters served as models (--lora NAME=FILE, vLLM's --lora-modules): (name, path); ids after `lora`'s
    lora_named: tuple[tuple[str, str], ...] = ()
    # Control vectors (--control-vector, --control-vector-scaled; engine/control_vector.py): (path, scale),
    # summed; --control-vector-layer-range START END, inclusive (-1: llama.cpp's default, 1 and the last)
    control_vectors: tuple[tuple[str, float], ...] = ()
    control_vector_layer_range: tuple[int, int] = (-1, -1)
    # Embeddings (--embedding) and rerank (--reranking: pooling rank): the routes answer only with them;
    # pooling None is the model's own (its GGUF's pooling_type, else none, as llama.cpp decides).
    embedding: bool = False
    pooling: str | None = None
    embd_normalize: int = 2  # -1 none, 0 max absolute (int16 range), 1 taxicab, 2 euclidean, >2 p-norm
    # Seconds without work before the model frees its weights and KV memory (-1: never); also per child.
    sleep_idle_seconds: float = -1

    # -- the chat template and reasoning blocks -------------------------------------------------------
    chat_template: str | None = None
    reasoning_format: str = "auto"  # none | deepseek | auto (deepseek when the template has a thinking block)
    reasoning: str = "auto"  # on | off | auto: enable_thinking for the template (off also closes the block)
    reasoning_budget: int = -1  # model tokens in a reasoning block: -1 unlimited, 0 closes it at once
    reasoning_budget_message: str = ""

    # -- the server: where it listens, who may call it, what it serves, what it logs ------------------
    host: str = "127.0.0.1"
    port: int = 8080
    api_keys: tuple[str, ...] = ()
    api_prefix: str = ""  # --api-prefix: every route under it (server/http/serving.py)
    ssl_key_file: str | None = None  # --ssl-key-file/--ssl-cert-file: HTTPS (both or neither)
    ssl_cert_file: str | None = None
    # None is the default policy: any origin, but only localhost ones when tools run on this host.
    cors_origins: tuple[str, ...] | None = None
    cors_methods: str = "GET, POST, DELETE, OPTIONS"  # --cors-methods: a preflight's allowed methods
    cors_headers: str = "*"  # --cors-headers: a preflight's allowed headers
    cors_credentials: bool = True  # --cors-credentials: pages may send cookies and credentials
    timeout: int = 3600  # -to: seconds a request body may take to arrive, and a response write may block
    shutdown_timeout: float = 0.0  # seconds SIGTERM lets in-flight requests finish (0: cancel them at once)
    slots: bool = True
    # LLAMA_SERVER_SLOTS_DEBUG (an environment variable, as llama-server): /slots adds each slot's
    # prompt and generated text
    slots_debug: bool = False
    metrics: bool = False
    props: bool = False  # --props: POST /props is served
    strict_fields: bool = False  # --strict-fields: a request field Llamba does not know is a 400
    webui: bool = True
    slot_save_path: Path | None = None  # where POST /slots/<id>?action=save|restore puts slot files
    verbose: bool = False
    # The log (common/log.cpp's flags): llama-server's lines, key=value ("text") or JSON events.
    log_format: str = "llama"
    verbosity: int = 3  # -lv: 0 output, 1 error, 2 warning, 3 info, 4 trace, 5 debug (-v: everything)
    log_file: Path | None = None  # --log-file: the log also written there
    log_disable: bool = False
    log_colors: str = "auto"  # on, off, auto (when stderr is a terminal)
    log_prefix: bool = True  # --log-prefix: the level letter before each line (llama-server: on)
    log_timestamps: bool = True  # --log-timestamps: with the prefix, the time since start (on)
    log_jsonl: bool = False  # --log-jsonl: each line a JSON object on stdout
    log_prompts_dir: Path | None = None

    # -- resumable streams (X-Conversation-Id) --------------------------------------------------------
    stream_buffer_size: int = 4 * 1024 * 1024
    stream_ttl: float = 300.0
    stream_max_sessions: int = 256
    stream_max_sessions_per_client: int = 64
    stream_journal: Path | None = None  # --stream-journal: durable resumable streams

    # -- request defaults: what a request gets unless it says otherwise -------------------------------
    sampling: SamplingParams = SamplingParams()  # the sampling flags: what a request's fields override
    n_predict: int = -1
    ignore_eos: bool = False  # --ignore-eos: the default of a request's `ignore_eos`
    reasoning_effort: str = "default"  # --reasoning-effort: the template's, under a request's own
    reverse_prompts: tuple[str, ...] = ()  # -r (repeatable): the stop strings of requests without any
    grammar: str | None = None  # --grammar/--grammar-file: the GBNF of requests without a constraint
    json_schema: dict[str, Any] | None = None  # -j/-jf: the same with a JSON schema
    chat_template_kwargs: dict[str, Any] = {}  # --chat-template-kwargs: under each request's own

    # -- tools and agents -----------------------------------------------------------------------------
    # MCP servers, validated while parsing: a bad config stops the server before it ever answers.
    mcp_servers: tuple[McpServerConfig, ...] = ()
    # --mcp-allow-hosts: the hosts a request may make this server connect to as an MCP server (its
    # `server_url`); none: per-request MCP servers are refused (server/mcp/egress.py checks every request).
    mcp_allow_hosts: tuple[str, ...] = ()
    # The server-side tool loop (server/agents/loop.py): rounds of MCP calls per request, seconds per call
    # (each server's own timeout_ms still applies when it is shorter), tokens a run generates (-1: any).
    tool_max_rounds: int = 8
    tool_timeout: float = 30.0
    tool_max_tokens: int = -1
    # The built-in tools (--tools; server/builtin_tools/), in their fixed order, and where
    # exec_shell_command runs without a request's x-tool-runtime (None: on this host).
    tools: tuple[str, ...] = ()
    tools_runtime: str | None = None
    tools_regex_timeout: float = 5.0  # seconds the patterns of one grep/glob search may take in all
    ui_mcp_proxy: bool = False  # --ui-mcp-proxy: /cors-proxy for the web UI's MCP client
    # --ui-config / --ui-config-file: the web UI's default settings (/props' ui_settings), under the user's
    ui_settings: dict[str, Any] = {}
    # Stored Responses API responses: how many are kept, and the folder that keeps them across restarts.
    responses_max: int = 1000
    responses_dir: Path | None = None

    # -- router mode (no -m): the catalogue's sources and policy (server/router/) ---------------------
    models_dir: Path | None = None
    models_preset: Path | None = None
    models_max: int = 4  # loaded models at once; 0: no limit
    models_autoload: bool = True

    # -- scale-out (server/cluster/): `ray`, `ray:ADDRESS` or `ray://HOST:PORT`; replicas of the model --
    cluster: str | None = None
    replicas: int = 1
    replicas_min: int | None = None  # autoscaling's bounds (server/cluster/autoscale.py); None: --replicas
    replicas_max: int | None = None
    scale_up_after: float = 10.0  # seconds of sustained queue before a replica is added
    scale_down_after: float = 60.0  # seconds of sustained low load before one is drained
    placement: str = "prefix"  # prefix (cache-aware, else least loaded), least-loaded, random (benchmarks)

    # -- request limits (server/config/limits.py; server/http/limits.py says how each answers) --------
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
        """-a/--alias, comma-separated, as llama-server keeps them: a sorted set, whose first is the
        model's id in the API; without -a, the model as -m named it (llama-server's alias then)."""
        given = sorted({a.strip() for a in (self.alias or "").split(",") if a.strip()})
        return given or ([self.model] if self.model else [])

    @property
    def model_alias(self) -> str:
        """The model's name in the API: the first alias, else what -m said (a path as given, or a
        built-in model's name), as llama-server names it."""
        return self.aliases[0] if self.aliases else "SmolLM2-135M-Instruct.Q4_1.gguf"

    @property
    def tag_list(self) -> list[str]:
        """--tags, comma-separated: informational, listed in /v1/models (not used for routing), a sorted
        set as llama-server's."""
        return sorted({t.strip() for t in (self.tags or "").split(",") if t.strip()})
