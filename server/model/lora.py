"""The server's LoRA adapters (--lora, --lora-scaled): their global scales, as llama-server keeps them.

`GET /lora-adapters` lists them ({id, path, scale, task_name, prompt_prefix}); `POST /lora-adapters` sets
the global scales ([{id, scale}]; an adapter not listed goes to 0, as llama-server's construct_lora_list
does). A request's own `lora` ([{id, scale}]) replaces the global scales for that request (adapters it
does not list run at 0); a request without one runs under the global scales at the time it is built.
Unlike llama-server (which skips them), an unknown id or a scale that is not a number is a 400 naming it.
The weights themselves are loaded with the model (server/model/loading.py, engine/lora.py).
"""

from __future__ import annotations

import math
import threading
from typing import Any

from engine.lora import AdapterSet, adapter_set


class LoraRequestError(ValueError):
    """A `lora` list that names no loaded adapter or carries no number (the route's 400)."""


class LoraScales:
    def __init__(self, adapters: tuple[tuple[str, float], ...]) -> None:
        self.paths = [path for path, _ in adapters]
        self._scales = [float(scale) for _, scale in adapters]
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.paths)

    def listing(self) -> list[dict[str, Any]]:
        """GET /lora-adapters: llama-server's server_task_result_get_lora::to_json."""
        with self._lock:
            scales = list(self._scales)
        return [
            {"id": i, "path": path, "scale": scale, "task_name": "", "prompt_prefix": ""}
            for i, (path, scale) in enumerate(zip(self.paths, scales, strict=True))
        ]

    def parse(self, value: Any, field: str = "lora") -> dict[int, float]:
        """[{id, scale}, ...] -> {id: scale}; LoraRequestError (one line naming what) if it does not fit."""
        if not isinstance(value, list):
            raise LoraRequestError(f"'{field}' must be an array of objects with 'id' and 'scale' fields")
        out: dict[int, float] = {}
        for entry in value:
            if not isinstance(entry, dict):
                raise LoraRequestError(
                    f"'{field}': each entry must be an object with 'id' and 'scale' fields"
                )
            adapter_id, scale = entry.get("id"), entry.get("scale", 0.0)
            if isinstance(adapter_id, bool) or not isinstance(adapter_id, int):
                raise LoraRequestError(f"'{field}': 'id' must be an integer (got {adapter_id!r})")
            if not 0 <= adapter_id < len(self.paths):
                loaded = f"ids 0-{len(self.paths) - 1}" if self.paths else "none is loaded"
                raise LoraRequestError(f"'{field}': unknown LoRA adapter id {adapter_id} ({loaded})")
            if isinstance(scale, bool) or not isinstance(scale, int | float) or not math.isfinite(scale):
                raise LoraRequestError(
                    f"'{field}': the scale of adapter {adapter_id} is not a number ({scale!r})"
                )
            out[adapter_id] = float(scale)
        return out

    def set_global(self, value: Any) -> None:
        """POST /lora-adapters: the listed scales; every adapter not listed goes to 0 (llama-server's)."""
        scales = self.parse(value)
        with self._lock:
            self._scales = [scales.get(i, 0.0) for i in range(len(self.paths))]

    def for_request(self, value: Any) -> AdapterSet:
        """A request's adapter set: its own `lora` (None: not given -> the global scales)."""
        if value is None:
            with self._lock:
                return adapter_set(list(enumerate(self._scales)))
        return adapter_set(list(self.parse(value).items()))
