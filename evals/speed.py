"""Speed and memory against the teacher: what a linearized student is for is being cheaper at long context.

For each context length and batch size, every model of `--models` in turn (the first is the reference, the teacher;
all loaded in this one process, `--threads` torch threads): one warm-up run, then `--repeats` runs interleaved across
the models, each a prefill (one forward over random token ids with `use_cache=True`, only the last logits kept) and
`--decode_tokens` greedy steps on the cache. Reported per model, the median of the repeats:

- prefill seconds; decode ms/token, per decoding step (one new token for every sequence of the batch);
- peak memory of the warm-up run: on CUDA `max_memory_allocated` above what was allocated before, on CPU the peak
  resident set size (psutil, sampled every millisecond) above the one before, the C heap's free memory handed back
  first (glibc's `malloc_trim`), so that memory a previous run left with the allocator is not counted as free
  (every model has run once on a few tokens before the first cell: weights loaded by memory map are resident);
- state bytes per sequence: the cache after the prefill, every tensor it holds summed (a softmax layer's KV cache, a
  linear layer's recurrent and convolution states, a window), divided by the batch;
- the decoding roofline: each step reads the parameters once and the whole cache, so at the memory bandwidth
  measured in the same run (a large tensor copy, bytes read + written over its time, as STREAM counts) a step
  takes at least (parameter bytes + cache bytes) / bandwidth; the share of it achieved is roofline / measured.

Each figure is also given as a ratio to the teacher's at the same length and batch (below 1: the student is
cheaper), and the crossover is the context length from which a student's prefill (decode) stays faster than the
teacher's. A length whose cell (one model's warm-up and repeats) would take longer than `--max_seconds_per_cell`,
predicted from the two longest lengths measured at that batch (time ~ length^p, p in [1, 2]), is skipped with every
longer one, and listed.

    linzoo eval speed --models embedded runs/main --lengths 256,512,1024,2048 --batch_sizes 1 --out results/speed/cpu
    linzoo eval speed --models embedded runs/main runs/hybrid --device cuda --dtype bfloat16
"""

from __future__ import annotations

import ctypes
import gc
import math
import os
import platform
import statistics
import threading
import time
from dataclasses import dataclass, field, fields
from pathlib import Path

import torch

from .common import (EvalSpec, ModelArguments, check_out_dir, check_quantize, load_for_eval, measured, output_cache,
                     parse_list, quantize_field, render, weights_sha256, write_json)
from linzoo.formatting import format_bytes

SCHEMA = "linzoo.speed/v1"
FIGURES = ("prefill_s", "decode_ms_per_token", "graph_decode_ms_per_token", "peak_memory_bytes",
           "state_bytes_per_sequence")  # each gets a ratio
BANDWIDTH_BYTES = {"cpu": 256 * 2**20, "cuda": 2**30}  # the copy that measures bandwidth: well past any cache
DEFAULT_OUT = "outputs/speed"  # where the first student is not a folder (`embedded`, a .gguf, a Hub id)


# --- what one run measures -----------------------------------------------------------------------------------------

def tensor_bytes(obj, seen: set | None = None) -> int:
    """Bytes of every tensor storage reachable from `obj` (a cache: its layers, their lists, dicts and attributes),
    each storage once."""
    seen = set() if seen is None else seen
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage()
        key = (storage.device, storage.data_ptr())
        if key in seen:
            return 0
        seen.add(key)
        return storage.nbytes()
    from transformers import PretrainedConfig

    if id(obj) in seen or isinstance(obj, (type, torch.nn.Module, PretrainedConfig)):  # what a cache may point at
        return 0
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set)):
        items = obj
    elif hasattr(obj, "__dict__"):
        items = vars(obj).values()
    else:
        return 0
    return sum(tensor_bytes(item, seen) for item in items)


def parameter_bytes(model) -> int:
    """What one decoding step reads of the weights: every parameter once (tied embeddings once), and the int8 weights
    of dynamically quantized linears (`--quantize int8`), which torch keeps packed outside `parameters()`."""
    total = sum(p.nbytes for p in model.parameters())
    for module in model.modules():
        if isinstance(module, torch.ao.nn.quantized.dynamic.Linear):
            weight = module.weight()
            total += weight.numel() * weight.element_size()
    return total


