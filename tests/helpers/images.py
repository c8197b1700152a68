"""The images the tests make and feed: a picture with structure at every scale and a gradient, a
mask over a block, an image encoded in a format, and the hostile or broken files and masks (over 300
each) sent to every path that takes an image from a client."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
from PIL import Image

from sdxl_tpu.imaging.image_input import MAX_BYTES


def picture(width: int = 64, height: int = 64) -> Image.Image:
    """A starting image with structure at every scale: gradients, a disc, stripes."""
    y, x = np.mgrid[0:height, 0:width] / max(width, height)
    r = 255 * x
    g = 255 * ((x - 0.5) ** 2 + (y - 0.5) ** 2 < 0.1)
    b = 127 + 120 * np.sin(25 * y)
    return Image.fromarray(np.stack([r, g, b], -1).astype(np.uint8))


def block_mask(width: int = 64, height: int = 64) -> Image.Image:
    """White (repaint) over a block aligned to the latents' 8-pixel cells, so diffusers' nearest
    downscale and A1111's bicubic-then-round agree on it."""
    mask = np.zeros((height, width), np.uint8)
    mask[16:48, 8:40] = 255
    return Image.fromarray(mask, "L")


def encoded(image: Image.Image, fmt: str, **kwargs) -> bytes:
    out = io.BytesIO()
    image.save(out, fmt, **kwargs)
    return out.getvalue()


def gradient(width: int = 48, height: int = 32) -> Image.Image:
    y, x = np.mgrid[0:height, 0:width]
    return Image.fromarray(np.stack([x * 5, y * 7, (x + y) * 3], -1).astype(np.uint8))


