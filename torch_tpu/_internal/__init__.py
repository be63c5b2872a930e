"""TorchTPU's ``torch_tpu._internal`` modules, each over tpusim's implementation (tpusim/backend/torchtpu/)."""
