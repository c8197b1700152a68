"""The tiny checkpoint's version and its two CLIP tokenizers: a small byte-level BPE vocabulary,
learned from a few hundred words, in CLIPTokenizer's files. JAX-free, so a front end whose back
ends serve "tiny" counts tokens without loading JAX (weights/hub.py); tiny.py writes the rest.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path

TINY_VERSION = 1  # bump when the checkpoint (tiny.py and these tokenizers) changes

# A few hundred words of the kind people type; the BPE merges are learned from them.
_CORPUS = """a photo of an astronaut riding a horse on the moon, a cat sitting on a red chair, portrait of a
woman with long hair, cinematic lighting, highly detailed, digital painting, landscape with mountains and a lake
at sunset, anime style girl, pixel art castle, neon city at night, 3d render of a robot, fantasy dragon flying
over a forest, watercolor flowers, oil painting of a ship in a storm, blurry, low quality, ugly, deformed, text,
watermark, photograph, sharp focus, dog, bird, tree, house, street, beach, snow, rain, sky, clouds, sun"""
_NUM_MERGES = 200


def _bytes_to_unicode() -> dict[int, str]:
    # GPT-2/CLIP's reversible byte -> printable character table.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def build_vocabulary(num_merges: int = _NUM_MERGES) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """A byte-level BPE vocabulary in CLIP's format, with merges learned from a small corpus.

    As in CLIP, every byte character exists alone and with the end-of-word marker, and the two
    special tokens come last, so <|endoftext|> has the highest id.
    """
    chars = list(_bytes_to_unicode().values())
    vocab_list = chars + [c + "</w>" for c in chars]
    words: Counter[str] = Counter(_CORPUS.lower().replace(",", " ").split())
    splits: dict[str, list[str]] = {w: [*w[:-1], w[-1] + "</w>"] for w in words}
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: Counter = Counter()
        for w, parts in splits.items():
            for a, b in zip(parts, parts[1:]):
                pairs[a, b] += words[w]
        if not pairs:
            break
        best = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))[0]
        merges.append(best)
        vocab_list.append(best[0] + best[1])
        for w, parts in splits.items():
            merged, i = [], 0
            while i < len(parts):
                if i + 1 < len(parts) and (parts[i], parts[i + 1]) == best:
                    merged.append(parts[i] + parts[i + 1])
                    i += 2
                else:
                    merged.append(parts[i])
                    i += 1
            splits[w] = merged
    vocab_list += ["<|startoftext|>", "<|endoftext|>"]
    return {tok: i for i, tok in enumerate(vocab_list)}, merges


def write_tokenizer(directory: str | os.PathLike, vocab: dict[str, int], merges: list[tuple[str, str]],
                    pad_token: str) -> None:
    """A CLIPTokenizer's files (vocab.json, merges.txt, special tokens, config) in `directory`."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False))
    (directory / "merges.txt").write_text("#version: 0.2\n" + "".join(f"{a} {b}\n" for a, b in merges))
    special = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "unk_token": "<|endoftext|>",
               "pad_token": pad_token}
    (directory / "special_tokens_map.json").write_text(json.dumps(special, indent=2))
    config = {"add_prefix_space": False, "clean_up_tokenization_spaces": True, "do_lower_case": True,
              "errors": "replace", "model_max_length": 77, "tokenizer_class": "CLIPTokenizer", **special}
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2))


def write_tokenizers(root: str | os.PathLike) -> int:
    """SDXL's two tokenizers (tokenizer/, tokenizer_2/: the same vocabulary, padded as SDXL base
    pads them) under `root`; returns the vocabulary size."""
    vocab, merges = build_vocabulary()
    write_tokenizer(Path(root) / "tokenizer", vocab, merges, pad_token="<|endoftext|>")
    write_tokenizer(Path(root) / "tokenizer_2", vocab, merges, pad_token="!")
    return len(vocab)
