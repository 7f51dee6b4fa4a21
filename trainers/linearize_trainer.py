"""Trainers of the three linearization stages, on TRL's SFTTrainer (data, logging, checkpoints, accelerate).

Each overrides only `compute_loss`; the losses are static methods with their own tests.
"""

import contextlib
import time
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint
from trl import SFTTrainer

from ..capture import mixer_io
from .common import CheckedSaves, lower_learning_rate, what_resumes


def mixed_precision(device, mode):
    """Autocast for what runs outside the student's forward: the frozen teacher and the KD loss's vocabulary
    projections, in the run's mixed precision `mode` ("bf16", "fp16" or "no", as accelerate's). Accelerate
    autocasts only the prepared model's forward, so without this the teacher and the [tokens, vocab] matmuls ran
    in fp32 on a bf16 run. Softmaxes and losses stay fp32 (autocast's own rules)."""
    if mode not in ("bf16", "fp16"):
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=torch.bfloat16 if mode == "bf16" else torch.float16)


class TeacherStudentTrainer(CheckedSaves, SFTTrainer):
    """SFTTrainer holding a frozen teacher beside the student; stops on a non-finite loss, and saves no non-finite
    weights (`CheckedSaves`; `stage` and `kept_before` go into that refusal); logs throughput."""

    def __init__(self, *args, teacher_model, stage=None, kept_before=None, **kwargs):
        super().__init__(*args, **kwargs)
        self.stage, self.kept_before = stage, kept_before
        self.teacher_model = teacher_model.to(self.accelerator.device).eval().requires_grad_(False)
        # Our stage losses are means over each micro-batch, not sums over `num_items_in_batch`: the Trainer must
        # divide them by the accumulation steps (it skips that for models whose forward takes **kwargs).
        self.model_accepts_loss_kwargs = False
        self._tokens = 0  # input tokens (all processes) since the last training log
        self._throughput_mark = None
        self.throughput_log = []  # tokens/s of every logging interval after the first (warm-up) one
        self._loss_terms = defaultdict(list)  # the KD loss's CE and KL per step, kept on device until a log
        # No host sync per step: the first non-finite loss's step and value are kept on the device
        # (`_check_finite`) and read at the next log, checkpoint or the end of training (`_raise_if_nonfinite`).
        # The Trainer's own NaN filter would sync every step only to hide such a loss from the logs.
        self._nonfinite = None
        self.args.logging_nan_inf_filter = False

    def log(self, logs, start_time=None):
        """Adds the loss terms (`ce`, `kl`) and `tokens_per_second` (all processes, over the interval since the
        previous log) to training logs.
        The first interval, which holds kernel compilation and the resume's data skipping, is not reported."""
        if "loss" in logs:
            self._raise_if_nonfinite()
            for name, values in self._loss_terms.items():
                logs[name] = round(torch.stack(values).mean().item(), 4)
            self._loss_terms.clear()
            now = time.perf_counter()
            if self._throughput_mark is not None:
                logs["tokens_per_second"] = round(self._tokens / (now - self._throughput_mark))
                self.throughput_log.append(logs["tokens_per_second"])
            self._throughput_mark, self._tokens = now, 0
        super().log(logs, start_time)

    def _prepare_inputs(self, inputs):
        """Drops an all-ones attention mask (packed rows have no padding) while the batch is still on the host: else
        every forward on the device (the teacher's mask builder, the student's backbone) syncs to find that out."""
        mask = inputs.get("attention_mask")
        if isinstance(mask, torch.Tensor) and mask.device.type == "cpu" and mask.numpy().all():  # a host array
            inputs = {k: v for k, v in inputs.items() if k != "attention_mask"}
        return super()._prepare_inputs(inputs)

    def _check_finite(self, loss):
        """Records, on the device, the first step whose loss is not finite (no host sync)."""
        step = torch.full((), self.state.global_step + 1, device=loss.device)
        if self._nonfinite is None:
            self._nonfinite = torch.zeros(2, device=loss.device)  # [first bad step (0: none), its loss]
        first = (self._nonfinite[0] == 0) & ~torch.isfinite(loss.detach())
        self._nonfinite = torch.where(first, torch.stack([step.float(), loss.detach().float()]), self._nonfinite)
        return loss

    def _raise_if_nonfinite(self):
        """Stops the run if a loss since the start was not finite, before anything after it is saved."""
        if self._nonfinite is None or self._nonfinite[0].item() == 0:
            return
        step, value = int(self._nonfinite[0].item()), self._nonfinite[1].item()
        raise FloatingPointError(
            f"Non-finite loss ({value}) at step {step} of {type(self).__name__}: nothing was saved after it; "
            f"{what_resumes(self.last_good())}. "
            f"{lower_learning_rate(self.args, self.stage)}, or use --kernel_backend torch to rule out kernels."
        )

    def _save_checkpoint(self, *args, **kwargs):
        self._raise_if_nonfinite()
        return super()._save_checkpoint(*args, **kwargs)

    def train(self, *args, **kwargs):
        result = super().train(*args, **kwargs)
        self._raise_if_nonfinite()  # steps after the last log
        return result

    def _log_metric(self, name, value):
        """Averaged into the next training log; a tensor stays on its device (no host sync per step)."""
        self._loss_terms[name].append(value.detach().float())

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        self._tokens += inputs["input_ids"].numel() * self.accelerator.num_processes
        with mixed_precision(self.accelerator.device, self.accelerator.mixed_precision):
            loss = self.stage_loss(model, inputs)
        loss = self._check_finite(loss)
        return (loss, None) if return_outputs else loss


