"""Router mode: many models behind one address, one child `llamba-server` process per loaded model.

`llamba-server` without `-m` runs `server/router/main.py` instead of a model server. The router holds no
engine: it keeps a catalogue of models (`catalogue.py`), starts and stops child processes on private
ports (`child.py`), decides which model runs and which is given up (`pool.py`) and carries that out
(`lifecycle.py`), forwards each request to its model's child over HTTP (`proxy.py`), remembers which
child owns a resumable conversation (`conversations.py`) and tells `/models/sse` listeners what happens
(`events.py`). Its routes are in `app.py`.
"""
