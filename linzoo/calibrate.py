"""A student's start fitted to its teacher: each mixer's new parameters set, per layer, to reproduce the teacher
attention on a few hundred tokens (`linzoo.linearize(..., calibration=ids)` calls `fit_to_teacher`).

The measure is stage 1's: each layer's ||mixer(x_l) - attn(x_l)||^2 / ||attn(x_l)||^2 with x_l the teacher's input
to layer l (`experiments/init_error/init_error.py` reports it per layer). Per mixer layer:

1. the knobs its class declares (`LinearMixer.start_knobs`: a decay half-life, a write strength) are chosen per head
   from a few candidates, one knob after the other, by how well the head's output, at its best scale, reproduces
   the teacher head's output (pre-`o_proj`, weighted by that head's block of `o_proj`). Heads are independent up to
   the output projection, so one pass per candidate scores every head at once;
2. the output norm's weight (a linear map of the normalised heads) is solved by least squares against the teacher's
   output after `o_proj`, exactly: it sets the scale. Before it, a fresh student's output norm left every head at
   unit RMS, 10-600x the teacher attention's energy;
3. `o_proj` itself is then solved by ridge least squares from the mixer's heads to the teacher attention's output,
   shrunk towards the teacher's o_proj (`fit_output_projection`), with the shrinkage chosen on held-out calibration
   rows (`choose_ridge`; no refit if none helps): the teacher's o_proj mixes heads that the linear mixer reproduces
   only in part, and the refit re-weights what it does reproduce.

Input-dependent gate weights stay at zero (their `reset_new_parameters` start): training makes the gates depend on
the input. What it measured on SmolLM2-135M-Instruct is in `results/init/`.
"""

from __future__ import annotations

import time

import torch

from .capture import mixer_io
from .modeling.memory import fit_null_logit, memory_forward

# Per-head candidates (tokens for a half-life, beta or input-gate level for a strength). The first search holds the
# later knobs at their default.
CANDIDATES = {"half_life": (2.0, 8.0, 32.0, 128.0, 2048.0), "strength": (0.05, 0.2, 0.5)}
DEFAULTS = {"half_life": 8.0, "strength": 0.2}
# o_proj's refit: shrinkage towards the weight it replaces, relative to the heads' mean energy; chosen per layer on
# held-out calibration tokens (`choose_ridge`), None meaning no refit at all
RIDGES = (0.03, 0.1, 0.3, 1.0, 3.0, None)
KNOB_TOKENS = 512


@torch.no_grad()
@torch.no_grad()
def normalised_heads(mixer, x, shares=None):
    """The mixer's per-head outputs on x after its output norm's normalisation, before its weight: [N, H, D] fp32;
    times the linear part's `shares` [N', H, 1] (their first N rows) where the layer has a window / sparse cache."""
    seen = {}
    hook = mixer.o_norm.register_forward_hook(lambda m, args, out: seen.__setitem__("z", args[0]))
    try:
        mixer(x)
    finally:
        hook.remove()
    z = seen["z"].float()
    z = z * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + mixer.o_norm.eps)
    z = z.reshape(-1, mixer.num_heads, mixer.head_dim)
    return z if shares is None else z * shares[: len(z)]


def head_misfit(n, a, o_weight):
    """Per head: the share of the teacher head's energy left after the best scale of the student head,
    ||W_h (s n_h - a_h)||^2 / ||W_h a_h||^2 minimised over s, with W_h the head's block of o_proj. n, a: [N, H, D]."""
    H, D = n.shape[1:]
    W = o_weight.float().view(-1, H, D)
    out = []
    for h in range(H):
        M = W[:, h].T @ W[:, h]
        nM, aM = n[:, h] @ M, a[:, h] @ M
        enn, eaa, ena = (nM * n[:, h]).sum(), (aM * a[:, h]).sum(), (nM * a[:, h]).sum()
        out.append(1 - ena**2 / (enn * eaa).clamp_min(1e-30))
    return torch.stack(out)


