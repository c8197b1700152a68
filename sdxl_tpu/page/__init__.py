"""The playground's page: what is on it (page_layout.py), what it does (page_events.py), what a run shows
(page_run.py, page.py, history.py), its menus, its own CSS and script (web/), and the process that serves
it (playground.py, which app.py runs)."""
