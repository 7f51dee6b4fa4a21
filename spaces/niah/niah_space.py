"""The NIAH Space without its UI: model choices and a load-once cache, one query over one to three
models, the haystack as HTML with the needle marked, fixed-state vs KV-cache sizes, each offered model's state size
and measured decoding speed, and the view of measured results. `app.py` beside it wires these into Gradio;
`linzoo space` runs that app locally.

    linzoo space --models runs/main,embedded --port 7860
    LINZOO_SPACE_MODELS=org/my-student-base python spaces/niah/app.py   # as on the Hub

Environment (what `linzoo space` flags set): LINZOO_SPACE_MODELS (comma-separated model specs, the
first is preselected), LINZOO_SPACE_RESULTS (comma-separated folders or results files),
LINZOO_SPACE_FILLER (haystack filler: "embedded", a linzoo.data spec or a .txt path).

A visitor picks among LINZOO_SPACE_MODELS only, its owner's list: `run_query` refuses anything else (a Hub
repo of the visitor's, a path on the Space's disk) before touching it. Even a listed model must be a linzoo
student or a Llama-family teacher (config.json's `model_type`, read, never executed) of at most
MAX_PARAMETERS parameters, with safetensors weights; it loads through linzoo's and transformers' installed
classes (`linzoo.load_model`), never with the repo's own code.

Queries may run at once (an owner may raise Gradio's concurrency limit): each model is loaded by one of them while
the others wait. Every input is checked before anything is loaded or tokenized: numbers finite and in range, a custom
haystack of at most MAX_CUSTOM_CHARS characters.
"""

from __future__ import annotations

import html
import math
import os
import threading
from functools import lru_cache
from pathlib import Path

from linzoo.arguments import ArgumentParser
from linzoo.evals import niah
from linzoo.evals.common import EVAL_DIR
from linzoo.formatting import NOT_MEASURED, format_bytes
from linzoo.modeling.configuration_linzoo import StateSize, state_sizes

MAX_CONTEXT = 4096  # so that a free CPU Space (2 vCPU) answers a 135M model within about a minute
MAX_MODELS = 3
CUSTOM = "custom"  # beside the NIAH variants: the user's own haystack, question and expected answer
VARIANT_CHOICES = (*niah.VARIANTS, CUSTOM)
CUSTOM_MAX_NEW_TOKENS = 32
# SmolLM2's longest token is 81 characters (runs of spaces or dashes tokenize at 64 a token): a pasted haystack longer
# than this cannot fit MAX_CONTEXT tokens and is refused before the tokenizer reads it; what passes tokenizes in < 1 s.
CHARS_PER_TOKEN = 128
MAX_CUSTOM_CHARS = MAX_CONTEXT * CHARS_PER_TOKEN
MAX_SEED = 2**32 - 1  # numpy's range; far below 2**53, above which a number box's float loses digits
DEFAULT_FOLDER = "runs/main"  # where the main training job leaves its student
RESULT_HEADERS = ["model", "expected", "answer", "verdict", "seconds", "prompt tokens",
                  "state at this context", "teacher KV cache at this context"]
RESULT_WIDTHS = ["20%", "9%", "21%", "9%", "7%", "7%", "14%", "13%"]
CORRECT, WRONG = "✓ correct", "✗ wrong"
MODEL_HEADERS = ["model", "state per sequence", "decode ms/token"]
MODEL_WIDTHS = ["30%", "35%", "35%"]
MODEL_TYPES = ("linzoo", "llama")  # linzoo's students and their teachers (SmolLM2 is a Llama)
MAX_PARAMETERS = 2_000_000_000  # 8 GB in fp32: a free CPU Space has 16 GB (SmolLM2-1.7B's students fit)


def _env_list(name: str) -> list[str]:
    return [item.strip() for item in os.environ.get(name, "").split(",") if item.strip()]


def default_models() -> list[str]:
    """The models this Space offers, its owner's list: $LINZOO_SPACE_MODELS, else the main job's student
    (runs/main) and the embedded teacher."""
    models = _env_list("LINZOO_SPACE_MODELS")
    if models:
        return models
    return [DEFAULT_FOLDER, "embedded"] if (Path(DEFAULT_FOLDER) / "config.json").is_file() else ["embedded"]


