"""Prompts as AUTOMATIC1111 writes them: emphasis, BREAK, and chunks of 75 tokens.

    "a (cat:1.3) BREAK [sky]" -> [("a ", 1.0), ("cat", 1.3), BREAK, ("sky", 1/1.1)]
                              -> chunks of token ids (k, 77) and one weight per token (k, 77)

`(text)` multiplies the attention to text by 1.1, `[text]` divides it by 1.1, `(text:w)` sets the
factor w, nesting multiplies; `\\(` `\\)` `\\[` `\\]` `\\\\` are literal characters; an unclosed
bracket applies to the end; a weight that is not a number is text (one with an exponent, as
1e30, is a weight here, to be refused when out of range, where A1111 reads it as text).
`BREAK` ends a chunk (also inside brackets, where A1111 would weigh it as the word).

A chunk is 75 tokens between a start and an end token, padded with end tokens (and, for an
encoder whose padding token differs, with that after the first end token, as its tokenizer pads).
When a chunk fills up, the text after its last comma moves to the next chunk if that comma is
among its last 20 tokens. `<lora:name:weight>` tags (A1111's extra networks) are not words: they
are taken out before anything is encoded. A textual inversion embedding named in the text (its
tokens, as A1111 finds them) takes as many positions as it has vectors, all in one chunk (the next
one where it does not fit), its weight the text's. Host-side only: no JAX here, a front end counts
tokens with it.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any
from dataclasses import dataclass, field

import numpy as np

CHUNK_TOKENS = 75       # tokens of text per chunk (77 with start and end)
COMMA_BACKTRACK = 20    # A1111's comma_padding_backtrack default
DEFAULT_MAX_CHUNKS = 3  # 225 tokens
MAX_CHUNKS = 8          # what --max-prompt-chunks allows: 600 tokens
MAX_WEIGHT = 100.0      # beyond this a weight is a typo (or an attack), not a wish
UP, DOWN = 1.1, 1 / 1.1

BREAK = ("BREAK", -1.0)  # the marker in a parsed prompt where a new chunk starts
EMBEDDED = -1  # the id at a position an embedding's vector fills (never a token's; not an end token's maximum)

_TOKEN = re.compile(r"""
    \\[()\[\]\\]          # an escaped bracket or backslash
  | \\                    # a lone backslash: text
  | \(                    # open emphasis
  | \[                    # open de-emphasis
  | :([+-]?[.\d]+(?:[eE][+-]?\d+)?)\)  # an explicit weight closing a round bracket
  | \)
  | ]
  | [^\\()\[\]:]+         # text
  | :                     # a colon that is not a weight: text