def roofline_ms(bytes_per_step: int, bandwidth: float) -> float:
    """The fastest a decoding step can be when it must read `bytes_per_step` at `bandwidth` bytes/s."""
    return 1e3 * bytes_per_step / bandwidth


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def memory_bandwidth(device: torch.device, nbytes: int | None = None, repeats: int = 5) -> float:
    """Bytes/s of a tensor copy on `device` (bytes read + bytes written over the median time)."""
    nbytes = nbytes or BANDWIDTH_BYTES.get(device.type, BANDWIDTH_BYTES["cuda"])
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)  # pages touched once, outside the timing
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * src.nbytes / statistics.median(times)


def _trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: the resident set keeps what the allocator holds
        pass


class PeakMemory:
    """`with PeakMemory(device) as peak: ...`, then `peak.bytes`: the most memory in use during the block above the
    amount in use when it began (CUDA: allocated tensors; CPU: the resident set size)."""

    def __init__(self, device: torch.device, interval: float = 1e-3):
        self.device, self.interval, self.bytes = device, interval, 0

    def __enter__(self):
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.base = torch.cuda.memory_allocated(self.device)
            return self
        import psutil

        _trim_heap()
        process, self.stop = psutil.Process(), threading.Event()
        self.base = self.peak = process.memory_info().rss

        def poll():
            while not self.stop.wait(self.interval):
                self.peak = max(self.peak, process.memory_info().rss)

        self.thread = threading.Thread(target=poll, daemon=True)
        self.thread.start()
        self.process = process
        return self

    def __exit__(self, *exc):
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.base
        else:
            self.stop.set()
            self.thread.join()
            self.bytes = max(self.peak, self.process.memory_info().rss) - self.base
        return False


@torch.inference_mode()
def run_once(model, input_ids: torch.Tensor, decode_tokens: int) -> tuple[float, float, int]:
    """(prefill seconds, decode seconds per step, cache bytes after the prefill) of a prefill over `input_ids` and
    `decode_tokens` greedy steps on its cache."""
    device = input_ids.device
    keep = {"logits_to_keep": 1} if model._supports_logits_to_keep() else {}
    _sync(device)
    start = time.perf_counter()
    out = model(input_ids=input_ids, use_cache=True, **keep)
    token = out.logits[:, -1:].argmax(-1)
    _sync(device)
    prefill = time.perf_counter() - start
    name, cache = output_cache(out)
    cache_bytes = tensor_bytes(cache)
    _sync(device)
    start = time.perf_counter()
    for _ in range(decode_tokens):
        out = model(input_ids=token, use_cache=True, **{name: cache})
        cache = getattr(out, name)
        token = out.logits[:, -1:].argmax(-1)
    _sync(device)
    return prefill, (time.perf_counter() - start) / decode_tokens, cache_bytes


class StaticDecoder:
    """Greedy decoding of a transformers model (the teacher) with a `StaticCache`, one step captured as a CUDA graph
    and replayed (on CPU the same static step runs eagerly): the teacher's side of graph decoding, beside a linear
    student's `GraphedDecoder` (modeling/graph_decoding.py). `generate(n)` -> [B, n] greedy tokens after the prompt,
    from the state just after it each time."""

    def __init__(self, model, prompt_ids, max_new_tokens: int, graph: bool = True):
        from transformers import StaticCache

        batch, length = prompt_ids.shape
        device = prompt_ids.device
        self.model, self.length = model.eval(), length
        self.cache = StaticCache(config=model.config, max_cache_len=length + max_new_tokens + 1)
        with torch.no_grad():
            out = model(input_ids=prompt_ids, past_key_values=self.cache, use_cache=True, logits_to_keep=1,
                        cache_position=torch.arange(length, device=device))
        self.first = out.logits[:, -1:].argmax(-1)
        self.tokens = self.first.clone()
        self.position = torch.full((1,), length, dtype=torch.long, device=device)
        self.graph = None
        if graph:
            stream = torch.cuda.Stream()
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream), torch.no_grad():
                for _ in range(2):  # warm-up outside the graph (its writes land past the prompt: overwritten later)
                    self._step()
            torch.cuda.current_stream().wait_stream(stream)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph), torch.no_grad():
                self._step()

    def _step(self):
        logits = self.model(input_ids=self.tokens, past_key_values=self.cache, use_cache=True,
                            cache_position=self.position, position_ids=self.position.expand(len(self.tokens), 1)).logits
        self.tokens.copy_(logits[:, -1:].argmax(-1))
        self.position.add_(1)

    @torch.no_grad()
    def generate(self, new_tokens: int) -> torch.Tensor:
        self.tokens.copy_(self.first)
        self.position.fill_(self.length)  # the cache past the prompt is rewritten step by step, so it need not be reset
        for layer in getattr(self.cache, "layers", []):  # transformers >= 5.2x counts the cached tokens on the device
            if isinstance(getattr(layer, "cumulative_length", None), torch.Tensor):
                layer.cumulative_length.fill_(self.length)
        out = [self.first]
        for _ in range(1, new_tokens):
            self.graph.replay() if self.graph is not None else self._step()
            out.append(self.tokens.clone())
        return torch.cat(out, 1)


