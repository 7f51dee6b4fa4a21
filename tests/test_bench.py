"""The GPU benchmark runs end to end on CPU at a tiny shape (`--device cpu`), so a GPU session never spends its
minutes on a benchmark bug. The numbers themselves are the GPU run's (results/gpu/)."""

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_bench_speed_cpu_smoke(tiny_teacher_dir, tmp_path):
    out = tmp_path / "bench.json"
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_speed.py"), "--teacher", str(tiny_teacher_dir), "--device", "cpu",
         "--mixers", "gated_deltanet,xlstm", "--skip_peers", "--batch", "2", "--seq_len", "32", "--iters", "1",
         "--new_tokens", "4", "--stages", "4", "--decode_prompts", "16,64", "--decode_batches", "1,3", "--out", str(out)],
        capture_output=True, text=True, timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = json.loads(out.read_text())["rows"]
    assert set(rows) == {"teacher", "gated_deltanet", "xlstm"}
    for mixer in ("gated_deltanet", "xlstm"):
        row = rows[mixer]
        assert row["train_tok_s"] > 0 and row["decode_graph_ms_per_token"] > 0
        assert row["graph_tokens_matching_generate"] == 4  # the decoder's step equals generate() (fp32)
        assert set(row["decode_graph_ms_after_prompt"]) == {"16", "64"}
        assert set(row["decode_graph_tok_s_by_batch"]) == {"1", "3"}
        stages = row["stages"]
        assert set(stages) == {"stage1-attention-transfer", "stage2-hidden-alignment", "stage3-kd"}
        assert all(s["steps"] == 4 and s["steady_tok_s"] > 0 for s in stages.values()), stages
        assert row["stage3_over_fwd_bwd"] > 0
    assert "s3/fwdbwd" in proc.stdout  # the stage table is printed
