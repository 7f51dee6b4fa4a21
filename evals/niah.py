"""Needle-in-a-haystack retrieval: hide a needle at a chosen depth of a haystack of a chosen token length, ask for
it back, and map greedy accuracy (with binomial standard errors) over (length, depth).

The default variant is the classic passkey test of Mohtashami & Jaggi (2023, "Landmark Attention"; the test that
LongLoRA's `passkey_retrieval.py` reuses), word for word: the instruction, the noise sentences repeated to the
length, the needle "The pass key is 68246. Remember it. 68246 is the pass key." on its own line at the depth,
and the question ending in the answer prefix "What is the pass key? The pass key is", so the next tokens are the
key. The other variants change one thing each (`VARIANTS`, `--variant`): `natural` (clean prose instead of the
noise), `uuid` (a word key whose value is a uuid) and `chat` (through the chat template).

Every sample has its own seed, from (seed, length, depth, sample index): its own key and its own haystack.

    linzoo eval niah --model embedded --lengths 256,512,1024,2048 --depths 0,0.25,0.5,0.75,1 --out outputs/niah
    linzoo eval niah --model runs/main --variant natural --lengths 512,1024 --out runs/main/eval/niah-natural
"""

from __future__ import annotations

import bisect
import hashlib
import json
import math
import os
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import torch
from tqdm.auto import tqdm

from .common import (EVAL_DIR, NOT_MEASURED, EvalSpec, ModelArguments, check_out_dir, load_texts,
                     measured, model_device, output_cache, run_on_models, name_of, parse_list, render, write_json)

SCHEMA = "linzoo.niah/v1"
# The classic test's words as landmark-attention and LongLoRA write them ("memorize them" included).
INTRO = ("There is an important info hidden inside a lot of irrelevant text. Find it and memorize them. "
         "I will quiz you about the important information there.")
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
KEY_WORDS = ("anchor", "apple", "bottle", "candle", "carpet", "castle", "cherry", "copper", "dragon", "engine",
             "falcon", "guitar", "hammer", "jacket", "kettle", "ladder", "lantern", "marble", "mirror", "orange",
             "pencil", "pepper", "pillow", "planet", "pocket", "rabbit", "ribbon", "rocket", "saddle", "silver",
             "spider", "statue", "tiger", "tunnel", "violin", "wallet", "wizard", "zipper")  # none is in NOISE


@dataclass(frozen=True)
class Needle:
    sentence: str  # what is hidden in the haystack
    question: str
    answer_prefix: str  # the prompt's last words, so that the answer is what comes next
    answer: str


def passkey_needle(rng: random.Random) -> Needle:
    key = str(rng.randint(10_000, 99_999))  # five digits, like the example in the papers
    return Needle(f"The pass key is {key}. Remember it. {key} is the pass key.", "What is the pass key?",
                  "The pass key is", key)


def uuid_needle(rng: random.Random) -> Needle:
    word, value = rng.choice(KEY_WORDS), str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return Needle(f"The value for key {word} is {value}.", f"What is the value for key {word}?",
                  f"The value for key {word} is", value)


NEEDLES = {"passkey": passkey_needle, "uuid": uuid_needle}
MAX_NEW_TOKENS = {"passkey": 16, "uuid": 48}  # the answer, with room for a few words before it
PROMPT_FORMATS = ("raw", "chat")


@dataclass(frozen=True)
class Variant:
    needle: str  # a NEEDLES name (niah.json's "needle")
    haystack: str  # "noise": NOISE repeated; "prose": clean prose (`prose`) from --filler
    prompt_format: str  # "raw" text, or "chat": one user turn of the tokenizer's chat template
    about: str


VARIANTS = {
    "passkey": Variant("passkey", "noise", "raw", "the classic passkey test"),
    "natural": Variant("passkey", "prose", "raw", "the pass key in clean prose (--filler, no play text, no digits)"),
    "uuid": Variant("uuid", "noise", "raw", "a word key whose value is a uuid, in the noise"),
    "chat": Variant("passkey", "noise", "chat", "the passkey test as a user turn of the chat template, the "
                    "assistant's turn started with the answer prefix"),
}


def get_variant(name: str) -> Variant:
    if name not in VARIANTS:
        raise ValueError(f"unknown NIAH variant {name!r}: pick one of {', '.join(VARIANTS)}")
    return VARIANTS[name]


