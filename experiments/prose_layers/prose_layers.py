"""Which of the teacher's layers a hybrid must keep as softmax for retrieval in prose: a search on the fitted start, no
training (issue 30). `--attn_layers auto:K` ranks layers by their best head's passkey score on a noise haystack; the
layers prose needs rank low there (8, 14, 15: results/recipe/natural/). Here a layer set S is scored by what the
fitted start with softmax at S (every other layer the mixer with its window, fitted as `linzoo linearize` fits it)
gives the key in clean prose: the teacher-forced log-probability of the whole five-digit key, averaged over
selection prompts. They are not the evals' prompts: their haystacks are the embedded **train** split's prose and
their needles come from another seed (`--seed`, default 1000; `linzoo eval niah` uses seed 0 and the test split), so
a set chosen here is measured on prompts it was not chosen on.

The fit is per layer, on the teacher's own activations (`linzoo.calibrate.fit_to_teacher`), so one fitted
all-mixer student gives every layer's fitted mixer: a set's start is the teacher's attention at S and that
student's mixers elsewhere (checked against a start built directly: `--check`).

Searches (one JSON line per scored set on stdout, the search's choice last):
  drop-one   every layer alone as the mixer, the rest softmax: how much each layer's linearization costs the key
  greedy     from --start (default none), add the layer whose softmax raises the score most, until --k layers

    python experiments/prose_layers/prose_layers.py --search greedy --k 10 --mixer gated_deltanet > greedy.jsonl
    python experiments/prose_layers/prose_layers.py --plot drop.jsonl runs/zoo/gated_deltanet/base/eval/teacher/heads.json --out x.png
"""

import argparse
import json
import sys
import time

import torch

import linzoo
from linzoo.data import load_text_dataset
from linzoo.evals.common import load_texts
from linzoo.evals.niah import _key_logprobs, build_haystack, prose, sample_seed, summarize_logprobs
from linzoo.trainers.linearize import calibration_ids


def selection_prompts(tokenizer, lengths, depths, per_cell, seed):
    """Natural-variant prompts on the train split's prose (the evals' haystacks are the test split's)."""
    texts = prose(load_texts("embedded", split="train"))
    return [build_haystack(tokenizer, texts, length, depth, "natural", sample_seed(seed, length, depth, i))
            for length in lengths for depth in depths for i in range(per_cell)]


class Starts:
    """Fitted starts of any softmax set from one fitted all-mixer student."""

    def __init__(self, teacher, tokenizer, mixer, window, calibration=None):
        """`calibration`: token ids [rows, length] (default: `linzoo linearize`'s, from the embedded train split)."""
        self.teacher, self.mixer, self.window = teacher, mixer, window
        self.calibration = (calibration_ids(load_text_dataset("embedded", split="train"), tokenizer)
                            if calibration is None else calibration)
        torch.manual_seed(0)
        self.fitted = linzoo.linearize(teacher, mixer, calibration=self.calibration, attn_layers=[],
                                       window_size=window).eval()

    def build(self, layers):
        torch.manual_seed(0)
        student = linzoo.linearize(self.teacher, self.mixer, attn_layers=sorted(layers), window_size=self.window,
                                   conv_activation="silu_qk").eval()
        own = student.state_dict()
        fitted = {k: v for k, v in self.fitted.state_dict().items()
                  if ".self_attn." in k and int(k.split(".")[2]) not in layers and k in own}
        student.load_state_dict(fitted, strict=False)
        return student


def score(model, tokenizer, prompts, batch_size):
    """The key's mean teacher-forced log-probability over `prompts` and its standard error (`linzoo eval niah`'s)."""
    values = []
    for start in range(0, len(prompts), batch_size):
        values += _key_logprobs(model, tokenizer, prompts[start:start + batch_size])
    summary = summarize_logprobs({0: values})
    return summary["key_logprob"], summary["key_logprob_se"]


