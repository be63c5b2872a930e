"""TorchTPU's ``g3_multiprocessing`` shim: ``handle_main(main)`` runs ``main(sys.argv)`` and exits with its value
(absl's ``app.run`` contract, without flag parsing: tpusim/backend/torchtpu/launchers.py); ``handle_test_main``."""

from tpusim.backend.torchtpu.launchers import handle_main, handle_test_main

__all__ = ["handle_main", "handle_test_main"]
