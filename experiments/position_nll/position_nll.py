"""Mean next-token NLL of a student and its teacher by position within a block, on the embedded test split: where
in the context a student is better or worse than its teacher (results/recipe/README.md, `perplexity_128`).

    python experiments/position_nll/position_nll.py runs/cpu_ablation/auto3_w64 --block 1024 --tokens 8192 --edges 0,128,256,512,1024
"""

import argparse

import torch

import linzoo
from linzoo.evals.common import load_texts
from linzoo.evals.quality import token_stream


def position_nll(lm, blocks: torch.Tensor, batch: int = 2) -> torch.Tensor:
    """[block] mean NLL of each position over `blocks` [N, block + 1] (no padding: every block is full)."""
    total = torch.zeros(blocks.shape[1] - 1)
    with torch.no_grad():
        for b in blocks.split(batch):
            logp = torch.log_softmax(lm(input_ids=b[:, :-1]).logits.float(), -1)
            total += -logp.gather(-1, b[:, 1:, None])[..., 0].sum(0)
    return total / len(blocks)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a student folder (linzoo.load_model)")
    parser.add_argument("--teacher", default="embedded")
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--tokens", type=int, default=8192, help="tokens of the test split, cut into full blocks")
    parser.add_argument("--edges", default="0,128,256,512,1024", help="position ranges to report")
    args = parser.parse_args(argv)
    teacher, tokenizer = linzoo.load_teacher(args.teacher)
    student = linzoo.load_model(args.model)[0].eval()
    stream = token_stream(tokenizer, load_texts("embedded", split="test"), args.tokens)
    blocks = torch.tensor([stream[i:i + args.block + 1] for i in range(0, args.tokens, args.block)
                           if len(stream[i:i + args.block + 1]) == args.block + 1])
    s, t = position_nll(student, blocks), position_nll(teacher.eval(), blocks)
    edges = [min(int(e), args.block) for e in args.edges.split(",")]
    print(f"{len(blocks)} blocks of {args.block} tokens; mean NLL by position, student / teacher")
    for a, b in zip(edges, edges[1:]):
        print(f"  positions {a:5d}-{b - 1:5d}: {s[a:b].mean():.3f} / {t[a:b].mean():.3f}")
    print(f"  all: perplexity {s.mean().exp():.2f} / {t.mean().exp():.2f}")


if __name__ == "__main__":
    main()
