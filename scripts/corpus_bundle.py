"""The long distillation corpus (`--dataset long`, linzoo.corpus.long): build it, measure it, bundle it for the GPU machine.

    python scripts/corpus_bundle.py build                        # fetch the sources once, build, print the manifest
    python scripts/corpus_bundle.py stats --out results/corpus   # tokens, lengths (PNG + quantiles), repetition
    python scripts/corpus_bundle.py probe --out results/corpus   # teacher on CPU: copy signal, own continuations
    python scripts/corpus_bundle.py export --out .dev/corpus     # xz bundles of <= 50 MB + manifest.json
    python scripts/corpus_bundle.py verify --dir .dev/corpus     # load from the bundles alone (no network), compare

On the GPU machine (no network): carry .dev/corpus, then
    LINZOO_CORPUS_DIR=.dev/corpus linzoo linearize --dataset long ...
the first load fills linzoo's cache from the bundles (sha256-checked), later loads are memory-mapped.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
QUANTILES = (0.1, 0.25, 0.5, 0.75, 0.9, 0.99)
BUCKETS = ("none", "near (<=512)", "far (512-2048)", "beyond (>2048)")
CALL_BYTES = 64 * 2**20  # what one GPU call carries, checkout included


def tokenizer():
    from transformers import AutoTokenizer

    from linzoo.loading import resolve

    return AutoTokenizer.from_pretrained(resolve("embedded"))  # load_teacher("embedded")[1]'s tokenizer


def token_ids(tok, texts: list[str], batch: int = 256) -> list[np.ndarray]:
    out = []
    for i in range(0, len(texts), batch):
        enc = tok(texts[i : i + batch], add_special_tokens=False, verbose=False)["input_ids"]
        out.extend(np.asarray(e, dtype=np.uint16) for e in enc)
    return out


# ----------------------------------------------------------------------------- repetition


def repeat_distances(ids: np.ndarray, n: int = 8) -> np.ndarray:
    """For each n-gram start, the distance back to the nearest earlier start of the same n-gram (0: none)."""
    m = len(ids) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=np.int64)
    x = ids.astype(np.uint64)
    h = np.zeros(m, dtype=np.uint64)
    for k in range(n):  # a polynomial hash of the n tokens, wrapping mod 2**64
        h = h * np.uint64(1_000_003) + x[k : k + m]
    order = np.argsort(h, kind="stable")  # equal hashes stay in position order
    same = h[order[1:]] == h[order[:-1]]
    dist = np.zeros(m, dtype=np.int64)
    dist[order[1:][same]] = order[1:][same] - order[:-1][same]
    return dist


def nontrivial(ids: np.ndarray, n: int = 8) -> np.ndarray:
    """n-gram starts whose n tokens are not one token repeated nor a period-2 pattern (rule lines, indentation)."""
    m = len(ids) - n + 1
    if m <= 0:
        return np.zeros(0, dtype=bool)
    ch1 = np.zeros(m, dtype=bool)
    ch2 = np.zeros(m, dtype=bool)
    for k in range(1, n):
        ch1 |= ids[k : k + m] != ids[k - 1 : k - 1 + m]
        if k >= 2:
            ch2 |= ids[k : k + m] != ids[k - 2 : k - 2 + m]
    return ch1 & ch2


def bucket_counts(seqs, n: int = 8) -> dict:
    """Counts of n-gram positions by the distance to their nearest earlier occurrence, in all n-grams and in the
    non-trivial ones."""
    counts = {"all": np.zeros(4, dtype=np.int64), "nontrivial": np.zeros(4, dtype=np.int64)}
    for ids in seqs:
        d = repeat_distances(ids, n)
        b = np.select([d == 0, d <= 512, d <= 2048], [0, 1, 2], 3)
        counts["all"] += np.bincount(b, minlength=4)
        counts["nontrivial"] += np.bincount(b[nontrivial(ids, n)], minlength=4)
    return counts


def fractions(counts: dict) -> dict:
    out = {}
    for kind, c in counts.items():
        total = int(c.sum())
        out[kind] = {"ngrams": total, **{name: round(float(v) / max(total, 1), 5) for name, v in zip(BUCKETS, c)},
                     "recur_>512_back": round(float(c[2] + c[3]) / max(total, 1), 5)}
    return out


def packed_rows(spec: str, tok, seq_len: int, max_tokens: int) -> list[np.ndarray]:
    from linzoo.data import load_text_dataset, pack_dataset

    rows = pack_dataset(load_text_dataset(spec, "train"), tok, seq_len, max_tokens=max_tokens)
    return [np.asarray(r, dtype=np.uint16) for r in rows["input_ids"]]


# ----------------------------------------------------------------------------- commands


def cmd_build(args):
    from linzoo.corpus.long import load_long, long_manifest

    t0 = time.time()
    dd = load_long()
    print(dd)
    print(json.dumps(long_manifest(), indent=1))
    print(f"ready in {time.time() - t0:.0f} s")


def cmd_stats(args):
    from linzoo.corpus.long import load_long, long_manifest
    from linzoo.data import load_text_dataset

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tok = tokenizer()
    dd, manifest = load_long(), long_manifest()
    t0 = time.time()
    lengths = defaultdict(list)  # (source, split) -> token counts per doc
    rep_seqs = defaultdict(list)  # source -> the first docs (corpus order) up to --rep_tokens tokens
    rep_tokens = defaultdict(int)
    for split in ("train", "test"):
        ds = dd[split]
        for start in range(0, len(ds), 2000):
            batch = ds[start : start + 2000]
            for src, ids in zip(batch["source"], token_ids(tok, batch["text"])):
                lengths[src, split].append(len(ids))
                if split == "train" and rep_tokens[src] < args.rep_tokens:
                    rep_seqs[src].append(ids)
                    rep_tokens[src] += len(ids)
        print(f"tokenized {split}: {len(ds)} docs, {time.time() - t0:.0f} s", flush=True)
    sources = list(manifest["sources"])
    table, all_train, all_docs = {}, [], []
    for src in sources:
        tr, te = lengths[src, "train"], lengths[src, "test"]
        docs = tr + te
        table[src] = {"origin": manifest["sources"][src]["origin"], "docs_train": len(tr), "docs_test": len(te),
                      "tokens_train": int(sum(tr)), "tokens_test": int(sum(te)),
                      "median_doc_tokens": int(np.median(docs)) if docs else 0,
                      "tokens_in_docs_>=2048": round(sum(x for x in docs if x >= 2048) / max(sum(docs), 1), 4)}
        all_train += tr
        all_docs += docs
    arr = np.asarray(all_docs)
    weights = np.sort(arr)
    cum = np.cumsum(weights) / weights.sum()
    stats = {
        "tokenizer": "SmolLM2 (linzoo.load_teacher('embedded')[1]), no eos counted",
        "manifest": manifest,
        "per_source": table,
        "total": {"docs_train": len(all_train), "docs_test": len(all_docs) - len(all_train),
                  "tokens_train": int(sum(all_train)), "tokens_test": int(arr.sum() - sum(all_train)),
                  "unique_tokens": int(arr.sum())},
        "doc_tokens_quantiles": {f"p{int(q * 100)}": int(np.quantile(arr, q)) for q in QUANTILES}
        | {"max": int(arr.max()), "mean": round(float(arr.mean()), 1)},
        # the document length that the q-th quantile of *tokens* sits in (half the tokens are in docs >= p50)
        "token_weighted_quantiles": {f"p{int(q * 100)}": int(weights[np.searchsorted(cum, q)]) for q in QUANTILES},
        "tokens_in_docs_>=2048": round(float(arr[arr >= 2048].sum() / arr.sum()), 4),
    }
    # Repetition: within each document, and within the 2048-token rows that training sees (long vs embedded).
    rep = {src: {"tokens_measured": rep_tokens[src], **fractions(bucket_counts(rep_seqs[src]))} for src in sources}
    emb_docs = load_text_dataset("embedded", "train")
    emb_ids = token_ids(tok, list(emb_docs["text"]))
    rep["embedded (today's corpus)"] = {"tokens_measured": int(sum(map(len, emb_ids))),
                                        **fractions(bucket_counts(emb_ids))}
    rows = {}
    for spec in ("embedded", "long"):
        seqs = packed_rows(spec, tok, 2048, args.row_tokens)
        eos = np.array([(r == tok.eos_token_id).sum() for r in seqs])
        rows[spec] = {"rows": len(seqs), "rows_inside_one_document": round(float((eos == 0).mean()), 4),
                      "documents_per_row": round(float(eos.mean() + 1), 2), **fractions(bucket_counts(seqs))}
    stats["repetition_8gram_per_doc"] = rep
    stats["repetition_8gram_per_2048_row"] = rows
    (out / "stats.json").write_text(json.dumps(stats, indent=1))
    plot_lengths(lengths, sources, out / "doc_lengths.png")
    print(json.dumps({k: v for k, v in stats.items() if k != "manifest"}, indent=1))


def plot_lengths(lengths, sources, path: Path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bins = np.logspace(1, 6.5, 45)
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(13, 4.8))
    data = [np.asarray(lengths[s, "train"] + lengths[s, "test"]) for s in sources]
    ax1.hist(data, bins=bins, stacked=True, label=sources)
    ax1.set(xscale="log", xlabel="document length (SmolLM2 tokens)", ylabel="documents",
            title="long corpus: documents by length")
    ax2.hist(data, bins=bins, stacked=True, weights=data, label=sources)
    ax2.set(xscale="log", xlabel="document length (SmolLM2 tokens)", ylabel="tokens",
            title="tokens by the length of their document")
    for ax in (ax1, ax2):
        ax.axvline(2048, color="k", ls="--", lw=1)
        ax.text(2048, ax.get_ylim()[1] * 0.95, " 2048 (row)", fontsize=8, va="top")
    ax2.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def cmd_probe(args):
    """Cheap CPU measurements with the teacher: how much it gains from copying far back (the signal a student is
    distilled on), and what its own continuations look like (are they worth training on?)."""
    import torch

    import linzoo

    torch.manual_seed(0)
    torch.set_num_threads(os.cpu_count() or 2)
    teacher, tok = linzoo.load_teacher("embedded")
    out = Path(args.out)
    result = {}

    def nll(ids: np.ndarray) -> np.ndarray:  # per predicted token (len(ids) - 1)
        x = torch.as_tensor(ids.astype(np.int64))[None]
        with torch.no_grad():
            logits = teacher(x).logits[0, :-1].float()
        return torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="none").numpy()

    def by_bucket(rows: list[np.ndarray]) -> dict:
        """Teacher NLL of each token by whether the 8-gram ending at it occurred earlier in the row, and how far."""
        sums, counts = np.zeros(4), np.zeros(4, dtype=np.int64)
        for ids in rows:
            losses = nll(ids)
            d = repeat_distances(ids, 8)  # d[i]: the 8-gram starting at i; it ends at token i+7
            tok_bucket = np.zeros(len(ids), dtype=np.int64)
            tok_bucket[7:] = np.select([d == 0, d <= 512, d <= 2048], [0, 1, 2], 3)
            b = tok_bucket[1:]
            sums += np.bincount(b, weights=losses, minlength=4)
            counts += np.bincount(b, minlength=4)
        return {name: {"tokens": int(c), "share": round(float(c / counts.sum()), 4),
                       "teacher_nll": round(float(s / c), 3) if c else None}
                for name, s, c in zip(BUCKETS, sums, counts)}

    t0 = time.time()
    result["settings"] = {"probe_rows": args.probe_rows, "gen_tokens": args.gen_tokens, "threads": torch.get_num_threads()}
    for spec in ("long", "embedded"):
        rows = packed_rows(spec, tok, 2048, args.probe_rows * 2048 * 4)
        rng = random.Random(0)
        rows = rng.sample(rows, min(args.probe_rows, len(rows)))
        result[f"teacher_nll_by_8gram_repeat/{spec}"] = by_bucket(rows)
        print(spec, result[f"teacher_nll_by_8gram_repeat/{spec}"], f"{time.time() - t0:.0f} s", flush=True)

    # A copy-rich document: a held-out text whose span [256, 512) comes back after 1,536 tokens, about 1,300 back.
    from linzoo.data import load_text_dataset

    test = [t for t in load_text_dataset("long", "test")["text"] if len(t) > 12_000][: args.probe_rows]
    first, again = [], []
    for text in test:
        ids = np.asarray(tok(text, add_special_tokens=False)["input_ids"][:1536], dtype=np.int64)
        doc = np.concatenate([ids, ids[256:512]])
        losses = nll(doc)
        first.append(losses[255:511].mean())
        again.append(losses[1535:].mean())
    result["copied_span_teacher_nll"] = {"docs": len(test), "first_occurrence": round(float(np.mean(first)), 3),
                                         "repeated_1280_tokens_later": round(float(np.mean(again)), 3)}
    print(result["copied_span_teacher_nll"], f"{time.time() - t0:.0f} s", flush=True)

    (out / "probe.json").write_text(json.dumps(result, indent=1))
    if args.gen_tokens <= 0:
        return
    # The teacher's own continuations of held-out prompts: speed, loops, and how much they tell beyond KD.
    gen = {"greedy": {}, "sampled (T=1, top_p=0.95)": {}}
    prompts = [np.asarray(tok(t, add_special_tokens=False)["input_ids"][:256], dtype=np.int64) for t in test]
    prompts = prompts[: args.gen_prompts]
    test = test[: args.gen_prompts]
    for name, kwargs in (("greedy", {"do_sample": False}),
                         ("sampled (T=1, top_p=0.95)", {"do_sample": True, "temperature": 1.0, "top_p": 0.95})):
        outs, t1 = [], time.time()
        for p in prompts:
            with torch.no_grad():
                seq = teacher.generate(torch.as_tensor(p)[None], max_new_tokens=args.gen_tokens, min_new_tokens=args.gen_tokens,
                                       pad_token_id=tok.eos_token_id, **kwargs)[0].numpy()
            outs.append(seq)
        secs = time.time() - t1
        new = [s[len(p):] for s, p in zip(outs, prompts)]
        counts = bucket_counts([s.astype(np.uint16) for s in new])
        gen[name] = {"samples": len(new), "cpu_tokens_per_s": round(sum(map(len, new)) / secs, 1),
                     "8gram_repeated_within_sample": round(float(1 - counts["all"][0] / counts["all"].sum()), 4),
                     "distinct_4gram": round(np.mean([len({tuple(s[i:i + 4]) for i in range(len(s) - 3)})
                                                      / max(len(s) - 3, 1) for s in new]), 4),
                     "teacher_nll_of_own_tokens": round(float(np.mean([nll(s)[len(p) - 1:].mean()
                                                                       for s, p in zip(outs, prompts)])), 3)}
    real = [np.asarray(tok(t, add_special_tokens=False)["input_ids"][256:256 + args.gen_tokens], dtype=np.int64)
            for t in test]
    counts = bucket_counts([s.astype(np.uint16) for s in real])
    gen["real continuation"] = {
        "samples": len(real), "8gram_repeated_within_sample": round(float(1 - counts["all"][0] / counts["all"].sum()), 4),
        "distinct_4gram": round(np.mean([len({tuple(s[i:i + 4]) for i in range(len(s) - 3)}) / max(len(s) - 3, 1)
                                         for s in real]), 4),
        "teacher_nll_of_own_tokens": round(float(np.mean([nll(np.concatenate([p, r]))[len(p) - 1:].mean()
                                                          for p, r in zip(prompts, real)])), 3)}
    result["teacher_continuations"] = gen
    result["settings"]["seconds"] = round(time.time() - t0)
    (out / "probe.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


def cmd_export(args):
    from linzoo.data import export_long_corpus

    t0 = time.time()
    manifest = export_long_corpus(args.out, max_part_bytes=args.max_part_bytes)
    where = Path(args.out) / f"long-v{manifest['version']}"
    total = sum(p["bytes"] for p in manifest["parts"])
    for p in manifest["parts"]:
        print(f"{where / p['file']}: {p['bytes'] / 1e6:.1f} MB, {p['docs']} docs")
    import subprocess

    listed = subprocess.run(["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=REPO, capture_output=True,
                            text=True).stdout.split("\0")  # what a GPU call copies besides `carry`
    checkout = sum((REPO / f).stat().st_size for f in listed if f and (REPO / f).is_file())
    per_call = CALL_BYTES - checkout
    print(f"total {total / 1e6:.1f} MB in {len(manifest['parts'])} parts ({time.time() - t0:.0f} s); "
          f"with a ~{checkout / 1e6:.1f} MB checkout one call carries {per_call / 1e6:.1f} MB: "
          f"{math.ceil(total / per_call)} call(s) if parts could be split, "
          f"{len(manifest['parts'])} if one part a call")


def cmd_verify(args):
    """Fill a fresh cache from the bundles alone (pip/npm/apt made unreachable) and compare with the built corpus."""
    import subprocess

    from linzoo.corpus.long import load_long

    built = load_long()
    with tempfile.TemporaryDirectory() as tmp:
        env = dict(os.environ, LINZOO_CACHE=tmp, LINZOO_CORPUS_DIR=str(Path(args.dir).resolve()), PATH="/nonexistent")
        code = ("import time; t=time.time(); from linzoo.corpus.long import load_long; dd = load_long(); "
                "import json; print(json.dumps({s: [len(dd[s]), dd[s][0]['text'][:60]] for s in dd}), "
                "round(time.time()-t, 1))")
        proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
        print(proc.stdout, proc.stderr[-2000:])
        if proc.returncode:
            sys.exit(proc.returncode)
        os.environ["LINZOO_CACHE"] = tmp
        imported = load_long()
        for split in ("train", "test"):
            same = built[split]["text"] == imported[split]["text"] and built[split]["source"] == imported[split]["source"]
            print(split, len(imported[split]), "identical to the built corpus" if same else "DIFFERS")
            if not same:
                sys.exit(1)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="cmd", required=True)
    sub.add_parser("build")
    p = sub.add_parser("stats")
    p.add_argument("--out", default=str(REPO / "results" / "corpus"))
    p.add_argument("--rep_tokens", type=int, default=3_000_000, help="tokens per source for the repetition count")
    p.add_argument("--row_tokens", type=int, default=8_000_000, help="tokens packed into 2048-rows per corpus")
    p = sub.add_parser("probe")
    p.add_argument("--out", default=str(REPO / "results" / "corpus"))
    p.add_argument("--probe_rows", type=int, default=8)
    p.add_argument("--gen_tokens", type=int, default=256, help="0: skip the teacher-continuation probe")
    p.add_argument("--gen_prompts", type=int, default=6)
    p = sub.add_parser("export")
    p.add_argument("--out", default=str(REPO / ".dev" / "corpus"))
    p.add_argument("--max_part_bytes", type=int, default=50_000_000)
    p = sub.add_parser("verify")
    p.add_argument("--dir", default=str(REPO / ".dev" / "corpus"))
    args = parser.parse_args(argv)
    {"build": cmd_build, "stats": cmd_stats, "probe": cmd_probe, "export": cmd_export, "verify": cmd_verify}[args.cmd](args)


if __name__ == "__main__":
    main()
