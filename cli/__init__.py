"""The command-line tools: llamba-bench, llamba-perplexity, llamba-models, llamba-bench-serve and the CUDA
compile check. Each reaches the engine (or a server over HTTP) through its public surface."""
