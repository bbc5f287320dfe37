"""llama-server's command line as an argparse parser: every flag Llamba honours, in its help's groups.

`build_parser` only declares the flags and their defaults; `server/config/parse.py` reads a command line
with it, `server/config/checks.py` and `server/config/flag_values.py` turn the values into `Settings`.
The router (`server/router/catalogue.py`) and scripts/import_llama_server_flags.py read its flag names.
"""

from __future__ import annotations

import argparse

from engine.api import POOLING_TYPES
from engine.speculative import SPEC_TYPES
from engine.text.reasoning import REASONING_FORMATS, REASONING_MODES
from server.config.ignored_flags import IGNORED_FLAGS
from server.config.limits import RequestLimits
from server.config.print_and_exit import CacheList, CompletionBash
from server.config.settings import LOAD_MODES, REASONING_EFFORTS


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
        _log_flags,
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
    add("-m", "--model", default=None, help="GGUF path or model name (smollm2, gemma3, qwen, org/repo:quant)")
    cache = "llama.cpp's cache (LLAMA_CACHE), offline: Llamba downloads nothing from a model hub"
    add("-hf", "-hfr", "--hf-repo", dest="hf_repo", default=None, help=f"<user>/<model>[:quant] from {cache}")
    add("-hff", "--hf-file", dest="hf_file", default=None, help="the file of -hf's repository to serve")
    add("-a", "--alias", default=None, help="the model's API names, comma-separated (the first is its id)")
    add("--tags", default=None, help="the model's tags, comma-separated (listed in /v1/models)")
    add("-mm", "--mmproj", default=None, help="a multimodal projector GGUF: images in (gemma3 projectors)")
    add("--media-path", default=None, help="the folder file:// media URLs may name (none: refused)")
    # both into one list, in command-line order (an adapter's id is its place in it)
    add("--lora", dest="lora_items", action="append", default=[], type=lambda v: ("", v),
        help="a LoRA adapter GGUF (comma list; repeat); NAME=FILE serves it as model NAME")  # fmt: skip
    add("--lora-scaled", dest="lora_items", action="append", type=lambda v: ("scaled", v),
        help="FNAME:SCALE,...: LoRA adapters with their scales (repeat)")  # fmt: skip
    add("--lora-init-without-apply", action="store_true", help="load the LoRA adapters at scale 0")
    # control vectors (engine/control_vector.py), both into one list in command-line order, summed
    add("--control-vector", dest="control_vector_items", action="append", default=[], type=lambda v: ("", v),
        help="a control vector GGUF (comma list; repeat)")  # fmt: skip
    add("--control-vector-scaled", dest="control_vector_items", action="append", type=lambda v: ("scaled", v),
        help="FNAME:SCALE,...: control vectors with their scales (repeat)")  # fmt: skip
    add("--control-vector-layer-range", nargs=2, type=int, default=None, metavar=("START", "END"),
        help="the layers the control vectors apply to, inclusive")  # fmt: skip
    # vLLM's spelling of --lora NAME=FILE (name=path, or its JSON {"name", "path"}): adapters as models
    add("--lora-modules", action="extend", nargs="+", default=[],
        help="NAME=FILE ...: LoRA adapters served as models named NAME (vLLM's flag)")  # fmt: skip
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
    # the adaptive-p sampler, used where --samplers names adaptive_p (negative target: off)
    add("--adaptive-target", dest="adaptive_target", type=float, default=-1.0)
    add("--adaptive-decay", dest="adaptive_decay", type=float, default=0.9)
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


def _log_colors(value: str) -> str:
    """--log-colors as common/arg.cpp reads it: a truthy word is on, a falsey one off, else auto."""
    word = value.lower()
    if word in ("on", "enabled", "true", "1"):
        return "on"
    if word in ("off", "disabled", "false", "0"):
        return "off"
    if word == "auto":
        return "auto"
    raise argparse.ArgumentTypeError(f"unknown value for --log-colors: '{value}'")


