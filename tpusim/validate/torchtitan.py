"""Per-eager-mode cases: TorchTitan's TPU recipes, each published row priced in the mode it ran.

Why: the report compares eager modes with torch.compile for the user's own script; these cases check that
comparison against TorchTPU's own runs. Google's torchtitan fork (public copy ``TITAN_REPO``) times the same
AFMv7 3B LoRA fine-tune on v6e slices with each layer ``torch.compile``'d (the rest in DEFER_AND_FUSE eager) and
with the whole step in DEFER_AND_FUSE eager. Each row is ``validation/lora_decoder.py`` (its docstring says what
it reproduces of the recipe) with the row's slice and local batch, recorded by `tpusim run --mode fused` like
every product case (tpusim/validate/product.py), and priced in Fused eager: ``mode`` "compile" runs the
script's ``--compile layers``, ``mode`` "fused" its ``--compile none``.

Each row is pinned to one date (the recipes' numbers moved up to 10% between dates) and quotes its TPS line:
the step time is local batch x sequence / tokens per second per chip (one process per chip; the recipes' "Total
TPS" is that times the chips). The AFMv7 3B *full fine-tune* rows (the recipes' ``afmv7/`` folder) are held out
for good: never added here, never run to check.

The Conformer rows (``conformer/v6e-8``: a 17-layer, 512-wide Conformer, CTC loss, data parallel over the
slice) are ``validation/conformer.py`` the same way; their compile row passes no eager mode, so what is not
compiled runs in TorchTPU's default DEFER_NEVER: it is recorded and priced in Strict eager (``eager``
"strict"). Their TPS counts frames (sequence positions): step = local batch x frames / TPS.

Adding a row = one ``_afm`` or ``_conformer`` call in ``RUNS``.
"""

from __future__ import annotations

from tpusim.validate.product import STEPS, ProductRun, case

TITAN_REPO = "https://github.com/lynnl0927/torchtitan-tpu-time-slicing-poc"
TITAN_COMMIT = "3a0f737140bc2d8308f9f42b28d762f14f308e10"
RECIPES = "torchtitan/experiments/tpu/recipes/trillium/afmv7_lora"
SEQ = 8192
# AFMv7 3B as the "3B-lora" flavour declares it (torchtitan/experiments/tpu/afmv7/__init__.py and
# model/args.py): 56 layers, the last 21 reusing layer 35's keys and values; FFN hidden 2048 x 3.25 = 6656;
# LoRA rank 16 on q/k/v/o and the FFN; the recipe's loss kernel block 2048 tokens
AFM_ARGS = ("--layers", "56", "--kv-reuse", "21", "--d-model", "2048", "--heads", "16", "--kv-heads", "2",
            "--mlp-dim", "6656", "--vocab", "153600", "--seq", str(SEQ), "--lora-rank", "16", "--loss-chunk", "2048",
            "--steps", str(STEPS))
TOPOLOGY = {8: "2d:2x4", 128: "2d:8x16", 256: "2d:16x16"}


def _afm(chips: int, mode: str, batch: int, tps: int, line: str, date: str, setup: str) -> ProductRun:
    """One AFMv7 3B LoRA row: its slice, mode ("compile" or "fused"), local batch and published TPS per chip."""
    step_s = batch * SEQ / tps
    compile_flag = "layers" if mode == "compile" else "none"
    return ProductRun(
        name=f"titan-afmv7-3b-lora-v6e-{chips}-{mode}", family="afmv7-3b-lora", chip="v6e",
        topology=TOPOLOGY[chips], accelerator=f"v6e-{chips}",
        args=(*AFM_ARGS, "--batch", str(batch), "--compile", compile_flag), published_s=step_s,
        published=f"{tps:,} tokens/s per chip", source=TITAN_REPO,
        where=f"{RECIPES}/v6e-{chips}/README.md @ {TITAN_COMMIT[:10]} ({date}): \"{line}\"",
        setup=f"AFMv7 3B LoRA (rank 16, adapters only trained), FSDP {chips}; local batch {batch} x seq {SEQ}; "
              f"full activation checkpointing; {setup}",
        conversion=f"step = local batch {batch} x {SEQ} / {tps:,} tokens/s per chip", mode=mode,
        script="lora_decoder.py")


