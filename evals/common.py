"""What every eval shares: the `EvalSpec` an eval module declares (its schema, results file, figures, command line,
model-card and Space contributions), loading a model for evaluation, text sources and small parsing helpers.

An eval is one module of this folder with a module-level `EVAL = EvalSpec(...)`; `registry.py` lists it by name.
Cards (`hub_cards/card.py`), release plans (`hub_cards/plan.py`), the CLI (`linzoo eval <name>`) and the Space's
results view iterate over the registry and never name an eval themselves (`tests/test_registry.py` checks it).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from linzoo.formatting import NOT_MEASURED, measured  # noqa: F401 (what every eval's card section and table use)

QUANTIZE = ("none", "int8")  # --quantize: the float weights as they are, or torch's dynamic int8 (CPU)


def quantize_field(who: str):
    """The --quantize field of the evals that measure what quantization costs (quality) and pays (speed)."""
    return field(default="none", metadata={
        "help": f"none | int8: every nn.Linear as int8 weights, activations quantized per call (torch's dynamic "
                f"quantization, CPU only), {who}; results say so and cards leave them out", "choices": QUANTIZE})

EVAL_DIR = "eval"  # a checkpoint's results live in <checkpoint>/eval/<results file>
RESULTS_ROOM = 16 * 2**20  # free bytes an eval wants before it starts: its JSON and figures, with room to spare



def _nothing(*args) -> list:
    return []


@dataclass(frozen=True)
class EvalSpec:
    """What an eval declares. Everything that lists, reads, shows or uploads eval results is derived from these.

    name: `linzoo eval <name>` and the key of its results in `read_results`;
    title: what its results are called where they are shown (the Space's table);
    help: the command's one-line description;
    schema: the `"schema"` its results file carries (files of another schema are not this eval's);
    result_file: its JSON, `<checkpoint>/eval/<result_file>`; figures: the PNGs written beside it;
    main: the command, `main(argv) -> results`;
    card_results: model-index entries (huggingface_hub `EvalResult`s) of one results dict;
    card_section: the markdown of its part of the card's "Results" (results dict or None when not measured,
        the checkpoint folder, and the sub-folder of eval/ the results came from, "" for eval/ itself: where its
        figures are) — "" to add nothing;
    space_headers / space_row: its table in the Space's "Measured results" tab (one row per results file);
    space_caption: the caption of its first figure in the Space's gallery;
    arguments: the dataclass of its command line (what `main` parses).
    """

    name: str
    title: str
    help: str
    schema: str
    result_file: str
    figures: tuple[str, ...]
    main: Callable[[list[str] | None], object]
    card_results: Callable[[dict], list] = _nothing
    card_section: Callable[[dict | None, Path, str], str] = lambda data, folder, sub: ""
    arguments: type | None = None  # its command-line dataclass: `linzoo zoo --check` parses a plan's flags with it
    space_headers: tuple[str, ...] = ()
    space_row: Callable[[dict], list] | None = None
    space_caption: Callable[[dict], str] | None = None

    @property
    def files(self) -> tuple[str, ...]:
        """The files one run of it writes into its output folder."""
        return (self.result_file, *self.figures)

    def read(self, path: str | os.PathLike) -> dict | None:
        """The results file's dict if `path` is one of this eval's (its schema), else None; unreadable -> None."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError):
            return None
        return data if isinstance(data, dict) and data.get("schema") == self.schema else None


def output_cache(out) -> tuple[str, object]:
    """(keyword, cache) of a model call's output, to pass the cache back in: transformers >= 5.20 calls it `cache`
    in and out, earlier versions `past_key_values`."""
    name = "cache" if getattr(out, "cache", None) is not None else "past_key_values"
    return name, getattr(out, name)


def render(template: str, **values) -> str:
    """A card section from a jinja template, rendered as huggingface_hub renders the card around it (jinja2's
    defaults), keeping the section's last newline."""
    import jinja2

    return jinja2.Environment(keep_trailing_newline=True).from_string(template).render(**values)


def weights_sha256(spec: str) -> str | None:
    """One sha256 naming a model's weights: over the sha256 of each of its safetensors files (the lineage's record where
    the folder has one: linzoo's loaders verify it at every load). None for a Hub id or a folder without safetensors.
    Every results file carries it, and cards and pushes use only the results whose hash is their folder's."""
    from linzoo.integrity import file_sha256, recorded_digests
    from linzoo.loading import resolve

    try:
        folder = Path(resolve(str(spec)))
    except (OSError, ValueError):
        return None
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return None
    recorded = recorded_digests(folder)
    digests = {p.name: recorded.get(p.name) or file_sha256(p) for p in files}
    return hashlib.sha256(json.dumps(digests, sort_keys=True).encode()).hexdigest()


def write_json(results: dict, path: Path) -> Path:
    """Writes a results file atomically (`linzoo.integrity.write_json`: a full disk or a kill leaves the old file or
    none, never a truncated one). Results that name their `model` record its weights' hash (`weights_sha256`, added
    to `results` in place, so that what a command returns is what it wrote) unless they carry one."""
    from linzoo.integrity import write_json as write_whole

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if "model" in results and "weights_sha256" not in results:
        results["weights_sha256"] = weights_sha256(results["model"])
    return write_whole(path, results, indent=2)


def check_out_dir(out) -> None:
    """A ValueError, before any model loads, unless the results can be written into folder `out` or, where it does
    not exist yet, created in its nearest existing parent folder."""
    out = Path(out)
    existing = next(p for p in (out, *out.parents) if os.path.lexists(p))  # a dangling link counts, and fails
    if not existing.is_dir():
        raise ValueError(f"--out {out}: {existing} is not a folder: give a folder for the results (created if "
                         "missing)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise ValueError(f"--out {out}: {existing} is not writable: give a folder you can write to")
    free = shutil.disk_usage(existing).free
    if free < RESULTS_ROOM:  # before the eval runs for hours, not at its end
        raise ValueError(f"the disk is full at {existing}: {free / 1e6:.1f} MB free, an eval's results and figures "
                         f"need ~{RESULTS_ROOM / 1e6:.0f} MB; free space or give another --out")


def load_texts(source: str | list[str], split: str = "test") -> list[str]:
    """Texts from a literal list, a .txt file (paragraphs split on blank lines), or any
    `linzoo.data.load_text_dataset` spec such as "embedded"."""
    if not isinstance(source, str):
        texts = list(source)
    elif source.endswith(".txt") or os.path.isfile(source):
        texts = re.split(r"\n\s*\n", Path(source).read_text(encoding="utf-8"))
    else:
        from linzoo.data import load_text_dataset

        texts = list(load_text_dataset(source, split=split)["text"])
    texts = [t.strip() for t in texts if t and t.strip()]
    if not texts:
        raise ValueError(f"no text found in {source!r}")
    return texts


def parse_list(value: str | list, cast=float) -> list:
    """'512,1024' or [512, 1024] -> [512, 1024] (the CLI passes strings, Python callers lists). An item given twice is
    a ValueError: every list of these (lengths, depths, tasks) would count it twice."""
    items = value.split(",") if isinstance(value, str) else value
    values = [cast(v) for v in items if str(v).strip() != ""]
    repeated = sorted({f"{v:g}" if isinstance(v, float) else str(v) for v in values if values.count(v) > 1})
    if repeated:
        raise ValueError(f"{', '.join(repeated)} given more than once in {value!r}: name each once")
    return values


def model_device(model) -> torch.device:
    param = next(model.parameters(), None) if hasattr(model, "parameters") else None
    return param.device if param is not None else torch.device("cpu")


def name_of(model) -> str:
    config = getattr(model, "config", None)
    return getattr(config, "name_or_path", None) or type(model).__name__


@dataclass
class ModelArguments:
    model: str = field(default="embedded", metadata={"help": "student: folder, Hub id, .gguf file or 'embedded'"})
    teacher: str | None = field(default=None, metadata={"help": "teacher spec, evaluated alongside the student"})
    batch_size: int = field(default=4, metadata={"help": "prompts per forward/generate call"})
    device: str = field(default="cuda" if torch.cuda.is_available() else "cpu", metadata={"help": "torch device"})
    dtype: str = field(default="auto", metadata={"help": "auto | float32 | bfloat16 | float16"})
    trust_remote_code: bool = field(default=False, metadata={
        "help": "run a checkpoint's own Python when it needs it (linzoo students and Llama teachers never do)"})

    LIMITS = {"batch_size": {"min": 1}}  # linzoo.arguments.check_fields; each eval adds its own

    def __post_init__(self):  # the evals' own checks call this first: all before any model loads
        from linzoo.arguments import check_fields

        check_fields(self)  # types, finite numbers and each field's limits (its metadata)
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"--dtype {self.dtype!r}: use auto, float32, bfloat16 or float16")
        if self.batch_size < 1:
            raise ValueError(f"--batch_size {self.batch_size}: give at least 1")
        try:
            device = torch.device(self.device)
        except RuntimeError:
            raise ValueError(f"--device {self.device!r} is not a torch device: use cpu, cuda or cuda:N") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: torch sees no CUDA GPU here "
                             f"({'a CPU-only build' if torch.version.cuda is None else 'none visible'}): use --device cpu")


