"""The files of a checkpoint repository vLLM loads, by name.

vLLM 0.33 loads safetensors weights (``*.safetensors``, with ``model.safetensors.index.json`` for
sharded checkpoints), the Hugging Face config (``config.json``, ``generation_config.json``), the
tokenizer (``tokenizer.json``, ``tokenizer_config.json``, ``special_tokens_map.json``,
``tokenizer.model`` / ``*.tiktoken``, ``vocab.*``, ``merges.txt``), the chat template
(``chat_template.jinja`` / ``*.json``), quantization configs (``*.json``) and, with
``--trust-remote-code`` (Kimi K3 needs it), the repository's Python modules (``*.py``). Other
weight formats (``*.bin``, ``*.pt``, ``*.pth``, ``*.gguf``, ``*.msgpack``, ``*.h5``, ``*.onnx``),
documentation and images are never downloaded: on a 1.5 TB repository a second format doubles
the bytes for nothing.
"""

from __future__ import annotations

import fnmatch
import posixpath

LOADED = ("*.safetensors", "*.json", "*.py", "*.jinja", "*.model", "*.tiktoken", "merges.txt", "vocab.txt")
"""Name patterns (``fnmatch``, of the file's base name) of the files vLLM loads."""


def loaded(path: str) -> bool:
    """Whether vLLM loads the repository file ``path`` (e.g. ``"model-00001-of-00096.safetensors"``
    -> True, ``"README.md"`` -> False, ``"original/consolidated.00.pth"`` -> False)."""
    name = posixpath.basename(path)
    return not name.startswith(".") and any(fnmatch.fnmatchcase(name, p) for p in LOADED)
