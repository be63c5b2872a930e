"""The real TPU compiler as a pricing source: XLA's own program for a recorded computation, without a TPU.

libtpu (the ``xla`` extra) compiles StableHLO for a virtual TPU slice (jax's deviceless topologies) and
returns XLA's optimized, scheduled program: its fusions with XLA's estimated cycles, its collectives in
schedule order, its buffer assignment. ``compiler`` runs each compile in a fresh process (libtpu's start-up
noise, and its aborts on a module it rejects, stay there), caches results on disk and says in one line why
a program fell back to tpusim's own model; ``worker`` is that process; ``hlo`` reads the optimized HLO.
"""
