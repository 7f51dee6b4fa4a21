"""Training and decoding speed: linzoo students vs fla's own *ForCausalLM peers, side by side.

    python scripts/bench_speed.py --out results/bench_speed.json [--batch 16 --seq_len 2048] [--stages 12]
    python scripts/bench_speed.py --teacher TINY_FOLDER --device cpu --skip_peers ...   # a CPU smoke run (tests)

Both sides run in this one process at the teacher's shape (SmolLM2-135M by default) in bf16, with the same inputs
and the same timing loop (CUDA events, warm-up first): fwd+bwd tokens/s with a next-token loss, and B=1 greedy
decoding ms/token (ours: plain cached forward, and the same step replayed as a CUDA graph). Ratios = ours / peer.
Each of ours is also checked whole-model on a small batch: logits, loss and all gradients of the fast path
(fla / mlstm-kernels kernels, fused norms, SwiGLU, conv and cross-entropy; bf16) against the torch path in fp32,
beside the torch path in bf16 against the same reference (the `floor` that bf16 alone explains).

`--stages N` also runs `linzoo linearize`'s three stages N steps each through their own trainers (fp32 weights,
bf16 autocast, as the CLI trains) on random rows of the same shape: steady and wall tokens/s per stage, and stage 3's
rate over the model's own fwd+bwd rate. `--decode_prompts` times graph decoding after long prompts (flat is the
goal), `--decode_batches` batched graph decoding in tokens/s.
"""

import argparse
import copy
import json
import tempfile
import time

import torch

import linzoo
from bench_utils import cuda_ms, rel
from linzoo.modeling.graph_decoding import GraphedDecoder
from linzoo.loading import load_teacher
from linzoo.modeling.mixers import MIXER_CLASSES

SHAPE = dict(hidden_size=576, num_hidden_layers=30, intermediate_size=1536, vocab_size=49152, tie_word_embeddings=True)


START = time.perf_counter()


def stamp(what: str) -> None:
    """Progress with the seconds since start, so a run cut by its time limit shows where the time went."""
    print(f"[{time.perf_counter() - START:6.1f} s] {what}", flush=True)


# mixer -> (config class, model class, extra kwargs) of fla's own model at our shape (fla's defaults otherwise). A
# benchmark fact, so it lives here rather than in the remote-code bundle; a mixer without a row has no fla peer.
FLA_PEERS = {
    "deltanet": ("DeltaNetConfig", "DeltaNetForCausalLM", dict(expand_k=1, expand_v=1)),
    "gated_deltanet": ("GatedDeltaNetConfig", "GatedDeltaNetForCausalLM", dict(head_dim=64, expand_v=1)),
    "gla": ("GLAConfig", "GLAForCausalLM", dict(expand_k=1, expand_v=1)),
    "kda": ("KDAConfig", "KDAForCausalLM", dict(head_dim=64, expand_v=1)),
    "linear_attn": ("LinearAttentionConfig", "LinearAttentionForCausalLM", dict(expand_k=1, expand_v=1, num_kv_heads=3)),
    # fla's Mamba-2 has no MLP blocks; expand=1 keeps its heads at the 135M shape's 9 x 64
    "mamba2": ("Mamba2Config", "Mamba2ForCausalLM", dict(head_dim=64, expand=1, state_size=64)),
    "retnet": ("RetNetConfig", "RetNetForCausalLM", dict(expand_k=1, expand_v=1)),
}


def fla_peer(mixer):
    """The peer model for the same mixer at the 135M shape: fla's own (`FLA_PEERS`), for xlstm the xlstm package's
    xLSTM Large; None where there is none."""
    if mixer == "xlstm":  # fla has no mLSTM model: the xlstm package's own (`pip install xlstm`), if installed
        try:
            return XlstmPeer()
        except ImportError as err:
            print(f"xlstm: no peer ({err}); its row compares with gated_deltanet's instead", flush=True)
            return None
    spec = FLA_PEERS.get(mixer)
    if spec is None:
        return None
    import fla.models as fm

    config_name, model_name, extra = spec
    return getattr(fm, model_name)(getattr(fm, config_name)(**SHAPE, num_heads=9, **extra))


