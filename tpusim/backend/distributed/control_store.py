"""The control keys of ``--ranks all`` (fingerprints, status, the diagnosis), signed with the run's secret.

The launcher's TCPStore listens on loopback, but any process on the machine that finds its port can list
every key (``TCPStore.list_keys()``) and write any of them. So the secret never goes into the store: the
launcher hands it to each rank through its environment (the worker takes it out before the script runs),
every value is stored as ``HMAC-SHA256(secret, key NUL value) : value``, and a value whose signature does not
match is read as absent. Another process can still delete or overwrite entries (the ranks then wait until
their hang timeout), but nothing it writes is printed or acted on as tpusim's.

Without a secret (a script under torchrun, whose store is torch's own) the signature is an HMAC with an
empty key: the same format, no authentication.
"""

from __future__ import annotations

import hashlib
import hmac

import torch.distributed as dist

PREFIX = "tpusim-control"     # PrefixStore adds the "/"
_SEP = b":"


class SignedStore:
    """A view of the shared store under ``tpusim-control/`` whose values carry an HMAC with the run's secret."""

    def __init__(self, store: dist.Store, secret: str) -> None:
        self._store = dist.PrefixStore(PREFIX, store)
        self._secret = secret.encode()

    def _sign(self, key: str, value: str | bytes) -> bytes:
        data = value.encode() if isinstance(value, str) else value
        mac = hmac.new(self._secret, key.encode() + b"\0" + data, hashlib.sha256).hexdigest().encode()
        return mac + _SEP + data

    def _open(self, key: str, stored: bytes) -> bytes | None:
        """The value of a genuine entry, None for a forged or malformed one."""
        mac, sep, data = bytes(stored).partition(_SEP)
        if not sep or not hmac.compare_digest(mac, self._sign(key, data).partition(_SEP)[0]):
            return None
        return data

    def set(self, key: str, value: str | bytes) -> None:
        self._store.set(key, self._sign(key, value))

    def read(self, key: str) -> bytes | None:
        """The key's value when it is there and genuine, else None."""
        if not self._store.check([key]):
            return None
        return self._open(key, self._store.get(key))

    def read_all(self, keys: list[str]) -> list[bytes] | None:
        """Every key's value when all are there and genuine, else None."""
        if not self._store.check(keys):
            return None
        values = [self._open(k, v) for k, v in zip(keys, self._store.multi_get(keys), strict=True)]
        return None if any(v is None for v in values) else values  # type: ignore[return-value]

    def check(self, keys: list[str]) -> bool:
        """Whether every key holds a genuine value (a forged one does not count)."""
        return self.read_all(keys) is not None

    def set_first(self, key: str, value: str | bytes) -> bytes:
        """Set ``key`` unless a genuine value is there already (a forged one is replaced); returns the value
        that stands."""
        signed = self._sign(key, value)
        current = self._store.compare_set(key, "", signed)
        for _ in range(8):
            genuine = self._open(key, current)
            if genuine is not None:
                return genuine
            current = self._store.compare_set(key, current, signed)
        return value.encode() if isinstance(value, str) else value