def is_hub_id(spec: str) -> bool:
    """`spec` names a Hub repo (org/name), not a path on this disk."""
    return spec.count("/") == 1 and not spec.startswith((".", "/", "~")) and not Path(spec).expanduser().exists()


def check_models(models: list[str]) -> list[str]:
    """`models`, once each local one is a model: a folder with config.json or a .gguf file (Hub ids and 'embedded'
    are loaded, and reported, when a visitor first picks them). A ValueError names the first that is not."""
    for spec in models:
        path = Path(spec).expanduser()
        if spec == "embedded" or is_hub_id(spec):
            continue
        if not ((path / "config.json").is_file() or (spec.endswith(".gguf") and path.is_file())):
            raise ValueError(f"--models: {spec!r} is not a model folder (none with a config.json), a .gguf file, a Hub "
                             "id (org/name) or 'embedded': fix the path, or train the main job's student first "
                             "(runs/main)")
    return models


def results_paths() -> list[Path]:
    """$LINZOO_SPACE_RESULTS, else the `results/` folder of the working directory (the Space repo)."""
    return [Path(p) for p in _env_list("LINZOO_SPACE_RESULTS") or ["results"]]


def approx_parameters(config: dict) -> int:
    """Parameters a Llama-shaped config.json implies: embeddings, attention and MLP projections (norms and a
    linzoo mixer's gates, well under 1 % of a model, left out). A ValueError when a size field is missing."""
    try:
        hidden, layers, vocab, inner, heads = (int(config[k]) for k in (
            "hidden_size", "num_hidden_layers", "vocab_size", "intermediate_size", "num_attention_heads"))
        kv_heads = int(config.get("num_key_value_heads") or heads)
        head_dim = int(config.get("head_dim") or hidden // heads)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as err:
        raise ValueError(f"config.json does not say the model's size ({err!r})") from None
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim  # q, o; k, v
    embeddings = vocab * hidden * (1 if config.get("tie_word_embeddings", True) else 2)
    return embeddings + layers * (attention + 3 * hidden * inner)


def check_model(spec: str, allowed: list[str]) -> None:
    """A ValueError unless `spec` is on the owner's list and its config.json (read, never executed) names a
    linzoo student or a Llama teacher of at most MAX_PARAMETERS parameters. Nothing is loaded here."""
    from linzoo.loading import read_config

    if spec not in allowed:
        raise ValueError(f"{spec!r} is not one of this Space's models; pick among {', '.join(allowed)}.")
    try:
        config = read_config(spec)
        if config.get("model_type") not in MODEL_TYPES:
            raise ValueError(f"it is a {config.get('model_type')!r} model; this Space runs "
                             f"{' and '.join(MODEL_TYPES)} models only")
        if (n := approx_parameters(config)) > MAX_PARAMETERS:
            raise ValueError(f"its config implies ~{n / 1e9:.1f}B parameters; this Space loads at most "
                             f"{MAX_PARAMETERS / 1e9:.0f}B")
    except (ValueError, FileNotFoundError) as err:
        raise ValueError(f"{spec} is not loaded: {err}.") from None


_LOAD_LOCKS: dict[str, threading.Lock] = {}  # one per model spec; only specs on the owner's list get one


def load(spec: str):
    """(model, tokenizer) through `linzoo.load_model` (installed classes, safetensors only), fp32 on CPU, in eval
    mode. `run_query` calls it only for specs that passed `check_model`. Queries asking at once for a model not yet
    loaded wait for the one that loads it (lru_cache alone would let each load its own copy)."""
    with _LOAD_LOCKS.setdefault(spec, threading.Lock()):
        return _loaded(spec)


@lru_cache(maxsize=MAX_MODELS + 1)  # one query's models stay loaded; each is loaded once while in use
def _loaded(spec: str):
    from linzoo import load_model

    return load_model(spec, safetensors_only=True)


@lru_cache(maxsize=2)
def filler_texts(spec: str) -> tuple[str, ...]:
    return tuple(niah.load_texts(spec, split="test"))


def describe_state(size: StateSize) -> str:
    if size.fixed == 0:
        return f"{format_bytes(size.attention_kv)} KV cache (grows with context)"
    text = f"{format_bytes(size.fixed)} fixed"
    return text + (f" + {format_bytes(size.attention_kv)} KV (softmax layers)" if size.attention_kv else "")


def highlight_html(haystack: str, spans: list[tuple[int, int]]) -> str:
    """The haystack as escaped HTML, each (start, end) character span wrapped in <mark>."""
    parts, last = [], 0
    for start, end in sorted(s for s in spans if s[1] > s[0]):
        parts += [html.escape(haystack[last:start]), f'<mark class="needle">{html.escape(haystack[start:end])}</mark>']
        last = end
    parts.append(html.escape(haystack[last:]))
    body = "".join(parts)
    return ('<div class="haystack" style="max-height:22em;overflow-y:auto;white-space:pre-wrap;'
            f'font-size:0.85em;border:1px solid #ccc;padding:0.5em">{body}</div>')


def check_custom_size(haystack: str, question: str) -> None:
    """A ValueError when a custom haystack and question cannot fit MAX_CONTEXT tokens by their length alone."""
    if (n := len(haystack or "") + len(question or "")) > MAX_CUSTOM_CHARS:
        raise ValueError(f"Your haystack and question have {n:,} characters; this Space reads at most "
                         f"{MAX_CUSTOM_CHARS:,} ({MAX_CONTEXT} tokens): shorten the haystack.")


def custom_sample(tokenizer, haystack: str, question: str, answer: str, prompt_format: str = "raw",
                  max_context: int = MAX_CONTEXT) -> niah.NiahSample:
    """A NIAH sample from the user's own haystack; the needle span is the expected answer's first occurrence."""
    check_custom_size(haystack, question)
    haystack, question, answer = (haystack or "").strip(), (question or "").strip(), (answer or "").strip()
    if not (haystack and question and answer):
        raise ValueError("A custom needle needs a haystack, a question and the expected answer.")
    prompt = niah.format_prompt(tokenizer, haystack, question, prompt_format)
    n_tokens = len(tokenizer(prompt, **niah._encode_kwargs(prompt_format))["input_ids"])
    if n_tokens > max_context:
        raise ValueError(f"Your haystack makes a {n_tokens}-token prompt; this Space allows {max_context}.")
    start = haystack.find(answer)
    span = (start, start + len(answer)) if start >= 0 else (0, 0)
    return niah.NiahSample(prompt, answer, answer, question, haystack, span, n_tokens, n_tokens,
                           start / max(len(haystack), 1) if start >= 0 else 0.0, CUSTOM, prompt_format)


def _no_progress(*args, **kwargs):
    pass


def checked_number(name: str, value, low: int | float, high: int | float, whole: bool = False) -> int | float:
    """`value` as a number in low..high (an int if `whole`); a ValueError saying the range when it is not one
    (NaN and infinities included)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not low <= number <= high or (whole and number != int(number)):  # NaN fails every comparison
        raise ValueError(f"{name} must be a {'whole number' if whole else 'number'} in {low}..{high} on this Space, "
                         f"got {value!r}.")
    return int(number) if whole else number


def run_query(models: list[str], context_len: int, depth: float, variant: str = "passkey", seed: int = 0,
              prompt_format: str = "raw", haystack: str = "", question: str = "", answer: str = "",
              progress=_no_progress, allowed: list[str] | None = None) -> tuple[str, list[list]]:
    """Ask each model for the needle: (haystack HTML with the needle marked, one RESULT_HEADERS row per model).
    A NIAH variant's haystack is built per model (its own tokenizer) from one seed, so the needle is the same;
    `prompt_format` is the custom haystack's (a variant has its own). Every model must pass `check_model` against
    `allowed` (default: `default_models()`) before any loads."""
    models = [m for m in dict.fromkeys(models or []) if m]
    if not 1 <= len(models) <= MAX_MODELS:
        raise ValueError(f"Pick one to {MAX_MODELS} models (got {len(models)}).")
    if variant not in VARIANT_CHOICES:
        raise ValueError(f"The needle must be one of {', '.join(VARIANT_CHOICES)}, got {variant!r}.")
    context_len = checked_number("Context length (tokens)", context_len, 64, MAX_CONTEXT, whole=True)
    depth = checked_number("Needle depth", depth, 0, 1)
    seed = checked_number("Seed", seed, 0, MAX_SEED, whole=True)
    if variant == CUSTOM:
        check_custom_size(haystack, question)
    for spec in models:
        check_model(spec, default_models() if allowed is None else allowed)
    rows, shown = [], None
    for i, spec in enumerate(models):
        progress(i / len(models), desc=f"loading {spec}")
        model, tokenizer = load(spec)
        progress((i + 0.3) / len(models), desc=f"{spec}: reading the haystack")
        if variant == CUSTOM:
            sample = custom_sample(tokenizer, haystack, question, answer, prompt_format)
        else:
            prose = niah.VARIANTS[variant].haystack == "prose"
            filler = list(filler_texts(os.environ.get("LINZOO_SPACE_FILLER", "embedded"))) if prose else None
            sample = niah.build_haystack(tokenizer, filler, context_len, depth, variant, seed)
        text, correct, seconds = niah.answer_one(model, tokenizer, sample,
                                                 CUSTOM_MAX_NEW_TOKENS if variant == CUSTOM else None)
        size = state_sizes(model.config, sample.n_tokens, next(model.parameters()).element_size())
        rows.append([spec, sample.answer, text.strip(), CORRECT if correct else WRONG, round(seconds, 2),
                     sample.n_tokens, describe_state(size), format_bytes(size.teacher_kv)])
        shown = shown or sample
    progress(1.0, desc="done")
    return highlight_html(shown.haystack, [shown.needle_span]), rows


def speed_results(spec: str) -> tuple[dict, list[dict]] | None:
    """(the speed eval's results, this model's rows in them) from beside the model: its results file in <folder>/eval/
    (`linzoo eval speed`'s default --out) or <folder>/eval/speed/ (the main job's), locally or in a Hub repo (push
    uploads eval/). Its rows are the model's whose name is this folder (or, failing that, the file's only student);
    None where no such file measured it ('embedded', a folder or repo without one)."""
    from huggingface_hub import hf_hub_download

    from linzoo.evals.registry import get_eval

    speed = get_eval("speed")
    folder, hub_id = Path(spec).expanduser(), is_hub_id(spec)
    if spec == "embedded" or not (hub_id or folder.is_dir()):
        return None
    for name in (f"{EVAL_DIR}/{speed.result_file}", f"{EVAL_DIR}/{speed.name}/{speed.result_file}"):
        try:
            path = hf_hub_download(spec, name) if hub_id else folder / name
        except (OSError, ValueError):  # not in the repo, or the Hub out of reach: not measured
            continue
        data = speed.read(path) if Path(path).is_file() else None
        if not data:
            continue
        ours = [m for m in data["models"] if not hub_id and Path(m).expanduser().resolve() == folder.resolve()]
        if not ours and len(data["models"]) == 2:  # a file beside the model with one student: that student's
            ours = data["models"][1:]
        rows = [r for r in data["rows"] if ours and r["model"] == ours[0]]
        if rows:
            return data, rows
    return None


def model_row(spec: str, tokens: int = MAX_CONTEXT) -> list[str]:
    """A MODEL_HEADERS row: the state one sequence keeps (measured beside the model at the longest context measured,
    else from its config.json at `tokens` tokens, fp32 as this Space runs) and its measured decoding ms/token at the
    smallest batch and longest context of that measurement with the teacher's beside it, else "not measured"."""
    from linzoo.loading import read_config

    found = speed_results(spec)
    if found is None:
        try:
            state = f"{describe_state(state_sizes(read_config(spec), tokens))} at {tokens} tokens (from its config)"
        except (OSError, ValueError, KeyError, TypeError):
            state = "unknown (its config.json could not be read)"
        return [spec, state, NOT_MEASURED]
    data, rows = found
    batch = min(r["batch"] for r in rows)
    row = max((r for r in rows if r["batch"] == batch), key=lambda r: r["length"])
    teacher = next(r for r in data["rows"] if r["model"] == data["teacher"] and r["length"] == row["length"]
                   and r["batch"] == batch)
    where = f"at {row['length']} tokens, batch {batch}, on {data['device_name']} ({data['device']})"
    vs = "" if row is teacher else (f"; teacher {teacher['decode_ms_per_token']:.1f} ms/token, "
                                    f"{row['ratios']['decode_ms_per_token']:.2f}×")
    return [spec, f"{format_bytes(row['state_bytes_per_sequence'])} at {row['length']} tokens (measured)",
            f"{row['decode_ms_per_token']:.1f} ms/token {where}{vs}"]


