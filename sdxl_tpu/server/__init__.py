"""Serving, whatever the transport: the server core that the page, the back end and the tools' APIs share
(core.py) and its parts (the engine that makes the images: engine.py, local_engine.py, remote_engine.py
with remote.py's client of the back ends; the batcher that feeds the pipeline: batcher.py; the
warm-up: warmup.py; image files and uploads: files.py, uploads.py; the drain: drain.py; metrics:
metrics.py), its settings and what it offers (settings.py, offer.py), and the form's values checked into
a request (form.py)."""
