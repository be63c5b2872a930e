"""Serving a small LLaMA: Hugging Face generate() on device "tpu", priced per token.

A randomly initialised LLaMA-style model (sizes are flags; nothing is downloaded) generates
--new-tokens tokens for --batch prompts of --context tokens each. Needs `pip install transformers`.

    python -m tpusim run examples/serve.py --topology 2d:2x2 --chip v6e
    python -m tpusim run examples/serve.py --chip v6e -- --batch 16 --context 1024 --new-tokens 32
    python -m tpusim run examples/serve.py --chip v6e -- --compile   # static KV cache, decode under torch.compile
    python examples/serve.py --device cpu                               # the same program on the CPU

The report gives time to first token, time per output token and tokens/s as a TPU would run them. The
tokens/s this script prints is the host's wall time: this machine running the simulator, not a prediction.

Default: model.generate() (dynamic KV cache, every step run eagerly); the report finds the prefill and
decode steps from the attention shapes. --compile: a static KV cache (its shapes never change) and a decode
step under torch.compile, one compiled program per token, each step marked with tpusim.backend.phase.
"""

import argparse
import contextlib
import inspect
import os
import sys
import time

import torch


def build_model(args: argparse.Namespace) -> torch.nn.Module:
    try:
        import transformers
    except ImportError:
        sys.exit("examples/serve.py needs Hugging Face transformers: pip install transformers")
    transformers.logging.set_verbosity_error()
    config = transformers.LlamaConfig(
        vocab_size=args.vocab, hidden_size=args.d_model, intermediate_size=4 * args.d_model,
        num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
        max_position_embeddings=args.context + args.new_tokens, bos_token_id=0, eos_token_id=None, pad_token_id=0)
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval().to(args.device)


def phase(device: str, name: str) -> contextlib.AbstractContextManager:
    """tpusim's phase marker on "tpu" (the report then never guesses which step is which); nothing elsewhere."""
    if device != "tpu":
        return contextlib.nullcontext()
    import tpusim.backend

    return tpusim.backend.phase(name)


def next_token(logits: torch.Tensor, sample: bool) -> torch.Tensor:
    if not sample:
        return logits.argmax(-1, keepdim=True)
    return torch.multinomial(torch.softmax(logits, dim=-1), num_samples=1)


def static_cache_decode(model: torch.nn.Module, prompt: torch.Tensor, args: argparse.Namespace) -> torch.Tensor:
    """Prefill, then one compiled decode step per token over a preallocated KV cache: every decode step has
    the same shapes (one token, a position tensor, the whole cache), so torch.compile builds one program."""
    from transformers import StaticCache

    cache = StaticCache(config=model.config, max_cache_len=args.context + args.new_tokens)
    # transformers 5 names the cache argument `cache`; 4.x named it `past_key_values`
    cache_arg = {"cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values": cache}
    # torch.compile's default backend is "tpu" for graphs on "tpu"; on CPU, "eager" spares Inductor's C++ build
    decode_step = torch.compile(model, fullgraph=True, **({} if args.device == "tpu" else {"backend": "eager"}))
    with phase(args.device, "prefill"):
        positions = torch.arange(args.context, device=args.device)
        logits = model(input_ids=prompt, cache_position=positions, **cache_arg).logits
        token = next_token(logits[:, -1], args.sample)
    tokens = [token]
    for position in range(args.context, args.context + args.new_tokens - 1):
        with phase(args.device, "decode"):
            position_tensor = torch.tensor([position], device=args.device)
            logits = decode_step(input_ids=token, cache_position=position_tensor, **cache_arg).logits
            token = next_token(logits[:, -1], args.sample)
        tokens.append(token)
    return torch.cat(tokens, dim=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="tpu")
    parser.add_argument("--batch", type=int, default=4, help="prompts decoded together")
    parser.add_argument("--context", type=int, default=128, help="prompt length in tokens")
    parser.add_argument("--new-tokens", type=int, default=16, help="tokens generated per prompt")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--d-model", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2, help="grouped-query attention: key/value heads")
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--sample", action="store_true", help="sample (top-k 50) instead of greedy decoding")
    parser.add_argument("--compile", action="store_true",
                        help="static KV cache and the decode step under torch.compile (default: generate())")
    args = parser.parse_args()
    readable = os.environ.get("TPUSIM_NUMERICS", "on") != "off"    # shape-only runs (tpusim sweep's) have no values
    if not readable and not args.compile:
        sys.exit("examples/serve.py: generate() reads token values (is a sequence finished?), which a shape-only "
                 "run (--numerics off, as tpusim sweep records) has none of: pass --compile for the static-cache "
                 "loop, which reads none")

    model = build_model(args)
    prompt = torch.randint(1, args.vocab, (args.batch, args.context), generator=torch.Generator().manual_seed(1))
    prompt = prompt.to(args.device)
    torch.manual_seed(2)                                   # the sampling draws
    start = time.perf_counter()
    with torch.no_grad():
        if args.compile:
            tokens = static_cache_decode(model, prompt, args)
        else:
            out = model.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.new_tokens,
                                 min_new_tokens=args.new_tokens, do_sample=args.sample, top_k=50)
            tokens = out[:, args.context:]
        if readable:
            tokens = tokens.cpu()                          # waits for the last token
    seconds = time.perf_counter() - start
    generated = tokens.numel()
    print(f"generated {generated} tokens ({args.batch} x {tokens.shape[1]}) in {seconds:.2f} s of host wall time: "
          f"{generated / seconds:.1f} tokens/s on this machine (not the TPU prediction: see the report)")
    if readable:
        print("first sequence:", tokens[0].tolist())


if __name__ == "__main__":
    main()