_hub_model_row = lru_cache(maxsize=None)(model_row)  # a Hub repo's files are fetched once a process, not every visit


def model_rows(models: list[str]) -> list[list[str]]:
    """One MODEL_HEADERS row per offered model, in the owner's order; a folder's read afresh at every visit (a speed
    eval may have finished since)."""
    return [(_hub_model_row if is_hub_id(spec) else model_row)(spec) for spec in models]


def result_tables() -> list:
    """The registered evals that show a table in the "Measured results" tab, in the registry's order."""
    from linzoo.evals.registry import all_evals

    return [spec for spec in all_evals() if spec.space_headers]


def results_view(paths: list[Path] | None = None) -> tuple:
    """(note, gallery items, then one table of rows per eval of `result_tables()`) from every eval results file
    under `paths`; a figure of the eval beside its file joins the gallery."""
    specs = result_tables()
    files = []
    for path in map(Path, paths if paths is not None else results_paths()):
        files += sorted(path.rglob("*.json")) if path.is_dir() else [path] if path.is_file() else []
    gallery, tables = [], {spec.name: [] for spec in specs}
    for path in files:
        for spec in specs:
            if data := spec.read(path):
                tables[spec.name].append(spec.space_row(data))
                figure = path.with_name(spec.figures[0]) if spec.figures else None
                if spec.space_caption and figure and figure.is_file():
                    gallery.append((str(figure), spec.space_caption(data)))
                break
    if not any(tables.values()):
        return ("no results yet", [], *([] for _ in specs))
    counts = ", ".join(f"{len(rows)} {name}" for name, rows in tables.items())
    return (f"results files: {counts}.", gallery, *tables.values())


