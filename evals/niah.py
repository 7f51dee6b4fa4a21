"""Needle-in-a-haystack retrieval: hide a pass key (or a uuid key-value pair) at a chosen depth of
a filler text of a chosen token length, ask for it back, and map accuracy over (depth, length).

    linzoo eval niah --model embedded --lengths 512,1024,2048 --depths 0,0.5,1 --out outputs/niah
"""

from __future__ import annotations

import json
import os
import random
import re
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

SCHEMA = "linzoo.niah/v1"
INTRO = ("There is an important piece of information hidden in the text below. "
         "Find it and remember it: you will be asked about it.")


def _passkey(rng: random.Random) -> tuple[str, str, str]:
    digits = rng.randint(5, 7)
    key = str(rng.randint(10 ** (digits - 1), 10**digits - 1))
    return f"The pass key is {key}. Remember it. {key} is the pass key.", "What is the pass key?", key


def _uuid_pair(rng: random.Random) -> tuple[str, str, str]:
    key, value = (str(uuid.UUID(int=rng.getrandbits(128), version=4)) for _ in range(2))
    return f"The value for key {key} is {value}.", f"What is the value for key {key}?", value


# name -> (maker of (needle sentence, question, answer), default max_new_tokens)
NEEDLES = {"passkey": (_passkey, 16), "uuid": (_uuid_pair, 64)}
PROMPT_FORMATS = ("raw", "chat")


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


def load_texts(source: str | list[str], split: str = "test") -> list[str]:
    """Texts from a literal list, a .txt file (paragraphs split on blank lines), or any
    `linzoo.data.load_text_dataset` spec such as "embedded"."""
    if not isinstance(source, str):
        texts = list(source)
    elif source.endswith(".txt") or os.path.isfile(source):
        texts = re.split(r"\n\s*\n", Path(source).read_text(encoding="utf-8"))
    else:
        from linzoo.data import load_text_dataset

        texts = list(load_text_dataset(source, split=split)["text"])
    texts = [t.strip() for t in texts if t and t.strip()]
    if not texts:
        raise ValueError(f"no text found in {source!r}")
    return texts


def parse_list(value: str | list, cast=float) -> list:
    """'512,1024' or [512, 1024] -> [512, 1024] (the CLI passes strings, Python callers lists)."""
    items = value.split(",") if isinstance(value, str) else value
    return [cast(v) for v in items if str(v).strip() != ""]


def model_device(model) -> torch.device:
    param = next(model.parameters(), None) if hasattr(model, "parameters") else None
    return param.device if param is not None else torch.device("cpu")


def name_of(model) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "name_or_path", None) or type(model).__name__


def format_prompt(tokenizer, haystack: str, question: str, prompt_format: str) -> str:
    if prompt_format == "raw":
        return f"{INTRO}\n\n{haystack}\n\nQuestion: {question}\nAnswer:"
    if prompt_format == "chat":
        message = {"role": "user", "content": f"{INTRO}\n\n{haystack}\n\n{question}"}
        return tokenizer.apply_chat_template([message], tokenize=False, add_generation_prompt=True)
    raise ValueError(f"prompt_format must be one of {PROMPT_FORMATS}, got {prompt_format!r}")


def _encode_kwargs(prompt_format: str) -> dict:
    # A chat template already writes its own special tokens; a raw prompt gets the tokenizer's BOS.
    return {"add_special_tokens": prompt_format == "raw"}


