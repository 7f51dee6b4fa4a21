"""Training and decoding speed: linzoo students vs fla's own *ForCausalLM peers, side by side (needs CUDA).

    python scripts/bench_speed.py --out results/bench_speed.json [--batch 16 --seq_len 2048]

Both sides run in this one process at the SmolLM2-135M shape in bf16, with the same inputs and the same
timing loop (CUDA events, warm-up first): fwd+bwd tokens/s with a next-token loss, and B=1 greedy decoding
ms/token (ours: plain cached forward, and the same step replayed as a CUDA graph). Ratios = ours / peer.
Each of ours is also checked whole-model on a small batch: logits, loss and all gradients of the fast path
(fla / mlstm-kernels kernels, fused norms, SwiGLU, conv and cross-entropy; bf16) against the torch path in fp32,
beside the torch path in bf16 against the same reference (the `floor` that bf16 alone explains).
"""

import argparse
import copy
import json
import time

import torch

import linzoo
from bench_utils import cuda_ms, rel
from linzoo.graphs import GraphedDecoder
from linzoo.loading import load_teacher
from linzoo.modeling.mixers import MIXER_CLASSES

SHAPE = dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)


START = time.perf_counter()


def stamp(what: str) -> None:
    """Progress with the seconds since start, so a run cut by its time limit shows where the time went."""
    print(f"[{time.perf_counter() - START:6.1f} s] {what}", flush=True)


def fla_peer(mixer):
    """fla's own model for the same mixer at the 135M shape (the mixer class's `fla_peer`, fla's defaults
    otherwise); None where fla has no such model."""
    spec = MIXER_CLASSES[mixer].fla_peer
    if spec is None:
        return None
    import fla.models as fm

    config_name, model_name, extra = spec
    return getattr(fm, model_name)(getattr(fm, config_name)(**SHAPE, num_heads=9, **extra))


def params_m(model):
    return round(sum(p.numel() for p in model.parameters()) / 1e6, 1)


def time_train(model, ids, iters, warmup=3):
    model.train()

    def step():
        model(input_ids=ids, labels=ids).loss.backward()

    cuda_ms(step, warmup)
    torch.cuda.reset_peak_memory_stats()
    seconds = cuda_ms(step, iters) / 1000
    model.zero_grad(set_to_none=True)
    return ids.numel() / seconds, torch.cuda.max_memory_allocated() / 2**30


