"""Retrieval heads: which heads copy the pass key out of the haystack, and which layers retrieval needs.

On the classic passkey prompts of `niah` (teacher-forced: the prompt followed by the true key), two signals:

- **retrieval score per head** (Wu et al. 2024, "Retrieval Head Mechanistically Explains Long-Context
  Factuality"): at each position that predicts a key token, does the head's top-1 weight fall on that token inside
  the needle? The score is the share of key tokens for which it does (1.0: the head copies every digit). A softmax
  head's weights are its attention; a linear mixer's are the weights its recurrence gives each earlier value
  (`token_weights` of the layer), so teachers, students and hybrids are scored alike.
- **per-layer ablation**: the layer's token mixer output set to zero, the mean log-probability of the key tokens
  (chance ln 1/10 = -2.30 for digits) against the intact model's; the drop says how much retrieval runs through
  that layer.

`choose_layers` turns the scores into the softmax layers a hybrid keeps (`linzoo linearize --attn_layers auto:K`).

    linzoo eval heads --model embedded --lengths 512 --samples 12 --out outputs/heads
    linzoo eval heads --model runs/main --out runs/main/eval
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm.auto import tqdm

from linzoo.capture import mixer_io

from .common import (EvalSpec, ModelArguments, measured, model_device, run_on_models, name_of, parse_list, render,
                     write_json)
from .niah import MAX_NEW_TOKENS, build_haystack, check_positions, sample_seed

SCHEMA = "linzoo.heads/v1"
CHANCE_LOGPROB = math.log(1 / 10)  # a uniform guess over the ten digits


@dataclass(frozen=True)
class KeyPrompt:
    """One teacher-forced passkey prompt: its token ids (prompt + key), the positions whose next token is a key
    token, those key tokens, and for each the needle positions holding the same token."""

    input_ids: torch.Tensor  # [T]
    query_positions: list[int]
    key_tokens: list[int]
    sources: list[list[int]]


def key_prompt(tokenizer, context_len: int, depth: float, seed: int) -> KeyPrompt:
    sample = build_haystack(tokenizer, None, context_len, depth, "passkey", seed)
    prompt_ids = tokenizer(sample.prompt)["input_ids"]
    full = tokenizer(sample.prompt + " " + sample.answer, return_offsets_mapping=True)
    ids, offsets = full["input_ids"], full["offset_mapping"]
    if ids[:len(prompt_ids)] != prompt_ids:
        raise ValueError("the tokenizer merges the prompt's last token with the key; the heads eval needs a "
                         "tokenizer that keeps them apart (Llama/SmolLM2 tokenizers do)")
    start = sample.prompt.find(sample.haystack) + sample.needle_span[0]
    end = start + len(sample.needle)
    needle = [i for i, (a, b) in enumerate(offsets[:len(prompt_ids)]) if a >= start and b <= end and b > a]
    key_at = [i for i in range(len(prompt_ids), len(ids)) if tokenizer.decode([ids[i]]).strip()]
    key_tokens = [ids[i] for i in key_at]
    return KeyPrompt(torch.tensor(ids), [i - 1 for i in key_at], key_tokens,
                     [[j for j in needle if ids[j] == token] for token in key_tokens])


def mixer_modules(model) -> list:
    """The token mixer (softmax attention or linear mixer) of every layer."""
    return [layer.self_attn for layer in model.model.layers]


@torch.no_grad()
def layer_weights(model, input_ids: torch.Tensor, rows: list[int]) -> list[torch.Tensor]:
    """Per layer, [H, len(rows), T]: each head's weights over the tokens at the query positions `rows`. A linzoo
    model's layers give them through `token_weights`; any other causal LM through its eager attention."""
    ids = input_ids[None].to(model_device(model))
    if getattr(model.config, "model_type", None) != "linzoo":
        if getattr(model.config, "_attn_implementation", "eager") != "eager":
            model.set_attn_implementation("eager")
        return [a[0, :, rows].float() for a in model(input_ids=ids, output_attentions=True).attentions]
    io = mixer_io(model, ids)
    return [module.token_weights(io[i].input, **io[i].kwargs)[0, :, rows].float()
            for i, module in enumerate(mixer_modules(model))]


def copy_hits(weights: torch.Tensor, prompt: KeyPrompt) -> torch.Tensor:
    """[H]: for how many key tokens the head's top-1 weight falls on a needle position holding that token."""
    top = weights.argmax(-1)  # [H, keys]
    hits = torch.zeros(weights.shape[0])
    for i, sources in enumerate(prompt.sources):
        if sources:
            hits += torch.isin(top[:, i], torch.tensor(sources, device=top.device)).float().cpu()
    return hits


