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
import os
import time
from datetime import timedelta
import torch
import torch.distributed as dist
dist.init_process_group("tpusim")
if dist.get_rank() == 0:                 # an outsider on this machine that found the loopback port
    host, port = os.environ["TPUSIM_CONTROL"].rsplit(":", 1)
    outsider = dist.TCPStore(host, int(port), is_master=False, timeout=timedelta(seconds=10))
    dist.PrefixStore("tpusim-control/", outsider).set("diagnosis", "ATTACKER TEXT")   # the key tpusim's code names
    time.sleep(1)                        # rank 1 waits in its recv, looking at the store meanwhile
    dist.send(torch.ones(4, device="tpu"), dst=1)
else:
    x = torch.zeros(4, device="tpu")
    dist.recv(x, src=0)
    print("SUM", x.sum().item())
dist.destroy_process_group()
"""


def test_a_process_that_reaches_the_store_cannot_write_the_diagnosis(tmp_path):
    # Issue 32, row 4: a client of the store set the diagnosis key and every rank stopped and printed the
    # attacker's text as tpusim's diagnosis. The control keys now live under this run's secret token.
    result, output = _two_ranks(tmp_path, OUTSIDER)
    assert "ATTACKER TEXT" not in output and "ATTACKER TEXT" not in result.diagnosis
    assert output.count("SUM 4.0") == 1