def graph_decoder(model, prompt_ids, new_tokens: int):
    """(a decoder whose `generate(n)` decodes greedily with one CUDA graph per step, None) for a pure linear student
    (its remote code's `GraphedDecoder`) or a transformers model with a static cache (`StaticDecoder`); (None, why)
    for a model whose cache grows (a hybrid student's softmax layers). Off CUDA the same static steps run eagerly."""
    import importlib

    graph = prompt_ids.device.type == "cuda"
    if hasattr(model, "graph_decoding"):  # a linzoo student: its own bundle's decoder
        if getattr(model.config, "attn_layers", None):
            return None, "a hybrid's softmax layers keep a growing KV cache"
        module = importlib.import_module(type(model).__module__.rsplit(".", 1)[0] + ".graph_decoding")
        return module.GraphedDecoder(model, prompt_ids, graph=graph), None
    return StaticDecoder(model, prompt_ids, new_tokens, graph=graph), None


@torch.no_grad()
def time_graph_decode(model, input_ids: torch.Tensor, decode_tokens: int) -> tuple[float | None, str | None]:
    """(ms per decoding step of graph decoding after a prefill over `input_ids`, None), or (None, why not)."""
    device = input_ids.device
    decoder, why = graph_decoder(model, input_ids, decode_tokens + 1)
    if decoder is None:
        return None, why
    decoder.generate(2)  # a replay before timing
    _sync(device)
    start = time.perf_counter()
    decoder.generate(decode_tokens + 1)  # the first token comes from the prefill: decode_tokens steps
    _sync(device)
    del decoder
    return 1e3 * (time.perf_counter() - start) / decode_tokens, None


def out_of_memory(error: BaseException) -> bool:
    return isinstance(error, torch.OutOfMemoryError) or "out of memory" in str(error).lower()