""", re.X)
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.S)


class PromptError(ValueError):
    """A prompt the user can fix (a weight out of range); the message says which."""


# A1111's extra-network tags: <lora:name>, <lora:name:weight> (more ":params" may follow), and
# the same for LyCORIS' (its extension's "lyco") and hypernetworks. No "<" inside one (A1111 allows
# it): each try then stops at the next tag, and a long text of unclosed tags is read in linear time.
_NETWORK_TAG = re.compile(r"<(lora|lyco|hypernet):([^:<>]+)(?::([^<>]*))?>", re.I)


@dataclass(frozen=True)
class NetworkTag:
    """An extra network named in a prompt, as A1111 users apply one."""
    kind: str  # "lora", "lyco" or "hypernet"
    name: str  # a LoRA's file stem, as A1111 names it
    weight: float | None  # the first number after the name; None: none given (A1111 applies 1)
    text: str  # as typed


def split_network_tags(text: str) -> tuple[str, list[NetworkTag]]:
    """A prompt -> the prompt without its extra-network tags (whitespace where they were
    collapsed) and the tags, in order."""
    tags = []
    for match in _NETWORK_TAG.finditer(text):
        first = (match.group(3) or "").split(":")[0].strip()
        tags.append(NetworkTag(match.group(1).lower(), match.group(2).strip(),
                               float(first) if _is_number(first) else None, match.group(0)))
    return (" ".join(_NETWORK_TAG.sub(" ", text).split()) if tags else text), tags


def parse_emphasis(text: str) -> list[tuple[str, float]]:
    """Text -> [(text, weight)], runs of equal weight merged; `BREAK` entries where chunks end."""
    parts: list[Any] = []  # [text, weight] lists (scaled in place); BREAK itself (a tuple) where a chunk ends
    round_open: list[int] = []
    square_open: list[int] = []

    def scale(start: int, factor: float) -> None:
        for part in parts[start:]:
            if part is not BREAK:  # (a text of weight -1 is still scaled)
                part[1] *= factor

    for match in _TOKEN.finditer(text):
        token, weight = match.group(0), match.group(1)
        if token.startswith("\\"):  # (a lone backslash is dropped, as A1111 drops it)
            parts.append([token[1:], 1.0])
        elif token == "(":
            round_open.append(len(parts))
        elif token == "[":
            square_open.append(len(parts))
        elif weight is not None and round_open and _is_number(weight):
            scale(round_open.pop(), float(weight))
        elif weight is not None and round_open:  # "(cat:1.2.3)": not a number, so text; ")" closes
            parts.append([token[:-1], 1.0])
            scale(round_open.pop(), UP)
        elif token == ")" and round_open:
            scale(round_open.pop(), UP)
        elif token == "]" and square_open:
            scale(square_open.pop(), DOWN)
        else:
            for i, piece in enumerate(_BREAK.split(token)):
                if i:
                    parts.append(BREAK)
                parts.append([piece, 1.0])
    for start in round_open:
        scale(start, UP)
    for start in square_open:
        scale(start, DOWN)
    merged: list[Any] = []
    for part in parts or [["", 1.0]]:
        if merged and part is not BREAK and merged[-1] is not BREAK and merged[-1][1] == part[1]:
            merged[-1][0] += part[0]
        else:
            merged.append(part)
    return [part if part is BREAK else (part[0], part[1]) for part in merged]


def _is_number(text: str) -> bool:
    try:
        return math.isfinite(float(text))
    except ValueError:
        return False


def check_weights(parsed: list[tuple[str, float]], name: str = "Prompt") -> None:
    """Refuses a weight no one means (|w| > 100, as `(cat:1e30)`), naming it and its text."""
    for text, weight in parsed:
        if (text, weight) != BREAK and abs(weight) > MAX_WEIGHT:
            shown = text.strip()[:30] or "(empty)"
            raise PromptError(f"{name}: the weight {weight:g} of '{shown}' is out of range; "
                              f"weights from {-MAX_WEIGHT:g} to {MAX_WEIGHT:g} are accepted.")


@dataclass(frozen=True)
class EmbeddingNames:
    """Textual inversion embeddings as one tokenizer reads their names (A1111's EmbeddingDatabase):
    a name's first token -> (its tokens, the name, its vector count), the longest names first."""
    by_first: dict[int, list[tuple[tuple[int, ...], str, int]]] = field(default_factory=dict)

    @staticmethod
    def of(tokenizer, counts: Mapping[str, int]) -> EmbeddingNames:
        by_first: dict[int, list[tuple[tuple[int, ...], str, int]]] = {}
        names = list(counts)
        ids = tokenizer(names, add_special_tokens=False, verbose=False).input_ids if names else []
        for name, tokens in zip(names, ids):
            if tokens:
                by_first.setdefault(tokens[0], []).append((tuple(tokens), name, counts[name]))
        for entries in by_first.values():
            entries.sort(key=lambda entry: -len(entry[0]))
        return EmbeddingNames(by_first)

    def at(self, tokens: list[int], position: int) -> tuple[int, str, int] | None:
        """The embedding whose name's tokens start at `position`: (its token count, name, vectors)."""
        for ids, name, count in self.by_first.get(tokens[position], ()):
            if tuple(tokens[position:position + len(ids)]) == ids:
                return len(ids), name, count
        return None


@dataclass(frozen=True)
class Chunks:
    """One prompt for one encoder, as it is encoded."""
    ids: np.ndarray       # (chunks, 77) int32; EMBEDDED where an embedding's vector goes
    weights: np.ndarray   # (chunks, 77) float32: each token's emphasis (1 for start, end, padding)
    tokens: int           # text tokens, as A1111 counts them (a full chunk counts 75)
    cut: int              # text tokens dropped past the last chunk allowed
    # Each embedding's vector in the chunks: (chunk, position in its 77, the embedding's name, which vector)
    embedded: tuple[tuple[int, int, str, int], ...] = ()

    @property
    def count(self) -> int:
        return len(self.ids)

    @property
    def embeddings(self) -> list[str]:
        """The embeddings used, each once, in order."""
        return list(dict.fromkeys(name for _, _, name, _ in self.embedded))


def chunk_prompt(tokenizer, text: str, max_chunks: int = DEFAULT_MAX_CHUNKS,
                 embeddings: EmbeddingNames | None = None) -> Chunks:
    """A prompt -> its chunks of token ids and weights, as A1111's CLIP wrapper builds them;
    at most `max_chunks` (the rest is cut and counted in `cut`); extra-network tags left out;
    the `embeddings` named in it placed."""
    parsed = parse_emphasis(split_network_tags(text)[0])
    texts = [t for t, w in parsed if (t, w) != BREAK]
    tokenized = iter(tokenizer(texts, add_special_tokens=False, verbose=False).input_ids if texts else [])
    comma = tokenizer.convert_tokens_to_ids(",</w>")
    chunks: list[tuple[list[int], list[float], list[Any]]] = []
    ids: list[int] = []
    weights: list[float] = []
    vectors: list[Any] = []  # per position: (embedding, vector) or None for a token
    last_comma = -1
    counted = 0

    def close(last: bool = False) -> None:
        nonlocal ids, weights, vectors, last_comma, counted
        counted += len(ids) if last else CHUNK_TOKENS
        chunks.append((ids, weights, vectors))
        ids, weights, vectors, last_comma = [], [], [], -1

    for text, weight in parsed:
        if (text, weight) == BREAK:
            close()
            continue
        tokens, position = next(tokenized), 0
        while position < len(tokens):
            token = tokens[position]
            found = embeddings.at(tokens, position) if embeddings else None
            if found is not None:  # (A1111: a whole embedding in one chunk, no comma moved for it)
                length, name, count = found
                if len(ids) + count > CHUNK_TOKENS:
                    close()
                ids += [EMBEDDED] * count
                weights += [weight] * count
                vectors += [(name, j) for j in range(count)]
                position += length
                continue
            position += 1
            if token == comma:
                last_comma = len(ids)
            elif len(ids) == CHUNK_TOKENS and last_comma != -1 and len(ids) - last_comma <= COMMA_BACKTRACK:
                moved = ids[last_comma + 1:], weights[last_comma + 1:], vectors[last_comma + 1:]
                ids, weights, vectors = ids[:last_comma + 1], weights[:last_comma + 1], vectors[:last_comma + 1]
                close()
                ids, weights, vectors = list(moved[0]), list(moved[1]), list(moved[2])
            if len(ids) == CHUNK_TOKENS:
                close()
            ids.append(token)
            weights.append(weight)
            vectors.append(None)
    if ids or not chunks:
        close(last=True)
    kept = chunks[:max_chunks]
    cut = sum(len(i) for i, _, _ in chunks[max_chunks:])
    start, end = tokenizer.bos_token_id, tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else end
    out_ids = np.full((len(kept), CHUNK_TOKENS + 2), pad, np.int32)
    out_weights = np.ones((len(kept), CHUNK_TOKENS + 2), np.float32)
    for row, (chunk_ids, chunk_weights, _) in enumerate(kept):
        n = len(chunk_ids)
        out_ids[row, 0], out_ids[row, 1:n + 1], out_ids[row, n + 1] = start, chunk_ids, end
        if pad != end:  # A1111 pads with end tokens, then (SD2, SDXL's second encoder) with padding after the first
            out_ids[row, n + 2:] = pad
        else:
            out_ids[row, n + 2:] = end
        out_weights[row, 1:n + 1] = chunk_weights
    embedded = tuple((row, column + 1, *source) for row, (_, _, sources) in enumerate(kept)
                     for column, source in enumerate(sources) if source is not None)
    tokens = counted if len(chunks) <= max_chunks else CHUNK_TOKENS * max_chunks
    return Chunks(out_ids, out_weights, tokens=tokens, cut=cut, embedded=embedded)
