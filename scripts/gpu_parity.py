"""Fast kernels vs the pure-torch path for every registered mixer at the real 135M shape (needs CUDA).

    python scripts/gpu_parity.py --out results/gpu_parity.json [--teacher embedded] [--layer 15]

Inputs are real: the teacher's own input to attention layer `--layer` (post-RMSNorm hidden states).
For each mixer, that layer of the linearized student (fresh parameters perturbed so gates are not
trivial) runs three ways on the same weights and inputs:
  reference  torch path, fp32;   fast  fla / mlstm-kernels, bf16;   floor  torch path, bf16.
We report the relative L2 error of outputs and of every gradient (inputs and parameters) against the
reference, next to the bf16 floor (what bf16 alone explains), and for decoding: prefill with the fast
chunk kernel, then token-by-token steps with the fused-recurrent kernel, against the full forward.

`--window_size W` / `--sparse_cache_size G` run the same checks on students with exact softmax memory beside the
linear state (`modeling/memory.py`: on the fast path the window runs through FlexAttention and the linear core through
fla's kernels; the reference is the banded torch window), rows named `mixer+wW` / `mixer+wW+sG`. `--remote_code` adds a whole-model check of such a student saved with `save_pretrained`
and loaded by `AutoModelForCausalLM.from_pretrained(..., trust_remote_code=True)` on the device: logits of the fast
path vs the torch path, and greedy `generate()` with the cache vs without it on a passkey prompt.
"""

import argparse
import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

import linzoo
from bench_utils import cuda_ms, rel
from linzoo.convert import fresh_parameters
from linzoo.loading import load_teacher, resolve
from linzoo.modeling.modeling_linzoo import LinzooCache


def fwd_bwd(layer, x, cot, backend, dtype):
    layer = copy.deepcopy(layer).to(dtype)
    layer.config = copy.copy(layer.config)
    layer.config.kernel_backend = backend
    x = x.to(dtype).detach().requires_grad_(True)
    out = layer(x)
    out.backward(cot.to(dtype))
    grads = {"input": x.grad.float()} | {n: p.grad.float() for n, p in layer.named_parameters() if p.grad is not None}
    return out.float().detach(), grads, layer


@torch.no_grad()
def decode(layer, x, prefill):
    """Fast prefill then fast one-token steps, with the state in a transformers cache."""
    cache = LinzooCache(config=layer.config)
    outs = [layer(x[:, :prefill], cache=cache)]
    for t in range(prefill, x.shape[1]):
        outs.append(layer(x[:, t : t + 1], cache=cache))
    return torch.cat(outs, 1).float()


def timed_fwd_bwd_ms(layer, x, cot, iters=5):
    """Mean ms of `iters` fast-path forward+backward passes after one warm-up (CUDA events)."""
    x = x.detach().requires_grad_(True)
    return cuda_ms(lambda: layer(x).backward(cot), iters, warmup=1)


