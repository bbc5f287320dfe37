"""
pytest plugin that makes llama.cpp's server test suite (tools/server/tests)
run offline against local models, without editing any of the test files.

Load it with:  PYTHONPATH=<this folder> pytest -p peer_suite_plugin ...
(run from inside the copied tests dir, see run_suite.sh).

What it does (all from the outside, by monkeypatching the `utils` module
that conftest.py and every unit/test_*.py star-import):

* every ServerPreset (tinyllama2, bert_bge_small*, tinyllama_infill,
  stories15m_moe, jina_reranker_tiny) -> local SmolLM2-135M-Instruct file,
  tinygemma3 -> local gemma-3-270m file; hf repo/file cleared, --offline on.
  The router preset stays model-less (that is what a router is) but offline.
* ServerProcess class defaults: no hf repo, local SmolLM2 file, offline.
* ServerPreset.load_all() -> no-op (no downloads).
* builds a fake HF cache ($LLAMA_CACHE, models--<org>--<repo>/snapshots/...)
  whose GGUF entries are symlinks to the local models, so router-mode tests
  that ask for "ggml-org/tinygemma3-GGUF:Q8_0" or
  "ggml-org/test-model-stories260K:F32" find something offline.
* ServerProcess.start(): refuses to start when the port is already taken
  (so a leftover process can never answer for the server under test),
  caps each /health probe at a few seconds, uses PEER_START_TIMEOUT
  (default 60 s) as the start deadline; a server that dies or never becomes
  healthy raises -> the test fails/errors instead of hanging.
* records per-test outcomes (passed/failed/skipped/error) incrementally to
  $PEER_OUTCOMES_JSONL and as a summary JSON to $PEER_OUTCOMES_JSON.
* optional selection: $PEER_SELECT_FILE = file with one test node id per line;
  every other collected test is deselected.
"""

import json
import os
import socket
import sys
import time

# ---------------------------------------------------------------------------
# configuration (env overridable)
# ---------------------------------------------------------------------------
HERE = os.path.dirname(os.path.abspath(__file__))
TESTS_DIR = os.environ.get("PEER_TESTS_DIR", os.path.join(HERE, "llama.cpp", "tools", "server", "tests"))
MODEL_DIR = (
    os.environ.get("PEER_MODEL_DIR")
    or os.environ.get("ACC_MODELS")
    or os.path.expanduser("~/.cache/llamba-acceptance/models")
)
SMOL = os.environ.get("PEER_MODEL_SMOL", os.path.join(MODEL_DIR, "SmolLM2-135M-Instruct.Q4_1.gguf"))
GEMMA = os.environ.get("PEER_MODEL_GEMMA", os.path.join(MODEL_DIR, "gemma-3-270m-Q4_K_M.gguf"))
# our own fake HF cache; never the user's real LLAMA_CACHE (symlinks get written into it)
FAKE_CACHE = os.environ.get("PEER_LLAMA_CACHE") or os.path.join(HERE, "hf_cache")
START_TIMEOUT = float(os.environ.get("PEER_START_TIMEOUT", "60"))
# circuit breaker: after this many consecutive start *timeouts* (process alive but never
# healthy) the start deadline drops to max(PEER_START_TIMEOUT_DEGRADED, 3 x slowest
# successful start so far) until a start succeeds again, so a server that hangs on
# start-up costs minutes, not hours
MAX_CONSECUTIVE_START_TIMEOUTS = int(os.environ.get("PEER_MAX_START_TIMEOUTS", "3"))
START_TIMEOUT_DEGRADED = float(os.environ.get("PEER_START_TIMEOUT_DEGRADED", "10"))
HEALTH_PROBE_TIMEOUT = float(os.environ.get("PEER_HEALTH_PROBE_TIMEOUT", "5"))
PORT_FREE_WAIT = float(os.environ.get("PEER_PORT_FREE_WAIT", "15"))

# the real llama-server looks up $LLAMA_CACHE; utils.py only sets LLAMA_CACHE=tmp
# when it is unset, so we set it before any server is started
os.environ["LLAMA_CACHE"] = FAKE_CACHE
os.environ.setdefault("PORT", "18200")

if TESTS_DIR not in sys.path:
    sys.path.insert(0, TESTS_DIR)

import utils  # noqa: E402  (the suite's own helper module; same object conftest imports)

# ---------------------------------------------------------------------------
# presets -> local models
# ---------------------------------------------------------------------------
PRESET_MODEL = {
    "tinyllama2": SMOL,
    "bert_bge_small": SMOL,
    "bert_bge_small_with_fa": SMOL,
    "tinyllama_infill": SMOL,
    "stories15m_moe": SMOL,
    "jina_reranker_tiny": SMOL,
    "tinygemma3": GEMMA,
}