class _Skipped(torch.nn.Module):
    """Stands in for a decoder layer's MLP whose output nobody uses (attention transfer): returns zero."""

    def forward(self, x):
        return x.new_zeros(())


def teacher_forced_mixers(model, blocks, layer_inputs, input_ids, attention_mask):
    """Outputs of the student's mixers in `blocks` (its decoder layers) at the indices of `layer_inputs`
    ({layer: input}), each fed its teacher's layer input (attention transfer).

    The student runs its own forward (so DDP/FSDP wrappers stay in charge of gradient sync and sharding) while
    hooks swap each mixer's input for the teacher's, keep its output, and cut the autograd graph after every
    decoder layer: only the mixers' own computations are kept for backward.
    """
    layers = list(layer_inputs)
    outputs, hooks = {}, []
    # Only the mixers' own activations are kept, so gradient checkpointing has nothing to save here; and its
    # recomputation in backward would run the layers again without these hooks.
    checkpointing = [getattr(block, "gradient_checkpointing", False) for block in blocks]

    def feed(i):
        def hook(module, args, kwargs):
            kwargs.pop("hidden_states", None)
            return (layer_inputs[i],) + tuple(args[1:]), kwargs
        return hook

    def keep(i):
        return lambda module, args, out: outputs.__setitem__(i, out)

    # Every mixer's input is the teacher's, so the student's MLPs feed nothing that is kept: they are skipped
    # (zeros in their place) for the duration of this forward, which is then the mixers' cost alone.
    mlps = [block.mlp for block in blocks]
    try:
        for i in layers:
            hooks.append(blocks[i].self_attn.register_forward_pre_hook(feed(i), with_kwargs=True))
            hooks.append(blocks[i].self_attn.register_forward_hook(keep(i)))
        for block in blocks:
            hooks.append(block.register_forward_hook(lambda module, args, out: out.detach()))
            block.gradient_checkpointing = False
            block.mlp = _Skipped()
        model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, logits_to_keep=1)
    finally:
        for h in hooks:
            h.remove()
        for block, on, mlp in zip(blocks, checkpointing, mlps):
            block.gradient_checkpointing = on
            block.mlp = mlp
    return [outputs[i] for i in layers]


class AttentionTransferTrainer(TeacherStudentTrainer):
    """Stage 1: each student mixer reproduces its teacher attention's output, given the teacher's layer input.

    Teacher-forced and per layer, so layers train independently; only mixer parameters require grad. Layers kept
    as softmax attention (a hybrid's `attn_layers`) are the teacher's own and are left out of the loss.
    """

    @staticmethod
    def attention_transfer_loss(student_outputs, teacher_outputs, mask=None):
        """Mean over layers of ||s - t||^2 / ||t||^2 (over real tokens).

        Normalising by each layer's own teacher energy keeps the layers with large activations (SmolLM2's
        residual stream grows with depth) from drowning the others; a perfect student scores 0, a zero
        output scores 1.
        """
        losses = []
        for s, t in zip(student_outputs, teacher_outputs):
            s, t = s.float(), t.float()
            err, energy = (s - t).pow(2).sum(-1), t.pow(2).sum(-1)
            if mask is not None:
                err, energy = err * mask, energy * mask
            losses.append(err.sum() / energy.sum().clamp_min(1e-12))
        return torch.stack(losses).mean()

    def stage_loss(self, model, inputs):
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        unwrapped = self.accelerator.unwrap_model(model)
        config = unwrapped.config
        layers = [i for i in range(config.num_hidden_layers) if i not in config.attn_layers]  # softmax layers: as is
        with torch.no_grad():
            io = mixer_io(self.teacher_model, ids, mask, layers)
        student = teacher_forced_mixers(model, unwrapped.model.layers, {i: io[i].input for i in layers}, ids, mask)
        return self.attention_transfer_loss(student, [io[i].output for i in layers], None if mask is None else mask.float())


