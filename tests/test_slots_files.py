"""Slot files: save/restore/erase of a slot's cache (--slot-save-path), the format and the HTTP routes."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import numpy as np
import pytest

from engine.backend import cpu_backend
from engine.lora import LoraAdapter, LoraContext, adapter_digest
from engine.memory.kv import KVCache
from engine.memory.slot_files import (
    ModelIdentity,
    SlotFileError,
    SlotState,
    check_filename,
    read_slot,
    slot_action,
    slot_path,
    write_slot,
)
from engine.slots import Slot
from tests.server_process import LIVENESS_S, ServerProcess, wait_until

TINY_CACHE = KVCache(2, 3, 16, 4, 8, cpu_backend())
IDENTITY = ModelIdentity.of(TINY_CACHE, n_vocab=100, model_name="tiny.gguf")
PROMPT = "The capital of France is Paris. The capital of Italy is"


def small_state(n: int = 5) -> SlotState:
    rng = np.random.default_rng(0)
    k = rng.standard_normal((2, 4, n, 8)).astype(np.float16)
    v = rng.standard_normal((2, 4, n, 8)).astype(np.float16)
    return SlotState(list(range(1, n + 1)), k, v)


# -- the file format ---------------------------------------------------------------------------------
def test_round_trip_is_exact(tmp_path: Path) -> None:
    state = small_state()
    n_written = write_slot(tmp_path / "s.bin", IDENTITY, state)
    back, n_read = read_slot(tmp_path / "s.bin", IDENTITY, n_ctx=16)
    assert n_read == n_written == (tmp_path / "s.bin").stat().st_size
    assert back.tokens == state.tokens
    assert np.array_equal(back.k, state.k) and np.array_equal(back.v, state.v)


@pytest.mark.parametrize("name", ["../x", "a/b", "..", ".", "", "a\\b", "x..y", None, 3])
def test_names_that_could_leave_the_directory_are_refused(name: object) -> None:
    with pytest.raises(SlotFileError):
        check_filename(name)


def test_plain_names_pass() -> None:
    assert check_filename("slot-0.bin") == "slot-0.bin"


def test_links_out_of_the_directory_are_refused(tmp_path: Path) -> None:
    slots, outside = tmp_path / "slots", tmp_path / "outside"
    slots.mkdir()
    outside.mkdir()
    (slots / "out.bin").symlink_to(outside / "victim.bin")
    (slots / "in.bin").symlink_to(slots / "real.bin")
    with pytest.raises(SlotFileError, match="leads out of the slot directory"):
        slot_path(slots, "out.bin")
    assert slot_path(slots, "in.bin") == slots / "in.bin"  # a link that stays inside is a file like any


def test_a_link_at_the_temporary_name_is_not_followed(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    (tmp_path / "s.bin.tmp").symlink_to(victim)
    with pytest.raises(SlotFileError, match="cannot write"):
        write_slot(tmp_path / "s.bin", IDENTITY, small_state())
    assert victim.read_bytes() == b"precious"


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda b: b[:-1], "truncated"),
        (lambda b: b[:10], "truncated"),
        (lambda b: b"NOTASLOT" + b[8:], "not a slot file"),
        (lambda b: b + b"\0", "truncated or corrupt"),
    ],
)
def test_damaged_files_are_refused(tmp_path: Path, damage, message: str) -> None:  # type: ignore[no-untyped-def]
    write_slot(tmp_path / "s.bin", IDENTITY, small_state())
    (tmp_path / "bad.bin").write_bytes(damage((tmp_path / "s.bin").read_bytes()))
    with pytest.raises(SlotFileError, match=message):
        read_slot(tmp_path / "bad.bin", IDENTITY, n_ctx=16)


def test_foreign_model_and_oversized_files_are_refused(tmp_path: Path) -> None:
    write_slot(tmp_path / "s.bin", IDENTITY, small_state(5))
    other = ModelIdentity.of(TINY_CACHE, n_vocab=100, model_name="other.gguf")
    with pytest.raises(SlotFileError, match="different model"):
        read_slot(tmp_path / "s.bin", other, n_ctx=16)
    with pytest.raises(SlotFileError, match="do not fit"):
        read_slot(tmp_path / "s.bin", IDENTITY, n_ctx=4)
    with pytest.raises(SlotFileError, match="not found"):
        read_slot(tmp_path / "missing.bin", IDENTITY, n_ctx=16)


def test_a_version_3_file_reads_as_the_base_models(tmp_path: Path) -> None:
    """Files saved before the LoRA set was recorded: the same bytes without it, under version 3."""
    write_slot(tmp_path / "s.bin", IDENTITY, small_state())
    data = (tmp_path / "s.bin").read_bytes()
    header = 56  # engine/memory/slot_files.py's _HEADER, then 8 bytes saying no adapters
    old = data[:8] + (3).to_bytes(4, "little") + data[12:header] + data[header + 8 :]
    (tmp_path / "v3.bin").write_bytes(old)
    back, _ = read_slot(tmp_path / "v3.bin", IDENTITY, n_ctx=16)
    assert back.tokens == small_state().tokens and back.adapters == () and back.adapters_from == 0


# -- the LoRA set a slot's cells were computed under ----------------------------------------------------
def adapters(*names: str, first_id: int = 0) -> LoraContext:
    served = {first_id + i: LoraAdapter(Path("/adapters") / name, 8.0, {}) for i, name in enumerate(names)}
    return LoraContext(cpu_backend(), served)


def test_the_adapter_set_survives_a_save_and_a_restore_on_another_server(tmp_path: Path) -> None:
    """Saved under ids 0 and 1 (an aLoRA from position 3), restored where the same files have ids 5
    and 4: the slot carries the new ids, so prefix reuse compares the right set."""
    kv = KVCache(2, 3, 16, 4, 8, cpu_backend())
    identity = ModelIdentity.of(kv, n_vocab=100, model_name="tiny.gguf")
    slot = Slot(0, tokens=[1, 2, 3, 4, 5], lora=((0, 1.0), (1, 0.5)), lora_from=3)
    kv.write_cells(0, small_state().k, small_state().v)
    slot_action(slot, kv, identity, "save", tmp_path / "s.bin", adapters("a.gguf", "b.gguf"))
    state, _ = read_slot(tmp_path / "s.bin", identity, n_ctx=16)
    assert state.adapters == (
        (adapter_digest(adapters("a.gguf").adapters[0]), 1.0),
        (state.adapters[1][0], 0.5),
    )
    other = Slot(1)
    slot_action(other, kv, identity, "restore", tmp_path / "s.bin", adapters("b.gguf", "a.gguf", first_id=4))
    assert other.lora == ((4, 0.5), (5, 1.0)) and other.lora_from == 3 and other.tokens == slot.tokens


def test_a_file_saved_under_an_adapter_not_loaded_is_refused_and_the_slot_kept(tmp_path: Path) -> None:
    kv = KVCache(2, 3, 16, 4, 8, cpu_backend())
    identity = ModelIdentity.of(kv, n_vocab=100, model_name="tiny.gguf")
    kv.write_cells(0, small_state().k, small_state().v)
    slot_action(Slot(0, tokens=[1, 2, 3, 4, 5], lora=((0, 1.0),)), kv, identity, "save", tmp_path / "s.bin",
                adapters("a.gguf"))  # fmt: skip
    kept = Slot(1, tokens=[9], lora=((0, 1.0),))
    for served in (adapters("b.gguf"), None):
        with pytest.raises(SlotFileError, match="saved under a LoRA adapter this server has not loaded"):
            slot_action(kept, kv, identity, "restore", tmp_path / "s.bin", served)
    assert kept.tokens == [9] and kept.lora == ((0, 1.0),)
    base = Slot(0, tokens=[1, 2, 3, 4, 5])  # a base slot's file restores without any adapter
    slot_action(base, kv, identity, "save", tmp_path / "base.bin", None)
    slot_action(kept, kv, identity, "restore", tmp_path / "base.bin", adapters("a.gguf"))
    assert kept.tokens == [1, 2, 3, 4, 5] and kept.lora == () and kept.lora_from == 0


def test_a_slot_computed_under_an_unloaded_adapter_is_not_saved(tmp_path: Path) -> None:
    kv = KVCache(2, 3, 16, 4, 8, cpu_backend())
    identity = ModelIdentity.of(kv, n_vocab=100, model_name="tiny.gguf")
    kv.write_cells(0, small_state().k, small_state().v)
    served = adapters("a.gguf")
    served.retire(0)  # held by no request: gone
    slot = Slot(0, tokens=[1, 2, 3, 4, 5], lora=((0, 1.0),))
    with pytest.raises(SlotFileError, match="unloaded"):
        slot_action(slot, kv, identity, "save", tmp_path / "s.bin", served)
    assert not (tmp_path / "s.bin").exists()


# -- the cache's cells ---------------------------------------------------------------------------------
def test_kv_cells_round_trip_touches_only_their_sequence() -> None:
    kv = KVCache(2, 3, 8, 2, 4, cpu_backend())  # tests/test_cuda_backend.py: the same on the device
    k = np.random.default_rng(1).standard_normal((2, 2, 5, 4)).astype(np.float16)
    kv.write_cells(1, k, 2 * k)
    got_k, got_v = kv.read_cells(1, 5)
    assert np.array_equal(got_k, k) and np.array_equal(got_v, 2 * k)
    assert list(kv.lengths) == [0, 5, 0]
    assert not kv.k[:, [0, 2]].any() and not kv.k[:, 1, :, 5:].any()


# -- the routes on a real server ---------------------------------------------------------------------
@pytest.fixture(scope="module")
def save_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("slots")


@pytest.fixture(scope="module")
def slot_server(save_dir: Path):  # type: ignore[no-untyped-def]
    proc = ServerProcess("-m", "smollm2", "-np", "2", "-c", "1024", "--slot-save-path", str(save_dir))
    yield proc.wait_healthy()
    proc.stop()


def complete(client: httpx.Client, prompt: str, **extra: object) -> dict:
    body = {"prompt": prompt, "n_predict": 8, "temperature": 0, "id_slot": 0, **extra}
    resp = client.post("/completion", json=body)
    assert resp.status_code == 200, resp.text
    return resp.json()


def action(client: httpx.Client, action: str, filename: object = None, slot: int = 0) -> httpx.Response:
    body = {} if filename is None else {"filename": filename}
    return client.post(f"/slots/{slot}", params={"action": action}, json=body)


def n_cached(client: httpx.Client, slot: int = 0) -> int:
    return next(s["n_cached"] for s in client.get("/slots").json() if s["id"] == slot)


def test_save_erase_restore_round_trip(slot_server, save_dir: Path) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=slot_server.base_url, timeout=120) as client:
        first = complete(client, PROMPT)
        held = n_cached(client)
        saved = action(client, "save", "roundtrip.bin").json()
        assert saved["id_slot"] == 0 and saved["filename"] == "roundtrip.bin"
        assert saved["n_saved"] == held > 0
        assert saved["n_written"] == (save_dir / "roundtrip.bin").stat().st_size
        assert saved["timings"]["save_ms"] >= 0
        assert action(client, "erase").json() == {"id_slot": 0, "n_erased": held}
        assert n_cached(client) == 0
        complete(client, "Something else entirely, to overwrite the cells.")  # the slot's cells change
        restored = action(client, "restore", "roundtrip.bin").json()
        assert restored["n_restored"] == held and restored["n_read"] == saved["n_written"]
        assert restored["timings"]["restore_ms"] >= 0
        again = complete(client, PROMPT)
        assert again["timings"]["prompt_n"] == 1
        assert again["content"] == first["content"]


@pytest.mark.parametrize("name", ["../escape.bin", "sub/dir.bin", "..", "", "a\\b.bin"])
def test_path_traversal_is_400(slot_server, save_dir: Path, name: str) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=slot_server.base_url, timeout=60) as client:
        for act in ("save", "restore"):
            resp = action(client, act, name)
            assert resp.status_code == 400, resp.text
            assert resp.json()["error"]["type"] == "invalid_request_error"
    assert not (save_dir.parent / "escape.bin").exists()


def test_a_link_out_of_the_slot_directory_is_400(slot_server, save_dir: Path, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    (save_dir / "link.bin").symlink_to(tmp_path / "elsewhere.bin")
    with httpx.Client(base_url=slot_server.base_url, timeout=60) as client:
        for act in ("save", "restore"):
            resp = action(client, act, "link.bin")
            assert resp.status_code == 400 and "leads out of the slot directory" in resp.text
    assert not (tmp_path / "elsewhere.bin").exists()


def test_bad_files_are_400_and_leave_the_slot_intact(slot_server, save_dir: Path) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=slot_server.base_url, timeout=120) as client:
        complete(client, PROMPT, id_slot=1)
        assert action(client, "save", "good.bin", slot=1).status_code == 200
        good = (save_dir / "good.bin").read_bytes()
        (save_dir / "truncated.bin").write_bytes(good[: len(good) // 2])
        (save_dir / "garbage.bin").write_bytes(b"\x00garbage" * 100)
        foreign = bytearray(good)
        foreign[24:28] = (12345).to_bytes(4, "little")  # n_vocab of another model
        (save_dir / "foreign.bin").write_bytes(bytes(foreign))
        held = n_cached(client, 1)
        for name, words in [
            ("truncated.bin", "truncated"),
            ("garbage.bin", "not a slot file"),
            ("foreign.bin", "different model"),
            ("missing.bin", "not found"),
        ]:
            resp = action(client, "restore", name, slot=1)
            assert resp.status_code == 400, resp.text
            assert words in resp.json()["error"]["message"]
            assert n_cached(client, 1) == held
        assert complete(client, PROMPT, id_slot=1)["timings"]["prompt_n"] == 1


def test_bad_action_and_slot_are_400(slot_server) -> None:  # type: ignore[no-untyped-def]
    with httpx.Client(base_url=slot_server.base_url, timeout=60) as client:
        assert action(client, "explode", "x.bin").status_code == 400
        assert action(client, "save", "x.bin", slot=7).status_code == 400
        assert client.post("/slots/abc", params={"action": "erase"}).status_code == 400


def test_busy_slot_is_refused(slot_server) -> None:  # type: ignore[no-untyped-def]
    body = {
        "prompt": "Tell me a very long story about dragons.",
        "n_predict": 2000,
        "ignore_eos": True,
        "id_slot": 1,
        "stream": True,
    }
    with httpx.Client(base_url=slot_server.base_url, timeout=120) as client:
        with client.stream("POST", "/completion", json=body) as resp:
            lines = resp.iter_lines()  # kept open: leaving the loop early would close it and cancel
            while not (line := next(lines)).startswith("data: ") or not json.loads(line[6:])["tokens"]:
                pass
            busy = action(client, "save", "busy.bin", slot=1)
            erase = action(client, "erase", slot=1)
        assert busy.status_code == 503, busy.text
        assert "busy" in busy.json()["error"]["message"]
        assert erase.status_code == 503, erase.text
        # A liveness bound, not a speed check: the closed stream's slot is freed.
        wait_until(
            lambda: not any(s["is_processing"] for s in client.get("/slots").json()),
            within_s=LIVENESS_S,
            what="the dropped stream's slot is freed",
        )


def test_without_slot_save_path_actions_are_not_supported(server) -> None:  # type: ignore[no-untyped-def]
    resp = httpx.post(server.base_url + "/slots/0", params={"action": "save"}, json={"filename": "x.bin"})
    assert resp.status_code == 501
    assert resp.json()["error"]["type"] == "not_supported_error"