# class-level defaults (used by the few tests that build ServerProcess() directly)
utils.ServerProcess.model_hf_repo = None
utils.ServerProcess.model_hf_file = None
utils.ServerProcess.model_file = SMOL
utils.ServerProcess.offline = True


def _wrap_preset(name, orig, model_path):
    def preset():
        s = orig()
        s.model_hf_repo = None
        s.model_hf_file = None
        s.model_url = None
        s.offline = True
        if model_path is not None:
            s.model_file = model_path
        else:  # router: no model at all
            s.model_file = None
        return s

    preset.__name__ = name
    preset.__wrapped__ = orig
    return staticmethod(preset)


for _name, _val in list(utils.ServerPreset.__dict__.items()):
    if _name.startswith("_") or _name == "load_all":
        continue
    _fn = _val.__func__ if isinstance(_val, staticmethod) else _val
    if not callable(_fn):
        continue
    setattr(utils.ServerPreset, _name, _wrap_preset(_name, _fn, PRESET_MODEL.get(_name)))


def _load_all_noop() -> None:
    """offline: nothing to download"""
    return None


utils.ServerPreset.load_all = staticmethod(_load_all_noop)

# ---------------------------------------------------------------------------
# robust start
# ---------------------------------------------------------------------------
_orig_start = utils.ServerProcess.start
_orig_make_request = utils.ServerProcess.make_request


class PortInUseError(Exception):
    """deliberately not a RuntimeError: some tests treat RuntimeError from start() as 'server died'"""


def _port_in_use(host: str, port: int) -> bool:
    host = host.split(",")[0].strip() or "127.0.0.1"
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError:
        infos = [(socket.AF_INET, socket.SOCK_STREAM, 0, "", ("127.0.0.1", port))]
    for family, socktype, proto, _, addr in infos:
        s = socket.socket(family, socktype, proto)
        s.settimeout(0.5)
        try:
            if s.connect_ex(addr) == 0:
                return True
        except OSError:
            pass
        finally:
            s.close()
    return False


_start_stats = {"consecutive_timeouts": 0, "slowest_ok": 0.0}
_cmdlines: dict = {}  # test nodeid -> server command lines it started (argv[0] dropped)


def _record_cmdline(server) -> None:
    proc = getattr(server, "process", None)
    if proc is None:
        return
    nid = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" (", 1)[0]
    try:
        _cmdlines.setdefault(nid, []).append(" ".join(str(a) for a in list(proc.args)[1:]))
    except Exception:
        pass


def _robust_start(self, timeout_seconds: int = utils.DEFAULT_HTTP_TIMEOUT) -> None:
    if getattr(self, "external_server", False):
        return _orig_start(self, timeout_seconds)
    if self.process is not None and self.process.poll() is None:
        # already running (some tests call start() twice on purpose)
        return _orig_start(self, timeout_seconds)
    deadline = time.time() + PORT_FREE_WAIT
    while _port_in_use(self.server_host, self.server_port):
        if time.time() > deadline:
            raise PortInUseError(
                f"port {self.server_port} is still in use by another process; "
                "refusing to start (a stale server would answer for this one)"
            )
        time.sleep(0.2)

    def _probe(method, path, data=None, headers=None, timeout=utils.DEFAULT_REQUEST_TIMEOUT, host=None):
        t = HEALTH_PROBE_TIMEOUT if path == "/health" else timeout
        return _orig_make_request(self, method, path, data, headers, timeout=t, host=host)

    self.make_request = _probe  # instance attribute shadows the method during start only
    try:
        eff_timeout = timeout_seconds
        if timeout_seconds == utils.DEFAULT_HTTP_TIMEOUT:
            eff_timeout = START_TIMEOUT
        if _start_stats["consecutive_timeouts"] >= MAX_CONSECUTIVE_START_TIMEOUTS:
            degraded = max(START_TIMEOUT_DEGRADED, 3.0 * _start_stats["slowest_ok"])
            if degraded < eff_timeout:
                print(
                    f"peer_suite_plugin: {_start_stats['consecutive_timeouts']} consecutive start "
                    f"timeouts, start deadline lowered to {degraded:.0f}s"
                )
                eff_timeout = degraded
        t0 = time.time()
        try:
            _orig_start(self, eff_timeout)
        except BaseException as e:
            _record_cmdline(self)
            if isinstance(e, TimeoutError):
                _start_stats["consecutive_timeouts"] += 1
            # make sure a half-started server does not linger into the next test
            try:
                self.stop()
            except Exception:
                pass
            raise
        _record_cmdline(self)
        _start_stats["consecutive_timeouts"] = 0
        _start_stats["slowest_ok"] = max(_start_stats["slowest_ok"], time.time() - t0)
    finally:
        try:
            del self.make_request
        except AttributeError:
            pass


utils.ServerProcess.start = _robust_start

