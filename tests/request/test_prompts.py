"""Prompts as AUTOMATIC1111 reads them: its emphasis syntax, chunks of 75 tokens, and the
embeddings that come of them, against a PyTorch reference on transformers' text encoders."""

from __future__ import annotations

import re
import time

import numpy as np
import pytest
import torch

from reference import rel_l2
from sdxl_tpu import CompileCounter, RequestError, load_pipeline, load_tokenizers
from sdxl_tpu.generate import sampling
from sdxl_tpu.a1111.prompts import BREAK, NetworkTag, chunk_prompt, parse_emphasis, split_network_tags
from sdxl_tpu.request.request import ImageInfo

# A1111's modules/prompt_parser.py, parse_prompt_attention's docstring: every example, verbatim.
A1111_EXAMPLES = [
    ("normal text", [["normal text", 1.0]]),
    ("an (important) word", [["an ", 1.0], ["important", 1.1], [" word", 1.0]]),
    ("(unbalanced", [["unbalanced", 1.1]]),
    ("\\(literal\\]", [["(literal]", 1.0]]),
    ("(unnecessary)(parens)", [["unnecessaryparens", 1.1]]),
    ("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
     [["a ", 1.0], ["house", 1.5730000000000004], [" ", 1.1], ["on", 1.0], [" a ", 1.1], ["hill", 0.55],
      [", sun, ", 1.1], ["sky", 1.4641000000000006], [".", 1.1]]),
]


@pytest.mark.parametrize("text, expected", A1111_EXAMPLES)
def test_a1111_docstring_examples(text, expected):
    assert [list(p) for p in parse_emphasis(text)] == expected


def test_escapes_break_nesting_and_what_is_text():
    assert parse_emphasis("\\(a\\) \\[b\\] c\\\\d") == [("(a) [b] c\\d", 1.0)]
    assert parse_emphasis("a lone \\ backslash") == [("a lone  backslash", 1.0)]  # dropped, as A1111 drops it
    assert parse_emphasis("[[x]]") == [("x", 1 / 1.1 / 1.1)]
    assert parse_emphasis("((a [b] c))") == [("a ", 1.1 * 1.1), ("b", 1.1 * 1.1 / 1.1), (" c", 1.1 * 1.1)]
    assert parse_emphasis("((cat:-1))") == [("cat", -1.1)]  # (a weight of -1 is not taken for BREAK's marker)
    assert parse_emphasis("(x:0.5) (y:-1) (z:+2)") == [("x", 0.5), (" ", 1.0), ("y", -1.0), (" ", 1.0), ("z", 2.0)]
    # A weight that is not a number is text (A1111 would fail on "1.2.3"); ":" alone is text.
    assert parse_emphasis("(cat:abc)") == [("cat:abc", 1.1)]
    assert parse_emphasis("(cat:1.2.3)") == [("cat:1.2.3", 1.1)]
    assert parse_emphasis("ratio 16:9, x:1.2) y") == [("ratio 16:9, x:1.2) y", 1.0)]
    assert parse_emphasis("a) b] c") == [("a) b] c", 1.0)]  # closers without openers are text
    # BREAK (a word of its own, in capitals) ends a chunk, also inside brackets.
    assert parse_emphasis("a BREAK b") == [("a", 1.0), BREAK, ("b", 1.0)]
    assert parse_emphasis("(a BREAK b)") == [("a", 1.1), BREAK, ("b", 1.1)]
    assert parse_emphasis("BREAKING break aBREAK") == [("BREAKING break aBREAK", 1.0)]
    assert parse_emphasis("") == [("", 1.0)]


def test_absurd_weights_are_refused_by_name(tiny_pipeline):
    for text, weight in [("a (cat:1e30)", "1e+30"), ("(dog:-500)", "-500"), ("a (cat:101)", "101")]:
        with pytest.raises(RequestError, match=re.escape(f"Prompt: the weight {weight} of '") + "(cat|dog)" +
                           re.escape("' is out of range; weights from -100 to 100 are accepted.")):
            tiny_pipeline.request(text, size=(64, 64))
    with pytest.raises(RequestError, match="Negative prompt: the weight 1000 of 'blur' is out of range"):
        tiny_pipeline.request("a cat", "(blur:1000)", size=(64, 64))
    tiny_pipeline.request("(cat:100) (dog:-100) ((((((((((x))))))))))", size=(64, 64))  # in range: taken


