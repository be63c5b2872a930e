"""tpusim: a simulator-first TPU emulator and PyTorch backend testbed.

This package is the simulator layer: it never imports torch (see DESIGN.md).
The PyTorch "tpu" device lives in ``tpusim.backend`` (top-level folder tpusim/backend/).

``tpusim.set_eager_mode``, ``tpusim.eager_mode`` and ``tpusim.get_eager_mode`` (tpusim/eager/state.py)
are loaded on first use, so ``import tpusim`` stays light.
"""

__version__ = "0.1.0"

_EAGER = ("set_eager_mode", "eager_mode", "get_eager_mode")


def __getattr__(name: str) -> object:
    if name in _EAGER:
        from tpusim.eager import state as eager

        return getattr(eager, name)
    raise AttributeError(f"module 'tpusim' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *_EAGER])
