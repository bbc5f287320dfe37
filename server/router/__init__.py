"""Router mode: many models behind one address, one child `llamba-server` process per loaded model.

`llamba-server` without `-m` runs `server/router/main.py` instead of a model server. The router holds no
engine: it keeps a catalogue of models (`catalogue.py`), starts and stops child processes on private
ports (`child.py`), decides which model runs and which is given up (`pool.py`), forwards each request to
its model's child over HTTP (`forward.py`, over `proxy.py`), remembers which child owns a resumable
conversation (`conversations.py`) and tells `/models/sse` listeners what happens (`events.py`). The routes
it serves as the cluster does are the front door's (`front_door.py`); its own are in `app.py`.
"""
