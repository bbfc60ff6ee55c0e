"""``engine.extraArgs``: flags the operator owns, and flags vLLM 0.33.0 refuses for the shape.

The arguments are read as vLLM's ``FlexibleArgumentParser`` reads them (``normalize_flag``:
``_`` as ``-``, ``--flag=value``, ``--json-flag.key value``; ``-O3``/``-O=3``/``-O 3`` as
``--optimization-level 3``), so every spelling vLLM accepts is judged alike.
"""

from __future__ import annotations

from kimik3.admission.rules import Candidate, Rule, Table, example
from kimik3.api.errors import SpecError
from kimik3.engine.args import OWNED_FLAGS, normalize_flag
from kimik3.topology.plan import tensor_parallel_size

PARSED_ARGV = ("extraArgs is free-form argv: judging it needs vLLM's argument parsing (underscores, "
               "--flag=value, --json-flag.key, -O3), which CEL string functions would only approximate")
"""Why the extraArgs rules have no CEL twin."""


def flag_values(extra_args: list[str]) -> list[tuple[int, str, str | None]]:
    """(index, flag as vLLM reads it, its value or None) for each flag in ``extra_args``."""
    out: list[tuple[int, str, str | None]] = []
    for i, arg in enumerate(extra_args):
        if not arg.startswith("-"):
            continue
        if arg.startswith("-O") and not arg.startswith("--") and arg != "-O":
            out.append((i, "--optimization-level", arg[3:] if arg[2:3] == "=" else arg[2:]))
            continue
        flag = "--optimization-level" if arg == "-O" else normalize_flag(arg)
        if "=" in arg:
            value: str | None = arg.split("=", 1)[1]
        elif i + 1 < len(extra_args) and not extra_args[i + 1].startswith("-"):
            value = extra_args[i + 1]
        else:
            value = None
        out.append((i, flag, value))
    return out


def no_owned_flags(c: Candidate) -> list[SpecError]:
    """A flag the operator derives from typed fields, set again in extraArgs, would fight them."""
    out = []
    for i, arg in enumerate(c.spec.engine.extra_args):
        flag = normalize_flag(arg)
        if flag in OWNED_FLAGS:
            out.append(SpecError(f"spec.engine.extraArgs[{i}]",
                                 f"{flag} is set by the operator from typed fields (engine, topology, "
                                 f"speculativeDecoding, model): set it there instead"))
    return out


def decode_context_parallel_divides_tp(c: Candidate) -> list[SpecError]:
    """vLLM 0.33.0's ParallelConfig: "tp_size must be divisible by dcp_size" (checked by tests/conformance)."""
    tp = tensor_parallel_size(c.topology)
    out = []
    for i, flag, value in flag_values(c.spec.engine.extra_args):
        if flag in ("--decode-context-parallel-size", "-dcp") and (
                value is None or not value.isdigit() or int(value) < 1 or tp % int(value)):
            out.append(SpecError(f"spec.engine.extraArgs[{i}]",
                                 f"decode context parallel {value} must divide the tensor parallel size {tp} "
                                 f"(vLLM: tp_size must be divisible by dcp_size)"))
    return out


EXTRA_ARGS = Table("extra_args", (
    Rule(no_owned_flags, example(engine={"extraArgs": ["--tensor_parallel_size=4"]}), operator_only=PARSED_ARGV),
    Rule(decode_context_parallel_divides_tp, example(engine={"extraArgs": ["-dcp", "3"]}),
         operator_only=PARSED_ARGV),
))
