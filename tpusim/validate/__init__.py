"""The fidelity suite: published TPU measurements and tpusim's predictions of them (`tpusim validate`).

Each case (``case.Case``) is one published figure with its source, the chip, slice, parallelism,
batch, precision and remat of the published run, and a predictor that prices the same setup:

- ``scaling_book``: collectives and a matmul from the JAX scaling book (C1-C10, V18), priced with
  ``tpusim.network.collectives.simulate_collective`` / ``tpusim.hardware.compute.kernel_cost``;
- ``maxtext``: MaxText's published training throughput on v5p, v5e and v4 (V23-V25), and Google's
  MLPerf Training v4.0 GPT-3 175B runs on 1024-6144 v5p chips (V2-V4, int8), a decoder step built
  from closed-form layer shapes and priced with ``tpusim.pricing.price`` in fused mode;
- ``product``: the training runs as a PyTorch script (validation/decoder.py) recorded by `tpusim run`;
- ``torchtitan``: TorchTPU's own runs of one script per eager mode (the TorchTitan TPU recipes' AFMv7 3B LoRA rows,
  compiled and DEFER_AND_FUSE eager, as validation/lora_decoder.py; their Conformer rows as
  validation/conformer.py), recorded the same way;
- ``inference``: published times per output token (vLLM on v6e; the scaling book's serving examples as formula
  checks) as a PyTorch decode loop (validation/decode.py) recorded by `tpusim run`.

``suite`` runs them against each chip's calibration (``tpusim.hardware.calibration``, files in
``topologies/calibration/``) and reports the error, held-out error and sensitivities.

Adding a case = one ``Case`` in a module's ``CASES`` (listed in ``CASES`` below). Two published
measurements are held out for good and must never be added, nor run to check: MLPerf Training v4.0
GPT-3 175B on 512 v5p chips (one 8x8x8 slice), and the scaling book's latency-bound small-message
all-gather measured on v5e.
"""

from __future__ import annotations

from tpusim.validate import inference, maxtext, product, scaling_book, torchtitan
from tpusim.validate.case import Case, Prediction
from tpusim.validate.suite import Result, Summary, explain, find_case, run_case, run_cases, summarise

CASES: tuple[Case, ...] = (*scaling_book.CASES, *product.CASES, *torchtitan.CASES, *inference.CASES, *maxtext.CASES)

__all__ = ["CASES", "Case", "Prediction", "Result", "Summary", "explain", "find_case", "run_case", "run_cases",
           "summarise"]
