"""The page's Extras tab without a browser (page/page_extras.py): its upscale is the
/sdapi/v1/extra-single-image route's (the same file, byte for byte), its menu the server's upscalers
by A1111's names, and what it cannot do is a line naming what is wrong. No model is loaded: Lanczos
runs on the CPU, and a model upscaler's name is followed to the engine. The browser's side: test_app.py."""

from __future__ import annotations

import base64
import dataclasses
import io
from pathlib import Path

import pytest
from PIL import Image
from starlette.applications import Starlette
from starlette.testclient import TestClient

from images import encoded, picture
from sdxl_tpu.page.page_extras import NO_IMAGE, extras_answer, extras_menu
from sdxl_tpu.request.load import LoadOptions
from sdxl_tpu.routes.extras import extras_routes
from sdxl_tpu.server.core import Server
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.server.settings import Settings
from sdxl_tpu.server.uploads import Uploads

MODEL = "R-ESRGAN 4x+"


@pytest.fixture
def server(tmp_path, monkeypatch):
    """A server that loads nothing, its uploads a folder of this test's, offering one (fake) model."""
    server = Server(Settings(load=LoadOptions(model="tiny", sizes=((64, 64),))), images=ImageStore(tmp_path / "out"))
    server.uploads = Uploads(set(), lambda path: server.images.holds([path]))  # (as the playground makes them)
    monkeypatch.setattr(server.warmup, "offer", dataclasses.replace(server.offer, upscalers=(MODEL,)))
    return server


def uploaded(server: Server, folder: Path, data: bytes, name: str = "upload.png") -> dict:
    """`data` as the page's upload: written where Gradio's upload route would, its file object."""
    path = folder / name
    path.write_bytes(data)
    assert server.uploads is not None
    server.uploads.uploaded.add(str(path))
    return {"path": str(path), "meta": {"_type": "gradio.FileData"}}


def test_lanczos_by_2_is_the_api_routes_file(server, tmp_path):
    image = encoded(picture(80, 56), "PNG")
    path, note = extras_answer(server, uploaded(server, tmp_path, image), "Lanczos", 2)
    answer = TestClient(Starlette(routes=extras_routes(server))).post(
        "/sdapi/v1/extra-single-image", json={"image": base64.b64encode(image).decode(), "upscaler_1": "Lanczos",
                                              "upscaling_resize": 2})
    assert answer.status_code == 200, answer.text
    assert Path(path).read_bytes() == base64.b64decode(answer.json()["image"])
    assert Image.open(path).size == (160, 112) and server.images.holds([path])  # (served by the page)
    assert note == "**160 × 112** (from 80 × 56) · Postprocess upscale by: 2, Postprocess upscaler: Lanczos"
    assert answer.json()["html_info"] == "<p>Postprocess upscale by: 2, Postprocess upscaler: Lanczos</p>"
    # One of the server's images (a result sent with 📐) is taken as an upload is.
    again, note = extras_answer(server, {"path": path}, "Lanczos", 1.5)
    assert Image.open(again).size == (240, 168) and note.startswith("**240 × 168** (from 160 × 112)")


def test_the_menu_is_the_servers_upscalers_and_a_model_runs_through_the_engine(server, tmp_path, monkeypatch):
    assert extras_menu(server).constructor_args["choices"] == ["Lanczos", MODEL]
    calls = []

    def upscale(image, upscaler, scale):  # (the engine's: a model on the device, under the pipeline's lock)
        calls.append((image.size, upscaler, scale))
        return image.resize((image.width * 4, image.height * 4))

    monkeypatch.setattr(server.engine, "upscale", upscale)
    path, note = extras_answer(server, uploaded(server, tmp_path, encoded(picture(40, 32), "JPEG")), MODEL, 4)
    assert calls == [((40, 32), MODEL, 4.0)] and Image.open(path).size == (160, 128)
    assert note.endswith(f"Postprocess upscale by: 4, Postprocess upscaler: {MODEL}")