def remote_code_check(args, teacher, tokenizer, dev, options):
    """A memory student (`options`, softmax kept at `--remote_code_attn_layers`, the fitted start with
    `--remote_code_fitted`) through trust_remote_code."""
    from transformers import AutoModelForCausalLM

    from linzoo.evals.niah import build_haystack

    attn = [int(i) for i in args.remote_code_attn_layers.split(",") if i]
    calibration = None
    if args.remote_code_fitted:  # the fitted start of `linzoo linearize` (its default calibration on the embedded text)
        from linzoo.data import load_text_dataset
        from linzoo.trainers.linearize import calibration_ids

        calibration = calibration_ids(load_text_dataset("embedded", split="train"), tokenizer)
    student = linzoo.linearize(teacher, args.mixers.split(",")[0], calibration=calibration, attn_layers=attn,
                               **options)
    with tempfile.TemporaryDirectory(prefix="remote-") as folder:  # a 135M student is 0.5 GB: gone once loaded
        student.float().cpu().save_pretrained(folder)
        del student
        model = AutoModelForCausalLM.from_pretrained(folder, trust_remote_code=True,
                                                     dtype=getattr(torch, args.remote_code_dtype)).to(dev).eval()
    sample = build_haystack(tokenizer, None, args.remote_code_length, 0.5, "passkey", 0)
    ids = tokenizer(sample.prompt, return_tensors="pt")["input_ids"].to(dev)
    row = {"module": type(model).__module__, "attn_layers": attn, "window_size": args.window_size,
           "sparse_cache_size": args.sparse_cache_size, "fitted": calibration is not None,
           "dtype": args.remote_code_dtype, "prompt_tokens": ids.shape[1]}
    with torch.no_grad():
        model.config.kernel_backend = args.fast_backend
        fast = model(ids).logits.float()
        model.config.kernel_backend = "torch"
        slow = model(ids).logits.float()
        row["logits_fast_vs_torch_rel"] = rel(fast, slow)
        model.config.kernel_backend = args.fast_backend
        new = dict(max_new_tokens=args.decode_steps, do_sample=False, pad_token_id=tokenizer.pad_token_id,
                   return_dict_in_generate=True, output_logits=True)
        cached = model.generate(ids, use_cache=True, **new)
        uncached = model.generate(ids, use_cache=False, **new)
    a, b = cached.sequences[0, ids.shape[1]:], uncached.sequences[0, ids.shape[1]:]
    same = int((a == b).cumprod(0).sum())  # tokens equal before the first difference (bf16 near-ties may flip one)
    row |= {"generate_cached_equals_uncached": bool(torch.equal(a, b)), "generate_same_prefix_tokens": same,
            "generate_logits_rel": rel(torch.stack(cached.logits[:same]).float(),
                                       torch.stack(uncached.logits[:same]).float()) if same else None,
            "generated": tokenizer.decode(a), "generated_uncached": tokenizer.decode(b), "passkey": sample.answer}
    print("remote_code", json.dumps(row), flush=True)
    return row


def run_parallel(args):
    """One process per mixer (Triton compiles in parallel; a crash in one mixer leaves the others), one JSON."""
    resolve(args.teacher)  # convert the embedded GGUF once, before the processes race for it
    with tempfile.TemporaryDirectory(prefix="parity-") as folder:  # per-mixer logs and JSON, merged below
        tmp = Path(folder)
        mixers = args.mixers.split(",")
        procs = {}
        for m in mixers:
            cmd = [sys.executable, __file__, "--mixers", m, "--out", str(tmp / f"{m}.json"), "--teacher",
                   args.teacher, "--layer", str(args.layer), "--batch", str(args.batch), "--seq_len", str(args.seq_len),
                   "--decode_steps", str(args.decode_steps), "--device", args.device, "--fast_backend", args.fast_backend,
                   "--fast_fp32_mixers", args.fast_fp32_mixers, "--window_size", str(args.window_size),
                   "--sparse_cache_size", str(args.sparse_cache_size)]
            if args.remote_code and m == mixers[0]:  # the whole-model check once, in the first mixer's process
                cmd += ["--remote_code", "--remote_code_attn_layers", args.remote_code_attn_layers, "--remote_code_dtype",
                        args.remote_code_dtype, "--remote_code_length", str(args.remote_code_length)]
                cmd += ["--remote_code_fitted"] if args.remote_code_fitted else []
            log = open(tmp / f"{m}.log", "w")
            procs[m] = (subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), log)
        results = {"mixers": {}}
        end = time.time() + args.deadline if args.deadline else None
        for m in mixers:
            proc, log = procs[m]
            try:
                code = proc.wait(timeout=None if end is None else max(1.0, end - time.time()))
            except subprocess.TimeoutExpired:  # report the others rather than lose everything to an outer timeout
                proc.kill()
                code = proc.wait()
                with open(tmp / f"{m}.log", "a") as f:
                    f.write(f"\ntimed out: --deadline {args.deadline} s\n")
            log.close()
            lines = (tmp / f"{m}.log").read_text().strip().splitlines() or [f"exit {code}"]
            print(f"--- {m} (exit {code})", *lines[-8 if code else -1:], sep="\n", flush=True)
            part = tmp / f"{m}.json"
            if part.is_file():
                data = json.loads(part.read_text())
                results.update({k: v for k, v in data.items() if k != "mixers"}, parallel_processes=len(mixers))
                results["mixers"].update(data["mixers"])
            if code:
                results["mixers"].setdefault(m, {"error": lines[-1]})
        return results