@dataclass
class NiahSample:
    prompt: str  # the exact text fed to the tokenizer (chat template already applied)
    needle: str
    answer: str
    question: str
    haystack: str
    needle_span: tuple[int, int]  # char span of the needle inside `haystack`, for highlighting
    n_tokens: int  # tokens of `prompt` as run_niah encodes it
    context_len: int
    depth: float
    needle_type: str
    prompt_format: str


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def short_lined(text: str) -> bool:
    """Laid out in short lines: a play script, verse or hard-wrapped Gutenberg text (the embedded corpus's
    Shakespeare), where a Wikipedia lead's prose runs in long lines."""
    lines = [line for line in text.split("\n") if line.strip()]
    return len(lines) >= 3 and sum(len(line) < 100 for line in lines) > len(lines) / 2


@lru_cache(maxsize=4)
def _prose(texts: tuple[str, ...]) -> tuple[str, ...]:
    paragraphs = []
    for text in texts:
        if not short_lined(text):
            kept = [s for s in _SENTENCE_END.split(" ".join(text.split())) if not re.search(r"\d", s)]
            paragraphs += [" ".join(kept)] if kept else []
    if not paragraphs:
        raise ValueError("no prose left for the haystack: every text is laid out in short lines or has a digit in "
                         "every sentence (give a .txt of prose, one paragraph per line)")
    return tuple(paragraphs)


def prose(texts: list[str]) -> list[str]:
    """The natural variant's filler: texts laid out in short lines dropped (`short_lined`), the rest one paragraph
    each with every sentence that holds a digit dropped (a number in the haystack would compete with the key)."""
    return list(_prose(tuple(texts)))


def format_prompt(tokenizer, haystack: str, question: str, prompt_format: str, answer_prefix: str = "") -> str:
    """The classic layout, one part per line: instruction, haystack, question and answer prefix. In "chat" the
    instruction, haystack and question are one user turn and the answer prefix starts the assistant's turn."""
    if prompt_format == "raw":
        return "\n".join(p for p in (INTRO, haystack, f"{question} {answer_prefix}".strip()) if p)
    if prompt_format == "chat":
        message = {"role": "user", "content": "\n".join(p for p in (INTRO, haystack, question) if p)}
        return tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=True) + answer_prefix
    raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")


def _encode_kwargs(prompt_format: str) -> dict:
    # A chat template already writes its own special tokens; a raw prompt gets the tokenizer's BOS.
    return {"add_special_tokens": prompt_format == "raw"}


