"""The simulated model's tokenizer, as files a Hugging Face client loads from a local folder.

The engine simulator counts a prompt's tokens as its words and punctuation marks
(``engine.token_ids``: ``engine.VOCAB``'s ids) and speaks the words ``engine.WORDS``, one token each. A client that
needs the model's tokenizer (``vllm bench serve --tokenizer DIR``: its random dataset makes
prompts of an exact token count by decoding random token ids) gets the same count from these
files: a ``tokenizers`` WordLevel model over ``<unk>`` and ``engine.WORDS``, split on whitespace
and punctuation, decoded by joining tokens with spaces. Nothing is downloaded.
"""

from __future__ import annotations

import json
from pathlib import Path

from kimik3_dev.sim.engine import UNK, VOCAB

MODEL_MAX_LENGTH = 1048576
"""Kimi K3's context (tokens), the simulator's default ``max_model_len``."""


def tokenizer_json() -> dict:
    """``tokenizer.json`` (the ``tokenizers`` library's serialization, format version 1.0)."""
    return {
        "version": "1.0", "truncation": None, "padding": None,
        "added_tokens": [{"id": 0, "content": UNK, "single_word": False, "lstrip": False, "rstrip": False,
                          "normalized": False, "special": True}],
        "normalizer": None, "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": VOCAB, "unk_token": UNK},
    }


def write_tokenizer(directory: str | Path) -> Path:
    """Write ``tokenizer.json`` and ``tokenizer_config.json`` into ``directory`` (made if missing);
    returns the folder, to pass as a tokenizer path (``transformers.AutoTokenizer.from_pretrained``)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tokenizer.json").write_text(json.dumps(tokenizer_json()), encoding="utf-8")
    (out / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "unk_token": UNK, "model_max_length": MODEL_MAX_LENGTH,
        "clean_up_tokenization_spaces": False}), encoding="utf-8")
    return out
