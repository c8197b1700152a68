"""The upscalers' PyTorch reference (spandrel's ESRGAN and Real-ESRGAN Compact architectures, as A1111 loads
them) with random weights, and upscaler files: as torch.save and safetensors write them, in ESRGAN's old key
layout or BasicSR's, and hostile ones.

spandrel's package imports every architecture it knows, some of which import torchvision (not installed
here: PyPI's Linux build is CUDA's); its ESRGAN and Compact architectures need torch alone, so they are
imported without running the package's own __init__.
"""

from __future__ import annotations

import collections
import importlib.util
import io
import pickle
import re
import sys
import types
import zipfile

import numpy as np
import torch


def spandrel_archs():
    """spandrel's ESRGANArch and CompactArch (their load(state_dict) builds the model A1111 runs)."""
    if "spandrel" not in sys.modules:
        spec = importlib.util.find_spec("spandrel")
        assert spec is not None and spec.submodule_search_locations, "spandrel is not installed"
        package = types.ModuleType("spandrel")
        package.__path__ = list(spec.submodule_search_locations)
        sys.modules["spandrel"] = package
    from spandrel.architectures.Compact import CompactArch
    from spandrel.architectures.ESRGAN import ESRGANArch

    return ESRGANArch(), CompactArch()


def randomize(model: torch.nn.Module, seed: int, gain: float = 1.0) -> torch.nn.Module:
    """He-scaled normal weights (times `gain`), biases and PReLU slopes of order 0.1: every output
    channel varies, every tensor counts."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 4:
                p.copy_(torch.randn(p.shape, generator=gen) * gain * (2.0 / np.prod(p.shape[1:])) ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:  # PReLU
                p.copy_(0.25 + 0.1 * torch.randn(p.shape, generator=gen))
    return model.eval()


def rrdb(seed: int = 0, *, nf: int = 16, nb: int = 2, scale: int = 4, unshuffle: int = 1) -> torch.nn.Module:
    """spandrel's RRDBNet (old key layout; gc 32), random. unshuffle 2 or 4: Real-ESRGAN's x2 / x1 (the
    network upsamples 4x a pixel-unshuffled input)."""
    esrgan, _ = spandrel_archs()
    from spandrel.architectures.ESRGAN import ESRGAN

    model = ESRGAN(in_nc=3 * unshuffle ** 2, out_nc=3, num_filters=nf, num_blocks=nb, scale=scale * unshuffle,
                   shuffle_factor=unshuffle if unshuffle > 1 else None)
    randomize(model, seed, gain=0.7)
    loaded = esrgan.load(model.state_dict())  # (as A1111 would build it from the file)
    assert loaded.scale == scale
    return loaded.model.eval()


def compact(seed: int = 0, *, nf: int = 16, nc: int = 4, scale: int = 4) -> torch.nn.Module:
    _, arch = spandrel_archs()
    from spandrel.architectures.Compact import Compact

    return randomize(Compact(num_feat=nf, num_conv=nc, upscale=scale), seed)


def basicsr_layout(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """spandrel's (ESRGAN's old) RRDBNet keys -> BasicSR's, as Real-ESRGAN's files hold them."""
    top = sorted({int(m.group(1)) for k in state if (m := re.fullmatch(r"model\.(\d+)\.weight", k))})
    trunk = max(int(m.group(1)) for k in state if (m := re.match(r"model\.1\.sub\.(\d+)\.weight", k)))
    names = {"model.0": "conv_first", f"model.1.sub.{trunk}": "conv_body", f"model.{top[-2]}": "conv_hr",
             f"model.{top[-1]}": "conv_last"}
    names |= {f"model.{n}": f"conv_up{i}" for i, n in enumerate(top[1:-2], 1)}
    out = {}
    for key, value in state.items():
        head, _, leaf = key.rpartition(".")
        m = re.fullmatch(r"model\.1\.sub\.(\d+)\.RDB(\d)\.conv(\d)\.0", head)
        out[f"body.{m[1]}.rdb{m[2]}.conv{m[3]}.{leaf}" if m else f"{names[head]}.{leaf}"] = value
    return out


def psnr01(a, b) -> float:
    """PSNR of images in [0, 1]."""
    mse = np.mean((np.asarray(a, np.float64) - np.asarray(b, np.float64)) ** 2)
    return float("inf") if mse == 0 else float(10 * np.log10(1.0 / mse))


# Hostile .pth files: torch's zip layout with whatever pickle and storages a test asks for.

class FakeStorage:
    def __init__(self, key: str, numel: int, kind: str = "FloatStorage"):
        self.key, self.numel, self.kind = key, numel, kind


class FakeTensor:
    def __init__(self, storage: FakeStorage, offset: int, size: tuple, stride: tuple):
        self.args = (storage, offset, size, stride, False, collections.OrderedDict())


class _Pickler(pickle.Pickler):
    def persistent_id(self, obj):
        if isinstance(obj, FakeStorage):
            return ("storage", getattr(torch, obj.kind), obj.key, "cpu", obj.numel)
        return None

    def reducer_override(self, obj):
        if isinstance(obj, FakeTensor):
            return torch._utils._rebuild_tensor_v2, obj.args
        return NotImplemented


def write_torch_zip(path, obj, storages: dict[str, bytes], prefix: str = "archive") -> None:
    """A file laid out as torch.save's: `obj` pickled (FakeTensor / FakeStorage as torch's tensors and
    storages), each storage's bytes as data/<key>."""
    buffer = io.BytesIO()
    _Pickler(buffer, protocol=2).dump(obj)
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr(f"{prefix}/data.pkl", buffer.getvalue())
        archive.writestr(f"{prefix}/byteorder", "little")
        for key, data in storages.items():
            archive.writestr(f"{prefix}/data/{key}", data)
        archive.writestr(f"{prefix}/version", "3\n")


GENERAL = "R-ESRGAN General 4xV3"  # A1111's name of realesr-general-x4v3.pth


def write_upscalers_folder(folder):
    """A server's --upscalers folder: Real-ESRGAN's compact general net (a small random one, 4x) as
    realesr-general-x4v3.pth (GENERAL), as its release wraps it ("params"), and a file that is not one."""
    folder.mkdir(parents=True, exist_ok=True)
    torch.save({"params": compact(3, nf=8, nc=2).state_dict()}, folder / "realesr-general-x4v3.pth")
    (folder / "notes.pth").write_text("not a model\n")
    return folder