@torch.no_grad()
def key_logprob(model, prompt: KeyPrompt, ablate: int | None = None) -> tuple[float, float]:
    """(mean log-probability of the key tokens, share of them that are the top prediction), teacher-forced;
    with `ablate` the token mixer output of that layer is zeroed."""
    hook = None
    if ablate is not None:
        hook = mixer_modules(model)[ablate].register_forward_hook(
            lambda mod, args, out: (torch.zeros_like(out[0]), *out[1:]) if isinstance(out, tuple)
            else torch.zeros_like(out))
    try:
        logits = model(input_ids=prompt.input_ids[None].to(model_device(model))).logits[0, prompt.query_positions]
    finally:
        if hook is not None:
            hook.remove()
    logp = torch.log_softmax(logits.float(), -1)
    targets = torch.tensor(prompt.key_tokens, device=logp.device)
    return (logp.gather(-1, targets[:, None]).mean().item(), (logp.argmax(-1) == targets).float().mean().item())


def score_heads(model, tokenizer, lengths=(512,), samples: int = 12, depths=(0.0, 0.25, 0.5, 0.75, 1.0),
                ablation: bool = True, seed: int = 0, model_name: str | None = None, progress: bool = True) -> dict:
    """The linzoo.heads/v1 dict: per-head retrieval scores, per-layer ablation and the intact key log-prob over
    `samples` passkey prompts per length (depths cycling through `depths`)."""
    lengths, depths = parse_list(lengths, int), parse_list(depths, float)
    prompts = [key_prompt(tokenizer, length, depths[i % len(depths)], sample_seed(seed, length, depths[i % len(depths)], i))
               for length in lengths for i in range(samples)]
    layers = len(mixer_modules(model))
    hits, keys = None, 0
    intact, top1 = [], []
    ablated = [[] for _ in range(layers)]
    bar = tqdm(prompts, desc="heads", unit="prompt", disable=not progress)
    for prompt in bar:
        weights = layer_weights(model, prompt.input_ids, prompt.query_positions)
        row = torch.stack([copy_hits(w, prompt) for w in weights])  # [layers, H]
        hits = row if hits is None else hits + row
        keys += len(prompt.key_tokens)
        logprob, argmax = key_logprob(model, prompt)
        intact.append(logprob)
        top1.append(argmax)
        if ablation:
            for layer in range(layers):
                ablated[layer].append(key_logprob(model, prompt, ablate=layer)[0])
    scores = (hits / keys).tolist()
    mean = sum(intact) / len(intact)
    flat = sorted(((s, l, h) for l, row in enumerate(scores) for h, s in enumerate(row)), reverse=True)
    return {
        "schema": SCHEMA,
        "model": model_name or name_of(model),
        "mixer": getattr(model.config, "mixer", None),
        "attn_layers": list(getattr(model.config, "attn_layers", []) or []),
        "lengths": lengths,
        "depths": depths,
        "samples_per_length": samples,
        "key_tokens": keys,
        "seed": seed,
        "scores": scores,  # [layer][head]: share of key tokens the head's top-1 weight copies from the needle
        "layer_scores": [max(row) for row in scores],
        "top_heads": [{"layer": l, "head": h, "score": s} for s, l, h in flat[:10]],
        "key_logprob": mean,
        "key_logprob_se": _se(intact),
        "key_top1": sum(top1) / len(top1),
        "chance_logprob": CHANCE_LOGPROB,
        "ablation_logprob_drop": [mean - sum(a) / len(a) for a in ablated] if ablation else None,
    }


def _se(values: list[float]) -> float | None:
    if len(values) < 2:
        return None
    mean = sum(values) / len(values)
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values))


def choose_layers(results: dict, k: int) -> list[int]:
    """The `k` layers whose best head scores highest (ties: the larger ablation drop, then the lower layer)."""
    drops = results.get("ablation_logprob_drop") or [0.0] * len(results["layer_scores"])
    order = sorted(range(len(results["layer_scores"])), key=lambda l: (-results["layer_scores"][l], -drops[l], l))
    return sorted(order[:k])


