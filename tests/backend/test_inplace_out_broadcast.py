"""In-place and out= ops whose output cannot take the broadcast shape: "tpu" refuses them as CPU does.

Why: the device runs an op on host aliases of its tensors; ``x.logical_and_(y)`` is ``logical_and.out(x, y,
out=x)``, and with two aliases of ``x`` the CPU kernel saw an output that is not an input and resized it, so
``x`` silently became [3, 3]. CPU is the truth here: the same error, and ``x`` unchanged.
"""

from __future__ import annotations

import pytest
import torch

CASES = {
    "logical_and_": lambda x, y: x.logical_and_(y),
    "logical_or_": lambda x, y: x.logical_or_(y),
    "logical_xor_": lambda x, y: x.logical_xor_(y),
    "ldexp_": lambda x, y: x.ldexp_(y),
    "add out=": lambda x, y: torch.add(x, y, out=x),
    "mul out=": lambda x, y: torch.mul(x, y, out=x),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_an_output_that_cannot_broadcast_is_refused_as_on_cpu(name: str) -> None:
    op = CASES[name]
    outcomes = []
    for device in ("cpu", "tpu"):
        x, y = torch.ones(3, 1, device=device), torch.ones(3, 3, device=device)
        with pytest.raises(RuntimeError) as raised:
            op(x, y)
        outcomes.append((str(raised.value), tuple(x.shape), x.cpu().tolist()))
    assert outcomes[1] == outcomes[0]          # the message, and x neither resized nor written


def test_an_output_that_is_also_an_input_still_computes_as_on_cpu() -> None:
    column = [[1.0], [0.0], [2.0]]
    for op in (lambda x, y: y.logical_and_(x), lambda x, y: torch.add(y, x, out=y), lambda x, y: y.mul_(x)):
        got, want = (op(torch.tensor(column, device=d), torch.full((3, 3), 3.0, device=d)).cpu()
                     for d in ("tpu", "cpu"))
        assert torch.equal(got, want) and got.shape == (3, 3)


def test_a_signature_seen_with_its_output_passed_twice_is_replayed_right_in_shape_only_mode(python) -> None:
    """Shape-only mode makes results from a seen signature: add.out(x, y, out=x) and then add.out(a, b, out=c)
    (same shapes) must return c, and x.mul_(x) then a.mul_(b) must return a."""
    result = python("""
        import torch, tpusim.backend as tb
        x, y, a, b, c = (torch.ones(4, 4, device="tpu") for _ in range(5))
        assert torch.add(x, y, out=x) is x and torch.add(a, b, out=c) is c
        assert x.mul_(x) is x and a.mul_(b) is a
        print("ok")
    """, env={"TPUSIM_NUMERICS": "off"})
    assert result.returncode == 0 and result.stdout.split()[-1] == "ok", result.stderr[-2000:]


def _inplace_broadcast_samples() -> list:
    """(name, op, sample) for every OpInfo op with an in-place variant and each of its float32 samples whose
    input must broadcast: CPU refuses those in place (issue 31: every in-place sample behaves as on CPU)."""
    from torch.testing._internal.common_methods_invocations import op_db

    found = []
    for op in op_db:
        if op.inplace_variant is None or torch.float32 not in op.supported_dtypes("cpu"):
            continue
        try:
            samples = [s for s in op.sample_inputs("cpu", torch.float32) if s.broadcasts_input]
        except Exception:               # a sample generator that needs what this build lacks
            continue
        found += [(f"{op.name}{'.' + op.variant_test_name if op.variant_test_name else ''}", op, s)
                  for s in samples]
    return found


def test_every_opinfo_inplace_sample_that_must_broadcast_fails_as_on_cpu() -> None:
    # addr_ resized where CPU raised: CPU's check compares C++ references, which a boxed call cannot keep
    # (tpusim/backend/dispatch/fallback.py CPU_COMPOSITES).
    samples = _inplace_broadcast_samples()
    assert len(samples) >= 50
    different = []
    for name, op, sample in samples:
        outcomes = []
        for device in ("cpu", "tpu"):
            moved = sample.transform(lambda t, d=device: t.to(d) if isinstance(t, torch.Tensor) else t)
            x = moved.input.clone()
            try:
                op.inplace_variant(x, *moved.args, **moved.kwargs)
                outcomes.append(("ran", tuple(x.shape)))
            except Exception as error:
                outcomes.append((type(error).__name__, tuple(x.shape)))
        if outcomes[0] != outcomes[1]:
            different.append((name, outcomes))
    assert different == []