def test_what_cannot_be_upscaled_is_said_naming_what_is_wrong(server, tmp_path):
    good = uploaded(server, tmp_path, encoded(picture(64, 48), "PNG"))
    big = io.BytesIO()
    Image.new("L", (4100, 4100)).save(big, "PNG")
    cases = [((None, "Lanczos", 2), NO_IMAGE),
             ((uploaded(server, tmp_path, b"<html>not an image</html>", "page.png"), "Lanczos", 2),
              "Image is not a PNG, JPEG or WebP image."),
             ((uploaded(server, tmp_path, b"", "empty.png"), "Lanczos", 2), "Image is empty."),
             ((uploaded(server, tmp_path, big.getvalue(), "big.png"), "Lanczos", 2),
              "Image is 4100x4100 pixels: it has more than 16 megapixels."),
             ((uploaded(server, tmp_path, encoded(picture(2048, 1100), "PNG"), "wide.png"), "Lanczos", 4),
              "Upscaling 2048x1100 by 4 would make 36,044,800 pixels; this server makes at most 16,777,216"),
             ((good, "Lanczos", 4.5), "Resize must be a number between 1 and 4."),
             ((good, "Lanczos", 0.5), "Resize must be a number between 1 and 4."),
             ((good, "Lanczos", "2"), "Resize must be a number between 1 and 4, got text."),
             ((good, "Lanczos", None), "Resize must be a number between 1 and 4, got null."),
             ((good, "4x-UltraSharp", 2), "Upscaler '4x-UltraSharp' is not available; choose one of: None, Lanczos, "
                                          f"{MODEL}."),
             ((good, ["Lanczos"], 2), "Upscaler"),
             (({"path": "/etc/passwd"}, "Lanczos", 2), "Image must be a file uploaded to this page"),
             (("/etc/passwd", "Lanczos", 2), "Image must be a file uploaded to this page")]
    for args, message in cases:
        shown, note = extras_answer(server, *args)
        assert shown == {"__type__": "update"} and note.startswith(f"⚠️ {message}"), (args, note)  # (the last kept)
    # A model the server cannot run (a front end's, or one that fails) is said, not raised.
    shown, note = extras_answer(server, good, MODEL, 2)
    assert note == f"⚠️ No upscaler {MODEL!r} here.", note


def test_the_upscale_keeps_the_sources_parameters_and_says_itself(server, tmp_path):
    """As A1111's Extras: the PNG keeps the generation parameters the source carried (PNG text
    chunk or JPEG's EXIF UserComment, as A1111 writes them), so PNG Info and sd-parsers still read
    what made it, and says the upscale in a "postprocessing" chunk; a source without them, or with
    text that cannot be written back, gives a PNG with the upscale's line alone."""
    from PIL.PngImagePlugin import PngInfo

    from reference import read_with_third_parties
    from sdxl_tpu.a1111.images import encode, read_parameters

    made = ("a lighthouse\nNegative prompt: fog\nSteps: 3, Sampler: Euler, CFG scale: 5, Seed: 7, Size: 40x32, "
            "Model: tiny")
    sources = {"png": encode(picture(40, 32), made, "png"), "jpeg": encode(picture(40, 32), made + " ✓", "jpeg")}
    for name, data in sources.items():
        path, _ = extras_answer(server, uploaded(server, tmp_path, data, f"{name}.img"), "Lanczos", 2)
        upscaled = Image.open(path)
        kept = made + (" ✓" if name == "jpeg" else "")
        assert read_parameters(upscaled) == kept, name
        assert upscaled.info["postprocessing"] == "Postprocess upscale by: 2, Postprocess upscaler: Lanczos"
        read = read_with_third_parties(Path(path).read_bytes(), tmp_path)
        assert (read["prompt"], read["negative"], read["size"]) == ("a lighthouse", "fog", "40x32"), (name, read)
    # None carried, a damaged UserComment (a lone UTF-16 surrogate, cut short), NULs in a chunk: the
    # upscale's line, nothing that is not text (the file still answers).
    forged = b"UNICODE\0" + b"\xd8\x00\xdc"
    with_nul = PngInfo()
    with_nul.add_text("parameters", "a cat\0<script>")
    for data, kept in ((encoded(picture(40, 32), "PNG"), None),
                       (encoded(picture(40, 32), "JPEG", exif=_exif_comment(forged)), None),
                       (encoded(picture(40, 32), "PNG", pnginfo=with_nul), "a cat<script>")):
        path, note = extras_answer(server, uploaded(server, tmp_path, data, "plain.png"), "Lanczos", 1.5)
        assert not note.startswith("⚠️"), note
        assert read_parameters(Image.open(path)) == kept
        assert Image.open(path).info["postprocessing"].startswith("Postprocess upscale by: 1.5")


def _exif_comment(payload: bytes) -> bytes:
    """An EXIF block whose UserComment is `payload` as is (a forged one)."""
    exif = Image.Exif()
    exif.get_ifd(0x8769)[0x9286] = payload
    return exif.tobytes()
