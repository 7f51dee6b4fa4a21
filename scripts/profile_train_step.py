"""Where a stage-3 (KD) training step spends its time, as `linzoo linearize` runs it.

    python scripts/profile_train_step.py --mixer gated_deltanet [--batch 8 --seq_len 2048] [--out prof.json]

Same setup as the trainer: fp32 student weights under bf16 autocast, the frozen teacher beside it,
`KnowledgeDistillationTrainer.kd_loss`, fused AdamW. Times each part (synchronised wall clock, mean over
`--iters` after warm-up): teacher forward, student forward, KD loss, backward, optimizer step; then a
`torch.profiler` pass of one step prints the top operators by device (or CPU) time. Compare the total with
`bench_speed.py`'s model-only fwd+bwd to see what the training loop adds.
"""

import argparse
import json
import time

import torch

import linzoo
from linzoo.loading import load_teacher
from linzoo.trainers.linearize_trainer import KnowledgeDistillationTrainer, mixed_precision


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--teacher", default="embedded")
    ap.add_argument("--mixer", default="gated_deltanet")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--seq_len", type=int, default=2048)
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", default=None)
    ap.add_argument("--fp32_teacher", action="store_true",
                    help="teacher and KD projections outside autocast (how the trainer ran before mixed_precision)")
    args = ap.parse_args()
    dev = torch.device(args.device)
    cuda = dev.type == "cuda"
    teacher, _ = load_teacher(args.teacher)
    student = linzoo.linearize(teacher, args.mixer).to(dev).train()
    teacher = teacher.to(dev).eval().requires_grad_(False)
    opt = torch.optim.AdamW(student.parameters(), lr=1e-5, fused=cuda)
    ids = torch.randint(0, teacher.config.vocab_size, (args.batch, args.seq_len), device=dev)
    mask = torch.ones_like(ids)
    labels = torch.nn.functional.pad(ids[:, 1:], (0, 1), value=-100)
    kw = dict(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=True, logits_to_keep=1)
    autocast = torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda)  # what accelerate does to the student

    def outside():  # the teacher and the KD loss, as the trainer runs them
        return mixed_precision(dev, "bf16" if cuda and not args.fp32_teacher else "no")

    def sync():
        if cuda:
            torch.cuda.synchronize()

    def step(times=None):
        marks = [time.perf_counter()]

        def mark():
            sync()
            marks.append(time.perf_counter())

        with torch.no_grad(), outside():
            t_hidden = teacher(**kw).hidden_states[-1]
        mark()
        with autocast:
            s_hidden = student(**kw).hidden_states[-1]
        mark()
        with outside():
            loss, _, _ = KnowledgeDistillationTrainer.kd_loss(
                s_hidden, t_hidden, student.get_output_embeddings(), teacher.get_output_embeddings(), labels)
        mark()
        loss.backward()
        mark()
        opt.step()
        opt.zero_grad(set_to_none=True)
        mark()
        if times is not None:
            for name, a, b in zip(("teacher_fwd", "student_fwd", "kd_loss", "backward", "optimizer"), marks, marks[1:]):
                times.setdefault(name, []).append(b - a)

    for _ in range(2):
        step()
    times = {}
    for _ in range(args.iters):
        step(times)
    ms = {k: 1000 * sum(v) / len(v) for k, v in times.items()}
    total = sum(ms.values())
    tokens = args.batch * args.seq_len
    print(f"{args.mixer}{' (fp32 teacher)' if args.fp32_teacher else ''}: {tokens} tokens/step, {total:.1f} ms/step = {tokens / total * 1000:,.0f} tokens/s")
    for k, v in ms.items():
        print(f"  {k:12s} {v:8.1f} ms  {100 * v / total:5.1f} %")
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if cuda else [])
    with torch.profiler.profile(activities=activities) as prof:
        step()
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    table = prof.key_averages().table(sort_by=key, row_limit=20, max_name_column_width=60)
    print(table)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"card": torch.cuda.get_device_name() if cuda else "cpu", "mixer": args.mixer, "batch": args.batch,
                       "seq_len": args.seq_len, "fp32_teacher": args.fp32_teacher, "ms": ms, "tokens_per_second": tokens / total * 1000,
                       "profile_top": table}, f, indent=1)


if __name__ == "__main__":
    main()