class XlstmPeer(torch.nn.Module):
    """xLSTM's own model (`xlstm` package's xLSTM Large on mlstm-kernels' Triton kernels) at the 135M shape behind the
    timing loop's interface (`model(input_ids=, labels=).loss`); training only (its generate() is not HF's)."""

    def __init__(self):
        super().__init__()
        from xlstm.xlstm_large.model import xLSTMLarge, xLSTMLargeConfig

        self.model = xLSTMLarge(xLSTMLargeConfig(
            embedding_dim=SHAPE["hidden_size"], num_heads=9, num_blocks=SHAPE["num_hidden_layers"],
            vocab_size=SHAPE["vocab_size"], qk_dim_factor=1.0, v_dim_factor=1.0,
            ffn_proj_factor=SHAPE["intermediate_size"] / SHAPE["hidden_size"], mode="train"))

    def forward(self, input_ids, labels):
        logits = self.model(input_ids)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
        return type("Output", (), {"loss": loss})()


def params_m(model):
    return round(sum(p.numel() for p in model.parameters()) / 1e6, 1)


def time_train(model, ids, iters, warmup=3):
    model.train()

    def step():
        model(input_ids=ids, labels=ids).loss.backward()

    cuda_ms(step, warmup)
    cuda = ids.device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    seconds = cuda_ms(step, iters) / 1000
    model.zero_grad(set_to_none=True)
    return ids.numel() / seconds, torch.cuda.max_memory_allocated() / 2**30 if cuda else float("nan")


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
    """ms/token of CUDA-graph decoding (the step run eagerly off CUDA), and how many of its tokens equal
    generate()'s greedy tokens (from the first on, until the first difference: one flipped near-tie changes
    everything after it)."""
    kw = dict(max_new_tokens=new_tokens, do_sample=False, eos_token_id=None)  # no eos: all tokens compared
    reference = model.generate(prompt, **kw)
    graphed = model.generate(prompt, custom_generate=model.graph_decoding, **kw)  # the user's switch
    differs = (graphed != reference)[0, prompt.shape[1]:].nonzero()
    same = int(differs[0]) if len(differs) else new_tokens
    decoder = GraphedDecoder(model, prompt, graph=prompt.device.type == "cuda")  # timed without capture
    return cuda_ms(lambda: decoder.generate(new_tokens)) / new_tokens, same


@torch.no_grad()
def time_long_decode(model, vocab, prompt_lengths, new_tokens, device):
    """Graph decoding ms/token after a random prompt of each length (B=1): a linear student's step does not grow
    with the context."""
    out = {}
    for length in prompt_lengths:
        prompt = torch.randint(0, vocab, (1, length), device=device)
        decoder = GraphedDecoder(model, prompt, graph=device.type == "cuda")
        out[str(length)] = cuda_ms(lambda: decoder.generate(new_tokens), warmup=1) / new_tokens
        del decoder
    return out


@torch.no_grad()
def time_batched_decode(model, vocab, batches, new_tokens, device):
    """Tokens/s of graph decoding B sequences at once after 32-token prompts."""
    out = {}
    for batch in batches:
        decoder = GraphedDecoder(model, torch.randint(0, vocab, (batch, 32), device=device), graph=device.type == "cuda")
        out[str(batch)] = batch * new_tokens / (cuda_ms(lambda: decoder.generate(new_tokens), warmup=1) / 1000)
        del decoder
    return out


