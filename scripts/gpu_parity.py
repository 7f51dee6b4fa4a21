"""Fast kernels vs the pure-torch path, for all seven mixers at the real 135M shape (needs CUDA).

    python scripts/gpu_parity.py --out results/gpu_parity.json [--teacher embedded] [--seq_len 512]

For each mixer: the linearized teacher (fresh parameters perturbed so gates are not trivial) runs
(a) fast path in bf16 and (b) torch path in fp32 on the same weights; we compare logits, every
parameter's gradient (relative L2 error), and cached prefill + decode steps against the full forward.
The torch path in bf16 against fp32 is printed too: the floor that bf16 alone explains.
"""

import argparse
import json
import time

import torch

import linzoo
from linzoo.loading import load_teacher


def rel(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12)).item()


def run(model, state, ids, backend, dtype):
    model.config.kernel_backend = backend
    m = model.to(dtype)
    m.load_state_dict(state)
    m.zero_grad(set_to_none=True)
    out = m(ids, labels=ids, use_cache=False)
    out.loss.backward()
    grads = {n: p.grad.float().clone() for n, p in m.named_parameters() if p.grad is not None}
    return out.logits.float().detach(), grads


@torch.no_grad()
def decode(model, state, ids, prefill, backend, dtype):
    model.config.kernel_backend = backend
    m = model.to(dtype)
    m.load_state_dict(state)
    out = m(ids[:, :prefill], use_cache=True)
    cache = getattr(out, "cache", None) or out.past_key_values
    steps = [out.logits[:, -1:]]
    for t in range(prefill, ids.shape[1] - 1):
        o = m(ids[:, t : t + 1], cache=cache, past_key_values=cache, use_cache=True)
        steps.append(o.logits)
    return torch.cat(steps, 1).float()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", default="embedded")
    ap.add_argument("--mixers", default=",".join(linzoo.MIXERS))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--seq_len", type=int, default=512)
    ap.add_argument("--prefill", type=int, default=448)
    ap.add_argument("--out", default="results/gpu_parity.json")
    args = ap.parse_args()
    dev = torch.device("cuda")
    teacher, _ = load_teacher(args.teacher)
    torch.manual_seed(0)
    ids = torch.randint(0, teacher.config.vocab_size, (args.batch, args.seq_len), device=dev)
    results = {"card": torch.cuda.get_device_name(), "torch": torch.__version__, "shape": "SmolLM2-135M",
               "batch": args.batch, "seq_len": args.seq_len, "mixers": {}}
    for mixer in args.mixers.split(","):
        t0 = time.time()
        student = linzoo.linearize(teacher, mixer).to(dev)
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():  # make the fresh gates data-dependent so the kernels see real decays
            for name in student.linzoo_fresh_parameters:
                p = student.get_parameter(name)
                if "norm" not in name:
                    p.add_(0.02 * torch.randn(p.shape, generator=g).to(dev))
        state = {k: v.clone() for k, v in student.state_dict().items()}
        ref_logits, ref_grads = run(student, state, ids, "torch", torch.float32)
        bf_logits, bf_grads = run(student, state, ids, "torch", torch.bfloat16)
        fast_logits, fast_grads = run(student, state, ids, "fast", torch.bfloat16)
        grad_err = {n: rel(fast_grads[n], ref_grads[n]) for n in ref_grads}
        grad_floor = {n: rel(bf_grads[n], ref_grads[n]) for n in ref_grads}
        worst = max(grad_err, key=grad_err.get)
        full = fast_logits[:, args.prefill - 1 : -1]
        dec = decode(student, state, ids, args.prefill, "fast", torch.bfloat16)
        dec_ref = decode(student, state, ids, args.prefill, "torch", torch.float32)
        row = {
            "logits_max_abs": (fast_logits - ref_logits).abs().max().item(),
            "logits_rel": rel(fast_logits, ref_logits),
            "logits_rel_bf16_floor": rel(bf_logits, ref_logits),
            "grad_rel_max": grad_err[worst],
            "grad_rel_max_param": worst,
            "grad_rel_median": sorted(grad_err.values())[len(grad_err) // 2],
            "grad_rel_max_bf16_floor": max(grad_floor.values()),
            "decode_vs_full_max_abs": (dec - full).abs().max().item(),
            "decode_vs_full_rel": rel(dec, full),
            "decode_fast_vs_torch_rel": rel(dec, dec_ref),
            "seconds": round(time.time() - t0, 1),
        }
        results["mixers"][mixer] = row
        print(mixer, json.dumps(row), flush=True)
        with open(args.out, "w") as f:  # after every mixer, so a timeout keeps what finished
            json.dump(results, f, indent=1)
        del student
        torch.cuda.empty_cache()
    with open(args.out, "w") as f:
        json.dump(results, f, indent=1)
    print(f"{'mixer':16s} {'logit rel':>10s} {'(bf16 floor)':>12s} {'grad rel max':>12s} {'(floor)':>8s} {'decode rel':>10s}")
    for m, r in results["mixers"].items():
        print(f"{m:16s} {r['logits_rel']:10.2e} {r['logits_rel_bf16_floor']:12.2e} {r['grad_rel_max']:12.2e} "
              f"{r['grad_rel_max_bf16_floor']:8.2e} {r['decode_vs_full_rel']:10.2e}")


if __name__ == "__main__":
    main()