def fit_output_norm(n, y, o_weight):
    """The output-norm weight w [D] minimising ||y - o_proj(w * n)||^2, and the stage-1 error it leaves.

    n: [N, H, D] normalised heads; y: [N, hidden] the teacher's output. With M = W^T W and C = n^T n over (head,
    channel) pairs, the normal equations are sum over head pairs of (C * M) w = sum over heads of n * (y W)."""
    H, D = n.shape[1:]
    N, W, y = n.reshape(-1, H * D), o_weight.float(), y.float()
    gram = ((N.T @ N) * (W.T @ W)).view(H, D, H, D).sum((0, 2))
    rhs = (N * (y @ W)).view(-1, H, D).sum((0, 1))
    ridge = 1e-6 * gram.diagonal().mean().clamp_min(1e-30)
    w = torch.linalg.solve(gram + ridge * torch.eye(D, device=gram.device), rhs)
    energy = y.pow(2).sum()
    return w, ((energy - 2 * w @ rhs + w @ gram @ w) / energy).item()


def _moments(z, y):
    """(z^T z, z^T y, ||y||^2), float32 products returned as float64: all that a least-squares fit and its error
    need."""
    z, y = z.float(), y.float()
    return (z.T @ z).double(), (z.T @ y).double(), y.double().pow(2).sum()


def _solve(gram, cross, prior, ridge):
    lam = ridge * gram.diagonal().mean().clamp_min(1e-30)
    eye = torch.eye(gram.shape[0], dtype=gram.dtype, device=gram.device)
    return torch.linalg.solve(gram + lam * eye, cross + lam * prior.double().T).T


def _squared_error(weight, gram, cross, energy):
    """||y - z W^T||^2 from the moments of (z, y)."""
    weight = weight.double()
    return (energy - 2 * (weight * cross.T).sum() + ((weight @ gram) * weight).sum()).item()


def fit_output_projection(z, y, prior, ridge):
    """o_proj's weight [hidden, H * D] minimising ||y - z W^T||^2 + ridge * mean(diag(z^T z)) * ||W - prior||^2: least
    squares from the mixer's heads z [N, H * D] (o_proj's input) to the teacher attention's output y [N, hidden],
    shrunk towards `prior` (the weight it replaces) so that a few hundred tokens cannot overfit it. In float64."""
    gram, cross, _ = _moments(z, y)
    return _solve(gram, cross, prior, ridge)


