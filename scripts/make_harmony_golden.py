"""llama.cpp on the synthetic gpt-oss GGUF with gpt-oss's tokenizer (tests/synthetic_harmony_gguf.py) ->
tests/golden/harmony.json.

Run it with Llamba's venv; it writes the GGUF (with llama.cpp's harmony template from the reference data)
into a scratch folder and has llama.cpp load it in a Python that has llama-cpp-python (the worker half,
`--worker`, imports only numpy and llama_cpp; CPU, 2 threads, flash attention off, YaRN's factors from
the file), which records:

- the vocabulary as llama.cpp reads it: BOS, EOS, EOT, the end-of-generation tokens, whether it adds BOS
  (what llama.cpp's load prints for the real gpt-oss-20b: 199998, 200002, 199999, {199999, 200002,
  200012}, no BOS);
- its tokens for a harmony prompt (special tokens parsed, no BOS);
- the 5 most likely next tokens after it and their log-probabilities (the whole 201,088-wide row
  would be a megabyte).

    .venv/bin/python scripts/make_harmony_golden.py --llama-python /work/llcpp-native/bin/python

The file's sha256 is recorded too: tests/test_moe_server.py serves the rebuilt file and checks it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "tests" / "golden" / "harmony.json"
# A harmony conversation up to the generation prompt: letters, digits, punctuation, accents and a
# non-Latin script for the gpt-4o pre-tokenizer, the harmony markers as special tokens.
PROMPT = (
    "<|start|>system<|message|>Reasoning: low\n\n# Valid channels: analysis, commentary, final.<|end|>"
    "<|start|>user<|message|>Weather in Paris, 21°C? Ça va — 1234 ok; 東京は?<|end|><|start|>assistant"
)
N_TOP = 5


def worker(path: Path) -> None:
    """In llama-cpp-python's venv: the vocabulary's special ids, PROMPT's tokens and the top next tokens."""
    import llama_cpp

    llm = llama_cpp.Llama(
        str(path),
        n_ctx=256,
        n_threads=2,
        n_threads_batch=2,
        flash_attn=False,
        yarn_attn_factor=-1.0,
        yarn_beta_fast=-1.0,
        yarn_beta_slow=-1.0,
        verbose=False,
    )
    vocab = llm._model.vocab
    n_vocab = llama_cpp.llama_vocab_n_tokens(vocab)
    tokens = llm.tokenize(PROMPT.encode(), add_bos=False, special=True)
    llm.eval(tokens)
    row = llama_cpp.llama_get_logits_ith(llm._ctx.ctx, -1)
    logits = np.ctypeslib.as_array(row, shape=(n_vocab,)).astype(np.float64)
    logprobs = logits - logits.max()
    logprobs -= np.log(np.exp(logprobs).sum())
    top = np.argsort(-logprobs, kind="stable")[:N_TOP]
    out = {
        "n_vocab": n_vocab,
        "bos": llama_cpp.llama_vocab_bos(vocab),
        "eos": llama_cpp.llama_vocab_eos(vocab),
        "eot": llama_cpp.llama_vocab_eot(vocab),
        "eog": [t for t in range(n_vocab) if llama_cpp.llama_vocab_is_eog(vocab, t)],
        "add_bos": bool(llama_cpp.llama_vocab_get_add_bos(vocab)),
        "tokens": tokens,
        "top_logprobs": [[int(t), float(logprobs[t])] for t in top],
        "version": llama_cpp.__version__,
    }
    print(json.dumps(out))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--llama-python", help="a Python with llama-cpp-python")
    parser.add_argument("--worker", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("-o", "--output", type=Path, default=OUT)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker)
        return
    sys.path.insert(0, str(ROOT))
    from engine.reference_data import reference_file
    from tests.synthetic_harmony_gguf import TEMPLATE, write_harmony_gguf

    with tempfile.TemporaryDirectory() as tmp:
        path = write_harmony_gguf(Path(tmp) / "gpt-oss.gguf", reference_file(TEMPLATE).read_text())
        run = [args.llama_python, __file__, "--worker", str(path)]
        found = json.loads(subprocess.run(run, check=True, capture_output=True, text=True).stdout)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    version = found.pop("version")
    source = f"llama.cpp 0c1e570 (llama-cpp-python {version}), CPU, 2 threads, flash attention off"
    golden = {"source": source, "sha256": digest, "prompt": PROMPT, "llama_cpp": found}
    args.output.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
