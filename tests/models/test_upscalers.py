"""Upscaler models (ESRGAN's RRDBNet, Real-ESRGAN's compact SRVGGNet) against spandrel's, the PyTorch code
A1111 runs them with: loaded from .pth (read without torch) and .safetensors, old and new key layouts; a folder
named as A1111 names its upscalers; hostile files refused without running anything; tiles stitched into the
untiled result, one compiled program for every image size; A1111's rule for reaching a size."""

from __future__ import annotations

import os
import pickle

import jax
import numpy as np
import pytest
import torch
from flax import nnx
from PIL import Image
from reference import rel_l2
from safetensors.torch import save_file
from upscaler_files import (FakeStorage, FakeTensor, basicsr_layout, compact, psnr01, rrdb, spandrel_archs,
                            write_torch_zip)

from sdxl_tpu import CheckpointError, CompileCounter
from sdxl_tpu.generate.upscaling import TiledUpscaler
from sdxl_tpu.imaging.upscale import Tiling, resize_with, target_size, upscale_by
from sdxl_tpu.models.esrgan import RRDBNet, SRVGGNetCompact
from sdxl_tpu.models.layers import Precision
from sdxl_tpu.weights.upscalers import UpscalerFileError, find_upscalers, load_upscaler
from sdxl_tpu.weights.torch_zip import read_torch_zip


def forward(model, x: np.ndarray) -> np.ndarray:
    graphdef, state = nnx.split(model)
    return np.asarray(jax.jit(lambda s, x: nnx.merge(graphdef, s)(x))(state, x)).astype(np.float32)


def untiled(model, image: np.ndarray) -> np.ndarray:
    """The whole image through the model at once, in and out as TiledUpscaler hands it (BGR, uint8)."""
    y = forward(model, (image[None, ..., ::-1] / 255).astype(np.float32))[0, ..., ::-1]
    return np.round(np.clip(y, 0, 1) * 255).astype(np.uint8)


def write(path, state: dict[str, torch.Tensor], wrapper: str | None = None):
    if path.suffix == ".safetensors":
        save_file({k: v.contiguous() for k, v in state.items()}, path)
    else:
        torch.save({wrapper: state} if wrapper else state, path)
    return path


def check_parity(reference: torch.nn.Module, path, shape, residual: bool = False) -> float:
    ours = load_upscaler(path)
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        ref = reference(x).numpy().transpose(0, 2, 3, 1)
    got = forward(ours, x.numpy().transpose(0, 2, 3, 1))
    assert got.shape == ref.shape and ref.std() > 0.05
    if residual:  # the compact network adds the (nearest-upsampled) input: compare what it adds
        base = np.repeat(np.repeat(x.numpy().transpose(0, 2, 3, 1), ours.scale, 1), ours.scale, 2)
        got, ref = got - base, ref - base
    assert rel_l2(got, ref) <= 1e-4
    return psnr01(np.clip(got, 0, 1), np.clip(ref, 0, 1))


@pytest.mark.parametrize("layout, suffix, wrapper, scale, unshuffle", [
    ("old", ".pth", None, 4, 1), ("old", ".safetensors", None, 4, 1), ("old", ".pth", None, 2, 1),
    ("new", ".pth", "params_ema", 4, 1), ("new", ".safetensors", None, 4, 1),
    ("new", ".pth", "params", 2, 2), ("new", ".pth", "state_dict", 1, 4), ("bsrgan", ".pth", "net", 4, 1)])
def test_rrdbnet_matches_spandrel(tmp_path, layout, suffix, wrapper, scale, unshuffle):
    reference = rrdb(scale, nf=16, nb=2, scale=scale, unshuffle=unshuffle)
    state = reference.state_dict()
    if layout == "new":  # BasicSR's names: spandrel renames them back when it loads the file
        state = basicsr_layout(state)
        esrgan, _ = spandrel_archs()
        reference = esrgan.load({"params_ema": state}).model.eval()
    elif layout == "bsrgan":  # (BSRGAN's names, saved as a DataParallel's: each prefixed `module.`)
        state = {"module." + k.replace("conv_body", "trunk_conv").replace("conv_up", "upconv")
                 .replace("conv_hr", "HRconv").replace("body.", "RRDB_trunk.").replace("rdb", "RDB"): v
                 for k, v in basicsr_layout(state).items()}
    value = check_parity(reference, write(tmp_path / f"m{suffix}", state, wrapper), (2, 3, 13, 18))
    print(f"RRDBNet {layout} {suffix} x{scale}: PSNR {value:.1f} dB against spandrel")
    assert value >= 40


