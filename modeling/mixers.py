"""The mixer registry: one line per mixer. Everything that lists mixers — the config's choices and defaults,
the kernel dispatch, model cards, the Space, tests, recipes and the speed benchmark — reads it from here.

Adding a mixer: a `mixer_<name>.py` with one `LinearMixer` subclass (see `mixer_base.py`), one line below,
one row in the tests' table (tests/test_modeling.py `NEW_PARAMS`). CONTRIBUTING.md walks through an example.
"""

from .mixer_deltanet import DeltaNet
from .mixer_gated_deltanet import GatedDeltaNet
from .mixer_gla import GLA
from .mixer_kda import KDA
from .mixer_linear_attn import LinearAttention
from .mixer_mamba2 import Mamba2
from .mixer_retnet import RetNet
from .mixer_xlstm import MLSTM

MIXER_CLASSES = {
    cls.name: cls
    for cls in (
        # the seven mixers of "What Matters in Linearizing Language Models?" (arXiv 2504.14366)
        LinearAttention, RetNet, GLA, DeltaNet, GatedDeltaNet, KDA, MLSTM,
        # beyond the paper
        Mamba2,
    )
}
MIXERS = tuple(MIXER_CLASSES)
DEFAULT_MIXER = GatedDeltaNet.name  # the paper's best at keeping retrieval


def mixer_table():
    """The mixers as a Markdown table (README, docs): config value, recurrence, new parameters, fast kernel."""
    rows = ["| `mixer` | recurrence | new parameters | fast kernel |", "|---|---|---|---|"]
    for cls in MIXER_CLASSES.values():
        modules = {role: path.rsplit(".", 1)[0] for role, path in cls.fast_kernels.paths.items()}
        kernels = modules["chunk"] if len(set(modules.values())) == 1 else ", ".join(
            f"{module} ({'decoding' if role == 'recurrent' else role})" for role, module in modules.items())
        rows.append(f"| `{cls.name}` | {cls.recurrence} | {cls.new_parameters} | {kernels} |")
    return "\n".join(rows)
