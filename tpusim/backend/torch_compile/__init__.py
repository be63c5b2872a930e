"""``torch.compile(model, backend="tpu")``: a Dynamo graph lowered through JAX into one XLA program.

Map: jax_backend.py (the ``"tpu"`` backend: Dynamo -> AOT autograd -> Core ATen -> JAX -> jax.jit; also
``compile_stats`` and ``dump_stablehlo``), collective_graph.py (a graph with functional collectives: XLA
programs between them, each collective run by c10d). The ATen -> JAX table is ../lowering/, the priced form
of a graph ../program_trace/compiled_program.py.
"""
