"""Images with their parameters, and the bounded store the app serves them from."""

from __future__ import annotations

import io
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from reference import read_with_third_parties
from sdxl_tpu.server.files import ImageStore
from sdxl_tpu.a1111.images import encode, encode_all, read_parameters, save_png
from sdxl_tpu.a1111.infotext import Stamp, parameters_text
from sdxl_tpu.request.request import ImageInfo
from sdxl_tpu.version import VERSION

INFO = ImageInfo(seed=7, prompt="a cät 🐈", negative_prompt="blurry", guidance_scale=5.5, steps=20, size=(64, 32),
                 sampler="Euler")
TEXT = ("a cät 🐈\nNegative prompt: blurry\nSteps: 20, Sampler: Euler, Schedule type: Checkpoint, CFG scale: 5.5, "
        f"Seed: 7, Size: 64x32, Model: m, RNG: JAX, Version: sdxl-tpu {VERSION}")


def _image(value: int = 0) -> Image.Image:
    return Image.fromarray(np.full((32, 64, 3), value, np.uint8))


def _save(store: ImageStore, values: list[int]) -> list[str]:
    """One call's images (one per value, its seed) written to `store` as the server writes them."""
    return store.write(encode_all([_image(v) for v in values], [TEXT] * len(values), "png"), values, "png")


@pytest.mark.parametrize("fmt, pil_format", [("png", "PNG"), ("jpeg", "JPEG"), ("webp", "WEBP")])
def test_each_format_carries_the_a1111_parameters_for_every_reader(fmt, pil_format, tmp_path):
    assert parameters_text(INFO, "m") == TEXT
    image = Image.open(io.BytesIO(encode(_image(), TEXT, fmt)))
    assert image.format == pil_format and image.size == (64, 32)
    assert read_parameters(image) == TEXT
    assert read_parameters(_image()) is None
    with pytest.raises(ValueError, match="image format 'gif'"):
        encode(_image(), TEXT, "gif")
    info = ImageInfo(seed=4_000_000_001, prompt="Ça, 東京の夜 ✨🐉, (neon:1.2)",
                     negative_prompt="größte Unschärfe, 模糊",
                     guidance_scale=6.5, steps=31, size=(64, 32), sampler="DPM++ 2M Karras", rng="CPU")
    stamp = Stamp("sd_xl_base_1.0", "31e35c80fc", (("pixel-art", 0.8, "0123456789ab"),))
    text = parameters_text(info, stamp)
    assert text.splitlines() == [
        "Ça, 東京の夜 ✨🐉, (neon:1.2) <lora:pixel-art:0.8>", "Negative prompt: größte Unschärfe, 模糊",
        "Steps: 31, Sampler: DPM++ 2M Karras, Schedule type: Checkpoint, CFG scale: 6.5, Seed: 4000000001, "
        'Size: 64x32, Model hash: 31e35c80fc, Model: sd_xl_base_1.0, RNG: CPU, Lora hashes: "pixel-art: 0123456789ab", '
        f"Version: sdxl-tpu {VERSION}"]
    seen = read_with_third_parties(encode(_image(), text, fmt), tmp_path)
    assert seen.pop("user_comment", text) == text
    assert seen == {"prompt": "Ça, 東京の夜 ✨🐉, (neon:1.2) <lora:pixel-art:0.8>",
                    "negative": "größte Unschärfe, 模糊", "sampler": "DPM++ 2M Karras", "scheduler": "Checkpoint",
                    "steps": "31", "cfg_scale": "6.5", "seed": "4000000001", "size": "64x32", "model": "sd_xl_base_1.0",
                    "model_hash": "31e35c80fc"}, seen


def test_the_schedule_and_the_noise_source_are_named_as_they_ran():
    """Schedule type right after the sampler, RNG after the model, as A1111 places them; a
    schedule of "Automatic" is written as the one it picked for the sampler (as A1111 does)."""
    settings = lambda **kw: parameters_text(ImageInfo(**{**INFO.__dict__, **kw}), "m").splitlines()[-1]
    assert settings(sampler="DPM++ 2M", schedule="Karras", rng="CPU") == (
        "Steps: 20, Sampler: DPM++ 2M, Schedule type: Karras, CFG scale: 5.5, Seed: 7, Size: 64x32, Model: m, "
        f"RNG: CPU, Version: sdxl-tpu {VERSION}")
    automatic = {"Euler": "Uniform", "Euler a": "Uniform", "DPM++ 2M": "Karras", "DPM++ 2M Karras": "Karras",
                 "DPM++ 2M SDE": "Exponential", "DPM++ SDE": "Karras", "DDIM": "Checkpoint", "LCM": "Checkpoint"}
    for sampler, schedule in automatic.items():
        assert f"Sampler: {sampler}, Schedule type: {schedule}, " in settings(sampler=sampler, schedule="Automatic")
    assert "Sampler: Euler, Schedule type: SGM Uniform, " in settings(schedule="SGM Uniform")
    # (a sampler not known yet: the schedule as asked)
    assert "Sampler: None, Schedule type: Automatic, " in settings(sampler=None, schedule="Automatic")


def test_png_is_lossless(tmp_path):
    pixels = np.random.default_rng(0).integers(0, 256, (32, 64, 3), dtype=np.uint8)
    save_png(Image.fromarray(pixels), INFO, tmp_path / "x.png", model="m")
    image = Image.open(tmp_path / "x.png")
    np.testing.assert_array_equal(np.asarray(image), pixels)
    assert image.info["parameters"] == TEXT


def test_the_store_deletes_old_calls_and_says_which(tmp_path):
    forgotten = []
    store = ImageStore(tmp_path / "store", keep_seconds=0.2)
    store.on_delete(forgotten.extend)
    first = _save(store, [1, 2])
    assert [read_parameters(Image.open(p)) for p in first] == [TEXT, TEXT]
    time.sleep(0.3)
    second = _save(store, [3])
    assert forgotten == first  # the first call's folder is gone, and the caller was told
    assert [Path(p).exists() for p in first + second] == [False, False, True]
    assert store.bytes_on_disk == sum(Path(p).stat().st_size for p in second)
    store.close()
    assert not (tmp_path / "store").exists()


def test_the_store_keeps_its_bytes_bounded_but_always_the_newest_call(tmp_path):
    store = ImageStore(tmp_path / "store", max_bytes=1)  # smaller than any call
    paths = [_save(store, [i])[0] for i in range(5)]
    on_disk = sorted(str(p) for p in (tmp_path / "store").rglob("*.png"))
    assert on_disk == [paths[-1]]
