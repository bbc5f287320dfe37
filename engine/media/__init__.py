"""Multimodal projectors (llama.cpp's mtmd, `--mmproj`): an image's bytes made into embeddings a text model
reads in place of tokens.

`mmproj.py` reads a projector GGUF (`clip.*` keys) and refuses what is not built; `preprocess.py` decodes
an image (Pillow) and resizes and normalises it as llama.cpp's mtmd-image.cpp does; `vision.py` runs the
SigLIP encoder and Gemma 3's pooling projector on the backend. One image at a time, no shared state.
`chunks.py` places the embeddings in a prompt (marker ids) and a step's batch. Nothing is imported here:
engine/batch.py imports chunks.py, and the projector's modules import the models.
"""
