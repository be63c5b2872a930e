"""Inference on "tpu" gives CPU's tokens (issue 30, item 5): Hugging Face ``generate()`` on a small random
LLaMA (greedy and sampling, dynamic and static cache), and a hand-written static-cache decode loop under
torch.compile, which ``python -m tpusim run`` records as one compiled graph run once per decode step.

The truth is CPU: the same seeded model and prompt, token for token (no tolerance: a token is an argmax or
a draw, and "tpu" computes with CPU's kernels). Sampling draws from the "tpu" device's own generator, which
``torch.manual_seed`` seeds as it seeds CPU's and which draws what CPU's draws (Philox on CUDA differs;
tpusim's generator is CPU's algorithm), so a seeded sample matches too.

Needs the optional ``transformers`` package (skipped without it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from static_decoder import generate as static_decode

from tpusim.trace.records import read_trace

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()

DECODER = Path(__file__).with_name("static_decoder.py")


def _llama() -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                      bos_token_id=0, eos_token_id=None, pad_token_id=0)
    return transformers.LlamaForCausalLM(config).eval()


def _generate(device: str, **options: object) -> torch.Tensor:
    model = _llama().to(device)
    prompt = torch.randint(1, 128, (2, 8), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(3)                                     # the sampling draws: the same seed on both devices
    with torch.no_grad():
        out = model.generate(prompt.to(device), attention_mask=torch.ones_like(prompt).to(device),
                             max_new_tokens=6, **options)
    assert out.device.type == device
    return out.cpu()


CASES = {
    "greedy-dynamic": dict(do_sample=False),
    "sample-dynamic": dict(do_sample=True, top_k=20),
    # A static cache on "tpu" makes generate() compile its forward (transformers does so on cuda, xpu and
    # tpu); here each step runs eagerly, which is what a CPU does, and the compiled case is the slow one below.
    "greedy-static": dict(do_sample=False, cache_implementation="static", disable_compile=True),
    "sample-static": dict(do_sample=True, top_k=20, cache_implementation="static", disable_compile=True),
}


@pytest.mark.parametrize("options", CASES.values(), ids=CASES.keys())
def test_generate_gives_cpus_tokens(options: dict) -> None:
    cpu, tpu = _generate("cpu", **options), _generate("tpu", **options)
    assert cpu.shape == (2, 14)
    assert torch.equal(tpu, cpu)


def test_sampling_draws_differ_from_greedy() -> None:
    """The sampling cases above test the generator, not a distribution that always picks the argmax."""
    greedy, sampled = _generate("tpu", do_sample=False), _generate("tpu", do_sample=True, top_k=20)
    assert not torch.equal(greedy, sampled)


@pytest.mark.slow
@pytest.mark.parametrize("sample", [False, True], ids=["greedy", "sample"])
def test_generate_with_a_static_cache_compiled_on_tpu_gives_cpus_tokens(sample: bool) -> None:
    """generate(cache_implementation="static") on "tpu" compiles its forward with the tpu backend (a few seconds)."""
    options = dict(do_sample=sample, cache_implementation="static")
    assert torch.equal(_generate("tpu", **options), _generate("cpu", **options))


@pytest.mark.slow
def test_static_decode_loop_under_torch_compile_gives_cpus_tokens() -> None:
    assert static_decode("tpu", compile_steps=True) == static_decode("cpu", compile_steps=False)


@pytest.mark.slow
def test_tpusim_run_records_each_decode_step_as_one_compiled_program(tmp_path: Path) -> None:
    out = tmp_path / "report"
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(DECODER), "--compiler", "model", "--quiet",
                           "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    tokens = json.loads(next(line for line in done.stdout.splitlines() if line.startswith("[[")))
    assert tokens == static_decode("cpu", compile_steps=False)

    trace = read_trace(out / "program.jsonl")
    facts = trace.meta.torch_compile
    assert facts is not None and facts.graphs == 1 and not facts.recompiles and not facts.graph_breaks
    programs = {r.program for r in trace.records if getattr(r, "program", 0)}
    assert len(programs) == 5                                # decode steps 2..6: the prefill ran eagerly
    (module,) = trace.meta.xla_modules
    assert sorted(module.programs) == sorted(programs) and not module.error
    report = json.loads((out / "report.json").read_text())
    assert report["complete"] and report["exit_code"] == 0


SERVE = Path(__file__).resolve().parents[2] / "examples" / "serve.py"


def _first_sequence(stdout: str) -> list[int]:
    return json.loads(next(line for line in stdout.splitlines() if line.startswith("first sequence:")).split(":")[1])


@pytest.mark.slow
@pytest.mark.parametrize("flags", [[], ["--compile"]], ids=["generate", "static-compiled"])
def test_the_serving_example_gives_cpus_tokens_and_an_inference_report(flags: list[str], tmp_path: Path) -> None:
    cpu = subprocess.run([sys.executable, str(SERVE), "--device", "cpu", *flags], capture_output=True, text=True,
                         timeout=300)
    assert cpu.returncode == 0, cpu.stderr
    done = subprocess.run([sys.executable, "-m", "tpusim", "run", str(SERVE), "--topology", "2d:2x2", "--chip", "v6e",
                           "--compiler", "model", "--quiet", "--out", str(tmp_path), "--", *flags],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert _first_sequence(done.stdout) == _first_sequence(cpu.stdout)
    assert "host wall time" in done.stdout and "TTFT (prefill)" in done.stdout
    inference = json.loads((tmp_path / "report.json").read_text())["inference"]
    assert inference["batch"] == 4 and inference["decode_steps"] == 15          # 16 new tokens: prefill gives one
    assert inference["phases_from"] == ("marked" if flags else "detected")
    assert inference["modes"]["strict"]["tpot_median_s"] > 0