@pytest.fixture(scope="module")
def tokenizers(tiny_checkpoint):
    return load_tokenizers(tiny_checkpoint)


def ids_of(tokenizer, text: str) -> list[int]:
    return tokenizer(text, add_special_tokens=False).input_ids


def test_a_prompt_without_brackets_is_tokenized_as_diffusers_tokenizes_it(tokenizers):
    """What SDXL's pipeline would encode, for both tokenizers (the second pads with its own token)."""
    for tokenizer in tokenizers:
        for text in ["a cat on a mat", "", "a photo of the sky, red " * 12]:  # the last: 75 tokens kept of more
            expected = tokenizer(text, padding="max_length", max_length=77, truncation=True).input_ids
            chunks = chunk_prompt(tokenizer, text, 1)
            assert chunks.ids.tolist() == [expected] and (chunks.weights == 1).all()


def test_chunks_of_75_tokens_commas_break_and_the_limit(tokenizers):
    t = tokenizers[0]
    a, comma, start, end = 320, 267, t.bos_token_id, t.eos_token_id
    # 80 tokens: a full chunk and one of 5; start and end around each, end tokens as padding.
    c = chunk_prompt(t, "a " * 80, 3)
    assert c.ids.shape == (2, 77) and c.tokens == 80 and c.cut == 0
    assert c.ids[0].tolist() == [start] + [a] * 75 + [end]
    assert c.ids[1].tolist() == [start] + [a] * 5 + [end] * 71
    # The second tokenizer pads with its own token after the first end token, as A1111 does.
    c2 = chunk_prompt(tokenizers[1], "a " * 80, 3)
    assert c2.ids[1].tolist() == [start] + [a] * 5 + [end] + [tokenizers[1].pad_token_id] * 70
    # A chunk that fills up moves the text after its last comma to the next, if within 20 tokens.
    c = chunk_prompt(t, "a " * 60 + ", " + "a " * 30, 3)
    assert c.ids[0].tolist() == [start] + [a] * 60 + [comma] + [end] * 15
    assert c.ids[1].tolist() == [start] + [a] * 30 + [end] * 46 and c.tokens == 75 + 30
    c = chunk_prompt(t, "a " * 40 + ", " + "a " * 50, 3)  # the comma is 35 tokens back: no move
    assert c.ids[0].tolist() == [start] + [a] * 40 + [comma] + [a] * 34 + [end]
    # BREAK ends a chunk; emphasis weighs the tokens it covers, and nothing else.
    c = chunk_prompt(t, "a (red:1.5) BREAK [sky]", 3)
    assert c.ids[:, :4].tolist() == [[start, a, 647, end], [start, 634, end, end]]
    assert c.weights[:, :4].tolist() == [[1, 1, 1.5, 1], [1, np.float32(1 / 1.1), 1, 1]]
    assert (c.weights[:, 4:] == 1).all() and c.tokens == 75 + 1
    # Past the last chunk the text is cut, and counted.
    c = chunk_prompt(t, "a " * 240, 3)
    assert c.count == 3 and c.tokens == 225 and c.cut == 15
    assert chunk_prompt(t, "a " * 240, 1).cut == 165


def test_lora_tags_are_taken_out_never_encoded(tokenizers):
    """A1111's <lora:name:weight> (and its other extra networks' tags) name a network to apply: no
    word of the prompt; the text around them is encoded as if they were not there."""
    assert split_network_tags("a cat <lora:detail:0.5>, <LORA:my style v2>  on a mat <hypernet:x:1:2>") == (
        "a cat , on a mat", [NetworkTag("lora", "detail", 0.5, "<lora:detail:0.5>"),
                             NetworkTag("lora", "my style v2", None, "<LORA:my style v2>"),
                             NetworkTag("hypernet", "x", 1.0, "<hypernet:x:1:2>")])
    assert split_network_tags("<lora:a:abc> <lyco:b:-0.5:unet=1>")[1] == [
        NetworkTag("lora", "a", None, "<lora:a:abc>"), NetworkTag("lyco", "b", -0.5, "<lyco:b:-0.5:unet=1>")]
    assert split_network_tags("a <b>, x:1 <lora:> <embedding:y>") == ("a <b>, x:1 <lora:> <embedding:y>", [])
    assert split_network_tags("<lora:x:1 unclosed <lora:y>")[1] == [NetworkTag("lora", "y", None, "<lora:y>")]
    start = time.perf_counter()  # unclosed tags: each try stops at the next one (to the end: 5 to 10 s)
    assert split_network_tags("<lora:a:1 " * 6000)[1] == []
    assert time.perf_counter() - start < 0.5
    for tokenizer in tokenizers:
        for tagged, plain in [("a cat <lora:detail:0.5> on a mat", "a cat on a mat"),
                              ("(a cat:1.2) <lora:x> BREAK sky", "(a cat:1.2) BREAK sky"),
                              ("<lora:only:1>", "")]:
            with_tag, without = chunk_prompt(tokenizer, tagged, 3), chunk_prompt(tokenizer, plain, 3)
            assert with_tag.ids.tolist() == without.ids.tolist() and with_tag.tokens == without.tokens, tagged
            assert with_tag.weights.tolist() == without.weights.tolist()
    assert len(ids_of(tokenizers[0], "<lora:detail:0.5>")) > 5  # (as text, the tag would be tokens)


