"""numba-cuda kernels: the CUDA twin of engine/cpu, same operations, same argument order.

Importing this package imports `numba.cuda` (numba-cuda when installed, else Numba's built-in target,
whose simulator runs everything on the CPU when NUMBA_ENABLE_CUDASIM=1 is set before numba loads).
Like engine/cpu it imports nothing from the rest of engine but the quant layouts (`engine/cuda/kv_cells.py`
keeps its own copy of Q8_0's block size).

Every kernel accepts device arrays (no copies) or numpy arrays (uploaded, and written back when they
are outputs), so code written against the CPU backend runs unchanged, just with transfers; a model that
allocates through the backend's array hooks keeps activations and the KV cache on the device.
"""