def time_stages(teacher, tokenizer, mixer, batch, seq_len, steps, device):
    """linzoo linearize's three stages, `steps` steps each through their own trainers (fp32 weights under bf16
    autocast on CUDA, as the CLI trains), on random rows: steady and wall tokens/s and seconds per stage."""
    from datasets import Dataset

    from linzoo.trainers.linearize import STAGES, run_stage
    from linzoo.trainers.linearize_config import LinearizeConfig

    data = Dataset.from_dict({"input_ids": torch.randint(0, teacher.config.vocab_size, (steps * batch, seq_len)).tolist()})
    out = {}
    with tempfile.TemporaryDirectory() as work:
        args = LinearizeConfig(
            output_dir=work, mixer=mixer, total_tokens=3 * steps * batch * seq_len, stage_fractions=[1, 1, 1],
            max_seq_length=seq_len, per_device_train_batch_size=batch, logging_steps=max(1, steps // 4),
            save_steps=10**9, calibration_tokens=0, bf16=device.type == "cuda", use_cpu=device.type != "cuda",
            kernel_backend="auto", disable_tqdm=True,
        )
        student = linzoo.linearize(teacher, mixer)
        for index, (name, _) in enumerate(STAGES):
            s = run_stage(index, student, teacher, tokenizer, data, args)
            out[name] = {"steady_tok_s": s["tokens_per_second_steady"], "wall_tok_s": s["tokens_per_second"],
                         "seconds": s["seconds"], "steps": s["steps"]}
    del student
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", default="embedded")
    ap.add_argument("--mixers", default=",".join(linzoo.MIXERS))
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--seq_len", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--new_tokens", type=int, default=128)
    ap.add_argument("--skip_peers", action="store_true")
    ap.add_argument("--stages", type=int, default=0, help="steps per linearize stage to time (0: skip)")
    ap.add_argument("--decode_prompts", default="", help="prompt lengths for graph decoding, e.g. 4096,32768")
    ap.add_argument("--decode_batches", default="", help="batch sizes for graph decoding, e.g. 1,8,64")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke run (fp32, no graphs, no parity)")
    ap.add_argument("--out", default="results/bench_speed.json")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    teacher, _ = load_teacher(args.teacher)
    teacher = teacher.to(dev, dtype)
    vocab = teacher.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.seq_len), device=dev)
    prompt = ids[:1, :32]
    res = {"card": torch.cuda.get_device_name() if cuda else "cpu", "torch": torch.__version__, "batch": args.batch,
           "seq_len": args.seq_len, "dtype": str(dtype).removeprefix("torch."), "rows": {}}
    stamp("teacher: fwd+bwd")
    tps, mem = time_train(teacher, ids, args.iters)
    res["rows"]["teacher"] = {"params_m": params_m(teacher), "train_tok_s": tps, "train_peak_gib": mem,
                              "decode_ms_per_token": time_generate(teacher, prompt, args.new_tokens)}
    print("teacher", json.dumps(res["rows"]["teacher"]), flush=True)
    stage_teacher = None
    for mixer in args.mixers.split(","):
        stamp(f"{mixer}: ours, fwd+bwd (first call compiles and autotunes the kernels)")
        ours = linzoo.linearize(teacher, mixer).to(dev, dtype)
        row = {"params_m": params_m(ours)}  # the peers have fla's defaults (e.g. output gates): sizes differ
        ours.config.kernel_backend = "fast" if cuda else "torch"
        row["train_tok_s"], row["train_peak_gib"] = time_train(ours, ids, args.iters)
        stamp(f"{mixer}: ours, generate()")
        row["decode_ms_per_token"] = time_generate(ours, prompt, args.new_tokens)
        stamp(f"{mixer}: ours, CUDA-graph decoding")
        row["decode_graph_ms_per_token"], row["graph_tokens_matching_generate"] = time_graph_decode(
            ours, prompt, args.new_tokens)
        if args.decode_prompts:
            stamp(f"{mixer}: ours, graph decoding after prompts of {args.decode_prompts} tokens")
            row["decode_graph_ms_after_prompt"] = time_long_decode(
                ours, vocab, [int(n) for n in args.decode_prompts.split(",")], args.new_tokens, dev)
        if args.decode_batches:
            stamp(f"{mixer}: ours, batched graph decoding at B = {args.decode_batches}")
            row["decode_graph_tok_s_by_batch"] = time_batched_decode(
                ours, vocab, [int(n) for n in args.decode_batches.split(",")], args.new_tokens, dev)
        if cuda:
            stamp(f"{mixer}: ours, fast vs torch path (logits, loss, gradients)")
            row["parity"] = model_parity(ours, ids[:2, :512])
        del ours
        if args.stages:
            stamp(f"{mixer}: linearize stages 1-3, {args.stages} steps each through their trainers")
            if stage_teacher is None:  # fp32, as `linzoo linearize` loads it; loaded once for all mixers
                stage_teacher = load_teacher(args.teacher)
            row["stages"] = time_stages(*stage_teacher, mixer, args.batch, args.seq_len, args.stages, dev)
            kd = row["stages"]["stage3-kd"]["steady_tok_s"]
            row["stage3_over_fwd_bwd"] = kd / row["train_tok_s"] if kd else None
            row["stage12_over_stage3"] = [row["stages"][n]["steady_tok_s"] / kd if kd else None
                                          for n in ("stage1-attention-transfer", "stage2-hidden-alignment")]
        peer = None
        if not args.skip_peers:
            stamp(f"{mixer}: the peer (fla's model; xLSTM Large for xlstm), built, then fwd+bwd")
            peer = fla_peer(mixer)
        if peer is not None:
            peer = peer.to(dev, dtype)
            row["peer_params_m"] = params_m(peer)
            row["peer_train_tok_s"], row["peer_train_peak_gib"] = time_train(peer, ids, args.iters)
            row["train_ratio"] = row["train_tok_s"] / row["peer_train_tok_s"]
            if hasattr(peer, "generate"):
                stamp(f"{mixer}: the peer's generate()")
                row["peer_decode_ms_per_token"] = time_generate(peer, prompt, args.new_tokens)
                row["decode_graph_speedup_vs_peer"] = row["peer_decode_ms_per_token"] / row["decode_graph_ms_per_token"]
            del peer
        row["train_ratio_vs_teacher"] = row["train_tok_s"] / res["rows"]["teacher"]["train_tok_s"]
        if "gated_deltanet" in res["rows"] and mixer != "gated_deltanet":
            row["train_ratio_vs_gated_deltanet"] = row["train_tok_s"] / res["rows"]["gated_deltanet"]["train_tok_s"]
        res["rows"][mixer] = row
        print(mixer, json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every mixer, so a timeout keeps what finished
            json.dump(res, f, indent=1)
        if cuda:
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
    staged = {name: r for name, r in res["rows"].items() if "stages" in r}
    if staged:
        print(f"\n{'mixer':16s} {'fwd+bwd':>9s} {'stage1':>9s} {'stage2':>9s} {'stage3':>9s} {'s3/fwdbwd':>9s} "
              f"{'s1/s3':>6s} {'s2/s3':>6s}   steady tokens/s (wall in brackets)")
        for name, r in staged.items():
            st = [r["stages"][n] for n in ("stage1-attention-transfer", "stage2-hidden-alignment", "stage3-kd")]
            s12 = [nan if v is None else v for v in r["stage12_over_stage3"]]
            print(f"{name:16s} {r['train_tok_s']:9.0f} " + " ".join(f"{x['steady_tok_s'] or nan:9.0f}" for x in st)
                  + f" {r['stage3_over_fwd_bwd'] or nan:9.2f} {s12[0]:6.2f} {s12[1]:6.2f}   ("
                  + " / ".join(f"{x['wall_tok_s']:.0f}" for x in st) + ")")


if __name__ == "__main__":
    main()
