"""Images a client gives, decoded by content (imaging/image_input.py): the modes and formats people
bring made the RGB image they meant, as A1111 makes it; hostile and broken files refused with a
message that names the problem, never another exception; no metadata carried further."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image, PngImagePlugin

from images import encoded, gradient, hostile_files, png_header_only
from sdxl_tpu.request.errors import RequestError
from sdxl_tpu.imaging.image_input import BACKGROUND, MAX_BYTES, MAX_PIXELS, decode_image


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_the_three_formats_decode_to_their_pixels(fmt):
    image = gradient()
    out = decode_image(encoded(image, fmt, **({"quality": 100} if fmt != "PNG" else {})))
    assert out.mode == "RGB" and out.size == image.size
    diff = np.abs(np.asarray(out, int) - np.asarray(image, int))
    assert diff.max() == 0 if fmt == "PNG" else diff.mean() < 3


def test_modes_become_the_image_a_person_sees():
    base = gradient()
    # Transparency onto white, as A1111 flattens an img2img input.
    rgba = base.convert("RGBA")
    rgba.putalpha(Image.new("L", base.size, 0))
    assert (np.asarray(decode_image(encoded(rgba, "PNG"))) == BACKGROUND).all()
    half = base.convert("RGBA")
    half.putalpha(128)
    expected = np.round(np.asarray(base, float) * 128 / 255 + 255 * (1 - 128 / 255))
    assert np.abs(np.asarray(decode_image(encoded(half, "PNG")), float) - expected).max() <= 1
    # A palette image with a transparent index.
    palette = base.convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    palette.info["transparency"] = 0
    out = np.asarray(decode_image(encoded(palette, "PNG", transparency=0)))
    assert (out[np.asarray(palette) == 0] == BACKGROUND).all()
    # CMYK JPEG, greyscale, 1-bit: RGB of the same picture.
    assert np.abs(np.asarray(decode_image(encoded(base.convert("CMYK"), "JPEG", quality=100)), int)
                  - np.asarray(base, int)).mean() < 4
    grey = decode_image(encoded(base.convert("L"), "PNG"))
    assert grey.mode == "RGB" and (np.asarray(grey)[..., 0] == np.asarray(base.convert("L"))).all()
    assert decode_image(encoded(base.convert("1"), "PNG")).mode == "RGB"
    # 16-bit greyscale: scaled to 8 bits, not clipped to white.
    sixteen = Image.fromarray((np.asarray(base.convert("L"), np.uint16) * 257).astype(np.uint16))
    assert np.abs(np.asarray(decode_image(encoded(sixteen, "PNG")))[..., 0].astype(int)
                  - np.asarray(base.convert("L"), int)).max() <= 1


def test_exif_orientation_is_applied_and_no_metadata_travels():
    image = gradient(48, 32)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotated: shown turned 90 degrees clockwise
    info = PngImagePlugin.PngInfo()
    info.add_text("parameters", "a secret prompt")
    out = decode_image(encoded(image, "PNG", exif=exif, pnginfo=info))
    assert out.size == (32, 48)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(image.transpose(Image.Transpose.ROTATE_270)))
    assert not out.info and not out.getexif()
    assert not decode_image(encoded(image, "JPEG", exif=exif)).getexif()


def test_an_animation_gives_its_first_frame():
    frames = [gradient(), Image.new("RGB", (48, 32), (255, 0, 0))]
    for fmt in ("PNG", "WEBP"):
        data = encoded(frames[0], fmt, save_all=True, append_images=frames[1:], **({"lossless": True}
                                                                                   if fmt == "WEBP" else {}))
        np.testing.assert_array_equal(np.asarray(decode_image(data)), np.asarray(frames[0]))


def test_hostile_and_broken_files_are_refused_with_a_message():
    cases = hostile_files()
    assert len(cases) >= 300
    decoded = refused = 0
    for name, data in cases:
        try:
            out = decode_image(data, "Starting image")
        except RequestError as e:
            refused += 1
            assert str(e).startswith("Starting image "), (name, str(e))
            assert "Traceback" not in str(e) and len(str(e)) < 200, (name, str(e))
        else:  # (a corruption may leave a valid image: then it is one, in RGB)
            decoded += 1
            assert out.mode == "RGB" and min(out.size) >= 8, name
    assert refused > 200, (decoded, refused)
    for name, data in cases[:23]:  # the handcrafted ones: every one refused but the PNG with HTML after
        if name == "png+html":  # its pixels, decoded anew: nothing of the file goes further
            np.testing.assert_array_equal(np.asarray(decode_image(data)), np.asarray(gradient()))
            continue
        with pytest.raises(RequestError):
            decode_image(data)


def test_messages_say_what_is_wrong():
    with pytest.raises(RequestError, match="Image has more than 16 megapixels"):
        decode_image(png_header_only(100_000, 100_000))  # (past PIL's own bound: refused while opening)
    with pytest.raises(RequestError, match="Image is 5000x4000 pixels: it has more than 16 megapixels"):
        decode_image(png_header_only(5000, 4000))
    assert MAX_PIXELS == 4096 * 4096
    with pytest.raises(RequestError, match="Mask is not a PNG, JPEG or WebP image"):
        decode_image(b"<svg/>", "Mask")
    with pytest.raises(RequestError, match="Image could not be read: the file is damaged or truncated"):
        noise = np.random.default_rng(0).integers(0, 256, (64, 64, 3), np.uint8)
        decode_image(encoded(Image.fromarray(noise), "PNG")[:2000])
    with pytest.raises(RequestError, match="Image is empty"):
        decode_image(b"")
    with pytest.raises(RequestError, match="Image is larger than 16 MB"):
        decode_image(bytes(MAX_BYTES + 1))
