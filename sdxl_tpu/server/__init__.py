"""Serving: the server core that the Gradio app and the HTTP back end share (core.py), its
settings (settings.py), the page's styles and form (styles.py, form.py), the batcher that feeds
the pipeline (batcher.py), the back end (backend.py) and a front end's client of it (remote.py),
the request guard in front of every route (guard.py), metrics (metrics.py) and the page's parts
(page.py)."""
