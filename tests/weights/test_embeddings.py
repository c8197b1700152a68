"""Textual inversion embeddings for SDXL (`clip_l`/`clip_g` .safetensors, named in a prompt by
file name): what the folder loads and skips, where A1111 places their vectors in a prompt's chunks,
the text encoders' output and the images against diffusers' `load_textual_inversion` on both
encoders, the parameters text's "TI hashes", and no compile for any of it.

One gap of the reference, worked around here only: transformers pools a text encoder whose config
keeps the legacy eos_token_id 2 (SDXL base's, the tiny checkpoint's) at the highest token id, which
an added token's id is: its pooled prompt is taken at the embedding, not at the end token. A1111
pools at the end token (its placeholders are token 0). The reference's second encoder is given the
tokenizer's end token id, as a config after transformers' fix has it, so both pool at the end token.
"""

from __future__ import annotations

import dataclasses
import hashlib

import numpy as np
import pytest
import torch

from embedding_files import GOOD, SKIPPED
from reference import psnr, rel_l2
from sdxl_tpu import CheckpointError, CompileCounter, load_pipeline
from sdxl_tpu.a1111.infotext import parameters_text, parse, request_fields
from sdxl_tpu.a1111.prompts import EMBEDDED, chunk_prompt
from sdxl_tpu.generate import sampling
from sdxl_tpu.request.request import ImageInfo
from sdxl_tpu.weights.embeddings import load_embeddings
from sdxl_tpu.weights.checkpoint import load_models
from sdxl_tpu.weights.hub import load_tokenizers

PROMPT, NEGATIVE = "a photo of myemb cat", "onevec, blurry"


@pytest.fixture(scope="module")
def pipe(tiny_checkpoint, embeddings_folder, compile_cache):
    return load_pipeline(tiny_checkpoint, dtype="float32", sizes=[(64, 64)], embeddings=embeddings_folder,
                         compile_cache=compile_cache, warmup=False)


def test_the_folder_loads_what_fits_and_skips_the_rest_with_the_reason(pipe, embeddings_folder, tiny_checkpoint):
    e = pipe.embeddings
    assert {name: emb.count for name, emb in e.loaded.items()} == GOOD
    assert set(e.skipped) == set(SKIPPED)
    for name, word in SKIPPED.items():
        assert word in e.skipped[name], (name, e.skipped[name])
    digest = hashlib.sha256((embeddings_folder / "myemb.safetensors").read_bytes()).hexdigest()
    assert e.loaded["myemb"].hash == digest[:12]
    with pytest.raises(CheckpointError, match="not a folder"):
        load_embeddings(embeddings_folder / "nowhere", load_tokenizers(tiny_checkpoint),
                        load_models(tiny_checkpoint, dtype="float32"))


def test_a_prompt_places_the_vectors_where_a1111_does(pipe):
    tokenizer, names = pipe.tokenizers[0], pipe.embeddings.names[0]
    plain = chunk_prompt(tokenizer, "a photo of cat", 3, names)
    c = chunk_prompt(tokenizer, PROMPT, 3, names)
    assert plain.embedded == () and c.tokens == plain.tokens + 3 and c.embeddings == ["myemb"]
    at = [position for _, position, _, _ in c.embedded]
    assert [(chunk, name, j) for chunk, _, name, j in c.embedded] == [(0, "myemb", j) for j in range(3)]
    assert at == list(range(at[0], at[0] + 3)) and (c.ids[0, at] == EMBEDDED).all()
    assert (c.ids[0] == EMBEDDED).sum() == 3
    assert (chunk_prompt(tokenizer, "(myemb:1.3) cat", 3, names).weights[0, 1:4] == np.float32(1.3)).all()
    # an embedding is never split between chunks: one that does not fit starts the next
    filler = chunk_prompt(tokenizer, "a " * 74, 3, names)
    c = chunk_prompt(tokenizer, "a " * 74 + "myemb", 3, names)
    assert filler.count == 1 and c.count == 2 and [e[:2] for e in c.embedded] == [(1, 1), (1, 2), (1, 3)]
    # moved with the words after a comma when a chunk fills (A1111 would leave its vectors behind)
    c = chunk_prompt(tokenizer, "a " * 60 + ", myemb " + "a " * 20, 3, names)
    assert c.count == 2 and {chunk for chunk, *_ in c.embedded} == {1} and (c.ids[1] == EMBEDDED).sum() == 3
    assert chunk_prompt(tokenizer, "myembx onevecs", 3, names).embedded == ()  # other words
    assert chunk_prompt(tokenizer, PROMPT, 3).embedded == ()  # a pipeline without embeddings reads words


