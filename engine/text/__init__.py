"""The text side of generation: tokenizers, chat templates, and the per-token text-stream state
(stop strings, reasoning blocks) that a Sequence drives."""