def refit_output_projection(z, y, prior, rows):
    """(ridge, weight): the ridge of `RIDGES` whose fit on the first half of the calibration rows best predicts the
    second half (first and second half of the tokens for a single row), and the fit with it on all rows; (None, None)
    (keep `prior`) when no refit predicts the held-out half better than `prior` does."""
    n = z.shape[0]
    cut = (rows // 2) * (n // rows) if rows > 1 else n // 2
    first, second = _moments(z[:cut], y[:cut]), _moments(z[cut:], y[cut:])
    scores = {r: _squared_error(prior if r is None else _solve(first[0], first[1], prior, r), *second) for r in RIDGES}
    best = min(scores, key=scores.get)
    if scores[None] <= scores[best] + 1e-6 * second[2].item():  # a tie keeps the teacher's weight
        return None, None
    return best, _solve(first[0] + second[0], first[1] + second[1], prior, best)


def choose_ridge(z, y, prior, rows):
    """The ridge `refit_output_projection` picks (None: no refit)."""
    return refit_output_projection(z, y, prior, rows)[0]


@torch.no_grad()
def fit_to_teacher(student, teacher, input_ids, verbose=False):
    """Fits every mixer layer of `student` (built by `linearize` from `teacher`) to the teacher on `input_ids`
    [rows, length] (see the module docstring). Returns {layer: {"knobs": {name: [per head]}, "error": stage-1 error
    on these tokens}, "seconds": wall time, "cpu_seconds": this process's CPU time}."""
    start, cpu = time.perf_counter(), time.process_time()
    config = student.config
    layers = [i for i in range(config.num_hidden_layers) if i not in config.attn_layers]
    input_ids = torch.as_tensor(input_ids).to(next(teacher.parameters()).device)
    if input_ids.dim() == 1:
        input_ids = input_ids[None]
    io = mixer_io(teacher, input_ids, layers=layers, heads=True)
    report = {}
    for i in layers:
        mixer = student.model.layers[i].self_attn
        x, y, _, a = io.pop(i)
        x = x.to(mixer.o_proj.weight.dtype)
        H = mixer.num_heads
        # The knobs are chosen on the first KNOB_TOKENS (512 tokens chose them about as well as 2,048:
        # results/init/), the output norm and o_proj fitted on all.
        knob_rows = min(x.shape[0], -(-KNOB_TOKENS // x.shape[1]))
        x_knob, a = x[:knob_rows], a[:knob_rows].float().reshape(-1, H, mixer.head_dim)
        shares = soft = None
        if mixer.memory is not None:
            # A window / sparse cache (`memory.py`) is the teacher's own softmax: fixed, its null logit set from the
            # teacher's scores; the linear part (weighted by its share p_null) is fitted to what the softmax leaves.
            fit_null_logit(mixer, x_knob)
            shares, soft = (t.reshape(-1, H, t.shape[-1]).float() for t in memory_forward(
                mixer, x, torch.ones(x.shape[:2], dtype=torch.bool, device=x.device), parts=True)[:2])
        if soft is not None:
            a = a - soft[: len(a)]
        knobs = {name: torch.full((H,), DEFAULTS[name]) for name in mixer.start_knobs}
        if knobs:
            mixer.set_start_knobs(**knobs)
        n = None
        for name in mixer.start_knobs:
            candidates = CANDIDATES[name]
            outs, misfit = [], []
            for value in candidates:
                mixer.set_start_knobs(**{**knobs, name: torch.full((H,), value)})
                outs.append(normalised_heads(mixer, x_knob, shares))
                misfit.append(head_misfit(outs[-1], a, mixer.o_proj.weight))
            best = torch.stack(misfit).argmin(0).cpu()
            knobs[name] = torch.tensor([candidates[k] for k in best])
            mixer.set_start_knobs(**knobs)
            # Heads do not interact before o_proj: the chosen heads' outputs are already computed.
            n = torch.stack([outs[k][:, h] for h, k in enumerate(best.tolist())], 1)
        if n is None or knob_rows < x.shape[0]:
            n = normalised_heads(mixer, x, shares)
        y = y.reshape(-1, y.shape[-1])
        rest = y if soft is None else y - mixer.o_proj(soft.reshape(len(y), -1).to(y.dtype))
        w, error = fit_output_norm(n, rest, mixer.o_proj.weight)
        mixer.o_norm.weight.copy_(w)
        z = n * mixer.o_norm.weight.float()  # what o_proj receives: o_norm = weight * n (plus the softmax part)
        z = (z if soft is None else z + soft).reshape(n.shape[0], -1)
        ridge, weight = refit_output_projection(z, y, mixer.o_proj.weight, input_ids.shape[0])
        if weight is not None:
            mixer.o_proj.weight.copy_(weight.to(mixer.o_proj.weight.dtype))
        error_after = ((y.float() - mixer.o_proj(z.to(mixer.o_proj.weight.dtype)).float()).pow(2).sum()
                       / y.float().pow(2).sum()).item()
        report[i] = {"knobs": {k: [round(v, 4) for v in values.tolist()] for k, values in knobs.items()},
                     "error_norm_fit": error, "o_proj_ridge": ridge, "error": error_after}
        if verbose:
            print(f"linzoo: calibrated layer {i}: error {error_after:.3f} {report[i]['knobs']}")
    report["seconds"] = round(time.perf_counter() - start, 1)
    report["cpu_seconds"] = round(time.process_time() - cpu, 1)
    return report