def _free(device: torch.device) -> None:
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def largest_batch(models: dict, length: int, decode_tokens: int, seed: int = 0, device="cpu", start: int = 1,
                  limit: int = 4096, graph: bool = False, progress=print) -> list[dict]:
    """Per model, alone: the batch doubled from `start` until a prefill over `length` tokens and `decode_tokens`
    steps on its cache run out of memory (or `limit` is reached); the largest that fit, with its prefill and decode
    times and the decode throughput of the whole batch (tokens/s), also by graph decoding where `graph`."""
    device = torch.device(device)
    vocab = min(m.config.vocab_size for m in models.values())
    out = []
    for name, model in models.items():
        best, batch, stop = None, start, f"the limit of {limit}"
        while batch <= limit:
            try:
                ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(device)
                prefill, step, cache_bytes = run_once(model, ids, decode_tokens)
                graph_ms, why = time_graph_decode(model, ids, decode_tokens) if graph else (None, "not asked")
                best = {"model": name, "length": length, "batch": batch, "prefill_s": prefill,
                        "decode_ms_per_token": 1e3 * step, "tokens_per_second": batch / step,
                        "graph_decode_ms_per_token": graph_ms, "graph_decode_note": why,
                        "graph_tokens_per_second": None if graph_ms is None else 1e3 * batch / graph_ms,
                        "state_bytes_per_sequence": cache_bytes // batch}
                progress(f"speed: largest batch at {length} tokens: {name} fits {batch} "
                         f"({best['tokens_per_second']:.0f} tokens/s decoding)")
            except (torch.OutOfMemoryError, RuntimeError) as error:
                if not out_of_memory(error):
                    raise
                stop = f"out of memory at batch {batch}"
                progress(f"speed: largest batch at {length} tokens: {name} runs out of memory at {batch}")
                break
            finally:
                ids = None
                _free(device)
            batch *= 2
        out.append({"model": name, "length": length, "stopped_by": stop, "largest": best})
    teacher = out[0]["largest"]
    for row in out:
        best = row["largest"]
        for key in ("tokens_per_second", "graph_tokens_per_second"):
            row[f"{key}_ratio"] = (None if best is None or teacher is None else ratio(best[key], teacher[key]))
    return out


# --- the grid ------------------------------------------------------------------------------------------------------

def predict_seconds(measured_cells: list[tuple[int, float]], length: int) -> float:
    """A cell's seconds at `length` from (length, seconds) of the cells measured so far: time ~ length^p through the
    two longest, p held within [1, 2] (2, the prefill of softmax attention, from a single one)."""
    (l1, t1), (l2, t2) = ([(1, 0.0)] + sorted(measured_cells))[-2:]
    p = 2.0 if l1 == 1 or t1 <= 0 or t2 <= 0 else min(max(math.log(t2 / t1) / math.log(l2 / l1), 1.0), 2.0)
    return t2 * (length / l2) ** p


def ratio(value, reference):
    return None if value is None or not reference else value / reference


def add_ratios(rows: list[dict], teacher: str) -> None:
    """Each row's figures over the teacher's row of the same length and batch."""
    reference = {(r["length"], r["batch"]): r for r in rows if r["model"] == teacher}
    for row in rows:  # no teacher row where the teacher ran out of memory: no ratio
        ref = reference.get((row["length"], row["batch"]), {})
        row["ratios"] = {key: ratio(row.get(key), ref.get(key)) for key in FIGURES}


def crossover(rows: list[dict], model: str, batch: int, figure: str) -> int | None:
    """The context length from which `model`'s `figure` ratio stays below 1 (faster than the teacher) at every longer
    length measured; None where it does not end below 1."""
    first = None
    for row in sorted((r for r in rows if r["model"] == model and r["batch"] == batch), key=lambda r: r["length"]):
        below = row["ratios"][figure] is not None and row["ratios"][figure] < 1
        first = (first or row["length"]) if below else None
    return first


def measure(models: dict, lengths: list[int], batch_sizes: list[int], decode_tokens: int = 32, repeats: int = 3,
            max_seconds_per_cell: float = 120.0, seed: int = 0, device="cpu", progress=print,
            graph: bool = False) -> dict:
    """The measured part of the linzoo.speed/v1 dict for `models` ({name: model}, the teacher first) on `device`.
    With `graph`, each run also decodes by graph decoding (`graph_decoder`). A model that runs out of memory in a
    cell is listed in `out_of_memory` and not run at that batch again (longer contexts need more)."""
    device = torch.device(device)
    names = list(models)
    vocab = min(m.config.vocab_size for m in models.values())
    bandwidth = memory_bandwidth(device)
    params = {name: parameter_bytes(m) for name, m in models.items()}
    progress(f"speed: memory bandwidth {bandwidth / 1e9:.1f} GB/s on {device}")
    for model in models.values():  # weights loaded by memory map become resident here, not in the first cell
        run_once(model, torch.zeros(1, 8, dtype=torch.long, device=device), 1)
    rows, skipped, oom = [], [], []
    for batch in batch_sizes:
        cells = {name: [] for name in names}  # (length, seconds of its warm-up and repeats)
        for length in lengths:
            live = [n for n in names if not any(o["model"] == n and o["batch"] == batch for o in oom)]
            predicted = max(predict_seconds(cells[n], length) for n in live if cells[n]) if any(
                cells[n] for n in live) else 0.0
            if not live or skipped and skipped[-1]["batch"] == batch or predicted > max_seconds_per_cell:
                skipped.append({"length": length, "batch": batch, "predicted_seconds": round(predicted, 1)})
                progress(f"speed: skip {length} tokens x {batch} (a cell predicted {predicted:.0f} s > "
                         f"{max_seconds_per_cell:g} s)" if live else f"speed: skip {length} tokens x {batch} (every "
                         "model ran out of memory at a shorter one)")
                continue
            ids = torch.randint(0, vocab, (batch, length), generator=torch.Generator().manual_seed(seed)).to(device)
            spent, runs, peak, graphs = dict.fromkeys(live, 0.0), {n: [] for n in live}, {}, {n: [] for n in live}
            for repeat in range(repeats + 1):  # the first, untimed, also measures the peak memory
                for name in list(live):
                    start = time.perf_counter()
                    try:
                        if repeat == 0:
                            with PeakMemory(device) as memory:
                                _, _, cache_bytes = run_once(models[name], ids, decode_tokens)
                            peak[name] = (memory.bytes, cache_bytes)
                        else:
                            runs[name].append(run_once(models[name], ids, decode_tokens))
                            spent[name] += time.perf_counter() - start
                        if graph:  # the warm-up's compiles and captures untimed as above
                            graphs[name].append(time_graph_decode(models[name], ids, decode_tokens))
                    except (torch.OutOfMemoryError, RuntimeError) as error:
                        if not out_of_memory(error):
                            raise
                        oom.append({"model": name, "length": length, "batch": batch})
                        live.remove(name)
                        progress(f"speed: {name} runs out of memory at {length} tokens x {batch}")
                    finally:
                        if device.type == "cuda":
                            _free(device)
            for name in live:  # a cell's time from its timed runs: a warm-up may hold one-off compiles (Triton,
                # torch.compile), which made a 1k-token H100 cell predict 688 s at 4k and skip every longer one
                spent[name] *= (repeats + 1) / repeats
                cells[name].append((length, spent[name]))
                memory_bytes, cache_bytes = peak[name]
                decode_ms = 1e3 * statistics.median(r[1] for r in runs[name])
                floor = roofline_ms(params[name] + cache_bytes, bandwidth)
                graph_ms = [g[0] for g in graphs[name][1:] if g[0] is not None]
                rows.append({"model": name, "length": length, "batch": batch,
                             "prefill_s": statistics.median(r[0] for r in runs[name]),
                             "decode_ms_per_token": decode_ms, "peak_memory_bytes": memory_bytes,
                             "graph_decode_ms_per_token": statistics.median(graph_ms) if graph_ms else None,
                             "graph_decode_note": graphs[name][0][1] if graphs[name] else "not asked",
                             "state_bytes_per_sequence": cache_bytes // batch, "cache_bytes": cache_bytes,
                             "roofline_bytes_per_token": params[name] + cache_bytes, "roofline_ms_per_token": floor,
                             "roofline_fraction": floor / decode_ms, "cell_seconds": spent[name]})
            progress(f"speed: {length} tokens x {batch}: " + ", ".join(
                f"{r['model']} {r['prefill_s']:.3f} s + {r['decode_ms_per_token']:.1f} ms/token" + (
                    f" ({r['graph_decode_ms_per_token']:.2f} graphed)" if r["graph_decode_ms_per_token"] else "")
                for r in rows if r["length"] == length and r["batch"] == batch))
    add_ratios(rows, names[0])
    return {"bandwidth_bytes_per_s": bandwidth, "parameter_bytes": params, "rows": rows, "skipped": skipped,
            "out_of_memory": oom,
            "crossover": [{"model": name, "batch": batch, "prefill": crossover(rows, name, batch, "prefill_s"),
                           "decode": crossover(rows, name, batch, "decode_ms_per_token")}
                          for name in names[1:] for batch in batch_sizes]}


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    try:
        with open("/proc/cpuinfo") as f:
            return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def run_speed(models: dict, lengths, batch_sizes, decode_tokens: int = 32, repeats: int = 3, threads: int = 2,
              max_seconds_per_cell: float = 120.0, seed: int = 0, device="cpu", dtype: str = "auto",
              progress=print, quantize: str = "none", graph_decoding: bool = False, largest_batch_lengths="",
              largest_batch_limit: int = 4096) -> dict:
    """The linzoo.speed/v1 dict for `models` ({name: model on `device`}, the teacher first), at `threads` torch
    threads (put back afterwards)."""
    lengths, batch_sizes = sorted(set(parse_list(lengths, int))), sorted(set(parse_list(batch_sizes, int)))
    before, load = torch.get_num_threads(), [os.getloadavg()[0]]
    torch.set_num_threads(threads)
    try:
        results = measure(models, lengths, batch_sizes, decode_tokens, repeats, max_seconds_per_cell, seed, device,
                          progress, graph_decoding)
        results["largest_batch"] = [row for length in sorted(set(parse_list(largest_batch_lengths, int)))
                                    for row in largest_batch(models, length, decode_tokens, seed, device,
                                                             max(batch_sizes), largest_batch_limit, graph_decoding,
                                                             progress)]
    finally:
        torch.set_num_threads(before)
    load.append(os.getloadavg()[0])
    hashes = {spec: weights_sha256(spec) for spec in models}
    return {"schema": SCHEMA, "models": list(models), "teacher": next(iter(models)),
            # what the results measured: each model's weights, and as `weights_sha256` the first student's (whose
            # folder they go to by default: its card and the zoo take them as its own)
            "weights_sha256_by_model": hashes, "weights_sha256": hashes[list(models)[1]] if len(models) > 1 else None,
            "device": str(device),
            "device_name": device_name(torch.device(device)), "threads": threads, "dtype": dtype,
            "quantize": quantize, "graph_decoding": graph_decoding, "lengths": lengths, "batch_sizes": batch_sizes,
            "decode_tokens": decode_tokens, "repeats": repeats,
            "max_seconds_per_cell": max_seconds_per_cell, "seed": seed,
            "load_average": load, **results}  # other processes' share of the CPUs: at or above --threads, suspect


# --- what it writes and shows --------------------------------------------------------------------------------------

def log_log_axes(ax, label: str) -> None:
    """A figure against context length: both axes logarithmic (context by powers of two), a grid."""
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel(label)
    ax.grid(True, which="both", alpha=0.3)


def save_speed(results: dict, out_dir) -> tuple[Path, Path]:
    """Writes speed.json and speed.png (log-log against context: prefill seconds, decode ms/token with each model's
    roofline dotted, peak memory; one line per model and batch size)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    out = Path(out_dir)
    json_path = write_json(results, out / "speed.json")
    fig = Figure(figsize=(13, 4))
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, 3)
    panels = (("prefill_s", "prefill (s)"), ("decode_ms_per_token", "decode (ms / token)"),
              ("peak_memory_bytes", "peak memory (MiB)"))
    for i, name in enumerate(results["models"]):
        for j, batch in enumerate(results["batch_sizes"]):
            rows = [r for r in results["rows"] if r["model"] == name and r["batch"] == batch]
            if not rows:
                continue
            x = [r["length"] for r in rows]
            style = dict(color=f"C{i}", linestyle=("-", "--", "-.", ":")[j % 4], marker="o", markersize=3)
            for ax, (key, label) in zip(axes, panels):
                scale = 2**-20 if key == "peak_memory_bytes" else 1
                ax.plot(x, [r[key] * scale for r in rows], label=f"{name} (batch {batch})", **style)
            if j == 0:
                axes[1].plot(x, [r["roofline_ms_per_token"] for r in rows], color=f"C{i}", linestyle=":",
                             linewidth=1, label=f"{name} roofline")
    for ax, (_, label) in zip(axes, panels):
        log_log_axes(ax, label)
    axes[1].legend(fontsize=7)
    fig.suptitle(f"speed on {results['device_name']} ({results['device']}, {results['threads']} threads); memory "
                 f"bandwidth {results['bandwidth_bytes_per_s'] / 1e9:.1f} GB/s", fontsize=10)
    fig.tight_layout()
    png_path = out / "speed.png"
    fig.savefig(png_path, dpi=120)
    return json_path, png_path


def _times(value) -> str:
    return measured(value, "{:.2f}×")


def _graphed(row: dict) -> str:
    ms = row.get("graph_decode_ms_per_token")
    return f"{ms:.2f} ms ({_times(row['ratios']['graph_decode_ms_per_token'])})" if ms else (
        row.get("graph_decode_note") or "-")


def describe_largest(results: dict) -> list[str]:
    """A line per model and length of --largest_batch_lengths."""
    lines = []
    for row in results.get("largest_batch", []):
        best = row["largest"]
        if best is None:
            lines.append(f"{row['model']} at {row['length']} tokens: no batch fits ({row['stopped_by']})")
            continue
        graphed = "" if best["graph_tokens_per_second"] is None else (
            f"; graphed {best['graph_tokens_per_second']:,.0f} tokens/s "
            f"({_times(row['graph_tokens_per_second_ratio'])})")
        lines.append(f"{row['model']} at {row['length']} tokens: largest batch {best['batch']} (stopped by "
                     f"{row['stopped_by']}), decoding {best['tokens_per_second']:,.0f} tokens/s "
                     f"({_times(row['tokens_per_second_ratio'])} the teacher's at its own largest batch){graphed}")
    return lines


def table_rows(results: dict) -> list[list[str]]:
    """[context, batch, model, prefill, decode, peak memory, state per sequence, roofline] as text: each figure with
    its ratio to the teacher."""
    out = []
    for r in results["rows"]:
        x = r["ratios"]
        out.append([str(r["length"]), str(r["batch"]), r["model"], f"{r['prefill_s']:.3f} s ({_times(x['prefill_s'])})",
                    f"{r['decode_ms_per_token']:.1f} ms ({_times(x['decode_ms_per_token'])})",
                    *([_graphed(r)] if results.get("graph_decoding") else []),
                    f"{format_bytes(r['peak_memory_bytes'])} ({_times(x['peak_memory_bytes'])})",
                    f"{format_bytes(r['state_bytes_per_sequence'])} ({_times(x['state_bytes_per_sequence'])})",
                    f"{r['roofline_ms_per_token']:.1f} ms ({r['roofline_fraction']:.0%})"])
    return out


def describe_crossover(results: dict) -> list[str]:
    def at(length):
        return f"from {length} tokens" if length else "not within the lengths measured"

    return [f"{c['model']} (batch {c['batch']}): prefill faster {at(c['prefill'])}, decode faster {at(c['decode'])}"
            for c in results["crossover"]]


def describe_skipped(results: dict) -> str:
    return ", ".join(f"{s['length']} x {s['batch']} (predicted {s['predicted_seconds']:g} s)"
                     for s in results["skipped"])


CARD_SECTION = """### Speed

Against {{ speed.teacher }} on {{ speed.device_name }} ({{ speed.device }}, {{ speed.threads }} threads, {{ speed.dtype }} weights{% if speed.quantize and speed.quantize != 'none' %}, every model's linear layers dynamically quantized to {{ speed.quantize }}{% endif %}): prefill of random tokens, then {{ speed.decode_tokens }} greedy tokens on the cache, median of {{ speed.repeats }} runs after a warm-up; memory bandwidth {{ bandwidth }} GB/s. Each figure is followed by its ratio to the teacher's (below 1: cheaper); decode is per step (a token for each sequence of the batch), its roofline the step's parameter and cache bytes over the bandwidth (and the share of it achieved).

| context (tokens) | batch | model | prefill | decode / token |{% if speed.graph_decoding %} graph decode / token |{% endif %} peak memory | state / sequence | roofline / token |
|---|---|---|---|---|{% if speed.graph_decoding %}---|{% endif %}---|---|---|
{% for row in rows %}| {{ row | join(" | ") }} |
{% endfor %}
{% for line in crossover %}- {{ line }}
{% endfor %}{% for line in largest %}- {{ line }}
{% endfor %}{% if oom %}- Out of memory: {{ oom }}
{% endif %}{% if skipped %}- Skipped (a cell predicted over {{ speed.max_seconds_per_cell }} s): {{ skipped }}
{% endif %}"""


def card_section(data: dict | None, folder: Path, sub: str = "") -> str:  # no figure: `sub` is not needed
    if data is None:  # optional: a card without it says nothing rather than "not measured"
        return ""
    return render(CARD_SECTION, speed=data, rows=table_rows(data), crossover=describe_crossover(data),
                  skipped=describe_skipped(data), largest=describe_largest(data),
                  oom=", ".join(f"{o['model']} at {o['length']} x {o['batch']}" for o in data.get("out_of_memory", [])),
                  bandwidth=f"{data['bandwidth_bytes_per_s'] / 1e9:.1f}")


def space_row(data: dict) -> list:
    """models, device, the longest context measured at the smallest batch, each student's decode and prefill ratio
    there, the crossovers."""
    batch = data["batch_sizes"][0]
    rows = [r for r in data["rows"] if r["batch"] == batch]
    longest = max(r["length"] for r in rows)
    at = {r["model"]: r["ratios"] for r in rows if r["length"] == longest}
    students = data["models"][1:]
    return [", ".join(data["models"]), f"{data['device_name']} ({data['threads']} threads)", f"{longest} x {batch}",
            "; ".join(f"{s}: {_times(at[s]['decode_ms_per_token'])}" for s in students),
            "; ".join(f"{s}: {_times(at[s]['prefill_s'])}" for s in students),
            "; ".join(f"{c['model']} x{c['batch']}: {c['prefill'] or '-'} / {c['decode'] or '-'}"
                      for c in data["crossover"])]


# --- the command ---------------------------------------------------------------------------------------------------

_MODEL_FIELDS = {f.name: f for f in fields(ModelArguments)}


def _positive(flag: str, value: str, cast, example: str) -> list:
    try:
        values = parse_list(value, cast)
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise ValueError(f"{flag} {value!r}: give positive whole numbers, comma-separated, e.g. {flag} {example}")
    return values


@dataclass
class SpeedArguments:
    models: list[str] = field(default_factory=list, metadata={
        "help": "the teacher (the reference of every ratio), then one or more students: folders, Hub ids, .gguf "
                "files or 'embedded'"})
    lengths: str = field(default=",".join(str(256 * 2**i) for i in range(8)),
                         metadata={"help": "context lengths in tokens, comma-separated"})
    batch_sizes: str = field(default="1,8", metadata={"help": "sequences per forward, comma-separated"})
    decode_tokens: int = field(default=32, metadata={"help": "greedy tokens decoded after each prefill"})
    repeats: int = field(default=3, metadata={"help": "timed runs per cell (the median is reported), after a warm-up"})
    threads: int = field(default=2, metadata={"help": "torch threads, fixed for the whole run"})
    max_seconds_per_cell: float = field(default=120.0, metadata={
        "help": "skip a length (and every longer one) whose cell, one model's warm-up and repeats, is predicted "
                "from the shorter ones to take longer"})
    seed: int = 0
    out: str | None = field(default=None, metadata={
        "help": f"output folder (default: <first student>/eval where that is a folder, else {DEFAULT_OUT})"})
    device: str = field(default=_MODEL_FIELDS["device"].default, metadata=_MODEL_FIELDS["device"].metadata)
    dtype: str = field(default=_MODEL_FIELDS["dtype"].default, metadata=_MODEL_FIELDS["dtype"].metadata)
    trust_remote_code: bool = field(default=False, metadata=_MODEL_FIELDS["trust_remote_code"].metadata)
    quantize: str = quantize_field("every model's alike, the teacher's too: what quantization pays")
    graph_decoding: bool = field(default=False, metadata={
        "help": "also decode with one CUDA graph per step (a pure student's `graph_decoding`, the teacher with a "
                "static cache; hybrids cannot): the decode cost without Python's kernel launches"})
    largest_batch_lengths: str = field(default="", metadata={
        "help": "context lengths at which to double each model's batch (from the largest of --batch_sizes) until "
                "it runs out of memory: the largest batch that fits and its decode tokens/s, comma-separated"})
    largest_batch_limit: int = field(default=4096, metadata={"help": "the largest batch --largest_batch_lengths tries"})

    def __post_init__(self):  # all before any model loads
        if len(self.models) < 2:
            raise ValueError(f"--models {' '.join(self.models)!r}: give the teacher, then at least one student, "
                             "e.g. --models embedded runs/main")
        if len(set(self.models)) < len(self.models):
            raise ValueError(f"--models {' '.join(self.models)}: each model once")
        ModelArguments(device=self.device, dtype=self.dtype)  # its checks of --device and --dtype
        check_quantize(self.quantize, self.device, self.dtype)
        _positive("--lengths", self.lengths, int, "256,512,1024")
        _positive("--batch_sizes", self.batch_sizes, int, "1,8")
        if self.largest_batch_lengths:
            _positive("--largest_batch_lengths", self.largest_batch_lengths, int, "32768")
        for flag, value in (("--decode_tokens", self.decode_tokens), ("--repeats", self.repeats),
                            ("--threads", self.threads), ("--max_seconds_per_cell", self.max_seconds_per_cell),
                            ("--largest_batch_limit", self.largest_batch_limit)):
            if value <= 0:
                raise ValueError(f"{flag} {value}: give a positive number")
        if self.out is None:
            student = Path(self.models[1]).expanduser()
            self.out = str(student / "eval") if student.is_dir() else DEFAULT_OUT
        from linzoo.loading import read_config

        for spec in self.models:  # config.json only: a wrong path fails now, not after the teacher has loaded
            read_config(spec)
        check_out_dir(self.out)


def main(argv: list[str] | None = None) -> dict:
    from linzoo.arguments import parse_arguments

    (args,) = parse_arguments(SpeedArguments, argv)
    models = {}
    for i, spec in enumerate(args.models):
        models[spec] = load_for_eval(spec, args.device, args.dtype, i == 0, args.trust_remote_code, args.quantize)[0]
    results = run_speed(models, args.lengths, args.batch_sizes, args.decode_tokens, args.repeats, args.threads,
                        args.max_seconds_per_cell, args.seed, args.device, args.dtype, quantize=args.quantize,
                        graph_decoding=args.graph_decoding, largest_batch_lengths=args.largest_batch_lengths,
                        largest_batch_limit=args.largest_batch_limit)
    json_path, _ = save_speed(results, args.out)
    print(card_section(results, Path(args.out)), end="")
    print(f"load average {results['load_average'][0]:.2f} before, {results['load_average'][1]:.2f} after "
          f"({os.cpu_count()} CPUs) -> {json_path}")
    return results


EVAL = EvalSpec(
    arguments=SpeedArguments,
    title="speed", name="speed", help="prefill, decode ms/token, peak memory and state size against the teacher by "
    "context length, with the decoding roofline (JSON + log-log plot)",
    schema=SCHEMA, result_file="speed.json", figures=("speed.png",), main=main, card_section=card_section,
    space_headers=("models", "device", "longest context x batch", "decode × teacher", "prefill × teacher",
                   "crossover: prefill / decode (tokens)"),
    space_row=space_row,
    space_caption=lambda d: f"{', '.join(d['models'][1:])} against {d['teacher']}: speed and memory by context")


if __name__ == "__main__":
    main()