@pytest.fixture(scope="module")
def reference(tiny_checkpoint, embeddings_folder):
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import load_file

    ref = StableDiffusionXLPipeline.from_pretrained(tiny_checkpoint)
    for name in GOOD:
        state = load_file(next(embeddings_folder.rglob(f"{name}.safetensors")))
        ref.load_textual_inversion(state["clip_l"], token=name, text_encoder=ref.text_encoder, tokenizer=ref.tokenizer)
        ref.load_textual_inversion(state["clip_g"], token=name, text_encoder=ref.text_encoder_2,
                                   tokenizer=ref.tokenizer_2)
    ref.text_encoder_2.text_model.eos_token_id = ref.tokenizer_2.eos_token_id  # (the module's docstring)
    return ref


def test_the_text_encoders_equal_diffusers_load_textual_inversion(pipe, reference):
    infos = [ImageInfo(seed=0, prompt=PROMPT, negative_prompt=NEGATIVE, guidance_scale=5.0, steps=1, size=(64, 64))]
    text = sampling.prepare(pipe.tokenizers, infos * pipe.images_per_call, True, pipe.max_prompt_chunks,
                            pipe.embeddings)
    encode = pipe.compiled((64, 64), ["encode"])["encode"]
    context, pooled, _ = encode(pipe.params["text_encoder"], pipe.params["text_encoder_2"], pipe.params["unet"],
                                *text[:7], text.zero_negative)
    context, pooled = np.asarray(context), np.asarray(pooled)
    with torch.no_grad():
        want, want_negative, want_pooled, want_negative_pooled = (
            t.numpy() for t in reference.encode_prompt(PROMPT, negative_prompt=NEGATIVE, device="cpu"))
    for got, got_pooled, ref, ref_pooled, what in ((context[0, 1], pooled[0, 1], want, want_pooled, "prompt"),
                                                   (context[0, 0], pooled[0, 0], want_negative, want_negative_pooled,
                                                    "negative prompt")):
        err, err_pooled = rel_l2(got[:77], ref[0]), rel_l2(got_pooled, ref_pooled[0])
        print(f"{what}: rel L2 {err:.1e}, pooled {err_pooled:.1e}")
        assert err <= 1e-5 and err_pooled <= 1e-5
    plain = sampling.prepare(pipe.tokenizers, [dataclasses.replace(infos[0], prompt="a photo of cat")] * 4, True,
                             pipe.max_prompt_chunks, pipe.embeddings)
    assert not plain.embedded1[:, 1].any() and text.embedded1[:, 1].any() and plain.embedded2[:, 0].any()


def test_images_equal_diffusers_and_nothing_compiles_for_an_embedding(pipe, reference):
    latents = torch.randn(4, 4, 8, 8, generator=torch.Generator().manual_seed(3))
    pipe.generate("a photo of cat", seed=1, steps=3, size=(64, 64), latents=latents.numpy())  # (compiles)
    with CompileCounter() as counter:
        result = pipe.generate(PROMPT, NEGATIVE, seed=1, guidance_scale=5.0, steps=3, size=(64, 64),
                               latents=latents.numpy())
    assert counter.compiles == 0
    ref = reference(PROMPT, negative_prompt=NEGATIVE, num_inference_steps=3, guidance_scale=5.0, height=64, width=64,
                    latents=latents, num_images_per_prompt=4, output_type="np").images
    ours = np.stack([np.asarray(im) for im in result.images])
    value = psnr(ours, np.round(ref * 255).astype(np.uint8))
    without = np.stack([np.asarray(im) for im in pipe.generate("a photo of cat", NEGATIVE, seed=1, steps=3,
                                                               size=(64, 64), latents=latents.numpy()).images])
    print(f"myemb and onevec: PSNR {value:.1f} dB against diffusers; {psnr(ours, without):.1f} dB against no embedding")
    assert value >= 40 and psnr(ours, without) < 30

    # The parameters name each embedding used once, with A1111's short hash, and read back
    text = parameters_text(result.infos[0], pipe.stamp_for(result.infos[0]))
    hashes = {name: pipe.embeddings.loaded[name].hash for name in GOOD}
    assert f'TI hashes: "myemb: {hashes["myemb"]}, onevec: {hashes["onevec"]}"' in text
    fields, notes = request_fields(parse(text), [(64, 64)], list(pipe.samplers))
    assert fields["prompt"] == PROMPT and any(n.startswith("Embeddings: myemb, onevec") for n in notes)
    assert not any("TI hashes" in n for n in notes)
    for prompt in ("a cat", "a " * 240 + "myemb"):  # (none named; one past the chunks encoded, so not used)
        assert "TI hashes" not in parameters_text(result.infos[0], pipe.stamp_for(
            ImageInfo(seed=0, prompt=prompt, negative_prompt="", guidance_scale=5.0, steps=1, size=(64, 64))))