@pytest.mark.parametrize("suffix, scale", [(".pth", 4), (".safetensors", 2)])
def test_compact_matches_spandrel(tmp_path, suffix, scale):
    reference = compact(scale, nf=16, nc=4, scale=scale)
    path = write(tmp_path / f"c{suffix}", reference.state_dict(), "params" if suffix == ".pth" else None)
    value = check_parity(reference, path, (2, 3, 13, 18), residual=True)
    print(f"SRVGGNetCompact {suffix} x{scale}: PSNR {value:.1f} dB against spandrel")
    assert value >= 40


def test_bfloat16_stays_close(tmp_path):
    for reference, path in ((rrdb(0), tmp_path / "r.pth"), (compact(0), tmp_path / "c.pth")):
        torch.save(reference.state_dict(), path)
        x = torch.rand(1, 3, 20, 24, generator=torch.Generator().manual_seed(3))
        with torch.no_grad():
            ref = np.clip(reference(x).numpy().transpose(0, 2, 3, 1), 0, 1)
        got = forward(load_upscaler(path, Precision.of("bfloat16")), x.numpy().transpose(0, 2, 3, 1))
        value = psnr01(np.clip(got, 0, 1), ref)
        print(f"{path.name} bfloat16: PSNR {value:.1f} dB")
        assert value >= 40


def test_the_pth_reader_reads_what_torch_loads(tmp_path):
    base = torch.randn(4, 6)
    state = {"f32": base, "t": base.t(), "view": base[1:, 2:5], "f16": torch.randn(3, 2).half(),
             "bf16": torch.randn(5).bfloat16(), "scalar": torch.tensor(2.5), "empty": torch.zeros(0, 3)}
    torch.save(state, tmp_path / "s.pth")
    ours = read_torch_zip(str(tmp_path / "s.pth"), 1 << 20)
    for key, value in torch.load(tmp_path / "s.pth", weights_only=True).items():
        assert ours[key].shape == tuple(value.shape)
        assert np.array_equal(ours[key].astype(np.float32), value.float().numpy()), key


def test_a_folder_is_named_as_a1111_names_it(tmp_path):
    folder = tmp_path / "upscalers"
    (folder / "sub").mkdir(parents=True)
    small, tiny = rrdb(0, nf=8, nb=1).state_dict(), compact(0, nf=8, nc=1).state_dict()
    write(folder / "RealESRGAN_x4plus.pth", basicsr_layout(small), "params_ema")
    write(folder / "realesr-general-x4v3.pth", tiny, "params")
    write(folder / "sub" / "realesr-animevideov3.safetensors", tiny)
    write(folder / "4x_Custom.safetensors", small)
    (folder / "empty.pth").write_bytes(b"")
    (folder / "notes.pth").write_text("not a model\n")
    write(folder / "vae.safetensors", {"decoder.conv_in.weight": torch.zeros(4, 4, 3, 3)})
    write(tmp_path / "outside.pth", small)
    (folder / "link.pth").symlink_to(tmp_path / "outside.pth")
    (folder / "readme.txt").write_text("ignored")
    found = find_upscalers(folder)
    assert {name: f.scale for name, f in found.found.items()} == {
        "R-ESRGAN 4x+": 4, "R-ESRGAN General 4xV3": 4, "R-ESRGAN AnimeVideo": 4, "4x_Custom": 4}
    assert sorted(found.skipped) == ["empty", "link", "notes", "vae"]
    for name, word in (("empty", "empty file"), ("link", "outside the folder"), ("notes", "not a torch zip"),
                       ("vae", "not an upscaler")):
        assert word in found.skipped[name], found.skipped[name]
    assert isinstance(found.found["R-ESRGAN AnimeVideo"].load(), SRVGGNetCompact)
    assert isinstance(found.found["R-ESRGAN 4x+"].load(), RRDBNet)
    with pytest.raises(CheckpointError, match="not a folder"):
        find_upscalers(tmp_path / "nowhere")


