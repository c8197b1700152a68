"""Parameters texts and the images that carry them, as the tools people bring images from write
them: an A1111 parameters text (A1111), a PNG with text chunks (png_with_text), a JPEG as A1111
saves one (a1111_jpeg), a PNG of ComfyUI's default workflow (comfyui_png)."""

from __future__ import annotations

import io
import json

from PIL import Image, PngImagePlugin

A1111 = ("a lighthouse, (stormy:1.2) sea\nNegative prompt: blurry\nSteps: 3, Sampler: Euler a, Schedule type: Karras, "
         "CFG scale: 4.5, Seed: 77, Size: 96x64, Model hash: 31e35c80fc, Model: sd_xl_base_1.0, RNG: CPU")


def png_with_text(text_chunks: dict[str, str], size=(64, 64)) -> bytes:
    meta = PngImagePlugin.PngInfo()
    for key, value in text_chunks.items():
        meta.add_text(key, value)
    out = io.BytesIO()
    Image.new("RGB", size, (90, 120, 200)).save(out, "PNG", pnginfo=meta)
    return out.getvalue()


def a1111_jpeg(text: str) -> bytes:
    """A JPEG as A1111 saves one: the parameters in EXIF's UserComment (piexif, Unicode)."""
    import piexif
    import piexif.helper

    exif = piexif.dump({"Exif": {piexif.ExifIFD.UserComment: piexif.helper.UserComment.dump(text, "unicode")}})
    out = io.BytesIO()
    Image.new("RGB", (64, 64), (200, 10, 10)).save(out, "JPEG", exif=exif)
    return out.getvalue()


def comfyui_png(size=(64, 64), sampler="dpmpp_2m", scheduler="karras", seed=156680208700286) -> bytes:
    """ComfyUI's default workflow as it saves it: the API graph ("prompt") and the editor's ("workflow")."""
    sampling = {"seed": seed, "steps": 20, "cfg": 8.0, "sampler_name": sampler, "scheduler": scheduler, "denoise": 1.0}
    prompt = {
        "3": {"class_type": "KSampler", "inputs": {**sampling, "model": ["4", 0], "positive": ["6", 0],
                                                   "negative": ["7", 0], "latent_image": ["5", 0]}},
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": "sd_xl_base_1.0.safetensors"}},
        "5": {"class_type": "EmptyLatentImage", "inputs": {"width": size[0], "height": size[1], "batch_size": 1}},
        "6": {"class_type": "CLIPTextEncode", "inputs": {"text": "a castle on a hill, sunset", "clip": ["4", 1]}},
        "7": {"class_type": "CLIPTextEncode", "inputs": {"text": "blurry, watermark", "clip": ["4", 1]}},
        "8": {"class_type": "VAEDecode", "inputs": {"samples": ["3", 0], "vae": ["4", 2]}},
        "9": {"class_type": "SaveImage", "inputs": {"filename_prefix": "ComfyUI", "images": ["8", 0]}}}
    links = [[1, 4, 0, 3, 0, "MODEL"], [2, 4, 1, 6, 0, "CLIP"], [3, 4, 1, 7, 0, "CLIP"],
             [4, 6, 0, 3, 1, "CONDITIONING"], [5, 7, 0, 3, 2, "CONDITIONING"], [6, 5, 0, 3, 3, "LATENT"],
             [7, 3, 0, 8, 0, "LATENT"], [8, 4, 2, 8, 1, "VAE"], [9, 8, 0, 9, 0, "IMAGE"]]
    workflow = {"last_node_id": 9, "last_link_id": 9, "links": links, "version": 0.4,
                "nodes": [{"id": int(k), "type": v["class_type"]} for k, v in prompt.items()]}
    return png_with_text({"prompt": json.dumps(prompt), "workflow": json.dumps(workflow)}, size)