def png_chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_header_only(width: int, height: int) -> bytes:
    """A PNG whose header claims a size and whose data is a few bytes: a decompression bomb's shape."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return (b"\x89PNG\r\n\x1a\n" + png_chunk(b"IHDR", ihdr) + png_chunk(b"IDAT", zlib.compress(b"\0" * 64))
            + png_chunk(b"IEND", b""))


def hostile_files() -> list[tuple[str, object]]:
    """At least 300 malformed or hostile inputs: wrong types, other formats, polyglots, bombs,
    truncations and corruptions of each format."""
    rng = np.random.default_rng(0)
    cases: list[tuple[str, object]] = [
        ("none", None), ("text", "not bytes"), ("number", 12), ("empty", b""), ("list", [1, 2]),
        ("svg", b'<svg xmlns="http://www.w3.org/2000/svg" onload="alert(1)"><rect width="9" height="9"/></svg>'),
        ("html", b"<!doctype html><script>alert(1)</script>"),
        ("gif", encoded(gradient(), "GIF")), ("bmp", encoded(gradient(), "BMP")), ("tiff", encoded(gradient(), "TIFF")),
        ("ico", encoded(gradient(), "ICO")), ("pdf-like", b"%PDF-1.4\n1 0 obj<<>>endobj"),
        ("zip", b"PK\x03\x04" + bytes(100)), ("elf", b"\x7fELF" + bytes(100)),
        ("png+html", encoded(gradient(), "PNG") + b"<html><script>alert(1)</script></html>"),
        ("html+png", b"<html><script>alert(1)</script>" + encoded(gradient(), "PNG")),
        ("bomb-png", png_header_only(100_000, 100_000)), ("bomb-wide", png_header_only(2**31 - 1, 1)),
        ("tiny", encoded(Image.new("RGB", (4, 4)), "PNG")), ("one-row", encoded(Image.new("RGB", (512, 1)), "PNG")),
        ("zero-size", png_header_only(0, 0)), ("too-many-pixels", png_header_only(4097, 4097)),
        ("oversized", b"\x89PNG\r\n\x1a\n" + bytes(MAX_BYTES)),
    ]
    for fmt in ("PNG", "JPEG", "WEBP"):
        data = encoded(gradient(64, 64), fmt)
        for cut in np.unique(np.linspace(1, len(data) - 1, 40).astype(int)):
            cases.append((f"{fmt}-truncated-{cut}", data[:cut]))
        for k in range(60):
            corrupt = bytearray(data)
            for position in rng.integers(0, len(data), size=1 + k % 8):
                corrupt[position] = int(rng.integers(0, 256))
            cases.append((f"{fmt}-corrupt-{k}", bytes(corrupt)))
    return cases


def hostile_masks() -> list[tuple[str, object, dict]]:
    """Over 300 malformed or hostile masks for a 64x64 image, with the request fields they come
    with: every hostile or broken file of hostile_files, then wrong sizes and modes, huge
    masks, masks that mark nothing, odd arrays and text."""

    def png(image: Image.Image, fmt: str = "PNG") -> bytes:
        out = io.BytesIO()
        image.save(out, fmt)
        return out.getvalue()

    cases = [(name, data, {}) for name, data in hostile_files() if data is not None]
    for w, h in ((1, 1), (63, 64), (64, 63), (65, 64), (32, 32), (128, 128), (64, 8), (8, 64), (4096, 1)):
        cases.append((f"size-{w}x{h}", png(Image.new("L", (w, h), 255)), {}))
    cases += [("huge", png(Image.new("L", (4096, 4096), 255)), {}), ("bomb", png_header_only(50_000, 50_000), {}),
              ("huge-header", png_header_only(4096, 4097), {})]
    white = np.full((64, 64), 255, np.uint8)
    rgba = np.zeros((64, 64, 4), np.uint8)
    rgba[8:24, 8:24, 3] = 255
    for mode in ("1", "L", "LA", "P", "RGB", "RGBA", "I;16", "I", "CMYK", "YCbCr"):
        image = block_mask().convert(mode)
        for fmt in ("PNG", "JPEG", "WEBP", "TIFF"):
            try:
                cases.append((f"mode-{mode}-{fmt}", png(image, fmt), {}))
            except (OSError, ValueError, KeyError):
                pass
    cases += [("transparent", Image.fromarray(np.zeros((64, 64, 4), np.uint8), "RGBA"), {}),
              ("alpha-strokes", Image.fromarray(rgba, "RGBA"), {}), ("opaque-rgba", Image.new("RGBA", (64, 64)), {}),
              ("black-only-masked", np.zeros((64, 64), np.uint8), {"inpaint_area": "Only masked"}),
              ("white-only-masked", white, {"inpaint_area": "Only masked", "mask_padding": 256}),
              ("pad-negative", white, {"inpaint_area": "Only masked", "mask_padding": -1}),
              ("pad-text", white, {"inpaint_area": "Only masked", "mask_padding": "32px"}),
              ("area-list", white, {"inpaint_area": ["Only masked"]}), ("blur-huge", white, {"mask_blur": 10**9}),
              ("blur-float", white, {"mask_blur": 4.5}), ("content-null-byte", white, {"masked_content": "fill\0"}),
              ("float-array", white.astype(np.float32), {}), ("bool-array", white > 0, {}),
              ("int64-array", white.astype(np.int64), {}), ("2-channels", np.zeros((64, 64, 2), np.uint8), {}),
              ("4-d", np.zeros((1, 64, 64, 1), np.uint8), {}), ("empty-array", np.zeros((0, 0), np.uint8), {}),
              ("one-channel", white[..., None], {}), ("wrong-array", np.zeros((32, 64), np.uint8), {}),
              ("base64-garbage", "!!not base64!!", {}), ("data-url-svg", "data:image/svg+xml;base64,PHN2Zy8+", {}),
              ("data-url-bare", "data:image/png,abc", {}), ("empty-text", "", {}), ("long-text", "A" * 100_000, {}),
              ("dict", {"path": "/etc/passwd"}, {}), ("nested", [[255] * 64] * 64, {}), ("true", True, {}),
              ("float", 0.5, {})]
    for k in range(20):  # masks of the size in every bit depth of PNG's greyscale, and noise
        noise = np.random.default_rng(k).integers(0, 256, (64, 64), np.uint8)
        cases.append((f"noise-{k}", png(Image.fromarray(noise).convert("1" if k % 2 else "L")), {}))
    return cases
