"""A tiny checkpoint folder laid out like a hub model repository, made at test time.

``write_checkpoint(folder, shards, shard_bytes)`` writes ``shards`` safetensors shards (each one
valid: an 8-byte little-endian header length, the JSON header, then one uint8 tensor of
``shard_bytes`` random bytes, fixed seed), their ``model.safetensors.index.json``, ``config.json``,
``generation_config.json``, ``tokenizer.json``, ``tokenizer_config.json``, and files a repository
holds that vLLM does not load (``README.md``, ``.gitattributes``, ``pytorch_model.bin``,
``original/consolidated.00.pth``), so a stager that downloads everything is caught.
"""

from __future__ import annotations

import json
import random
import struct
from pathlib import Path

NOT_LOADED = ("README.md", ".gitattributes", "pytorch_model.bin", "original/consolidated.00.pth")


def _safetensors(path: Path, name: str, data: bytes) -> None:
    header = json.dumps({name: {"dtype": "U8", "shape": [len(data)], "data_offsets": [0, len(data)]},
                         "__metadata__": {"format": "pt"}}).encode()
    header += b" " * (-len(header) % 8)
    with path.open("wb") as fh:
        fh.write(struct.pack("<Q", len(header)))
        fh.write(header)
        fh.write(data)


def write_checkpoint(folder: Path, shards: int = 2, shard_bytes: int = 1 << 20, seed: int = 0) -> dict[str, int]:
    """Write the checkpoint; returns {file: size} of the files vLLM loads."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    weight_map = {}
    for i in range(1, shards + 1):
        name = f"model-{i:05d}-of-{shards:05d}.safetensors"
        _safetensors(folder / name, f"layers.{i}.weight", rng.randbytes(shard_bytes))
        weight_map[f"layers.{i}.weight"] = name
    docs = {
        "model.safetensors.index.json": {"metadata": {"total_size": shards * shard_bytes}, "weight_map": weight_map},
        "config.json": {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64},
        "generation_config.json": {"bos_token_id": 1, "eos_token_id": 2},
        "tokenizer.json": {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}},
        "tokenizer_config.json": {"model_max_length": 2048},
    }
    for name, doc in docs.items():
        (folder / name).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    for name in NOT_LOADED:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_bytes(rng.randbytes(4096))
    return {p.relative_to(folder).as_posix(): p.stat().st_size for p in folder.rglob("*")
            if p.is_file() and p.relative_to(folder).as_posix() not in NOT_LOADED}
