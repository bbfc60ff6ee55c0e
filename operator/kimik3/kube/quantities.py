"""Kubernetes resource quantities (``960G``, ``800Gi``, ``2Ti``, ``512``) as numbers of bytes.

The core may not import the Kubernetes client (whose ``kubernetes.utils.quantity`` parses every
form): this reads the forms the spec's memory fields and the accelerator profiles use, the
binary (Ki, Mi, Gi, Ti, Pi) and decimal (k, M, G, T, P) suffixes on a whole number, as
``resource.Quantity`` reads them (k8s.io/apimachinery ``pkg/api/resource``)."""

from __future__ import annotations

import re

_SUFFIX = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15,
           "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50}
_QUANTITY = re.compile(r"^([0-9]+)(|k|M|G|T|P|Ki|Mi|Gi|Ti|Pi)$")
GIB = 2**30


def quantity_bytes(quantity: str) -> int:
    """Bytes in a whole-number quantity: ``quantity_bytes("960G") == 960 * 10**9``,
    ``quantity_bytes("2Ti") == 2 * 2**40``. Raises ValueError for any other form (fractions,
    exponents, milli-units)."""
    m = _QUANTITY.match(quantity)
    if m is None:
        raise ValueError(f"not a whole-number quantity with a binary or decimal suffix (e.g. 960G, 800Gi): {quantity!r}")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def gibibytes(n_bytes: int) -> str:
    """``n_bytes`` as a quantity in whole Gi, rounded up (``gibibytes(2**30 + 1) == "2Gi"``)."""
    return f"{-(-n_bytes // GIB)}Gi"