def _filler(kind: str, texts: list[str] | None, rng: random.Random, min_chars: int) -> tuple[str, list[int]]:
    """(text, ends): at least `min_chars` of this sample's filler and the offsets right after each of its sentences.
    Noise: NOISE's sentences in a cycle from a random one on, one line. Prose: the paragraphs in a random order
    (reshuffled on every pass), one per line."""
    if kind == "noise":
        sentences = _SENTENCE_END.split(NOISE)
        first = rng.randrange(len(sentences))
        cycle = sentences[first:] + sentences[:first]
        paragraphs = [cycle * (min_chars // len(NOISE) + 1)]
    else:
        paragraphs, chars = [], 0
        while chars < min_chars:
            order = list(texts)
            rng.shuffle(order)
            paragraphs += [_SENTENCE_END.split(p) for p in order]
            chars += sum(len(p) + 1 for p in order)
    text, ends = "", []
    for paragraph in paragraphs:
        for i, sentence in enumerate(paragraph):
            text += ("\n" if text and i == 0 else " " if text else "") + sentence
            ends.append(len(text))
    return text, ends


def build_haystack(tokenizer, filler_texts: list[str] | None, context_len: int, depth: float,
                   variant: str = "passkey", seed: int = 0) -> NiahSample:
    """One prompt of the variant, at most `context_len` tokens and within a sentence of it: the filler cut at a
    sentence end, the needle on its own line after a `depth` share of the filler (0.0 = right after the
    instruction, 1.0 = right before the question), at the sentence end nearest to that share. The seed fixes the
    needle and the haystack; `filler_texts` is read by the prose variant only (and cleaned by `prose`)."""
    spec = get_variant(variant)
    rng = random.Random(seed)
    needle = NEEDLES[spec.needle](rng)
    texts = prose(filler_texts or []) if spec.haystack == "prose" else None

    def render(cut: int):  # the prompt whose filler is text[:cut], cut at a sentence end (or 0)
        at = min(round(min(max(depth, 0.0), 1.0) * cut), cut)
        i = bisect.bisect_right(ends, at)
        split = min((e for e in (0, cut, *ends[max(i - 1, 0):i + 1]) if e <= cut), key=lambda e: abs(e - at))
        pre, post = text[:split].rstrip(), text[split:cut].strip()
        haystack = "\n".join(p for p in (pre, needle.sentence, post) if p)
        start = len(pre) + 1 if pre else 0
        prompt = format_prompt(tokenizer, haystack, needle.question, spec.prompt_format, needle.answer_prefix)
        # only counted (a filler that overshoots is cut): no warning that the count exceeds the model's length
        n_tokens = len(tokenizer(prompt, verbose=False, **_encode_kwargs(spec.prompt_format))["input_ids"])
        return haystack, (start, start + len(needle.sentence)), prompt, n_tokens

    min_chars = 6 * context_len
    while True:  # enough filler that using all of it overshoots the target
        text, ends = _filler(spec.haystack, texts, rng, min_chars)
        if render(len(text))[3] > context_len:
            break
        min_chars *= 2
    if render(0)[3] > context_len:
        raise ValueError(f"context_len={context_len} is shorter than the needle and question alone")
    lo, hi = -1, len(ends) - 1  # invariant: a filler of ends[lo] characters fits (lo = -1: none); answer in [lo, hi]
    while lo < hi:  # the longest filler, at a sentence end, whose prompt fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if render(ends[mid])[3] <= context_len else (lo, mid - 1)
    haystack, span, prompt, n_tokens = render(ends[lo] if lo >= 0 else 0)
    return NiahSample(prompt, needle.sentence, needle.answer, needle.question, haystack, span, n_tokens, context_len,
                      depth, spec.needle, spec.prompt_format)


def sample_seed(seed: int, length: int, depth: float, index: int) -> int:
    """The seed of sample `index` of the (length, depth) cell: every sample gets its own needle and haystack."""
    return int.from_bytes(hashlib.sha256(f"{seed}/{length}/{depth:g}/{index}".encode()).digest()[:8], "big")


def is_hit(answer: str, text: str) -> bool:
    """The answer appears in the generated text as a whole (not inside a longer number or word)."""
    return re.search(rf"(?<![0-9A-Za-z]){re.escape(answer)}(?![0-9A-Za-z])", text) is not None


def _prepare_tokenizer(tokenizer):
    tokenizer.padding_side = "left"  # generation continues every row from its last real token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


@torch.inference_mode()
def _generate(model, tokenizer, samples: list[NiahSample], max_new_tokens: int | None = None) -> list[str]:
    _prepare_tokenizer(tokenizer)
    max_new_tokens = MAX_NEW_TOKENS[samples[0].needle_type] if max_new_tokens is None else max_new_tokens
    batch = tokenizer([s.prompt for s in samples], return_tensors="pt", padding=True,
                      **_encode_kwargs(samples[0].prompt_format)).to(model_device(model))
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def position_limit(config: dict) -> int | None:
    """The most positions (prompt and answer) a model takes, from its config.json dict: `max_position_embeddings`
    under the name its config class maps it to (GPT-2's `n_positions`). None when every layer is linear attention
    (`layer_types`), as in a linzoo student without softmax layers: its mixers index nothing by position (the
    teacher's number in its config serves a hybrid's RoPE layers only), so a length past the teacher's measures
    length extrapolation, bounded by memory alone."""
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    if softmax_layers(config) == 0:
        return None
    key, model_type = "max_position_embeddings", config.get("model_type")
    if model_type in CONFIG_MAPPING:
        key = CONFIG_MAPPING[model_type].attribute_map.get(key, key)
    return config.get(key)


def softmax_layers(config: dict) -> int | None:
    """How many layers are not linear attention, by the config's `layer_types`; None where it has none."""
    types = config.get("layer_types")
    return sum(t != "linear_attention" for t in types) if types else None


def check_positions(config: dict, lengths: list[int], new_tokens: int, name: str) -> None:
    """A ValueError when a prompt of one of `lengths` tokens plus its `new_tokens` answer passes the model's
    positions: past them a learnt position table fails (GPT-2's IndexError) and RoPE runs on untrained angles."""
    limit = position_limit(config)
    too_long = [length for length in lengths if limit is not None and length + new_tokens > limit]
    if too_long:
        raise ValueError(f"--lengths {','.join(map(str, too_long))}: {name} takes {limit} positions and the answer "
                         f"needs {new_tokens} of them: give lengths up to {limit - new_tokens}")


# Host memory per prompt token while the fast tokenizer encodes it into Python lists (measured: ~625 bytes with
# SmolLM2's tokenizer), and the prompt and haystack strings kept for every sample (two strings of at most ~6
# characters a token, the share build_haystack starts from; SmolLM2's tokenizer makes 3.75 of the noise).
TOKENIZE_BYTES, KEPT_BYTES = 640, 2 * 6
# One prefill's activations per prompt token in floats of the model's dtype, per unit of hidden_size and of
# intermediate_size: fitted to the peak memory of the 135M shape on CPU in fp32, 1,024-2,048 tokens x 2 rows
# (a Gated DeltaNet student 93-132 KB a token, Llama 80-153 KB with its KV cache).
PREFILL_FLOATS = (32, 8)


def generation_memory(model, lengths: list[int], prompts_per_length: int, batch_size: int,
                      new_tokens: int) -> tuple[int, int]:
    """(host bytes, device bytes), roughly, that `run_niah` needs beyond the loaded model: every prompt kept as
    text, the longest batch tokenized on the host, and its prefill (activations of one layer at a time, the
    softmax layers' KV cache, full logits where the model cannot keep only the last) on the model's device."""
    config = model.config
    rows = batch_size * (max(lengths) + new_tokens)
    host = KEPT_BYTES * prompts_per_length * sum(lengths) + TOKENIZE_BYTES * rows
    hidden = getattr(config, "hidden_size", None)
    if not hidden:  # a config without the usual names: the host's share is all we can tell
        return host, 0
    heads = getattr(config, "num_attention_heads", None) or 1
    kv_width = (getattr(config, "num_key_value_heads", None) or heads) * (getattr(config, "head_dim", None)
                                                                         or hidden // heads)
    attention = softmax_layers(config.to_dict())
    attention = getattr(config, "num_hidden_layers", 0) if attention is None else attention
    floats = PREFILL_FLOATS[0] * hidden + PREFILL_FLOATS[1] * (getattr(config, "intermediate_size", None) or 4 * hidden)
    floats += 2 * attention * kv_width + (0 if model._supports_logits_to_keep() else config.vocab_size)
    return host, rows * floats * next(model.parameters()).element_size()


def check_memory(model, lengths: list[int], prompts_per_length: int, batch_size: int, new_tokens: int) -> None:
    """A ValueError, before any prompt is built, when `generation_memory` exceeds the memory available now."""
    import psutil

    host, device = generation_memory(model, lengths, prompts_per_length, batch_size, new_tokens)
    where = model_device(model)
    if where.type == "cuda":
        needs = {"host": (host, psutil.virtual_memory().available), where: (device, torch.cuda.mem_get_info(where)[0])}
    else:
        needs = {where: (host + device, psutil.virtual_memory().available)}
    short = [f"about {need / 2**30:.1f} GiB on {place} ({free / 2**30:.1f} GiB available)"
             for place, (need, free) in needs.items() if need > free]
    if short:
        raise ValueError(f"NIAH up to {max(lengths):,} tokens, batch {batch_size}, needs {' and '.join(short)}: "
                         "use shorter --lengths, a smaller --batch_size, fewer --samples_per_cell or --depths, or a "
                         "machine with more memory")



def answer_one(model, tokenizer, sample: NiahSample, max_new_tokens: int | None = None) -> tuple[str, bool, float]:
    """One prompt, for the Space: (generated text, whether it contains the answer, seconds)."""
    start = time.perf_counter()
    text = _generate(model, tokenizer, [sample], max_new_tokens)[0]
    return text, is_hit(sample.answer, text), time.perf_counter() - start


@torch.inference_mode()
def _key_logprobs(model, tokenizer, samples: list[NiahSample]) -> list[float]:
    """log p(answer | prompt) of each sample, teacher-forced (nats, summed over the answer's tokens): how close a
    model that misses the key came to it. The answer follows the prompt's answer prefix after one space, as in the
    needle; its tokens (the space's included) are those that end past the prompt (offsets of prompt + answer,
    encoded together)."""
    _prepare_tokenizer(tokenizer)
    texts = [f"{s.prompt}{'' if s.prompt.endswith((' ', chr(10))) else ' '}{s.answer}" for s in samples]
    batch = tokenizer(texts, return_tensors="pt", padding=True, return_offsets_mapping=True,
                      **_encode_kwargs(samples[0].prompt_format))
    offsets = batch.pop("offset_mapping")
    scored = (offsets[:, 1:, 1] > torch.tensor([len(s.prompt) for s in samples])[:, None]) \
        & batch["attention_mask"][:, 1:].bool()  # [B, T - 1]: target t + 1 is an answer token
    # Left padding puts every answer at the end: only the last `keep` positions' logits are formed (all T of them,
    # [B, T, vocab] in fp32, were 6 GiB at 16 x 2048 and ran a shared card out of memory).
    keep = int(scored.shape[1] - scored.float().argmax(1).min()) if scored.any() else 1
    batch = batch.to(model_device(model))
    positions = (batch["attention_mask"].cumsum(-1) - 1).clamp_min(0)  # left padding: each row counts from 0
    logits = model(**batch, position_ids=positions, use_cache=False, logits_to_keep=keep + 1).logits[:, :-1]
    logp = torch.log_softmax(logits.float(), -1).gather(-1, batch["input_ids"][:, -keep:, None])[..., 0].cpu()
    return [float(logp[row][scored[row, -keep:]].sum()) for row in range(len(samples))]


@torch.inference_mode()
def _answer_and_score(model, tokenizer, samples: list[NiahSample], max_new_tokens: int | None = None
                      ) -> tuple[list[str], list[float]]:
    """`_generate`'s greedy answers and `_key_logprobs`'s teacher-forced key log-probabilities from one prefill: the
    prompts but their last token go through the model once; a copy of that cache scores the last token and the
    answer's tokens, and `generate` goes on from the cache itself (transformers' prefix caching), so the long prompt
    is not run twice (the two prefills were most of an eval's time on a CPU). Where prompt + answer does not encode
    as the prompt's tokens followed by the answer's, the two passes of old."""
    import copy

    _prepare_tokenizer(tokenizer)
    enc = _encode_kwargs(samples[0].prompt_format)
    joined = [f"{s.prompt}{'' if s.prompt.endswith((' ', chr(10))) else ' '}{s.answer}" for s in samples]
    batch = tokenizer([s.prompt for s in samples], return_tensors="pt", padding=True, **enc)
    alone = [row[keep.bool()].tolist() for row, keep in zip(batch["input_ids"], batch["attention_mask"])]
    full = tokenizer(joined, **enc)["input_ids"]
    if any(f[:len(a)] != a or len(f) == len(a) for a, f in zip(alone, full)):
        return _generate(model, tokenizer, samples, max_new_tokens), _key_logprobs(model, tokenizer, samples)
    answers = [f[len(a):] for a, f in zip(alone, full)]
    batch = batch.to(model_device(model))
    ids, mask = batch["input_ids"], batch["attention_mask"]
    positions = (mask.cumsum(-1) - 1).clamp_min(0)  # left padding: each row counts from 0
    out = model(input_ids=ids[:, :-1], attention_mask=mask[:, :-1], position_ids=positions[:, :-1], use_cache=True,
                logits_to_keep=1)
    name, cache = output_cache(out)
    # scoring: the last prompt token and the answer's tokens but its last, each predicting the next answer token
    width = max(map(len, answers))
    tail = torch.full((len(samples), width), tokenizer.pad_token_id, dtype=ids.dtype)
    for row, answer in enumerate(answers):
        tail[row, :len(answer)] = torch.tensor(answer)
    tail = tail.to(ids.device)
    steps = torch.cat([ids[:, -1:], tail[:, :-1]], 1)
    logits = model(input_ids=steps, attention_mask=torch.cat([mask, torch.ones_like(steps[:, 1:])], 1),
                   position_ids=positions[:, -1:] + torch.arange(width, device=ids.device), use_cache=True,
                   **{name: copy.deepcopy(cache)}).logits
    logp = torch.log_softmax(logits.float(), -1).gather(-1, tail[..., None])[..., 0].cpu()
    scored = [float(logp[row, :len(answer)].sum()) for row, answer in enumerate(answers)]
    new_tokens = MAX_NEW_TOKENS[samples[0].needle_type] if max_new_tokens is None else max_new_tokens
    generated = model.generate(input_ids=ids, attention_mask=mask, **{name: cache}, max_new_tokens=new_tokens,
                               do_sample=False, pad_token_id=tokenizer.pad_token_id,
                               eos_token_id=tokenizer.eos_token_id)
    return tokenizer.batch_decode(generated[:, ids.shape[1]:], skip_special_tokens=True), scored


def summarize(hits: dict[tuple[int, float], list[bool]], lengths: list[int], depths: list[float]) -> dict:
    """Accuracy of every cell with its binomial standard error sqrt(p (1 - p) / n); the mean over depths of each
    length and the mean over all cells, each with the standard error of a mean of independent cells,
    sqrt(sum of the cells' se^2) / cells."""
    def mean_se(ses):
        return math.sqrt(sum(s * s for s in ses)) / len(ses)

    accuracy = {str(l): {f"{d:g}": sum(hits[l, d]) / len(hits[l, d]) for d in depths} for l in lengths}
    se = {l: {d: math.sqrt(p * (1 - p) / len(hits[int(l), float(d)])) for d, p in row.items()}
          for l, row in accuracy.items()}
    cells = [p for row in accuracy.values() for p in row.values()]
    return {
        "accuracy": accuracy,
        "accuracy_se": se,
        "mean_by_length": {l: sum(row.values()) / len(row) for l, row in accuracy.items()},
        "mean_by_length_se": {l: mean_se(row.values()) for l, row in se.items()},
        "overall": sum(cells) / len(cells),
        "overall_se": mean_se([s for row in se.values() for s in row.values()]),
    }


def summarize_logprobs(logprobs: dict[int, list[float]]) -> dict:
    """The key's teacher-forced log-probability (nats), mean and standard error of the mean by length and over
    all samples; absent for a model that gives no logits (a stand-in)."""
    def mean_se(xs):
        m = sum(xs) / len(xs)
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs)) if len(xs) > 1 else 0.0

    every = [x for xs in logprobs.values() for x in xs]
    if not every or any(math.isnan(x) for x in every):
        return {}
    by_length = {str(n): mean_se(xs) for n, xs in logprobs.items()}
    overall, overall_se = mean_se(every)
    return {"key_logprob_by_length": {n: m for n, (m, _) in by_length.items()},
            "key_logprob_by_length_se": {n: se for n, (_, se) in by_length.items()},
            "key_logprob": overall, "key_logprob_se": overall_se}


def run_niah(model, tokenizer, lengths, depths, variant: str = "passkey", samples_per_cell: int = 10,
             batch_size: int = 4, filler: str | list[str] | None = None, seed: int = 0,
             max_new_tokens: int | None = None, model_name: str | None = None) -> dict:
    """Greedy retrieval accuracy over the (length, depth) grid, as the linzoo.niah/v1 dict. Every sample has its
    own needle and haystack (`sample_seed`); `filler` is the natural variant's text source (default "embedded",
    its held-out split)."""
    spec = get_variant(variant)
    lengths, depths = parse_list(lengths, int), parse_list(depths, float)
    if max_new_tokens is not None and max_new_tokens < 1:
        raise ValueError(f"max_new_tokens {max_new_tokens}: give at least 1 (None: the needle's default)")
    if hasattr(model, "config"):  # a transformers model (not a stand-in): within its positions and memory
        new_tokens = MAX_NEW_TOKENS[spec.needle] if max_new_tokens is None else max_new_tokens
        check_positions(model.config.to_dict(), lengths, new_tokens, model_name or name_of(model))
        check_memory(model, lengths, len(depths) * samples_per_cell, batch_size, new_tokens)
    if spec.haystack == "prose":
        filler = "embedded" if filler is None else filler
        texts = prose(load_texts(filler))
    elif filler is not None:
        raise ValueError(f"--filler is the natural variant's prose; the {variant} variant's haystack is the noise")
    else:
        texts = None
    samples = [build_haystack(tokenizer, texts, length, depth, variant, sample_seed(seed, length, depth, i))
               for length in lengths for depth in depths for i in range(samples_per_cell)]
    hits: dict[tuple[int, float], list[bool]] = {}
    logprobs: dict[int, list[float]] = {}
    examples = []  # the first sample of every cell: what was asked for and what came out
    for start in tqdm(range(0, len(samples), batch_size), desc=f"niah {variant}", unit="batch"):
        chunk = samples[start:start + batch_size]
        answered, scored = (_answer_and_score(model, tokenizer, chunk, max_new_tokens) if hasattr(model, "config")
                            else (_generate(model, tokenizer, chunk, max_new_tokens), [math.nan] * len(chunk)))
        for sample, text, lp in zip(chunk, answered, scored):
            cell = hits.setdefault((sample.context_len, sample.depth), [])
            if not cell:
                examples.append({"length": sample.context_len, "depth": sample.depth, "answer": sample.answer,
                                 "generated": text, "hit": is_hit(sample.answer, text)}
                                | ({} if math.isnan(lp) else {"key_logprob": lp}))
            cell.append(is_hit(sample.answer, text))
            logprobs.setdefault(sample.context_len, []).append(lp)
    return {
        "schema": SCHEMA,
        "model": model_name or name_of(model),
        "variant": variant,
        "needle": spec.needle,
        "prompt_format": spec.prompt_format,
        "filler": "noise" if texts is None else filler if isinstance(filler, str) else f"{len(filler)} texts",
        "lengths": lengths,
        "depths": depths,
        "samples_per_cell": samples_per_cell,
        **summarize(hits, lengths, depths),
        **summarize_logprobs(logprobs),
        "seed": seed,
        "examples": examples,
    }


def save_niah(results: dict, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Writes niah.json and niah_heatmap.png (rows = depth, columns = length; accuracy ± its standard error where
    the results have one)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "niah.json", out / "niah_heatmap.png"
    write_json(results, json_path)

    lengths, depths = [str(l) for l in results["lengths"]], [f"{d:g}" for d in results["depths"]]
    grid = [[results["accuracy"][l][d] for l in lengths] for d in depths]
    se = results.get("accuracy_se")
    fig = Figure(figsize=(1.3 * len(lengths) + 2.5, 0.6 * len(depths) + 2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for row, d in enumerate(depths):
        for col, l in enumerate(lengths):
            ax.text(col, row, f"{grid[row][col]:.2f}" + (f"±{se[l][d]:.2f}" if se else ""), ha="center",
                    va="center", fontsize=8 if se else 9)
    ax.set_xticks(range(len(lengths)), lengths)
    ax.set_yticks(range(len(depths)), depths)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    if "variant" in results:
        title = (f"NIAH {results['variant']}, {results['samples_per_cell']} per cell, overall "
                 f"{results['overall']:.2f}±{results['overall_se']:.2f}")
    else:  # written before variants and standard errors
        title = f"NIAH {results['needle']} ({results['prompt_format']}), overall {results['overall']:.2f}"
    ax.set_title(f"{results['model']}\n{title}", fontsize=10)
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


@dataclass
class NiahArguments(ModelArguments):
    out: str = field(default="outputs/niah", metadata={"help": "output folder (teacher results go in <out>/teacher)"})
    lengths: str = field(default="512,1024,2048,4096", metadata={"help": "context lengths in tokens, comma-separated"})
    depths: str = field(default="0,0.25,0.5,0.75,1", metadata={"help": "needle depths in [0, 1], comma-separated"})
    variant: str = field(default="passkey", metadata={"help": "; ".join(f"{name}: {v.about}"
                                                                        for name, v in VARIANTS.items())})
    samples_per_cell: int = field(default=10, metadata={"help": "prompts per (length, depth) cell, each its own"})
    filler: str | None = field(default=None, metadata={
        "help": "the natural variant's prose: 'embedded' (the default: its held-out split), a linzoo.data spec, "
                "or a .txt path (one paragraph per line)"})
    seed: int = 0
    max_new_tokens: int | None = field(default=None, metadata={"help": "default: 16 for a pass key, 48 for a uuid"})
    LIMITS = {"samples_per_cell": {"min": 1}, "max_new_tokens": {"min": 1}}

    def __post_init__(self):
        super().__post_init__()
        # checked here, before any model loads (the grid itself is built only after loading)
        if get_variant(self.variant).haystack != "prose" and self.filler is not None:
            raise ValueError(f"--filler is the natural variant's prose; --variant {self.variant} hides the needle "
                             "in the noise sentences")
        if self.samples_per_cell < 1:
            raise ValueError(f"--samples_per_cell {self.samples_per_cell}: give at least 1 (10 or more for a "
                             "standard error below 0.16)")
        for flag, value, cast, valid, want, example in (
                ("--lengths", self.lengths, int, lambda v: v > 0, "positive token counts", "512,1024,2048"),
                ("--depths", self.depths, float, lambda v: 0.0 <= v <= 1.0, "needle depths in [0, 1]", "0,0.5,1")):
            try:
                values = parse_list(value, cast)
            except ValueError as err:
                if "more than once" in str(err):
                    raise ValueError(f"{flag} {err}") from None
                values = []
            if not values or not all(map(valid, values)):
                raise ValueError(f"{flag} {value!r}: give {want}, comma-separated, e.g. {flag} {example}")
        from linzoo.loading import read_config

        new_tokens = self.max_new_tokens
        if new_tokens is None:
            new_tokens = MAX_NEW_TOKENS[get_variant(self.variant).needle]
        for spec in filter(None, (self.model, self.teacher)):  # config.json only: no model loads, no code runs
            check_positions(read_config(spec), parse_list(self.lengths, int), new_tokens, spec)
        check_out_dir(self.out)


def main(argv: list[str] | None = None) -> dict:
    from linzoo.arguments import parse_arguments

    (args,) = parse_arguments(NiahArguments, argv)
    def evaluate(spec, out, model, tokenizer):
        r = run_niah(model, tokenizer, args.lengths, args.depths, args.variant, args.samples_per_cell,
                     args.batch_size, args.filler, args.seed, args.max_new_tokens, model_name=spec)
        by_length = ", ".join(f"{l}: {p:.2f}±{r['mean_by_length_se'][l]:.2f}" for l, p in r["mean_by_length"].items())
        print(f"{spec}: NIAH {args.variant} {by_length}; overall {r['overall']:.3f}±{r['overall_se']:.3f} "
              f"-> {save_niah(r, out)[0]}")
        return r

    all_results = run_on_models(args, evaluate)
    return all_results[0]


def card_results(n: dict) -> list:
    """The model-index entries of a niah.json: overall accuracy and the accuracy at each length."""
    from huggingface_hub import EvalResult

    variant = n.get("variant")  # absent in results made before the variants
    test = f"{variant} variant" if variant and variant != "passkey" else f"{n['needle']}, {n['prompt_format']} prompt"
    where = dict(task_type="text-generation", dataset_type=f"linzoo-niah-{variant or n['needle']}",
                 dataset_name=f"needle in a haystack ({test})")
    return [EvalResult(**where, metric_type="accuracy", metric_name="overall accuracy", metric_value=n["overall"]),
            *(EvalResult(**where, metric_type="accuracy", metric_name=f"accuracy at {length} tokens",
                         metric_config=str(length), metric_value=value)
              for length, value in n["mean_by_length"].items())]


CARD_SECTION = """### Needle in a haystack{% if niah and niah.variant and niah.variant != "passkey" %} ({{ niah.variant }} variant){% endif %}
{% if niah %}
Greedy retrieval of a {{ niah.needle }} needle ({{ niah.prompt_format }} prompt, {{ niah.samples_per_cell }} samples per cell, depths {{ niah.depths | join(", ") }}): overall accuracy **{{ overall }}**.

| context length (tokens) | accuracy |
|---|---|
{% for length, acc in rows %}| {{ length }} | {{ acc }} |
{% endfor %}{% else %}
{{ not_measured }}
{% endif %}{% if heatmap %}
![NIAH accuracy by context length and needle depth]({{ heatmap }})
{% endif %}
"""
HEATMAPS = (f"{EVAL_DIR}/niah_heatmap.png", "niah_heatmap.png")  # where a checkpoint folder may hold the heatmap


def card_section(n: dict | None, folder: Path, sub: str = "") -> str:
    heatmaps = (f"{EVAL_DIR}/{sub}/niah_heatmap.png",) if sub else HEATMAPS
    return render(CARD_SECTION, niah=n, overall=measured(n and n["overall"], "{:.3f}"),
                  rows=[[length, f"{acc:.2f}"] for length, acc in n["mean_by_length"].items()] if n else [],
                  heatmap=next((h for h in heatmaps if (folder / h).is_file()), None), not_measured=NOT_MEASURED)


def space_row(data: dict) -> list:
    variant = data.get("variant", data["needle"])  # files written before variants: the needle's name
    se = data.get("mean_by_length_se")  # standard errors, where the file has them
    by_length = ", ".join(f"{length}: {acc:.2f}" + (f"±{se[length]:.2f}" if se else "")
                          for length, acc in data["mean_by_length"].items())
    overall = f"{data['overall']:.3f}" + (f"±{data['overall_se']:.3f}" if "overall_se" in data else "")
    return [data["model"], variant, data["prompt_format"], overall, by_length]


EVAL = EvalSpec(
    arguments=NiahArguments,
    title="NIAH", name="niah", help="needle-in-a-haystack retrieval (JSON + heatmap)", schema=SCHEMA, result_file="niah.json",
    figures=("niah_heatmap.png",), main=main, card_results=card_results, card_section=card_section,
    space_headers=("model", "variant", "prompt", "overall", "accuracy by length"), space_row=space_row,
    space_caption=lambda d: f"{d['model']}: NIAH {d.get('variant', d['needle'])}, overall {d['overall']:.2f}")


if __name__ == "__main__":
    main()
