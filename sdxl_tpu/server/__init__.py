"""Serving: the server core that the Gradio app and the HTTP back end share (core.py) and its parts
(the engine that makes the images: engine.py, local_engine.py, remote_engine.py; the warm-up:
warmup.py; image files: files.py; the drain: drain.py; metrics: metrics.py), its settings and what
it offers (settings.py, offer.py), the page's form and parts (form.py, page.py, page_run.py,
history.py, sampler_menu.py; its own CSS and script: web/), the batcher that
feeds the pipeline (batcher.py), the back end (backend.py) and a front end's client of it
(remote.py), and the request guard in front of every route (guard.py, envelope.py)."""