CONFORMER = "torchtitan/experiments/tpu/recipes/trillium/conformer/v6e-8/README.md"
CONFORMER_FRAMES = 512
# conformer/config_registry.py conformer_test() and conformer/__init__.py "test": 17 layers, hidden 512, 8 heads,
# conv kernel 31, vocabulary 64; CTC targets of 30 labels (train_minimal.py's ctc_loss_target_len default)
CONFORMER_ARGS = ("--layers", "17", "--d-model", "512", "--heads", "8", "--kernel", "31", "--vocab", "64",
                  "--seq", str(CONFORMER_FRAMES), "--ctc-targets", "30", "--steps", str(STEPS))


def _conformer(mode: str, batch: int, tps: int, line: str, date: str, setup: str) -> ProductRun:
    """One Conformer v6e-8 row: mode ("compile": layers compiled, the rest DEFER_NEVER = Strict; "fused":
    DEFER_AND_FUSE), local batch and published frames per second per chip."""
    step_s = batch * CONFORMER_FRAMES / tps
    return ProductRun(
        name=f"titan-conformer-v6e-8-{mode}", family="conformer", chip="v6e", topology=TOPOLOGY[8],
        accelerator="v6e-8", args=(*CONFORMER_ARGS, "--batch", str(batch),
                                   "--compile", "layers" if mode == "compile" else "none"),
        published_s=step_s, published=f"{tps:,} frames/s per chip", source=TITAN_REPO,
        where=f"{CONFORMER} @ {TITAN_COMMIT[:10]} ({date}): \"{line}\"",
        setup=f"Conformer 103M (17 layers, 512 wide, CTC loss), data parallel 8; local batch {batch} x "
              f"{CONFORMER_FRAMES} frames; full activation checkpointing; fp32 weights, bf16 compute; {setup}",
        conversion=f"step = local batch {batch} x {CONFORMER_FRAMES} frames / {tps:,} frames/s per chip", mode=mode,
        eager="strict" if mode == "compile" else "fused", script="conformer.py")


RUNS: tuple[ProductRun, ...] = (
    _afm(8, "compile", 1, 10858, "- Average TPS/chip: 10,858", "6/15/26",
         "layers torch.compile'd (SimpleFSDP, adapters replicated), the rest DEFER_AND_FUSE"),
    _afm(8, "fused", 4, 8037, "- Average TPS (excl. 10 warmup steps): **8,037**", "6/15/26",
         "DEFER_AND_FUSE eager (SimpleFSDP), AMP"),
    _afm(128, "compile", 1, 9210, "- Average TPS/chip: **9,210**", "5/21/26",
         "layers torch.compile'd (SimpleFSDP, adapters replicated), the rest DEFER_AND_FUSE, AMP"),
    _afm(128, "fused", 4, 6726, "- Average TPS/chip: **~6,726**", "5/21/26", "DEFER_AND_FUSE eager (FSDP2), AMP"),
    _afm(256, "compile", 3, 10033, "- Average TPS/chip: **10,033**", "6/15/26",
         "layers torch.compile'd (SimpleFSDP), the rest DEFER_AND_FUSE, AMP"),
    _afm(256, "fused", 4, 7481, "- Average TPS/chip: **~7,481**", "6/15/26",
         "DEFER_AND_FUSE eager (SimpleFSDP), AMP"),
    _conformer("compile", 512, 89000, "- Average TPS/chip: **89,000**", "5/21/26, numbers of 5/22",
               "layers torch.compile'd (SimpleFSDP replicate), the rest in the default eager (DEFER_NEVER)"),
    _conformer("fused", 512, 59000, "- Average TPS/chip: **59,000**", "5/21/26, numbers of 5/22",
               "DEFER_AND_FUSE eager (SimpleFSDP replicate)"),
)

CASES = tuple(case(run) for run in RUNS)
__all__ = ["CASES", "RUNS"]