class Evil:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def _hostile(tmp_path, case: str):
    """A hostile or broken file, and a word its refusal says."""
    path = tmp_path / f"{case}.pth"
    good = {k: v for k, v in basicsr_layout(rrdb(0, nf=8, nb=1).state_dict()).items()}
    f32 = np.arange(8, dtype=np.float32).tobytes()
    if case == "os_system":
        write_torch_zip(path, {"conv_first.weight": Evil(tmp_path / "pwned")}, {})
        return path, "posix.system"
    if case == "plain_pickle":
        path.write_bytes(pickle.dumps(Evil(tmp_path / "pwned")))
        return path, "not a torch zip"
    if case == "numpy_global":
        write_torch_zip(path, {"w": np.zeros(3)}, {})
        return path, "numpy"
    if case == "truncated":
        torch.save(good, path)
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])
        return path, "not a torch zip"
    if case == "offset_past_end":
        write_torch_zip(path, {"w": FakeTensor(FakeStorage("0", 8), 6, (4,), (1,))}, {"0": f32})
        return path, "reaches past"
    if case == "stride_past_end":
        write_torch_zip(path, {"w": FakeTensor(FakeStorage("0", 8), 0, (3, 3), (3, 1))}, {"0": f32})
        return path, "reaches past"
    if case == "negative_stride":
        write_torch_zip(path, {"w": FakeTensor(FakeStorage("0", 8), 7, (4,), (-1,))}, {"0": f32})
        return path, "negative"
    if case == "storage_too_short":
        write_torch_zip(path, {"w": FakeTensor(FakeStorage("0", 1 << 40), 0, (4,), (1,))}, {"0": f32})
        return path, "holds 32 bytes"
    if case == "storage_name":
        write_torch_zip(path, {"w": FakeTensor(FakeStorage("../../0", 8), 0, (4,), (1,))}, {"0": f32})
        return path, "a storage named"
    if case == "wrong_shape":
        torch.save({**good, "conv_body.weight": torch.zeros(8, 8, 1, 1)}, path)
        return path, "wrong shape"
    if case == "missing":
        torch.save({k: v for k, v in good.items() if k != "conv_hr.bias"}, path)
        return path, "missing: conv_hr.bias"
    if case == "not_an_upscaler":
        torch.save({"encoder.weight": torch.zeros(3, 3)}, path)
        return path, "not an upscaler"
    if case == "esrgan_plus":
        torch.save({"model.0.weight": torch.zeros(1), "model.1.sub.0.RDB1.conv1x1.weight": torch.zeros(1)}, path)
        return path, "ESRGAN+"
    if case == "a_list":
        torch.save([torch.zeros(2)], path)
        return path, "not a state dict"
    if case == "empty":
        path.write_bytes(b"")
        return path, "empty file"
    if case == "text":
        path.write_text("hello\n" * 100)
        return path, "not a torch zip"
    path = path.with_suffix(".safetensors")
    if case == "text_safetensors":
        path.write_text("{}" * 100)
        return path, "not a safetensors file"
    assert case == "safetensors_past_end"
    header = b'{"conv_first.weight": {"dtype": "F32", "shape": [64, 3, 3, 3], "data_offsets": [0, 6912]}}'
    path.write_bytes(len(header).to_bytes(8, "little") + header + bytes(100))
    return path, "outside the file"


HOSTILE = ["os_system", "plain_pickle", "numpy_global", "truncated", "offset_past_end", "stride_past_end",
           "negative_stride", "storage_too_short", "storage_name", "wrong_shape", "missing", "not_an_upscaler",
           "esrgan_plus", "a_list", "empty", "text", "text_safetensors", "safetensors_past_end"]


def test_the_hostile_pickles_are_live(tmp_path):
    """(What the refusal above prevents: the same pickle, loaded as pickle loads it, runs its command.)"""
    path, _ = _hostile(tmp_path, "plain_pickle")
    pickle.loads(path.read_bytes())
    assert (tmp_path / "pwned").exists()


@pytest.mark.parametrize("case", HOSTILE)
def test_hostile_and_broken_files_are_refused_saying_why(tmp_path, case):
    path, word = _hostile(tmp_path, case)
    with pytest.raises(UpscalerFileError) as err:
        load_upscaler(path)
    message = str(err.value)
    assert word in message and str(path) in message and "\n" not in message, message
    assert not (tmp_path / "pwned").exists()


def test_tiles_stitch_into_the_untiled_result(tmp_path):
    """Where the network sees no farther than a quarter of the overlap, tiling changes nothing: the compact
    network (4 convs: 4 pixels) with overlap 16, RRDBNet of one block (18.25 pixels) with 76."""
    torch.save(compact(1, nf=8, nc=2).state_dict(), tmp_path / "c.pth")
    torch.save(rrdb(1, nf=8, nb=1).state_dict(), tmp_path / "r.pth")
    image = np.random.default_rng(0).integers(0, 256, (170, 200, 3), dtype=np.uint8)
    for path, tile, overlap in ((tmp_path / "c.pth", 40, 16), (tmp_path / "r.pth", 160, 76)):
        model = load_upscaler(path)
        tiled = TiledUpscaler(model, tile=tile, overlap=overlap, batch=3).run(image)
        whole = untiled(model, image)
        assert tiled.shape == whole.shape == (680, 800, 3)
        diff = np.abs(tiled.astype(int) - whole)
        print(f"{path.name}: tiled vs untiled, max {diff.max()}, {np.mean(diff > 0):.1e} of values differ")
        assert diff.max() <= 1 and np.mean(diff > 0) < 1e-4
    assert Tiling(40, 16).starts(200) == [0, 22, 45, 68, 91, 114, 137, 160]  # spread evenly, overlaps >= 16
    for tiling in (Tiling(40, 16), Tiling(32, 8, multiple=2), Tiling(48, 20, multiple=4), Tiling(16, 0)):
        for n in range(tiling.tile, 300, tiling.multiple):
            starts = tiling.starts(n)
            assert starts[0] == 0 and starts[-1] == n - tiling.tile and all(s % tiling.multiple == 0 for s in starts)
            assert all(0 < b - a <= tiling.tile - tiling.overlap for a, b in zip(starts, starts[1:]))