def save_heads(results: dict, out_dir) -> tuple[Path, Path]:
    """Writes heads.json and heads.png (the layer x head score heatmap, beside the per-layer ablation drop)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    json_path = write_json(results, out / "heads.json")
    scores, drops = results["scores"], results["ablation_logprob_drop"]
    fig = Figure(figsize=(9 if drops else 6, 0.22 * len(scores) + 2))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 2, width_ratios=(3, 2), sharey=True) if drops else [fig.add_subplot()]
    image = axes[0].imshow(scores, cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
    axes[0].set_xlabel("head")
    axes[0].set_ylabel("layer")
    axes[0].set_yticks(range(len(scores)))
    axes[0].tick_params(axis="y", labelsize=7)
    for layer in results["attn_layers"]:
        axes[0].text(-0.9, layer, "◆", ha="right", va="center", fontsize=7, color="crimson")
    fig.colorbar(image, ax=axes[0], label="retrieval score (top-1 copy of the key)")
    if drops:
        axes[1].barh(range(len(drops)), drops, color="slategray")
        axes[1].set_xlabel("key log-prob drop with the layer's mixer zeroed")
    lengths = ",".join(map(str, results["lengths"]))
    fig.suptitle(f"{results['model']}: retrieval heads on passkey prompts\n({lengths} tokens, "
                 f"{results['samples_per_length']} per length); key log-prob {results['key_logprob']:.2f} "
                 f"(chance {results['chance_logprob']:.2f})", fontsize=9)
    fig.tight_layout()
    png_path = out / "heads.png"
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


def describe_top(results: dict, n: int = 5) -> str:
    return ", ".join(f"L{h['layer']}H{h['head']} {h['score']:.2f}" for h in results["top_heads"][:n])


CARD_SECTION = """### Retrieval heads

Teacher-forced passkey prompts ({{ lengths }} tokens, {{ heads.samples_per_length }} per length): mean log-probability of the key's tokens {{ logprob }} (chance {{ chance }}), {{ top1 }} of them the top prediction.
Heads whose top-1 weight copies the key from the needle (Wu et al. 2024 retrieval score): {{ top }}.
{% if heads.attn_layers %}Softmax attention kept at layers {{ heads.attn_layers }}.
{% endif %}{% if drops %}Layers whose zeroed mixer costs the key most log-probability: {{ drops }}.
{% endif %}
"""


def card_section(data: dict | None, folder: Path, sub: str = "") -> str:  # no figure: `sub` is not needed
    if data is None:
        return ""
    drops = data.get("ablation_logprob_drop")
    worst = sorted(range(len(drops)), key=lambda l: -drops[l])[:3] if drops else []
    return render(CARD_SECTION, heads=data, lengths=", ".join(map(str, data["lengths"])),
                  logprob=measured(data["key_logprob"], "{:.2f}"), chance=f"{data['chance_logprob']:.2f}",
                  top1=f"{data['key_top1']:.0%}", top=describe_top(data),
                  drops=", ".join(f"{l} ({drops[l]:.2f})" for l in worst))


@dataclass
class HeadsArguments(ModelArguments):
    out: str = field(default="outputs/heads", metadata={"help": "output folder (teacher results in <out>/teacher)"})
    lengths: str = field(default="512", metadata={"help": "prompt lengths in tokens, comma-separated"})
    samples: int = field(default=12, metadata={"help": "passkey prompts per length (depths 0, 0.25, .., 1 in turn)"})
    ablation: bool = field(default=True, metadata={"help": "also zero each layer's mixer in turn (layers x samples "
                                                           "more forwards)"})
    seed: int = 0

    def __post_init__(self):
        super().__post_init__()
        if self.samples < 1:
            raise ValueError(f"--samples {self.samples}: give at least 1 (10 or more for a stable score)")
        try:
            lengths = parse_list(self.lengths, int)
        except ValueError:
            lengths = []
        if not lengths or min(lengths) < 64:
            raise ValueError(f"--lengths {self.lengths!r}: give token counts of at least 64, e.g. --lengths 512")
        from linzoo.loading import read_config

        for spec in filter(None, (self.model, self.teacher)):  # config.json only, as `linzoo eval niah` checks
            check_positions(read_config(spec), lengths, MAX_NEW_TOKENS["passkey"], spec)  # the key, teacher-forced


def main(argv: list[str] | None = None) -> dict:
    from linzoo.arguments import parse_arguments

    (args,) = parse_arguments(HeadsArguments, argv)
    def evaluate(spec, out, model, tokenizer):
        results = score_heads(model, tokenizer, args.lengths, args.samples, ablation=args.ablation, seed=args.seed,
                              model_name=spec)
        print(f"{spec}: top retrieval heads {describe_top(results)}; key log-prob {results['key_logprob']:.2f} "
              f"(chance {CHANCE_LOGPROB:.2f}) -> {save_heads(results, out)[0]}")
        return results

    all_results = run_on_models(args, evaluate)
    return all_results[0]


EVAL = EvalSpec(
    arguments=HeadsArguments,
    title="retrieval heads", name="heads", help="retrieval heads: per-head copy score and per-layer ablation on passkey prompts (JSON + heatmap)",
    schema=SCHEMA, result_file="heads.json", figures=("heads.png",), main=main, card_section=card_section,
    space_headers=("model", "top retrieval heads", "key log-prob", "softmax layers"),
    space_row=lambda d: [d["model"], describe_top(d), f"{d['key_logprob']:.2f}", ", ".join(map(str, d["attn_layers"]))],
    space_caption=lambda d: f"{d['model']}: retrieval heads, key log-prob {d['key_logprob']:.2f}")


if __name__ == "__main__":
    main()