class HiddenAlignmentTrainer(TeacherStudentTrainer):
    """Stage 2: the student, end to end, matches the teacher's hidden states after every layer."""

    @staticmethod
    def hidden_alignment_loss(student_hidden, teacher_hidden, mask=None):
        """Mean over layers of ||h_s - h_t||^2 / ||h_t||^2 (per-layer normalised, as stage 1)."""
        return AttentionTransferTrainer.attention_transfer_loss(student_hidden, teacher_hidden, mask)

    def stage_loss(self, model, inputs):
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        with torch.no_grad():
            teacher = self.teacher_model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        student = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
        # hidden_states[0] is the (shared, copied) embedding output; compare after every layer.
        return self.hidden_alignment_loss(
            student.hidden_states[1:], teacher.hidden_states[1:], None if mask is None else mask.float()
        )


class KnowledgeDistillationTrainer(TeacherStudentTrainer):
    """Stage 3 (and instruction-aware distillation): next-token CE + KL(teacher || student) on the logits."""

    @staticmethod
    def kd_loss(student_hidden, teacher_hidden, student_head, teacher_head, labels, temperature=1.0, alpha=0.5,
                chunk_size=1024):
        """(1 - alpha) * CE(student, labels) + alpha * T^2 * KL(teacher_T || student_T), per label token.

        Hidden states come in instead of logits: vocabulary logits are formed `chunk_size` positions at a time
        (the projection in the run's autocast dtype, softmaxes in fp32) and recomputed in backward (checkpoint),
        so the full [tokens, vocab] fp32 logits never exist.
        `labels` are already aligned with the hidden states (shifted), -100 where nothing is predicted.
        Returns (loss, ce, kl).
        """
        keep = labels != -100
        hs, ht, y = student_hidden[keep], teacher_hidden[keep], labels[keep]
        n = max(int(y.numel()), 1)

        def chunk_terms(hs_c, ht_c, y_c):
            s_logits = student_head(hs_c).float()
            with torch.no_grad():
                t_logits = teacher_head(ht_c).float()
            ce = F.cross_entropy(s_logits, y_c, reduction="sum")
            kl = F.kl_div(
                F.log_softmax(s_logits / temperature, -1), F.log_softmax(t_logits / temperature, -1),
                log_target=True, reduction="sum",
            )
            return ce, kl

        ce = kl = hs.new_zeros((), dtype=torch.float32)
        if not y.numel():  # every row lost its completion to truncation: a zero that still reaches the student's
            ce = kl = hs.sum().float()  # graph (hs is empty), so that backward (and every rank's all-reduce) runs
        for start in range(0, y.numel(), chunk_size):
            part = slice(start, start + chunk_size)
            c, k = checkpoint(chunk_terms, hs[part], ht[part], y[part], use_reentrant=False)
            ce, kl = ce + c, kl + k
        ce, kl = ce / n, kl / n
        return (1 - alpha) * ce + alpha * temperature**2 * kl, ce, kl

    def stage_loss(self, model, inputs):
        ids, mask = inputs["input_ids"], inputs.get("attention_mask")
        labels = inputs.get("labels")
        if labels is None:
            labels = ids.masked_fill(mask == 0, -100) if mask is not None else ids
        extra = {k: inputs[k] for k in ("position_ids",) if k in inputs}
        # Through the (possibly DDP-wrapped) model, keeping only one position's logits: the KD loss forms the
        # vocabulary logits itself, in chunks, from the final hidden states.
        kw = dict(input_ids=ids, attention_mask=mask, use_cache=False, output_hidden_states=True, logits_to_keep=1)
        with torch.no_grad():
            teacher = self.teacher_model(**kw, **extra).hidden_states[-1]
        student = model(**kw, **extra).hidden_states[-1]
        unwrapped = self.accelerator.unwrap_model(model)
        shifted = F.pad(labels[:, 1:], (0, 1), value=-100)
        if "position_ids" in extra:  # packed rows: no prediction across a sequence boundary
            shifted = shifted.masked_fill(F.pad(extra["position_ids"][:, 1:], (0, 1), value=0) == 0, -100)
        loss, ce, kl = self.kd_loss(
            student, teacher, unwrapped.get_output_embeddings(), self.teacher_model.get_output_embeddings(),
            shifted, self.args.kd_temperature, self.args.kd_alpha, self.args.kd_chunk_size,
        )
        self._log_metric("ce", ce)
        self._log_metric("kl", kl)
        return loss
