"""The mixer registry is the single source of a mixer's facts, and the remote-code bundle degrades, never breaks.

- every registered class declares its facts, and nothing outside its own file and the registry names it;
- the README's mixer table is the registry's table;
- with a partial fla (one op missing) or a broken kernel import, `kernel_backend="auto"` falls back to the torch path
  with one warning naming what is missing (same logits), `"fast"` raises with that reason, and the mixers whose
  kernels did import use them.
"""

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import linzoo
from linzoo.modeling.mixer_base import LinearMixer
from linzoo.modeling.mixers import MIXER_CLASSES, mixer_table

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("modeling", "hub_cards", "evals", "linzoo", "spaces")


@pytest.mark.parametrize("name", linzoo.MIXERS)
def test_every_mixer_declares_its_facts(name):
    cls = MIXER_CLASSES[name]
    assert issubclass(cls, LinearMixer) and cls.name == name
    assert (ROOT / "modeling" / f"mixer_{name}.py").is_file()
    assert cls.__module__.endswith(f".mixer_{name}")
    assert cls.title and cls.recurrence and "_t" in cls.recurrence and cls.new_parameters
    assert set(cls.fast_kernels.paths) == {"chunk", "recurrent"}


def product_files():
    """(path, text) of every text file in the product's folders."""
    for folder in PACKAGE_DIRS:
        for path in sorted((ROOT / folder).rglob("*")):
            if path.is_file() and path.suffix not in (".pyc", ".png", ".jsonl") and "__pycache__" not in path.parts:
                yield path, path.read_text(errors="ignore")


def test_no_mixer_is_named_outside_its_file_and_the_registry():
    """Names (and the hyphenated forms used in repo names) in the product's folders: only mixer_<name>.py and
    mixers.py may spell them; everything else asks the registry. (A kernel package's module path, such as
    fla's `fla.ops.gla`, is that package's name, not ours.)"""
    found = []
    for path, text in product_files():
        for name in linzoo.MIXERS:
            if path.name in (f"mixer_{name}.py", "mixers.py"):
                continue
            for variant in {name, name.replace("_", "-")}:
                for m in re.finditer(rf"(?<![\w.]){re.escape(variant)}\b", text):
                    found.append(f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {variant}")
    assert not found, "\n".join(found)


def test_readme_table_is_the_registrys():
    assert mixer_table() in (ROOT / "README.md").read_text(), "README's mixer table drifted: paste mixer_table()"


def test_state_shapes_match_a_real_cache():
    """The state size the Space and the cards report is the size the cache really holds."""
    import torch

    from linzoo.modeling import LinzooConfig, LinzooForCausalLM

    from linzoo.modeling.configuration_linzoo import state_sizes
    from linzoo.modeling.memory import COUNTS, SPARSE, WINDOW

    for name, cls in MIXER_CLASSES.items():
        for memory in ({}, {"window_size": 3}, {"window_size": 3, "sparse_cache_size": 2}):
            config = LinzooConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                  num_attention_heads=4, num_key_value_heads=2, kernel_backend="torch", mixer=name,
                                  **memory)
            model = LinzooForCausalLM(config).eval()
            with torch.no_grad():
                out = model(torch.randint(0, 50, (1, 9)), use_cache=True)
            layer = (out.cache if hasattr(out, "cache") else out.past_key_values).layers[0]
            shapes = cls.state_shapes(config)
            held = {"recurrent": layer.recurrent_states[0]}
            if config.use_short_conv:
                held["conv"] = layer.conv_states[0]
            for key, index in (("window", WINDOW), ("sparse", SPARSE), ("counts", COUNTS)):
                if key in shapes or layer.recurrent_states.get(index) is not None:
                    held[key] = layer.recurrent_states[index]
            assert {k: tuple(t.shape[1:]) for k, t in held.items()} == shapes, (name, memory)
            size = state_sizes(config, 9)  # bytes: fp32 states, the conv window in the model dtype (fp32 here)
            assert size.fixed == sum(t[0].numel() * t.element_size() for t in held.values()), (name, memory)


# --- a partial or broken fla, in a fresh process (the stub must not leak into other tests) ----------------

STUB_GLA = '''
from linzoo.modeling.linear_ops import torch_chunk, torch_recurrent
CALLS = []  # which stand-in ran, so the test sees the fast path was taken

def chunk_gla(q, k, v, g=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    CALLS.append("chunk")
    return torch_chunk(q, k, v, g, None, delta=False, scale=scale, initial_state=initial_state,
                       output_final_state=output_final_state, chunk_size=8)

def fused_recurrent_gla(q, k, v, gk=None, scale=None, initial_state=None, output_final_state=False, cu_seqlens=None):
    CALLS.append("recurrent")
    return torch_recurrent(q, k, v, gk, None, delta=False, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state)
'''
# fla's simple GLA decoding step (a per-head decay), as documented
STUB_SIMPLE_GLA = STUB_GLA.replace("gk=None", "g=None").replace("v, gk, None", "v, g, None").replace(
    "fused_recurrent_gla", "fused_recurrent_simple_gla").replace("def chunk_gla", "def chunk_simple_gla")