@torch.no_grad()
def time_generate(model, prompt, new_tokens):
    model.eval()
    kw = dict(max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    return cuda_ms(lambda: model.generate(prompt, **kw), warmup=1) / new_tokens


def model_parity(ours, ids):
    """Whole-model check of the fast path: relative L2 errors of logits and of all gradients (one vector), and
    the loss, against the torch path in fp32; the torch path in bf16 against the same reference is the floor."""
    runs = {}
    for name, backend, dtype in [("ref", "torch", torch.float32), ("fast", "fast", torch.bfloat16),
                                 ("floor", "torch", torch.bfloat16)]:
        model = copy.deepcopy(ours).to(dtype).train()
        model.config.kernel_backend = backend
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        grads = torch.cat([p.grad.float().flatten() for p in model.parameters() if p.grad is not None])
        runs[name] = (out.logits.detach().float(), out.loss.item(), grads)
        del model, out
    ref = runs["ref"]
    return {"logits_rel": rel(runs["fast"][0], ref[0]), "logits_rel_floor": rel(runs["floor"][0], ref[0]),
            "grad_rel": rel(runs["fast"][2], ref[2]), "grad_rel_floor": rel(runs["floor"][2], ref[2]),
            "loss": runs["fast"][1], "loss_ref": ref[1], "loss_floor": runs["floor"][1]}


@torch.no_grad()
def time_graph_decode(model, prompt, new_tokens):
    """ms/token of CUDA-graph decoding, and how many of its tokens equal generate()'s greedy tokens (from the
    first on, until the first difference: one flipped near-tie changes everything after it)."""
    reference = model.generate(prompt, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False)
    graphed = GraphedDecoder(model, prompt).generate(new_tokens)
    differs = (graphed != reference[:, prompt.shape[1]:])[0].nonzero()
    same = int(differs[0]) if len(differs) else new_tokens
    decoder = GraphedDecoder(model, prompt)
    return cuda_ms(lambda: decoder.generate(new_tokens)) / new_tokens, same


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", default="embedded")
    ap.add_argument("--mixers", default=",".join(linzoo.MIXERS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq_len", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--skip_peers", action="store_true")
    ap.add_argument("--out", default="results/bench_speed.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    teacher, _ = load_teacher(args.teacher)
    teacher = teacher.to(dev, torch.bfloat16)
    ids = torch.randint(0, teacher.config.vocab_size, (args.batch, args.seq_len), device=dev)
    prompt = ids[:1, :32]
    res = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "batch": args.batch,
           "seq_len": args.seq_len, "dtype": "bfloat16", "rows": {}}
    stamp("teacher: fwd+bwd")
    tps, mem = time_train(teacher, ids, args.iters)
    res["rows"]["teacher"] = {"params_m": params_m(teacher), "train_tok_s": tps, "train_peak_gib": mem,
                              "decode_ms_per_token": time_generate(teacher, prompt, args.new_tokens)}
    print("teacher", json.dumps(res["rows"]["teacher"]), flush=True)
    for mixer in args.mixers.split(","):
        stamp(f"{mixer}: ours, fwd+bwd (first call compiles and autotunes the kernels)")
        ours = linzoo.linearize(teacher, mixer).to(dev, torch.bfloat16)
        row = {"params_m": params_m(ours)}  # the peers have fla's defaults (e.g. output gates): sizes differ
        ours.config.kernel_backend = "fast"
        row["train_tok_s"], row["train_peak_gib"] = time_train(ours, ids, args.iters)
        stamp(f"{mixer}: ours, generate()")
        row["decode_ms_per_token"] = time_generate(ours, prompt, args.new_tokens)
        stamp(f"{mixer}: ours, CUDA-graph decoding")
        row["decode_graph_ms_per_token"], row["graph_tokens_matching_generate"] = time_graph_decode(
            ours, prompt, args.new_tokens)
        stamp(f"{mixer}: ours, fast vs torch path (logits, loss, gradients)")
        row["parity"] = model_parity(ours, ids[:2, :512])
        del ours
        peer = None
        if not args.skip_peers:
            stamp(f"{mixer}: fla's peer, built, then fwd+bwd")
            peer = fla_peer(mixer)
        if peer is not None:
            peer = peer.to(dev, torch.bfloat16)
            row["peer_params_m"] = params_m(peer)
            row["peer_train_tok_s"], row["peer_train_peak_gib"] = time_train(peer, ids, args.iters)
            stamp(f"{mixer}: fla's peer, generate()")
            row["peer_decode_ms_per_token"] = time_generate(peer, prompt, args.new_tokens)
            row["train_ratio"] = row["train_tok_s"] / row["peer_train_tok_s"]
            row["decode_graph_speedup_vs_peer"] = row["peer_decode_ms_per_token"] / row["decode_graph_ms_per_token"]
            del peer
        row["train_ratio_vs_teacher"] = row["train_tok_s"] / res["rows"]["teacher"]["train_tok_s"]
        res["rows"][mixer] = row
        print(mixer, json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every mixer, so a timeout keeps what finished
            json.dump(res, f, indent=1)
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    nan = float("nan")
    print(f"\n{'model':16s} {'train tok/s':>12s} {'peer tok/s':>11s} {'ratio':>6s} {'GiB':>5s} {'peer GiB':>8s} "
          f"{'decode ms':>10s} {'graph ms':>9s} {'peer ms':>8s} {'graph=gen':>9s} {'logits rel':>10s} {'floor':>8s} "
          f"{'grad rel':>9s} {'floor':>8s}")
    for name, r in res["rows"].items():
        p = r.get("parity", {})
        print(f"{name:16s} {r['train_tok_s']:12.0f} {r.get('peer_train_tok_s', nan):11.0f} "
              f"{r.get('train_ratio', nan):6.2f} {r['train_peak_gib']:5.1f} {r.get('peer_train_peak_gib', nan):8.1f} "
              f"{r['decode_ms_per_token']:10.2f} {r.get('decode_graph_ms_per_token', nan):9.3f} "
              f"{r.get('peer_decode_ms_per_token', nan):8.2f} "
              f"{str(r.get('graph_tokens_matching_generate', '-')) + '/' + str(args.new_tokens):>9s} "
              f"{p.get('logits_rel', nan):10.2e} {p.get('logits_rel_floor', nan):8.2e} "
              f"{p.get('grad_rel', nan):9.2e} {p.get('grad_rel_floor', nan):8.2e}")


if __name__ == "__main__":
    main()
