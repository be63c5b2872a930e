"""`--ranks all`'s store listens on the loopback interface only (issue 32): a TCPStore given no socket of its
own binds every interface, and a peer on the network could then write the ranks' rendezvous and the run's
diagnosis. The truth is the kernel's table of listening sockets, read by a rank while the store is up."""

from __future__ import annotations

import pytest
from factories import launch_ranks

pytestmark = pytest.mark.distributed

SCRIPT = """
import os
import torch.distributed as dist
dist.init_process_group("tpusim")
port = int(os.environ["MASTER_PORT"])
listening = []
for table in ("/proc/net/tcp", "/proc/net/tcp6"):
    for line in open(table).read().splitlines()[1:]:
        local, state = line.split()[1], line.split()[3]
        address, hex_port = local.rsplit(":", 1)
        if state == "0A" and int(hex_port, 16) == port:
            listening.append(address)
if dist.get_rank() == 0:
    print("STORE", ",".join(listening))
dist.destroy_process_group()
"""


def _two_ranks(tmp_path, text: str):
    """The launch result and output of ``text`` run as 2 ranks; both must end well."""
    script = tmp_path / "script.py"
    script.write_text(text)
    result, _, output = launch_ranks(script, 2, tmp_path)
    assert result.exit_codes == [0, 0], output
    return result, output


def test_the_store_of_a_multi_rank_run_listens_on_loopback_only(tmp_path):
    _, output = _two_ranks(tmp_path, SCRIPT)
    line = next(line for line in output.splitlines() if "STORE " in line)
    assert line.split("STORE ", 1)[1] == "0100007F", line          # 127.0.0.1 in /proc's byte order, nothing else


OUTSIDER = """
import json
import os
import time
from datetime import timedelta
import torch
import torch.distributed as dist
from tpusim.backend.distributed import process_group
dist.init_process_group("tpusim")
secret = process_group.CONTROL_SECRET
print("SECRET IN ENV", "TPUSIM_CONTROL_TOKEN" in os.environ)
if dist.get_rank() == 0:                 # an outsider on this machine that found the loopback port
    host, port = os.environ["TPUSIM_CONTROL"].rsplit(":", 1)
    outsider = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    keys = outsider.list_keys()
    seen = keys + [bytes(outsider.get(k)).decode("latin-1") for k in keys]
    print("KEYS", len(keys), "SECRET SEEN", len(secret) == 32 and any(secret in text for text in seen))
    forged = "ATTACKER TEXT"
    for key in ["tpusim-control/diagnosis", *(k for k in keys if k.startswith("tpusim-control/"))]:
        if key.endswith("diagnosis"):
            outsider.set(key, forged)
        elif key.endswith("status/1"):   # a failed status: its detail is what a waiting peer raises
            outsider.set(key, "0" * 64 + ":" + json.dumps({"state": "failed", "detail": forged, "last": ""}))
    time.sleep(1)                        # rank 1 waits in its recv, looking at the store meanwhile
    dist.send(torch.ones(4, device="tpu"), dst=1)
else:
    x = torch.zeros(4, device="tpu")
    dist.recv(x, src=0)
    print("SUM", x.sum().item())
dist.destroy_process_group()
"""


def test_a_process_that_reaches_the_store_cannot_read_the_secret_or_write_the_diagnosis(tmp_path):
    # Issue 32, row 4: a client of the store set the diagnosis key and every rank stopped and printed the
    # attacker's text as tpusim's diagnosis. Issue 44, problem 2: the keys then carried the run's secret token
    # in their names, which TCPStore.list_keys() gives any local process. Now the secret is never in the store
    # (each value is signed with it) and an entry another process wrote is read as absent.
    result, output = _two_ranks(tmp_path, OUTSIDER)
    assert "KEYS " in output and "SECRET SEEN False" in output, output
    assert "SECRET IN ENV True" not in output, output             # the script's children never inherit it
    assert "ATTACKER TEXT" not in output and "ATTACKER TEXT" not in result.diagnosis
    assert output.count("SUM 4.0") == 1


def test_a_signed_value_is_read_only_with_the_secret_it_was_signed_with():
    import torch.distributed as dist

    from tpusim.backend.distributed.control_store import SignedStore

    shared = dist.HashStore()
    ours, theirs = SignedStore(shared, "a" * 32), SignedStore(shared, "b" * 32)
    theirs.set("diagnosis", "forged")
    assert ours.read("diagnosis") is None and not ours.check(["diagnosis"])
    assert ours.set_first("diagnosis", "genuine") == b"genuine"         # the forged entry gave way
    assert ours.set_first("diagnosis", "second") == b"genuine"          # a genuine first diagnosis stands
    assert theirs.read("diagnosis") is None
    ours.set("status/0", "x")
    shared.set("tpusim-control/status/1", shared.get("tpusim-control/status/0"))   # replayed under another key
    assert ours.read("status/1") is None and ours.read("status/0") == b"x"
