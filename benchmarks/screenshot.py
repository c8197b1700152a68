"""The README's pictures of the page: the playground after a run, from a real browser session.

    python benchmarks/screenshot.py                # writes benchmarks/screenshots/*.png

Starts `python app.py --model tiny` (random weights: the images are noise, everything else is
real) on 127.0.0.1, opens it in Debian's Chromium (Playwright), types a prompt, generates with the
Anime style and takes a desktop (1280x800) and a phone (390x844: the results, where Generate
scrolls) screenshot once the four images are in; then a run from an image with a painted mask (the
"Start from an image" panel open; 1280x1500, to show the panel, its inpaint editor and the images
together). Needs what the tests need (requirements-dev.txt and `apt-get install chromium`; and
fonts-noto-color-emoji for the buttons' emoji).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "helpers"))

from served_app import generate_in_page, paint_a_mask, playground_page, start_app  # noqa: E402


def picture(width: int, height: int):
    """A starting image to show: a sunset's colours and a disc (any image would do)."""
    import numpy as np
    from PIL import Image

    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    disc = (x - 0.5) ** 2 + (y - 0.35) ** 2 < 0.02
    rgb = np.stack([200 + 55 * disc, 80 + 120 * y + 150 * disc, 140 - 100 * y], -1)
    return Image.fromarray(np.clip(rgb, 0, 255).astype(np.uint8))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "screenshots"))
    parser.add_argument("--prompt", default="a lighthouse on a cliff during a storm, dramatic waves")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="sdxl-screenshot-") as tmp:
        app = start_app(Path(tmp), Path(tmp) / "jax-cache", extra_args=("--sizes", "256x256,384x256"))
        server = next(app)
        try:
            for (width, height), name in (((1280, 800), "playground.png"), ((390, 844), "playground-phone.png")):
                with playground_page(server["url"], "Ready (", viewport=(width, height)) as page:
                    generate_in_page(page, args.prompt, "blurry, low quality")
                    page.get_by_text("More options").click()
                    page.locator("#style input").click()
                    page.get_by_role("option", name="Anime", exact=True).click()
                    generate_in_page(page, None)
                    page.get_by_text("More options").click()  # closed again: the picture shows the main form
                    if width < 768:  # a phone: the results, where a run takes the page ("More options" moved it)
                        page.evaluate("document.querySelector('#progress').scrollIntoView({block: 'start'})")
                    else:  # (opening "More options", below the fold, scrolled the page)
                        page.evaluate("window.scrollTo(0, 0)")
                    page.wait_for_timeout(500)
                    page.screenshot(path=str(out / name))
                    print(out / name)
            with playground_page(server["url"], "Ready (", viewport=(1280, 1500)) as page:
                start = Path(tmp) / "start.png"
                picture(384, 256).save(start)
                page.get_by_text("Start from an image").click()
                page.locator("#image input[type=file]").set_input_files(str(start))
                page.locator("#strength input").first.fill("0.6")
                page.locator("#strength input").first.press("Enter")
                paint_a_mask(page, at=(0.45, 0.3))  # (inpainting: a stroke over the disc becomes the mask)
                generate_in_page(page, args.prompt, "blurry, low quality")
                page.evaluate("window.scrollTo(0, 0)")
                page.wait_for_timeout(500)
                page.screenshot(path=str(out / "playground-img2img.png"))
                print(out / "playground-img2img.png")
        finally:
            app.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
