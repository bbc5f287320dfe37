"""Scale-out on Ray (`llamba-server --cluster ray`): the router's model servers as Ray-placed replicas.

Nothing here imports Ray at module level except `server/cluster/main.py`, which `server/__main__.py`
imports only with `--cluster`: a plain server or router never loads Ray. `prefixes.py` (the prompt-cache
summary's hashes) is shared with the model server's `/slots/prefixes` route.
"""