def check_quantize(quantize: str, device: str, dtype: str) -> None:
    if quantize not in QUANTIZE:
        raise ValueError(f"--quantize {quantize!r}: use {' or '.join(QUANTIZE)}")
    if quantize == "int8" and torch.device(device).type != "cpu":
        raise ValueError(f"--quantize int8 is torch's dynamic quantization, which runs on the CPU: use --device cpu "
                         f"(on {device}, --dtype bfloat16 is the cheaper model)")
    if quantize == "int8" and dtype not in ("auto", "float32"):
        raise ValueError(f"--quantize int8 quantizes float32 weights: leave --dtype auto (given {dtype})")


def quantize_int8(model):
    """Every nn.Linear of `model` with int8 weights (per tensor) and int8 activations quantized per call, in place:
    torch.ao's dynamic quantization (fbgemm / x86). torch marks its quantized tensors deprecated (pytorch#184982) in
    favour of torchao, but torchao's int8 on a CPU without torch.compile took 4x longer than float32 here (a
    4096 x 576 @ 576 x 1536 product: 184 ms against 44 ms; torch.ao: 11 ms), so this is the one that pays."""
    import warnings

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantize_per_tensor.*deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message=".*torch.ao.quantization.*deprecated", category=DeprecationWarning)
        model = torch.ao.quantization.quantize_dynamic(model, {torch.nn.Linear}, dtype=torch.qint8, inplace=True)
    # A tied head is now an int8 copy of the embedding: re-tying it (lm-eval's HFLM calls tie_weights()) would set the
    # float embedding on a module whose `weight` is a method ("attribute 'weight' already exists").
    model.tie_weights = lambda *args, **kwargs: None
    return model