def test_one_program_runs_every_image_size(tmp_path):
    torch.save(rrdb(2, nf=8, nb=1, scale=2, unshuffle=2).state_dict(), tmp_path / "x2.pth")
    upscaler = TiledUpscaler(load_upscaler(tmp_path / "x2.pth"), "x2", tile=32, overlap=8, batch=2)
    assert upscaler.scale == 2 and upscaler.tiling.multiple == 2
    rng = np.random.default_rng(1)
    with CompileCounter() as first:
        upscaler.warm()
    assert first.compiles == 1
    with CompileCounter() as counter:
        for h, w in ((7, 3), (97, 33), (64, 130), (40, 50)):  # smaller than a tile, odd, several tiles
            out = upscaler.run(rng.integers(0, 256, (h, w, 3), dtype=np.uint8))
            assert out.shape == (2 * h, 2 * w, 3)
    assert counter.compiles == 0 and counter.traces == 0


def test_tiles_a_batch_follow_the_platform(tmp_path, monkeypatch):
    """8 tiles a batch on an accelerator (the fastest on a v5e, RESULTS 2026-12-07), 4 on a CPU."""
    from sdxl_tpu.generate import upscaling

    torch.save(rrdb(2, nf=8, nb=1, scale=2, unshuffle=2).state_dict(), tmp_path / "x2.pth")
    model = load_upscaler(tmp_path / "x2.pth")
    assert TiledUpscaler(model).batch == 4 and TiledUpscaler(model, batch=3).batch == 3
    monkeypatch.setattr(upscaling.jax, "default_backend", lambda: "tpu")
    assert TiledUpscaler(model).batch == upscaling.ACCELERATOR_BATCH == 8


def test_a1111s_rule_for_reaching_a_size():
    calls = []

    def model(factor):
        def apply(image):
            calls.append(image.size)
            return image.resize((image.width * factor, image.height * factor), Image.Resampling.NEAREST)
        return apply

    image = Image.fromarray(np.random.default_rng(2).integers(0, 256, (48, 64, 3), dtype=np.uint8))
    assert target_size((64, 48), 3.5) == (224, 168) and target_size((100, 75), 1.5) == (144, 112)
    out = upscale_by(image, 3.5, model(2))  # 2x twice (256x192 covers 224x168), then Lanczos down
    assert calls == [(64, 48), (128, 96)] and out.size == (224, 168)
    want = image.resize((256, 192), Image.Resampling.NEAREST).resize((224, 168), Image.Resampling.LANCZOS)
    assert np.array_equal(np.asarray(out), np.asarray(want))
    calls.clear()
    assert upscale_by(image, 20, model(2)).size == (1280, 960) and len(calls) == 3  # three passes at most
    calls.clear()
    assert upscale_by(image, 2, model(1)).size == (128, 96) and len(calls) == 1  # a 1x model: once
    calls.clear()
    assert resize_with(image, (96, 72), model(4)).size == (96, 72) and calls == [(64, 48)]  # hires fix 1.5x
    assert resize_with(image, (32, 24), model(4)).size == (32, 24) and len(calls) == 1  # smaller: Lanczos alone


def test_extras_upscale_through_the_compiled_model(tmp_path):
    torch.save(compact(3, nf=8, nc=1).state_dict(), tmp_path / "c.pth")
    model = load_upscaler(tmp_path / "c.pth")
    upscaler = TiledUpscaler(model, tile=32, overlap=12, batch=2)  # (3 convs see 3 pixels: 12 / 4)
    image = Image.fromarray(np.random.default_rng(3).integers(0, 256, (34, 41, 3), dtype=np.uint8))
    assert upscaler.upscale(image, 2).size == (80, 64)  # (82, 68) rounded down to multiples of 8
    assert upscaler.resize(image, (61, 45)).size == (61, 45)
    once = upscaler.apply(image)
    assert once.size == (164, 136) and np.array_equal(np.asarray(once), untiled(model, np.asarray(image)))
