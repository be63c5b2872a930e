"""The default eager mode from the environment: TPUSIM_EAGER_MODE, then TorchTPU's variables with TorchTPU's
precedence (its csrc/eager/eager_mode.cc: launch blocking wins, the public name overrides the legacy one)."""

import pytest

from tpusim.eager.modes import get_mode
from tpusim.eager.state import mode_from_environment
from tpusim.errors import TpusimError


@pytest.mark.parametrize(("environ", "mode"), [
    ({}, "strict"),
    ({"TORCH_TPU_DEFER_AND_FUSE": "1"}, "fused"),
    ({"TPU_DEFER_AND_FUSE": "true"}, "fused"),
    ({"TORCH_TPU_LAUNCH_BLOCKING": "1", "TORCH_TPU_DEFER_AND_FUSE": "1"}, "debug"),   # blocking wins
    ({"TPU_LAUNCH_BLOCKING": "YES", "TORCH_TPU_DEFER_AND_FUSE": "1"}, "debug"),
    ({"TORCH_TPU_DEFER_AND_FUSE": "0", "TPU_DEFER_AND_FUSE": "1"}, "strict"),         # public overrides legacy
    ({"TORCH_TPU_LAUNCH_BLOCKING": "false", "TPU_LAUNCH_BLOCKING": "1"}, "strict"),
    ({"TPUSIM_EAGER_MODE": "fused", "TORCH_TPU_LAUNCH_BLOCKING": "1"}, "fused"),       # tpusim's own is explicit
])
def test_the_environment_selects_the_default_mode(environ, mode):
    assert mode_from_environment(environ) == mode


def test_a_value_that_is_no_boolean_counts_as_unset_with_a_warning():
    with pytest.warns(UserWarning, match="TORCH_TPU_DEFER_AND_FUSE='on' is not a boolean"):
        assert mode_from_environment({"TORCH_TPU_DEFER_AND_FUSE": "on", "TPU_DEFER_AND_FUSE": "1"}) == "fused"


def test_torch_tpu_mode_names_are_aliases_and_unknown_names_list_the_accepted_ones():
    assert [get_mode(n).name for n in ("DEFER_NEVER", "defer_and_fuse", "Defer_Never_And_Launch_Blocking")] == \
        ["strict", "fused", "debug"]
    with pytest.raises(TpusimError, match="unknown eager mode 'lazy' in TPUSIM_EAGER_MODE; accepted: debug"):
        mode_from_environment({"TPUSIM_EAGER_MODE": "lazy"})


def test_a_bad_mode_under_plain_python_leaves_no_half_registered_device():
    # issue 44, NT5: TPUSIM_EAGER_MODE=turbo was refused after torch had taken "tpu" as the device's name, so
    # the first op died inside tpusim (AttributeError: 'NoneType' object has no attribute 'host_alias'); now it
    # is refused first: a warning naming the variable, then torch's own "no such device" at the user's line
    import os
    import subprocess
    import sys

    code = ("import torch\ntry:\n    torch.ones(2, device='tpu') + 1\nexcept RuntimeError as e:\n"
            "    print('REFUSED', str(e)[:40])\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "TPUSIM_EAGER_MODE": "turbo"})
    assert "unknown eager mode 'turbo' in TPUSIM_EAGER_MODE" in done.stderr, done.stderr
    assert "REFUSED Expected one of cpu" in done.stdout and "Traceback" not in done.stderr, done.stderr