def load_for_eval(spec: str, device: str, dtype: str, teacher: bool = False, trust_remote_code: bool = False,
                  quantize: str = "none"):
    """(model, tokenizer) through linzoo's loaders, moved to the device/dtype (or quantized) and in eval mode."""
    import linzoo

    load = linzoo.load_teacher if teacher else linzoo.load_model
    model, tokenizer = load(spec, trust_remote_code=True) if trust_remote_code else load(spec)
    model = model.to(device) if dtype == "auto" else model.to(device=device, dtype=getattr(torch, dtype))
    if quantize == "int8":
        model = quantize_int8(model.float())
    return model.eval(), tokenizer


def run_on_models(args: ModelArguments, evaluate) -> list:
    """[evaluate(spec, output folder, model, tokenizer)] for --model, then for --teacher (its results in
    <out>/teacher): what an eval's command runs, one model in memory at a time."""
    runs = [(args.model, False, Path(args.out))]
    if args.teacher:
        runs.append((args.teacher, True, Path(args.out) / "teacher"))
    results = []
    for spec, is_teacher, out in runs:
        model, tokenizer = load_for_eval(spec, args.device, args.dtype, is_teacher, args.trust_remote_code)
        results.append(evaluate(spec, out, model, tokenizer))
        del model
    return results