def _insert(body: str, needle: str, depth: float) -> tuple[str, tuple[int, int]]:
    target = round(min(max(depth, 0.0), 1.0) * len(body))
    sentence_end = body.rfind(". ", 0, target)
    if 0 <= sentence_end and target - sentence_end <= min(256, len(body) // 50) and target < len(body):
        cut = sentence_end + 2  # prefer a sentence boundary close before the requested depth
    else:
        cut = body.rfind(" ", 0, target) + 1 if target < len(body) else len(body)
    pre, post = body[:cut].rstrip(), body[cut:].lstrip()
    start = len(pre) + 1 if pre else 0
    haystack = " ".join(p for p in (pre, needle, post) if p)
    return haystack, (start, start + len(needle))


def build_haystack(tokenizer, filler_texts: list[str], context_len: int, depth: float, needle: str = "passkey",
                   seed: int = 0, prompt_format: str = "raw") -> NiahSample:
    """A prompt of at most `context_len` tokens (and within a word of it) with the needle after a `depth`
    share of the filler (0.0 = start of the haystack, 1.0 = end), snapped back to a sentence end when one
    is near, else to a word boundary. The seed fixes the needle and the filler order."""
    if needle not in NEEDLES:
        raise ValueError(f"needle must be one of {sorted(NEEDLES)}, got {needle!r}")
    rng = random.Random(seed)
    sentence, question, answer = NEEDLES[needle][0](rng)
    docs = list(filler_texts)
    rng.shuffle(docs)

    def render(n_chars: int):
        haystack, span = _insert(text[:n_chars].rstrip(), sentence, depth)
        prompt = format_prompt(tokenizer, haystack, question, prompt_format)
        return haystack, span, prompt, len(tokenizer(prompt, **_encode_kwargs(prompt_format))["input_ids"])

    min_chars = 6 * context_len
    while True:  # enough filler that using all of it overshoots the target
        text = " ".join(docs * (min_chars // sum(len(d) + 1 for d in docs) + 1))
        if render(len(text))[3] > context_len:
            break
        min_chars *= 2
    cuts = [0] + [m.start() for m in re.finditer(r"\s+", text)]
    if render(0)[3] > context_len:
        raise ValueError(f"context_len={context_len} is shorter than the needle and question alone")
    lo, hi = 0, len(cuts) - 1  # invariant: cuts[lo] fits; the answer is in [lo, hi]
    while lo < hi:  # largest filler prefix (at word boundaries) whose prompt fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if render(cuts[mid])[3] <= context_len else (lo, mid - 1)
    haystack, span, prompt, n_tokens = render(cuts[lo])
    return NiahSample(prompt, sentence, answer, question, haystack, span, n_tokens, context_len, depth, needle,
                      prompt_format)


def _prepare_tokenizer(tokenizer):
    tokenizer.padding_side = "left"  # generation continues every row from its last real token
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


@torch.inference_mode()
def _generate(model, tokenizer, samples: list[NiahSample], max_new_tokens: int | None = None) -> list[str]:
    _prepare_tokenizer(tokenizer)
    max_new_tokens = max_new_tokens or NEEDLES[samples[0].needle_type][1]
    batch = tokenizer([s.prompt for s in samples], return_tensors="pt", padding=True,
                      **_encode_kwargs(samples[0].prompt_format)).to(model_device(model))
    out = model.generate(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                         max_new_tokens=max_new_tokens, do_sample=False,
                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    return tokenizer.batch_decode(out[:, batch["input_ids"].shape[1]:], skip_special_tokens=True)


def answer_one(model, tokenizer, sample: NiahSample, max_new_tokens: int | None = None) -> tuple[str, bool, float]:
    """One prompt, for the Space: (generated text, whether it contains the answer, seconds)."""
    start = time.perf_counter()
    text = _generate(model, tokenizer, [sample], max_new_tokens)[0]
    return text, sample.answer in text, time.perf_counter() - start


def run_niah(model, tokenizer, lengths, depths, needle: str = "passkey", prompt_format: str = "raw",
             samples_per_cell: int = 5, batch_size: int = 4, filler: str | list[str] = "embedded", seed: int = 0,
             max_new_tokens: int | None = None, model_name: str | None = None) -> dict:
    """Greedy retrieval accuracy over the (length, depth) grid, as the linzoo.niah/v1 dict.
    Sample i of a length uses the same needle and filler at every depth, so depths compare fairly."""
    lengths, depths = parse_list(lengths, int), parse_list(depths, float)
    filler_texts = load_texts(filler)
    samples = [build_haystack(tokenizer, filler_texts, length, depth, needle, seed * 1_000_003 + length * 1_009 + i,
                              prompt_format)
               for length in lengths for depth in depths for i in range(samples_per_cell)]
    hits: dict[tuple[int, float], list[bool]] = {}
    examples = []  # the first sample of every cell: what was asked for and what came out
    for start in tqdm(range(0, len(samples), batch_size), desc=f"niah {needle}", unit="batch"):
        chunk = samples[start:start + batch_size]
        texts = _generate(model, tokenizer, chunk, max_new_tokens)
        for sample, text in zip(chunk, texts):
            cell = hits.setdefault((sample.context_len, sample.depth), [])
            if not cell:
                examples.append({"length": sample.context_len, "depth": sample.depth, "answer": sample.answer,
                                 "generated": text, "hit": sample.answer in text})
            cell.append(sample.answer in text)
    accuracy = {str(l): {f"{d:g}": sum(hits[l, d]) / len(hits[l, d]) for d in depths} for l in lengths}
    return {
        "schema": SCHEMA,
        "model": model_name or name_of(model),
        "needle": needle,
        "prompt_format": prompt_format,
        "lengths": lengths,
        "depths": depths,
        "samples_per_cell": samples_per_cell,
        "accuracy": accuracy,
        "mean_by_length": {l: sum(row.values()) / len(row) for l, row in accuracy.items()},
        "overall": sum(sum(h) for h in hits.values()) / len(samples),
        "seed": seed,
        "examples": examples,
    }


def save_niah(results: dict, out_dir: str | os.PathLike) -> tuple[Path, Path]:
    """Writes niah.json and niah_heatmap.png (rows = depth, columns = length)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path, png_path = out / "niah.json", out / "niah_heatmap.png"
    json_path.write_text(json.dumps(results, indent=2) + "\n")

    lengths, depths = [str(l) for l in results["lengths"]], [f"{d:g}" for d in results["depths"]]
    grid = [[results["accuracy"][l][d] for l in lengths] for d in depths]
    fig = Figure(figsize=(1.2 * len(lengths) + 2.5, 0.6 * len(depths) + 2))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    image = ax.imshow(grid, cmap="RdYlGn", vmin=0.0, vmax=1.0, aspect="auto")
    for row, values in enumerate(grid):
        for col, value in enumerate(values):
            ax.text(col, row, f"{value:.2f}", ha="center", va="center", fontsize=9)
    ax.set_xticks(range(len(lengths)), lengths)
    ax.set_yticks(range(len(depths)), depths)
    ax.set_xlabel("context length (tokens)")
    ax.set_ylabel("needle depth")
    ax.set_title(f"{results['model']}\nNIAH {results['needle']} ({results['prompt_format']}), "
                 f"overall {results['overall']:.2f}", fontsize=10)
    fig.colorbar(image, ax=ax, label="accuracy")
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


@dataclass
class ModelArguments:
    model: str = field(default="embedded", metadata={"help": "student: folder, Hub id, .gguf file or 'embedded'"})
    teacher: str | None = field(default=None, metadata={"help": "teacher spec, evaluated alongside the student"})
    batch_size: int = field(default=4, metadata={"help": "prompts per forward/generate call"})
    device: str = field(default="cuda" if torch.cuda.is_available() else "cpu", metadata={"help": "torch device"})
    dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16 | float16"})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "run a checkpoint's own Python when it needs it (linzoo students and Llama teachers never do)"})


def load_for_eval(spec: str, device: str, dtype: str, teacher: bool = False, trust_remote_code: bool = False):
    """(model, tokenizer) through linzoo's loaders, moved to the device/dtype and in eval mode."""
    import linzoo

    load = linzoo.load_teacher if teacher else linzoo.load_model
    model, tokenizer = load(spec, trust_remote_code=True) if trust_remote_code else load(spec)
    model = model.to(device) if dtype == "auto" else model.to(device=device, dtype=getattr(torch, dtype))
    return model.eval(), tokenizer


@dataclass
class NiahArguments(ModelArguments):
    out: str = field(default="outputs/niah", metadata={"help": "output folder (teacher results go in <out>/teacher)"})
    lengths: str = field(default="512,1024,2048,4096", metadata={"help": "context lengths in tokens, comma-separated"})
    depths: str = field(default="0,0.25,0.5,0.75,1", metadata={"help": "needle depths in [0, 1], comma-separated"})
    needle: str = field(default="passkey", metadata={"help": "passkey | uuid"})
    prompt_format: str = field(default="raw", metadata={"help": "raw | chat"})
    samples_per_cell: int = field(default=5, metadata={"help": "prompts per (length, depth) cell"})
    filler: str = field(default="embedded", metadata={"help": "'embedded', a linzoo.data spec, or a .txt path"})
    seed: int = 0
    max_new_tokens: int | None = field(default=None, metadata={"help": "default: 16 passkey, 64 uuid"})

    def __post_init__(self):
        if self.needle not in NEEDLES or self.prompt_format not in PROMPT_FORMATS:
            raise ValueError(f"--needle in {sorted(NEEDLES)}, --prompt_format in {PROMPT_FORMATS}")
        # checked here, before any model loads (the grid itself is built only after loading)
        for flag, value, cast, valid, want, example in (
                ("--lengths", self.lengths, int, lambda v: v > 0, "positive token counts", "512,1024,2048"),
                ("--depths", self.depths, float, lambda v: 0.0 <= v <= 1.0, "needle depths in [0, 1]", "0,0.5,1")):
            try:
                values = parse_list(value, cast)
            except ValueError:
                values = []
            if not values or not all(map(valid, values)):
                raise ValueError(f"{flag} {value!r}: give {want}, comma-separated, e.g. {flag} {example}")


def main(argv: list[str] | None = None) -> dict:
    from transformers import HfArgumentParser

    (args,) = HfArgumentParser(NiahArguments).parse_args_into_dataclasses(args=argv)
    runs = [(args.model, False, Path(args.out))]
    if args.teacher:
        runs.append((args.teacher, True, Path(args.out) / "teacher"))
    all_results = []
    for spec, is_teacher, out in runs:  # one model in memory at a time
        model, tokenizer = load_for_eval(spec, args.device, args.dtype, is_teacher, args.trust_remote_code)
        all_results.append(run_niah(model, tokenizer, args.lengths, args.depths, args.needle, args.prompt_format,
                                    args.samples_per_cell, args.batch_size, args.filler, args.seed,
                                    args.max_new_tokens, model_name=spec))
        del model
        print(f"{spec}: overall {all_results[-1]['overall']:.3f} -> {save_niah(all_results[-1], out)[0]}")
    return all_results[0]


if __name__ == "__main__":
    main()
