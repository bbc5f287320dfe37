"""llamastat 0.3.0 against a server: its provider (LlamaCppProvider) and engine (Engine), which the dashboard
polls, plus `llamastat --once --json`.

Starts `<bin> -m <model> -c 4096 -np 2 --metrics`, polls /health, /slots, /props, /v1/models and /metrics
through the provider every 0.2 s while two generations run at once, and checks that the engine's figures
(header, per-slot phase and context, client-side token rates and totals, server metrics) are filled in and
non-zero where the dashboard would show activity.

usage: python drive_llamastat.py --bin BIN --model GGUF --port N --workdir DIR
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Checks, Server, driver_args, http, short  # noqa: E402
from llamastat.core.engine import Engine  # noqa: E402
from llamastat.providers.llamacpp import LlamaCppProvider  # noqa: E402

PROMPT = ("The lighthouse keeper wrote in his log every evening. " * 12) + "Continue the story:"
N_PREDICT = 160


def main() -> int:
    a = driver_args()
    c = Checks("llamastat")
    log = os.path.join(a.workdir, "server.log")
    with Server(
        a.bin, a.model, a.port, ["-c", "4096", "-np", "2", "--metrics", *a.server_args], log_path=log
    ) as srv:
        snaps, raws, engine = asyncio.run(poll_during_load(srv.url))
        run(c, srv.url, snaps, raws, engine)
        cli(c, srv.url)
    return c.finish()


async def poll_during_load(url):
    provider = LlamaCppProvider(url)
    engine = Engine(url=url)
    snaps, raws = [], []
    results = []

    def request(i):
        results.append(
            http(
                "POST",
                url + "/completion",
                {
                    "prompt": PROMPT + f" ({i})",
                    "n_predict": N_PREDICT,
                    "ignore_eos": True,
                    "temperature": 0.7,
                    "seed": i,
                },
                timeout=600,
            )
        )

    try:
        for _ in range(2):  # baseline polls: the engine's first sight of a slot only records it
            now = time.monotonic()
            raw = await provider.poll(now)
            raws.append(raw)
            snaps.append(engine.derive(raw, now))
            await asyncio.sleep(0.2)
        threads = [threading.Thread(target=request, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            now = time.monotonic()
            raw = await provider.poll(now)
            raws.append(raw)
            snaps.append(engine.derive(raw, now))
            await asyncio.sleep(0.2)
        for _ in range(3):  # after: idle slots, completed tasks counted
            await asyncio.sleep(0.2)
            now = time.monotonic()
            raw = await provider.poll(now)
            raws.append(raw)
            snaps.append(engine.derive(raw, now))
    finally:
        await provider.aclose()
    bad = [r for r in results if r[0] != 200]
    if bad:
        raise RuntimeError(f"load request failed: {bad[0][0]} {short(bad[0][2])}")
    return snaps, raws, engine


def run(c: Checks, url, snaps, raws, engine):
    first, last = snaps[0], snaps[-1]
    busy = [s for s in snaps if s.running > 0]

    def health():
        assert all(r.health == "ok" and r.ok and not r.error for r in raws), (
            f"health/errors: {sorted({(r.health, r.error) for r in raws}, key=str)}"
        )
        assert all(r.slots is not None for r in raws), "/slots not a JSON list in some poll"
        return f"{len(raws)} polls, all healthy"

    c.check("poll: /health ok, /slots list every poll", health)

    def header():
        s = last
        missing = [k for k in ("model_alias", "model_path", "model_ftype", "build_info") if not getattr(s, k)]
        assert not missing, f"/props lacks {missing}"
        assert s.total_slots == 2, f"props.total_slots={s.total_slots}"
        m = [
            k
            for k in ("n_params", "model_size_bytes", "n_ctx_train", "n_embd", "n_vocab")
            if not getattr(s, k)
        ]
        assert not m, f"/v1/models data[0].meta lacks {m}"
        assert s.slot_ctx > 0 and s.ctx_total >= 2 * s.slot_ctx, (
            f"slot n_ctx {s.slot_ctx}, total {s.ctx_total}"
        )
        return (
            f"{s.model_alias} {s.model_ftype} build={s.build_info} "
            f"slots={s.total_slots} n_ctx/slot={s.slot_ctx}"
        )

    c.check("header: /props + /v1/models meta", header)

    def sampling():
        s = last
        vals = {k: getattr(s, k) for k in ("temperature", "top_p", "top_k", "min_p", "max_tokens")}
        assert all(v is not None for v in vals.values()), f"default_generation_settings.params: {vals}"
        return str(vals)

    c.check("sampling defaults from /props", sampling)

    def slots_live():
        assert busy, f"no poll saw a processing slot ({len(snaps)} polls)"
        live = [v for x in busy for v in x.slots if v.is_processing]
        v = max(live, key=lambda v: v.n_decoded)
        assert v.n_decoded > 0, "next_token[0].n_decoded never > 0 while processing"
        assert v.n_prompt_tokens > 0 and v.n_prompt_tokens_processed > 0, (
            f"n_prompt_tokens={v.n_prompt_tokens} n_prompt_tokens_processed={v.n_prompt_tokens_processed}"
        )
        assert v.ctx_used > 0 and v.ctx_frac > 0, f"ctx_used={v.ctx_used}"
        assert v.n_remain >= 0, f"next_token[0].n_remain={v.n_remain}"
        assert v.id_task >= 0, f"id_task={v.id_task}"
        # llamastat calls a slot "gen" only once n_prompt_tokens_processed >= n_prompt_tokens; llama-server's
        # n_prompt_tokens is the slot's whole token list (prompt + generated so far), so it can stay "prompt".
        phases = sorted({x.phase for x in live})
        return (
            f"slot {v.id}: task {v.id_task}, prompt {v.n_prompt_tokens_processed}/{v.n_prompt_tokens}, "
            f"decoded {v.n_decoded}, remain {v.n_remain}, ctx {v.ctx_used}/{v.n_ctx}; phases shown {phases}"
        )

    c.check("slots during load: phase, tokens, context", slots_live)

    def concurrency():
        peak = max(s.running for s in snaps)
        assert peak == 2, f"peak running {peak} (2 requests on 2 slots)"
        assert last.running == 0, f"running {last.running} after the requests finished"
        return f"peak running {peak}"

    c.check("running / peak concurrency", concurrency)

    def rates():
        s = last
        assert s.gen_tokens_session >= N_PREDICT, (
            f"gen_tokens_session {s.gen_tokens_session} (2x{N_PREDICT} generated)"
        )
        assert s.prompt_tokens_session > 0, f"prompt_tokens_session {s.prompt_tokens_session}"
        assert s.peak_gen_rate > 0, f"peak_gen_rate {s.peak_gen_rate}"
        slot_rates = [v.gen_rate for x in busy for v in x.slots]
        assert max(slot_rates, default=0) > 0, "per-slot gen_rate never > 0"
        return (
            f"gen {s.gen_tokens_session} tok, prompt {s.prompt_tokens_session} tok, "
            f"peak {s.peak_gen_rate:.1f} t/s, "
            f"slot peak {max(slot_rates):.1f} t/s"
        )

    c.check("client-side throughput (diffs of /slots counters)", rates)

    def completed():
        assert last.tasks_completed >= 2, f"tasks_completed {last.tasks_completed}"
        return f"tasks_completed {last.tasks_completed}"

    c.check("tasks completed", completed)

    def metrics():
        s = last
        assert s.metrics_available, "/metrics not parsed (not 200, or not Prometheus text)"
        vals = {
            k: getattr(s, k)
            for k in (
                "m_prompt_tokens_total",
                "m_tokens_predicted_total",
                "m_prompt_tps",
                "m_predicted_tps",
                "m_requests_processing",
                "m_requests_deferred",
                "m_n_tokens_max",
                "m_busy_slots_per_decode",
            )
        }
        # llamastat looks up "llamacpp:n_tokens_max", but llama-server types it a counter and
        # prometheus_client names a counter's sample <name>_total, so that one is None with any server:
        # not counted here.
        missing = [k for k, v in vals.items() if v is None and k != "m_n_tokens_max"]
        assert not missing, f"/metrics lacks llamacpp:{', llamacpp:'.join(m[2:] for m in missing)}"
        zero = [k for k in ("m_prompt_tokens_total", "m_tokens_predicted_total") if not vals[k]]
        assert not zero, f"zero after load: {zero}"
        # the two rates are per /metrics call (llama-server resets that bucket on each call):
        # non-zero during load
        for k in ("m_predicted_tps", "m_prompt_tps"):
            seen = [getattr(x, k) for x in snaps if getattr(x, k)]
            assert seen, f"{k[2:]} zero in every poll"
            vals[k] = max(seen)
        busy_proc = [x.m_requests_processing for x in busy if x.m_requests_processing is not None]
        assert busy_proc and max(busy_proc) >= 1, f"llamacpp:requests_processing during load {busy_proc[:5]}"
        return ", ".join(f"{k[2:]}={v}" for k, v in vals.items())

    c.check("server /metrics panel", metrics)

    def first_poll():
        assert first.ok and first.slots, f"first poll ok={first.ok} slots={len(first.slots)}"
        assert all(v.phase == "idle" for v in first.slots), [v.phase for v in first.slots]
        return f"{len(first.slots)} idle slots"

    c.check("idle slots before load", first_poll)


def cli(c: Checks, url):
    def once():
        exe = os.path.join(os.path.dirname(sys.executable), "llamastat")
        p = subprocess.run(
            [exe, "-u", url, "--once", "--json", "--no-host"], capture_output=True, text=True, timeout=60
        )
        assert p.returncode == 0, f"exit {p.returncode}: {p.stderr[-300:]}"
        d = json.loads(p.stdout)
        assert d["ok"] and d["health"] == "ok" and d["total_slots"] == 2 and len(d["slots"]) == 2, short(d)
        assert d["metrics_available"], "metrics_available false"
        return f"ok, {len(d['slots'])} slots, model {d['model_alias']}"

    c.check("llamastat --once --json", once)


if __name__ == "__main__":
    sys.exit(main())
