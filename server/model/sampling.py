"""The engine's request vocabulary that request bodies are checked against: the sampler fields a body
may set and the sampler chain's names (engine/sampling), and the speculative decoding types
(engine/speculative). Named here so that the request layer (server/chat/) imports no engine module
but engine.api.
"""

from __future__ import annotations

from engine.sampling import NUMBER_FIELDS, parse_samplers
from engine.speculative import SPEC_TYPES

__all__ = ["NUMBER_FIELDS", "SPEC_TYPES", "parse_samplers"]