def launch(demo, results: list[Path], host: str | None = None, port: int | None = None, block: bool = True) -> str:
    """Serve `demo` one query at a time (a CPU Space has no room for two) and return its local URL.
    host/port None: Gradio's defaults or $GRADIO_SERVER_NAME / $GRADIO_SERVER_PORT, as on the Hub."""
    demo.queue(default_concurrency_limit=1).launch(server_name=host, server_port=port, prevent_thread_lock=not block,
                                                   allowed_paths=[str(p) for p in results])
    return demo.local_url


def apply_flags(argv: list[str] | None = None) -> tuple[str | None, int | None]:
    """`linzoo space`'s flags: --models, --results and --filler set the environment the Hub sets; returns (host, port)
    (None: Gradio's defaults, or $GRADIO_SERVER_NAME / $GRADIO_SERVER_PORT as on the Hub)."""
    parser = ArgumentParser(prog="linzoo space", description="Run the NIAH Gradio Space locally.")
    parser.add_argument("--models", help="comma-separated model specs, the only ones the Space loads (default: "
                                         "$LINZOO_SPACE_MODELS, else runs/main and embedded); the first is preselected")
    parser.add_argument("--results", help="comma-separated results folders/files (default: results/)")
    parser.add_argument("--filler", help="haystack filler: 'embedded', a linzoo.data spec or a .txt path")
    parser.add_argument("--host", help="default: $GRADIO_SERVER_NAME, else 127.0.0.1")
    parser.add_argument("--port", type=int, help="default: $GRADIO_SERVER_PORT, else 7860 (or the next free one)")
    args = parser.parse_args(argv)
    if args.port is not None and not 0 < args.port < 65536:
        raise ValueError(f"--port {args.port}: give a TCP port, 1-65535 (7860 is Gradio's)")
    for name, value in (("LINZOO_SPACE_MODELS", args.models), ("LINZOO_SPACE_RESULTS", args.results),
                        ("LINZOO_SPACE_FILLER", args.filler)):
        if value:
            os.environ[name] = value
    return args.host, args.port