def plot(drop_file, heads_file, out):
    """Per layer: the key log-prob the drop-one search lost by linearizing it, beside the passkey score of its best
    head (`linzoo eval heads`, what auto:K ranks by), the chosen ten marked."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in open(drop_file)]
    teacher = next(r["key_logprob"] for r in rows if r["name"] == "teacher")
    cost = {int(r["name"][4:]): teacher - r["key_logprob"] for r in rows if r["name"].startswith("drop")}
    heads = json.load(open(heads_file))["layer_scores"]
    layers = sorted(cost)
    chosen = sorted(sorted(layers, key=cost.get, reverse=True)[:10])
    auto = sorted(sorted(range(len(heads)), key=lambda l: heads[l], reverse=True)[:10])
    fig, (a, b) = plt.subplots(2, 1, figsize=(10, 6), sharex=True)
    a.bar(layers, [cost[l] for l in layers], color=["C3" if l in chosen else "C7" for l in layers])
    a.set_yscale("log")
    a.set_ylabel("key log-prob lost (nats)\nthis layer alone linear")
    a.set_title(f"prose: the ten costliest layers (red) {chosen}")
    b.bar(range(len(heads)), heads, color=["C0" if l in auto else "C7" for l in range(len(heads))])
    b.set_ylabel("best head's passkey score\n(noise haystack)")
    b.set_title(f"auto:10 keeps the ten best (blue) {auto}")
    b.set_xlabel("teacher layer")
    b.set_xticks(range(len(heads)))
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    print(f"prose_layers: wrote {out}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--search", choices=["drop-one", "greedy", "sets"], default="greedy")
    p.add_argument("--mixer", default="gated_deltanet")
    p.add_argument("--window", type=int, default=64)
    p.add_argument("--k", type=int, default=10, help="greedy: softmax layers to end with")
    p.add_argument("--start", default="", help="greedy: layers to start from, comma-separated")
    p.add_argument("--sets", nargs="*", default=[], help="sets: NAME=LAYERS (comma-separated) to score")
    p.add_argument("--lengths", default="256,512")
    p.add_argument("--per_cell", type=int, default=4, help="prompts per length x depth (depths 0, 0.5, 1)")
    p.add_argument("--seed", type=int, default=1000)
    p.add_argument("--batch_size", type=int, default=6)
    p.add_argument("--check", action="store_true", help="compare a composed start with one built directly")
    p.add_argument("--plot", nargs=2, metavar=("DROP_JSONL", "HEADS_JSON"),
                   help="no search: draw a drop-one search's costs beside the teacher's head scores into --out")
    p.add_argument("--out", help="--plot: the PNG to write")
    args = p.parse_args(argv)
    if args.plot:
        if not args.out:
            p.error("--plot needs --out PNG")
        return plot(*args.plot, args.out)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    teacher, tok = linzoo.load_teacher("embedded")
    teacher = teacher.to(device).eval()
    prompts = selection_prompts(tok, [int(x) for x in args.lengths.split(",")], (0, 0.5, 1), args.per_cell,
                                args.seed)
    t0 = time.time()
    starts = Starts(teacher, tok, args.mixer, args.window)
    print(f"prose_layers: fitted every layer's {args.mixer} in {time.time() - t0:.0f} s; {len(prompts)} prompts",
          file=sys.stderr, flush=True)
    n_layers = teacher.config.num_hidden_layers

    def measure(name, layers):
        start = time.time()
        model = teacher if len(layers) == n_layers else starts.build(set(layers))
        mean, se = score(model, tok, prompts, args.batch_size)
        row = {"name": name, "mixer": args.mixer, "window": args.window, "attn_layers": sorted(layers),
               "key_logprob": round(mean, 3), "se": round(se, 3), "prompts": len(prompts), "seed": args.seed,
               "seconds": round(time.time() - start, 1)}
        print(json.dumps(row), flush=True)
        return mean

    if args.check:
        layers = [6, 8, 14, 15, 17, 18, 20, 21, 23, 24]
        torch.manual_seed(0)
        direct = linzoo.linearize(teacher, args.mixer, calibration=starts.calibration, attn_layers=layers,
                                  window_size=args.window).eval()
        composed = starts.build(set(layers))
        ids = starts.calibration[:1, :256].to(device)
        with torch.inference_mode():
            a, b = direct(ids).logits, composed(ids).logits
        print(f"prose_layers: composed vs direct start, max |logit difference| {(a - b).abs().max().item():.2e}",
              file=sys.stderr, flush=True)

    measure("teacher", list(range(n_layers)))
    if args.search == "sets":
        for spec in args.sets:
            name, _, layers = spec.partition("=")
            measure(name, [int(x) for x in layers.split(",") if x])
    elif args.search == "drop-one":
        for layer in range(n_layers):
            measure(f"drop{layer}", [l for l in range(n_layers) if l != layer])
    else:
        chosen = [int(x) for x in args.start.split(",") if x]
        measure(f"start{len(chosen)}", chosen)
        while len(chosen) < args.k:
            scores = {l: measure(f"add{len(chosen) + 1}:{l}", chosen + [l])
                      for l in range(n_layers) if l not in chosen}
            best = max(scores, key=scores.get)
            chosen.append(best)
            print(json.dumps({"name": f"greedy{len(chosen)}", "attn_layers": sorted(chosen), "added": best,
                              "key_logprob": round(scores[best], 3)}), flush=True)


if __name__ == "__main__":
    main()