def a1111_embeddings(te1, te2, chunks1, chunks2):
    """A1111's SDXL text conditioning written out in PyTorch (float64 for the arithmetic): per
    encoder and chunk, the penultimate hidden states times each token's weight, rescaled to their
    mean before; chunks side by side, the encoders' features concatenated; the pooled embedding
    of the first chunk, unweighted."""
    out = []
    for encoder, chunks in ((te1, chunks1), (te2, chunks2)):
        zs = []
        for ids, weights in zip(chunks.ids, chunks.weights, strict=True):
            with torch.no_grad():
                z = encoder(torch.from_numpy(ids[None]).long(), output_hidden_states=True).hidden_states[-2][0].double()
            weighted = z * torch.from_numpy(weights).double()[:, None]
            zs.append(weighted * (z.mean() / weighted.mean()))
        out.append(torch.cat(zs))
    with torch.no_grad():
        pooled = te2(torch.from_numpy(chunks2.ids[:1]).long()).text_embeds[0].double()
    return torch.cat(out, dim=-1).numpy(), pooled.numpy()


def test_emphasis_and_long_prompts_match_a_pytorch_reference(tiny_pipeline, tiny_checkpoint):
    import transformers

    te1 = transformers.CLIPTextModel.from_pretrained(tiny_checkpoint / "text_encoder").eval()
    te2 = transformers.CLIPTextModelWithProjection.from_pretrained(tiny_checkpoint / "text_encoder_2").eval()
    texts = [  # (negative, prompt) per image
        ("", "a (red:1.4) [cat] on a ((mat))"),
        ("blurry, (bad hands:1.2)", "a photo of the sky, red " * 14),  # 2 chunks against 1
        ("[[dark]] " * 30 + "BREAK low quality", "a (dog:0.7) BREAK (sky:1.3), red"),
        ("x", "a photo of (the sky:1.2), red " * 24),  # 3 chunks, cut
    ]
    infos = [ImageInfo(seed=0, prompt=p, negative_prompt=n, guidance_scale=5.0, steps=1, size=(64, 64))
             for n, p in texts]
    k = tiny_pipeline.max_prompt_chunks
    text = sampling.prepare(tiny_pipeline.tokenizers, infos, True, k, tiny_pipeline.embeddings)
    encode = tiny_pipeline.compiled((64, 64))["encode"]
    context, pooled, _ = encode(tiny_pipeline.params["text_encoder"], tiny_pipeline.params["text_encoder_2"],
                                tiny_pipeline.params["unet"], *text[:7], text.zero_negative)
    context, pooled = np.asarray(context), np.asarray(pooled)
    assert context.shape[:3] == (4, 2, k * 77)
    for i, pair in enumerate(texts):
        for j, t in enumerate(pair):
            if not t:  # an empty negative prompt: zeros, as diffusers and A1111 do for SDXL
                assert not context[i, j].any() and not pooled[i, j].any()
                continue
            chunks1, chunks2 = (chunk_prompt(tok, t, k) for tok in tiny_pipeline.tokenizers)
            want, want_pooled = a1111_embeddings(te1, te2, chunks1, chunks2)
            n = 77 * chunks1.count
            assert text.lengths[i, j] == n
            err, err_pooled = rel_l2(context[i, j, :n], want), rel_l2(pooled[i, j], want_pooled)
            print(f"image {i} text {j}: {chunks1.count} chunk(s), rel L2 {err:.1e}, pooled {err_pooled:.1e}")
            assert err <= 1e-5 and err_pooled <= 1e-5
            assert not context[i, j, n:].any()  # the chunks it does not use: zeros, masked out of attention


