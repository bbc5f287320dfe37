"""A sequence's memory, as llama.cpp separates its kinds: the KV cache of attention layers, the recurrent
state of linear-attention (Gated DeltaNet) layers, and a hybrid of the two, behind one interface
(base.py) that the slots, the scheduler, the prompt cache and slot files speak."""