CHECK = textwrap.dedent('''
    import json, sys, warnings
    import torch
    from linzoo.convert import fresh_parameters
    from linzoo.modeling import LinzooConfig, LinzooForCausalLM, kernels
    from linzoo.modeling.mixers import MIXER_CLASSES

    kernels.FAST_DEVICE_TYPES = ("cpu",)  # let this CPU stand in for CUDA: what matters is what imported
    out = {}

    def logits(mixer, backend):
        """Logits of a short input (the decoding kernels' length) and a long one (the chunk kernels'), and of a
        few generated tokens, from a model whose gates depend on the input."""
        torch.manual_seed(0)
        config = LinzooConfig(vocab_size=50, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, chunk_size=8, kernel_backend=backend,
                              mixer=mixer)
        model = LinzooForCausalLM(config).eval()
        with torch.no_grad():
            fresh = set(fresh_parameters(model))
            for name, p in model.named_parameters():
                if name in fresh:
                    p.add_(0.3 * torch.randn_like(p))
            short = model(torch.arange(1, 20)[None]).logits
            long = model((torch.arange(1, 81) % 49 + 1)[None]).logits
            generated = model.generate(torch.arange(1, 10)[None], max_new_tokens=4, do_sample=False)
        return torch.cat([short.flatten(), long.flatten(), generated.flatten().float()])

    for mixer in sys.argv[1:]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            same = torch.allclose(logits(mixer, "auto"), logits(mixer, "torch"), atol=1e-5)
            logits(mixer, "auto")  # a second model: no second warning
        try:
            logits(mixer, "fast")
            fast_error = None
        except RuntimeError as err:
            fast_error = str(err)
        fast = MIXER_CLASSES[mixer].fast_kernels.load() is not None
        out[mixer] = {"same_logits": same, "warnings": [str(w.message) for w in caught], "fast_error": fast_error,
                      "fast_path": fast}
    import fla.ops.gla as stub
    out["gla_stub_calls"] = len(stub.CALLS)
    print(json.dumps(out))
''')


def _run_with_stub_fla(tmp_path, files, mixers):
    for rel, text in {"fla/__init__.py": "", "fla/ops/__init__.py": "", **files}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, "-c", CHECK, *mixers], env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_partial_fla_falls_back_per_mixer(tmp_path):
    """An fla with gla's kernels but no kda (and none of the fused ops): gla runs its kernels, kda falls back."""
    out = _run_with_stub_fla(tmp_path, {"fla/ops/gla.py": STUB_GLA, "fla/ops/simple_gla.py": STUB_SIMPLE_GLA},
                             ["gla", "kda", "mamba2"])
    gla, kda = out["gla"], out["kda"]
    assert gla["fast_path"] and gla["same_logits"] and gla["fast_error"] is None and out["gla_stub_calls"] > 0
    assert not kda["fast_path"] and kda["same_logits"]
    # mamba2 maps its per-head decay and step onto the GLA chunk kernel and the simple-GLA step: same numbers
    assert out["mamba2"]["fast_path"] and out["mamba2"]["same_logits"] and out["mamba2"]["fast_error"] is None
    kda_warnings = [w for w in kda["warnings"] if "fla.ops.kda" in w]
    assert len(kda_warnings) == 1 and "pure-torch path" in kda_warnings[0] and "pip install" in kda_warnings[0]
    assert "fla.ops.kda" in kda["fast_error"] and "kernel_backend" in kda["fast_error"]
    # the fused norm/SwiGLU/conv/cross-entropy are missing from the stub too: one warning, torch forms used
    fused = [w for w in gla["warnings"] + kda["warnings"] if "fused" in w]
    assert len(fused) == 1 and "fla.modules" in fused[0]


def test_broken_kernel_import_falls_back(tmp_path):
    """A kernel module that raises at import (as a broken Triton does) is a missing kernel, not a crash."""
    broken = "raise RuntimeError('Triton cannot find a GPU driver')\n"
    out = _run_with_stub_fla(tmp_path, {"fla/ops/gla.py": STUB_GLA, "fla/ops/gated_delta_rule.py": broken},
                             ["gated_deltanet"])
    gdn = out["gated_deltanet"]
    assert not gdn["fast_path"] and gdn["same_logits"]
    assert any("RuntimeError: Triton cannot find a GPU driver" in w for w in gdn["warnings"])
    assert "Triton cannot find a GPU driver" in gdn["fast_error"]


# --- the eval registry: like the mixers', the single source of an eval's facts ------------------------------

def test_every_eval_declares_its_facts():
    from linzoo.evals.registry import EVAL_MODULES, all_evals

    for name, spec in zip(EVAL_MODULES, all_evals()):
        assert spec.name == name and (ROOT / "evals" / f"{name}.py").is_file()
        assert spec.schema.startswith(f"linzoo.{name}/") and spec.result_file == f"{name}.json"
        assert spec.help and callable(spec.main) and all(f.endswith(".png") for f in spec.figures)
        assert (spec.space_row is None) == (not spec.space_headers)


def test_no_eval_is_named_outside_its_file_and_the_registry():
    """An eval's results file, figures and schema appear only in its own module (and documents of its own in
    evals/, e.g. LM_EVAL.md) and the registry: cards, plans, the CLI and the Space ask the registry."""
    from linzoo.evals.registry import all_evals

    found = []
    for path, text in product_files():
        for spec in all_evals():
            if path.parent.name == "evals" and path.name in (f"{spec.name}.py", "registry.py"):
                continue
            for word in (spec.schema, *spec.files):
                for m in re.finditer(rf"(?<![\w.]){re.escape(word)}(?![\w])", text):
                    found.append(f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {word}")
    assert not found, "\n".join(found)


def test_import_linzoo_imports_no_torch():
    """`import linzoo` (and the CLI's dispatch table) stay cheap: torch and transformers load on first use."""
    code = ("import sys, linzoo, linzoo.cli; heavy = [m for m in ('torch', 'transformers') if m in sys.modules]; "
            "print(heavy); assert linzoo.MIXERS and 'torch' in sys.modules")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]"