# ---------------------------------------------------------------------------
# fake HF cache for router-mode tests
# ---------------------------------------------------------------------------
FAKE_COMMIT = "0123456789abcdef0123456789abcdef01234567"
FAKE_REPOS = {
    # repo id                                   file name (tag is parsed from it) -> target
    "ggml-org/tinygemma3-GGUF": ("tinygemma3-Q8_0.gguf", GEMMA),
    "ggml-org/test-model-stories260K": ("stories260K-F32.gguf", SMOL),
    "ggml-org/test-model-stories260K-infill": ("stories260K-infill-F32.gguf", SMOL),
}


def build_fake_cache(root: str = FAKE_CACHE) -> None:
    os.makedirs(root, exist_ok=True)
    for repo, (fname, target) in FAKE_REPOS.items():
        rdir = os.path.join(root, "models--" + repo.replace("/", "--"))
        os.makedirs(os.path.join(rdir, "refs"), exist_ok=True)
        with open(os.path.join(rdir, "refs", "main"), "w") as f:
            f.write(FAKE_COMMIT)
        snap = os.path.join(rdir, "snapshots", FAKE_COMMIT)
        os.makedirs(snap, exist_ok=True)
        link = os.path.join(snap, fname)
        if os.path.islink(link) and os.readlink(link) == target:
            continue
        if os.path.lexists(link):
            os.remove(link)
        os.symlink(target, link)


# ---------------------------------------------------------------------------
# pytest hooks
# ---------------------------------------------------------------------------
_outcomes: dict = {}
_details: dict = {}
_deselected: list = []
_jsonl_fh = None


def pytest_configure(config):
    global _jsonl_fh
    for p in (SMOL, GEMMA):
        if not os.path.exists(p):
            raise RuntimeError(f"peer_suite_plugin: model file missing: {p}")
    build_fake_cache()
    os.makedirs(os.path.join(TESTS_DIR, "tmp"), exist_ok=True)
    path = os.environ.get("PEER_OUTCOMES_JSONL")
    if path:
        _jsonl_fh = open(path, "a", buffering=1)


def pytest_collection_modifyitems(session, config, items):
    sel_file = os.environ.get("PEER_SELECT_FILE")
    if not sel_file:
        return
    with open(sel_file) as f:
        wanted = {line.strip() for line in f if line.strip() and not line.startswith("#")}
    keep, drop = [], []
    for it in items:
        (keep if it.nodeid in wanted else drop).append(it)
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = keep


def pytest_deselected(items):
    for it in items:
        _deselected.append(it.nodeid)


def _short_msg(report) -> str:
    try:
        if report.skipped and isinstance(report.longrepr, tuple):
            return str(report.longrepr[2])[:300]
        crash = getattr(report.longrepr, "reprcrash", None)
        if crash is not None:
            return str(crash.message).splitlines()[0][:300] if crash.message else ""
        return str(report.longrepr).strip().splitlines()[-1][:300]
    except Exception:
        return ""


def pytest_runtest_logreport(report):
    nid = report.nodeid
    prev = _outcomes.get(nid)
    if report.when == "setup":
        if report.failed:
            _outcomes[nid] = "error"
            _details[nid] = _short_msg(report)
        elif report.skipped:
            _outcomes[nid] = "skipped"
            _details[nid] = _short_msg(report)
    elif report.when == "call":
        if hasattr(report, "wasxfail"):
            _outcomes[nid] = "skipped" if report.skipped else "passed"
        elif report.passed:
            _outcomes[nid] = "passed"
        elif report.failed:
            _outcomes[nid] = "failed"
            _details[nid] = _short_msg(report)
        elif report.skipped:
            _outcomes[nid] = "skipped"
            _details[nid] = _short_msg(report)
    elif report.when == "teardown":
        if report.failed and prev in (None, "passed"):
            _outcomes[nid] = "error"
            _details[nid] = "teardown: " + _short_msg(report)
        if _jsonl_fh is not None:
            rec = {"nodeid": nid, "outcome": _outcomes.get(nid, "error")}
            if nid in _details:
                rec["message"] = _details[nid]
            _jsonl_fh.write(json.dumps(rec) + "\n")


def pytest_sessionfinish(session, exitstatus):
    # stop any server a test left running (belt and braces; conftest does it per test)
    for s in list(getattr(utils, "server_instances", [])):
        try:
            s.stop()
        except Exception:
            pass
    path = os.environ.get("PEER_OUTCOMES_JSON")
    if path:
        with open(path, "w") as f:
            json.dump(
                {
                    "tests": _outcomes,
                    "messages": _details,
                    "deselected": _deselected,
                    "server_cmdlines": _cmdlines,
                    "server_bin": os.environ.get("LLAMA_SERVER_BIN_PATH"),
                },
                f,
                indent=1,
                sort_keys=True,
            )
    if _jsonl_fh is not None:
        _jsonl_fh.close()
