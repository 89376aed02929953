#!/usr/bin/env python3
"""Write a tiny random Llama that vLLM can serve, with kvroute's shipped tokenizer.

    target/vllm-venv/bin/python scripts/vllm/make_model.py OUT_DIR

Nothing is downloaded: the config and seeded random weights are made here with
transformers' LlamaConfig/LlamaForCausalLM (bf16 safetensors), and the tokenizer is kvroute's
own 2,048-token byte-level BPE (crates/preprocess/assets/tokenizer) with its ChatML template,
so the gateway (`--tokenizer OUT_DIR`) and the engine count exactly the same token ids.
Re-running with the same inputs leaves the directory as it is (a stamp file).
"""
import hashlib
import json
import os
import shutil
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
TOKENIZER_DIR = os.path.join(ROOT, "crates", "preprocess", "assets", "tokenizer")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")

# Small enough to load in a second and to prefill 1,000 tokens in a few tens of ms on one
# core; head_dim 64 is one the CPU attention kernels support.
SHAPE = dict(
    hidden_size=128,
    intermediate_size=256,
    num_hidden_layers=2,
    num_attention_heads=2,
    num_key_value_heads=2,
    head_dim=64,
    max_position_embeddings=8192,
)
SEED = 1234


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = os.path.abspath(sys.argv[1])
    with open(os.path.join(TOKENIZER_DIR, "tokenizer.json"), "rb") as f:
        tok_bytes = f.read()
    tok = json.loads(tok_bytes)
    ids = list(tok["model"]["vocab"].values()) + [t["id"] for t in tok.get("added_tokens", [])]
    vocab_size = max(ids) + 1
    tok_cfg = json.load(open(os.path.join(TOKENIZER_DIR, "tokenizer_config.json")))
    by_content = {t["content"]: t["id"] for t in tok.get("added_tokens", [])}
    eos_id = by_content[tok_cfg["eos_token"]]
    pad_id = by_content.get(tok_cfg.get("pad_token"), eos_id)

    key = hashlib.sha256(json.dumps([SHAPE, SEED, vocab_size], sort_keys=True).encode() + tok_bytes
                         + open(os.path.join(TOKENIZER_DIR, "tokenizer_config.json"), "rb").read()
                         + open(__file__, "rb").read()).hexdigest()[:16]
    stamp = os.path.join(out, ".kvroute-model-stamp")
    if os.path.exists(stamp) and open(stamp).read().strip() == key:
        print(f"[make_model] up to date: {out} ({key})")
        return

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(SEED)
    config = LlamaConfig(
        vocab_size=vocab_size,
        rms_norm_eps=1e-5,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        **SHAPE,
    )
    config.dtype = "bfloat16"
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    # Larger than the default init so the random logits are not flat (not that it matters).
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.5)
    if os.path.exists(out):
        shutil.rmtree(out)
    os.makedirs(out)
    model.save_pretrained(out, safe_serialization=True)
    for name in TOKENIZER_FILES:
        shutil.copy(os.path.join(TOKENIZER_DIR, name), os.path.join(out, name))
    # The engine stops on <|im_end|> (its generation config), like a chat model would.
    with open(os.path.join(out, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": eos_id, "pad_token_id": pad_id}, f)
    with open(stamp, "w") as f:
        f.write(key + "\n")
    n = sum(p.numel() for p in model.parameters())
    print(f"[make_model] wrote {out}: llama {SHAPE['num_hidden_layers']} layers, hidden "
          f"{SHAPE['hidden_size']}, vocab {vocab_size}, {n / 1e6:.2f}M params (bf16), seed {SEED}")


if __name__ == "__main__":
    main()
