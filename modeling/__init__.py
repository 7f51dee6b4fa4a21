"""The remote-code bundle: these flat files are what `save_pretrained` copies beside the weights."""

from .configuration_linzoo import MIXERS, LinzooConfig
from .modeling_linzoo import LinzooForCausalLM, LinzooModel

__all__ = ["MIXERS", "LinzooConfig", "LinzooForCausalLM", "LinzooModel"]
