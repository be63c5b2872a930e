"""``torch.tpu.compiler``: TorchTPU's ``custom_compiler_options``.

    with torch.tpu.compiler.custom_compiler_options({"xla_optimization_level": "O1"}):
        y = model(x).cpu()

On a TPU the options go to XLA for every computation materialised inside the block (innermost block
wins per key; TORCH_TPU_INTERNAL_XLA_OPTIONS over them, XLA_FLAGS under them). tpusim prices XLA's work
with its own cost model, which no XLA option changes, and computes values on the host, so here the
options are checked (a dict of option name -> value, both text) and kept for ``current()``, and change
nothing else.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from tpusim.errors import TpusimError

_STACK: list[dict[str, str]] = []


@contextlib.contextmanager
def custom_compiler_options(options: dict[str, str]) -> Iterator[None]:
    """XLA compiler options for what the block materialises (checked and kept; see the module docstring)."""
    if not isinstance(options, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in options.items()):
        raise TpusimError(f"torch.tpu.compiler.custom_compiler_options({options!r}): expected a dict of XLA "
                          f"option name -> value, both text, e.g. {{'xla_optimization_level': 'O1'}}")
    _STACK.append(dict(options))
    try:
        yield
    finally:
        _STACK.pop()


def current() -> dict[str, str]:
    """The options in effect: every enclosing block's, the innermost winning per key."""
    merged: dict[str, str] = {}
    for options in _STACK:
        merged.update(options)
    return merged


__all__ = ["custom_compiler_options"]