def _log_flags(p: argparse.ArgumentParser) -> None:
    """The log (common/log.cpp's flags), and Llamba's choice of line format."""
    add = p.add_argument_group("logging").add_argument
    add("-v", "--verbose", "--log-verbose", dest="verbose", action="store_true",
        help="log everything (verbosity: infinity); also the default of a request's `verbose`")  # fmt: skip
    add("-lv", "--verbosity", "--log-verbosity", dest="verbosity", type=int, default=3,
        help="0 output, 1 error, 2 warning, 3 info, 4 trace, 5 debug: lines above it left out")  # fmt: skip
    add("--log-file", default=None, help="also write the log to FNAME (truncated at start)")
    add("--log-disable", action="store_true", help="no log at all")
    add("--log-colors", type=_log_colors, default="auto", metavar="[on|off|auto]",
        help="colour the level letters of --log-prefix (auto: when stderr is a terminal)")  # fmt: skip
    # on by default, as llama-server (its common_init() turns both on before reading the flags)
    add("--log-prefix", dest="log_prefix", action="store_true", default=True,
        help="a level letter before each line (I, W, E, D)")  # fmt: skip
    add("--no-log-prefix", dest="log_prefix", action="store_false")
    add("--log-timestamps", dest="log_timestamps", action="store_true", default=True,
        help="with --log-prefix, the time since start (minutes.seconds.ms.us) before each line")  # fmt: skip
    add("--no-log-timestamps", dest="log_timestamps", action="store_false")
    add("--log-jsonl", dest="log_jsonl", action="store_true", default=False,
        help="each line a JSON object on stdout (type, time, level, msg), no colours")  # fmt: skip
    add("--no-log-jsonl", dest="log_jsonl", action="store_false")
    add("--log-format", choices=["llama", "text", "json"], default="llama",
        help="llama: llama-server's lines (its slot and timing lines in its words); text: key=value "
        "events; json: one JSON object per event, every field (a router reads its children's)")  # fmt: skip


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
    add("-hfd", "-hfrd", "--spec-draft-hf", "--hf-repo-draft", dest="hf_repo_draft", default=None,
        help="a draft model <user>/<model>[:quant] from llama.cpp's cache, offline")  # fmt: skip
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
    add("--log-prompts-dir", default=None)
    add(
        "-cram",
        "--cache-ram",
        type=int,
        default=8192,
        help="MiB; 0 off, -1 no limit",
    )
    add("-ctxcp", "--ctx-checkpoints", "--swa-checkpoints", dest="ctx_checkpoints", type=int, default=32,
        help="recurrent-state checkpoints kept per slot (models with recurrent layers)")  # fmt: skip
    add("-cms", "--checkpoint-min-step", type=int, default=8192,
        help="least tokens between checkpoints taken at message ends (the last is always taken)")  # fmt: skip
    add("--slot-save-path", default=None, help="directory for slot save/restore files")
    add("--slot-prompt-similarity", "-sps", type=float, default=0.1)
    add("--context-shift", dest="context_shift", action="store_true", default=False)
    add("--no-context-shift", dest="context_shift", action="store_false")
    add("--keep", type=int, default=0, help="tokens kept by a context shift (-1: all)")
    add("-kvu", "--kv-unified", dest="kv_unified", action="store_true", default=False)
    add("-no-kvu", "--no-kv-unified", dest="kv_unified", action="store_false")
    add("--cache-idle-slots", dest="cache_idle_slots", action="store_true", default=True)
    add("--no-cache-idle-slots", dest="cache_idle_slots", action="store_false")
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
    add("--mcp-allow-hosts", default=None, metavar="PATTERNS",
        help="the hosts a request's MCP server_url may name (none by default: per-request MCP servers are "
        "off): comma-separated host names, *.domain, *, IP addresses or CIDR networks; a loopback, "
        "private or link-local address only when an address, network or exact name lists it")  # fmt: skip
    add("--cors-origins", default=None,
        help="comma-separated allowed origins, * (any), or localhost (any page on this machine); "
        "default *, localhost with --tools or MCP servers")  # fmt: skip
    add("--cors-methods", default="GET, POST, DELETE, OPTIONS",
        help="a preflight's Access-Control-Allow-Methods")  # fmt: skip
    add("--cors-headers", default="*", help="a preflight's Access-Control-Allow-Headers")
    add("--cors-credentials", dest="cors_credentials", action="store_true", default=True,
        help="Access-Control-Allow-Credentials: true (default); off: with --cors-origins * any page, "
        "without credentials")  # fmt: skip
    add("--no-cors-credentials", dest="cors_credentials", action="store_false")
    add("--tools", default=None, metavar="TOOL1,TOOL2,...",
        help="built-in tools served at /tools: all, or names (read_file, file_glob_search, "
        "grep_search, exec_shell_command, write_file, edit_file); without exec_shell_command the file "
        "tools are confined to x-tool-cwd, else the server's cwd")  # fmt: skip
    add("--tools-runtime", default=None, metavar="OPTION",
        help="where exec_shell_command runs by default: docker-container:ID, "
        "podman-container:ID or ssh:TARGET")  # fmt: skip
    add("--tools-regex-timeout", type=float, default=5.0, metavar="SECONDS",
        help="seconds the patterns of one grep_search or file_glob_search call may take to match, "
        "in all; a call past it is a tool error")  # fmt: skip
    add("--ui-mcp-proxy", "--webui-mcp-proxy", dest="ui_mcp_proxy", action="store_true", default=False,
        help="serve /cors-proxy?url= for the web UI's MCP client "
        "(only x-llama-server-proxy-header-* headers are sent)")  # fmt: skip
    add("--no-ui-mcp-proxy", "--no-webui-mcp-proxy", dest="ui_mcp_proxy", action="store_false")
    add("--ui-config", "--webui-config", dest="ui_config", default=None, metavar="JSON",
        help="JSON object of the web UI's default settings (/props' ui_settings)")  # fmt: skip
    add("--ui-config-file", "--webui-config-file", dest="ui_config_file", default=None, metavar="PATH",
        help="a file with --ui-config's JSON object")  # fmt: skip
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
    add("--strict-fields", action="store_true", default=False,
        help="answer 400 to a request field Llamba does not know (default: ignored and logged once, as "
        "llama-server ignores keys it does not read)")  # fmt: skip


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("llamba")
    except PackageNotFoundError:
        return "unknown"