@pytest.fixture(scope="module")
def one_chunk_pipeline(tiny_checkpoint, compile_cache):
    """The tiny model with room for one chunk: the programs as they were before long prompts."""
    return load_pipeline(tiny_checkpoint, dtype="float32", sizes=[(64, 64)], max_prompt_chunks=1,
                         compile_cache=compile_cache, warmup=False)


def pixels(pipe, prompt, negative="", seed=3):
    result = pipe.generate(prompt, negative, seed=seed, steps=3, size=(64, 64), guidance_scale=6.0)
    return np.stack([np.asarray(im) for im in result.images])


def test_prompts_make_the_images_a1111_users_expect(tiny_pipeline, one_chunk_pipeline):
    """A short prompt gives exactly the image of a program without room for more; brackets are
    emphasis, not text; text past the first chunk counts, past the last it is cut; nothing
    recompiles."""
    base = pixels(one_chunk_pipeline, "a cat on a mat", "blurry")
    with CompileCounter() as counter:
        assert np.array_equal(pixels(tiny_pipeline, "a cat on a mat", "blurry"), base)
        assert np.array_equal(pixels(tiny_pipeline, "a (cat:1.0) on a mat", "blurry"), base)
        assert np.array_equal(pixels(tiny_pipeline, "a ((cat)) on a mat"),
                              pixels(tiny_pipeline, "a (cat:1.21) on a mat"))
        assert not np.array_equal(pixels(tiny_pipeline, "a (cat:1.5) on a mat", "blurry"), base)
        head = "a photo of the sky, red " * 15  # 90 tokens
        long_a, long_b = pixels(tiny_pipeline, head + "cat"), pixels(tiny_pipeline, head + "dog")
        assert not np.array_equal(long_a, long_b)
        assert np.array_equal(pixels(one_chunk_pipeline, head + "cat"), pixels(one_chunk_pipeline, head + "dog"))
        head = "a photo of the sky, red " * 40  # 240 tokens: past the third chunk
        assert np.array_equal(pixels(tiny_pipeline, head + "cat"), pixels(tiny_pipeline, head + "dog"))
        # A1111's LoRA tags are not words: the image of the text without them.
        assert np.array_equal(pixels(tiny_pipeline, "a cat <lora:detail:0.5> on a mat", "<lora:x:1> blurry"), base)
        assert np.array_equal(pixels(tiny_pipeline, "a cat on a mat", "<lora:x:1>"),
                              pixels(tiny_pipeline, "a cat on a mat"))  # a negative prompt of tags alone: none
    assert counter.compiles == 0


def test_text_encoding_runs_only_the_chunks_the_prompts_fill(tiny_pipeline):
    """The encode program loops over the chunks (a scan) and encodes a chunk only where the call's
    longest prompt fills it (a cond: the encoders, or zeros): one copy of each text encoder in the
    program, however many chunks it has room for (one branch per chunk count held three copies,
    and compiled three times as long); a long prompt's second chunk changes the images."""
    from sdxl_tpu.bench.flops import _sub_jaxprs, jaxpr_flops

    def find(jaxpr, name: str) -> list:
        eqns = getattr(jaxpr, "jaxpr", jaxpr).eqns
        return [e for e in eqns if e.primitive.name == name] + [
            s for e in eqns if e.primitive.name != name for sub in _sub_jaxprs(e) for s in find(sub, name)]

    assert tiny_pipeline.max_prompt_chunks == 3
    program = tiny_pipeline.trace("encode", (64, 64)).jaxpr
    (scan,) = find(program, "scan")
    assert scan.params["length"] == 3
    (cond,) = [e for e in scan.params["jaxpr"].jaxpr.eqns if e.primitive.name == "cond"]
    work = sorted(jaxpr_flops(branch) for branch in cond.params["branches"])
    assert work[0] == 0 < work[1], work  # zeros, or the encoders
    # All the program's matrix work is that one branch's (nothing encodes outside the loop).
    assert sum(jaxpr_flops(e.params["jaxpr"]) for e in find(program, "scan")) == work[1]
    kwargs = dict(seed=3, steps=2, size=(64, 64), guidance_scale=5.0)
    long = "a red chair, " * 30  # (some 120 tokens: two chunks)
    varied = tiny_pipeline.generate(long + "in a garden", "blurry", **kwargs)
    other = tiny_pipeline.generate(long + "on the moon", "blurry", **kwargs)
    assert not np.array_equal(np.stack(varied.images), np.stack(other.images))
