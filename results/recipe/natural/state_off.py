# usage: PYTHONPATH=<checkout> OMP_NUM_THREADS=1 python state_off.py <student folder> swa
# Diagnostic: the trained ten-layer hybrid with its linear state switched off (null logit -> -inf: pure 64-token
# sliding-window softmax in the linear layers) vs as trained, natural NIAH at 256/512, 12 samples a length.
import sys, json, torch
torch.set_num_threads(1)
from evals.common import load_for_eval
from evals.niah import run_niah
spec, mode = sys.argv[1], sys.argv[2]  # mode: swa (null logit -1e4), asis, or a null logit value
m, t = load_for_eval(spec, "cpu", "float32")
if mode != "asis":
    for mod in m.modules():
        if hasattr(mod, "null_logit"):
            with torch.no_grad():
                mod.null_logit.fill_(-1e4 if mode == "swa" else float(mode))
r = run_niah(m, t, "256,512", "0,0.5,1", variant="natural", samples_per_cell=4, batch_size=6)
print(mode, r["mean_by_length"], r["key_logprob_by_length"], flush=True)
json.dump(r, open(f"state_off_{mode}.json", "w"))
