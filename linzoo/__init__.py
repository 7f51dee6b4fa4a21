"""linzoo: linearized SmolLM2 students as Hub AutoModels, and the recipes that make them."""

from .convert import linearize
from .modeling.configuration_linzoo import MIXERS, LinzooConfig

__version__ = "0.1.0"


def __getattr__(name):
    # Heavy entry points load lazily so `import linzoo` stays cheap for the CLI and the Space.
    if name in ("load_teacher", "load_model"):
        from . import loading

        return getattr(loading, name)
    raise AttributeError(f"module 'linzoo' has no attribute {name!r}")


__all__ = ["MIXERS", "LinzooConfig", "linearize", "load_model", "load_teacher", "__version__"]
