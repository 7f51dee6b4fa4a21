"""linzoo: linearized SmolLM2 students as Hub AutoModels, and the recipes that make them.

Every entry point loads on first use, so `import linzoo` (the CLI's dispatch, `linzoo --help`) imports neither
torch nor transformers (`python -X importtime -c "import linzoo"`; tests/test_cli.py checks it)."""

import importlib

__version__ = "0.1.0"

# public name -> the module that defines it
_LAZY = {
    "linearize": "linzoo.convert",
    "MIXERS": "linzoo.modeling.configuration_linzoo",
    "LinzooConfig": "linzoo.modeling.configuration_linzoo",
    "load_teacher": "linzoo.loading",
    "load_model": "linzoo.loading",
}


def __getattr__(name):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'linzoo' has no attribute {name!r}")


def __dir__():
    return sorted([*globals(), *_LAZY])


__all__ = ["MIXERS", "LinzooConfig", "linearize", "load_model", "load_teacher", "__version__"]
