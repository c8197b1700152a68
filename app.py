"""SDXL playground: a Gradio page that fills a four-image gallery from one compiled JAX pipeline.

    python app.py                      # SDXL base 1.0 (downloaded on first run)
    python app.py --model tiny         # offline, the built-in tiny checkpoint
    python app.py --backend URL        # no model here: back ends (python -m sdxl_tpu serve) make the images

The Space's entry point and nothing else: the form's fields are sdxl_tpu/request/fields.py's, the page
is sdxl_tpu/page/page_layout.py (what is on it) and page_events.py (what it does), the process
sdxl_tpu/page/playground.py (the routes, the queue, the drain on SIGTERM).
"""

from __future__ import annotations

import sys

from sdxl_tpu.page.playground import build_app, build_demo, main

__all__ = ["build_app", "build_demo", "main"]

if __name__ == "__main__":
    sys.exit(main())