def print_table(results):
    r = results.get("remote_code")
    if r:
        print(f"trust_remote_code ({r['dtype']}, {r['prompt_tokens']} tokens): logits fast vs torch "
              f"{r['logits_fast_vs_torch_rel']:.2e}; generate cached == uncached: {r['generate_cached_equals_uncached']} "
              f"({r['generate_same_prefix_tokens']} equal tokens, logits rel {r['generate_logits_rel']}); "
              f"answer {r['generated']!r}, passkey {r['passkey']}")
    print(f"\n{'mixer':16s} {'out rel':>9s} {'floor':>9s} {'grad rel':>9s} {'floor':>9s} {'decode rel':>10s} "
          f"{'floor':>9s} {'fwd+bwd ms':>10s} {'worst grad':>14s}")
    for m, r in results["mixers"].items():
        if "error" in r:
            print(f"{m:16s} ERROR {r['error']}")
            continue
        print(f"{m:16s} {r['out_rel']:9.2e} {r['out_rel_bf16_floor']:9.2e} {r['grad_rel_max']:9.2e} "
              f"{r['grad_rel_max_bf16_floor']:9.2e} {r['decode_steps_vs_full_rel']:10.2e} "
              f"{r.get('decode_steps_vs_full_rel_bf16_floor', float('nan')):9.2e} "
              f"{r.get('fwd_bwd_ms', float('nan')):10.2f} {r.get('grad_rel_max_param', ''):>14s}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", default="embedded")
    ap.add_argument("--mixers", default=",".join(linzoo.MIXERS))
    ap.add_argument("--layer", type=int, default=15)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq_len", type=int, default=1024)
    ap.add_argument("--decode_steps", type=int, default=32)
    ap.add_argument("--out", default="results/gpu_parity.json")
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--fast_backend", default="fast", help="'torch' only to dry-run this script on a CPU")
    ap.add_argument("--parallel", action="store_true", help="one process per mixer, merged into one --out JSON")
    ap.add_argument("--deadline", type=float, default=0, help="--parallel: seconds before unfinished mixers are killed")
    ap.add_argument("--fast_fp32_mixers", default="xlstm",
                    help="mixers whose kernels also run on fp32 inputs ('all', or a comma list; each costs a compile)")
    ap.add_argument("--window_size", type=int, default=0, help="students with an exact softmax window of this many tokens")
    ap.add_argument("--sparse_cache_size", type=int, default=0, help="... and a sparse cache of this many pairs")
    ap.add_argument("--remote_code", action="store_true",
                    help="also the whole-model trust_remote_code check (first of --mixers, with the memory options)")
    ap.add_argument("--remote_code_attn_layers", default="6,17,18,20,21,23",
                    help="softmax layers of that student (comma list; default: the main job's auto:6 on SmolLM2-135M)")
    ap.add_argument("--remote_code_fitted", action="store_true", help="that student from the fitted start (needs the "
                    "embedded text), so that its greedy answer can be the passkey")
    ap.add_argument("--remote_code_dtype", default="bfloat16")
    ap.add_argument("--remote_code_length", type=int, default=512, help="its passkey prompt's length in tokens")
    args = ap.parse_args()
    if args.parallel:
        results = run_parallel(args)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
        print_table(results)
        return
    dev = torch.device(args.device)
    teacher, tokenizer = load_teacher(args.teacher)
    teacher.to(dev)
    torch.manual_seed(0)
    ids = torch.randint(0, teacher.config.vocab_size, (args.batch, args.seq_len), device=dev)
    captured = {}
    def grab(module, args_, kwargs):
        captured["x"] = (args_[0] if args_ else kwargs["hidden_states"]).detach()

    hook = teacher.model.layers[args.layer].self_attn.register_forward_pre_hook(grab, with_kwargs=True)
    with torch.no_grad():
        teacher(ids)
    hook.remove()
    x = captured["x"].float()
    cot = torch.randn_like(x)
    results = {"card": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__, "shape": "SmolLM2-135M",
               "layer": args.layer, "batch": args.batch, "seq_len": args.seq_len, "mixers": {}}
    options = {k: getattr(args, k) for k in ("window_size", "sparse_cache_size") if getattr(args, k)}
    suffix = "".join(f"+{k[0]}{v}" for k, v in options.items())  # +w64, +w64+s16
    if args.remote_code:
        results["remote_code"] = remote_code_check(args, teacher, tokenizer, dev, options)
    for mixer in args.mixers.split(","):
        t0 = time.time()
        student = linzoo.linearize(teacher, mixer, **options)
        layer = student.model.layers[args.layer].self_attn
        fresh = set(fresh_parameters(student))
        g = torch.Generator(device="cpu").manual_seed(1)
        with torch.no_grad():  # data-dependent gates so the kernels see real decays
            for name, p in layer.named_parameters():
                if f"model.layers.{args.layer}.self_attn.{name}" in fresh and "norm" not in name:
                    p.add_(0.02 * torch.randn(p.shape, generator=g).to(p.device))
        ref, ref_g, _ = fwd_bwd(layer, x, cot, "torch", torch.float32)
        floor, floor_g, floor_layer = fwd_bwd(layer, x, cot, "torch", torch.bfloat16)
        fast, fast_g, fast_layer = fwd_bwd(layer, x, cot, args.fast_backend, torch.bfloat16)
        fp32_row = {}
        if args.fast_fp32_mixers == "all" or mixer in args.fast_fp32_mixers.split(","):
            try:  # the kernels on fp32 inputs
                fast32, fast32_g, _ = fwd_bwd(layer, x, cot, args.fast_backend, torch.float32)
                fp32_row = {"out_rel_fast_fp32": rel(fast32, ref),
                            "grad_rel_fast_fp32": {n: rel(fast32_g[n], ref_g[n]) for n in ref_g}}
                fp32_row["grad_rel_max_fast_fp32"] = max(fp32_row["grad_rel_fast_fp32"].values())
            except Exception as e:  # noqa: BLE001 - a kernel without fp32 support is reported, not fatal
                fp32_row = {"fast_fp32_error": f"{type(e).__name__}: {e}"[:300]}
        grad_err = {n: rel(fast_g[n], ref_g[n]) for n in ref_g}
        floor_err = {n: rel(floor_g[n], ref_g[n]) for n in ref_g}
        worst = max(grad_err, key=grad_err.get)
        prefill = args.seq_len - args.decode_steps
        dec = decode(fast_layer, x.bfloat16(), prefill)
        dec_floor = decode(floor_layer, x.bfloat16(), prefill)  # the torch path's own bf16 decode vs its full forward
        row = {
            "out_rel": rel(fast, ref), "out_rel_bf16_floor": rel(floor, ref),
            "out_max_abs": (fast - ref).abs().max().item(),
            "grad_rel_max": grad_err[worst], "grad_rel_max_param": worst,
            "grad_rel_max_bf16_floor": max(floor_err.values()),
            "grad_rel_input": grad_err["input"],
            "decode_steps_vs_full_rel": rel(dec[:, prefill:], fast[:, prefill:]),
            "decode_steps_vs_full_rel_bf16_floor": rel(dec_floor[:, prefill:], floor[:, prefill:]),
            "decode_steps_vs_reference_rel": rel(dec[:, prefill:], ref[:, prefill:]),
            "grad_rel": grad_err, "grad_rel_bf16_floor": floor_err,
            **fp32_row,
            "seconds": round(time.time() - t0, 1),
        }
        if dev.type == "cuda":  # layer fwd+bwd on the fast path, B x T of the check, kernels warm
            row["fwd_bwd_ms"] = timed_fwd_bwd_ms(fast_layer, x.bfloat16(), cot.bfloat16())
        results["mixers"][mixer + suffix] = row
        print(mixer + suffix, json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every mixer, so a timeout keeps what finished
            json.dump(results, f, indent=1)
        del student, fast_layer, floor_layer
        torch.cuda.empty_cache()
    print_table(results)


if __name__ == "__main__":
    main()
