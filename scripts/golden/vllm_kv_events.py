#!/usr/bin/env python3
# Regenerates the vLLM golden payloads of crates/protocol/tests/engine_golden.rs with vLLM's own
# classes: VLLM_TARGET_DEVICE=cpu target/vllm-venv/bin/python scripts/golden/vllm_kv_events.py
# Golden vLLM 0.32 KV event payloads made by vLLM's own classes (vllm/distributed/kv_events.py).
import msgspec
from vllm.distributed.kv_events import BlockStored, BlockRemoved, AllBlocksCleared, KVEventBatch
from vllm.v1.core.kv_cache_utils import to_event_extra_keys
enc = msgspec.msgpack.Encoder()
def show(name, batch):
    print(name, enc.encode(batch).hex())
# A LoRA request with a cache salt: extra keys as the block pool builds them (tagged), then untagged for events.
tagged = [(("lora", "sql-adapter", "/adapters/sql"), ("cache_salt", "tenant-7")), (("lora", "sql-adapter", "/adapters/sql"),)]
ek = to_event_extra_keys(tagged)
print("extra_keys", ek)
a = BlockStored(block_hashes=[11, 2**64-5], parent_block_hash=None, token_ids=list(range(1, 9)), block_size=4,
                lora_id=1, medium="GPU", lora_name="sql-adapter", extra_keys=ek, group_idx=0, kv_cache_spec_kind="full_attention")
show("lora_salt", KVEventBatch(ts=1.25, events=[a], data_parallel_rank=1))
# A continuation of that chain (no salt: only the first block carries it).
b = BlockStored(block_hashes=[12], parent_block_hash=2**64-5, token_ids=[9, 10, 11, 12], block_size=4,
                lora_id=1, medium="GPU", lora_name="sql-adapter", extra_keys=to_event_extra_keys([(("lora", "sql-adapter", "/adapters/sql"),)]), group_idx=0, kv_cache_spec_kind="full_attention")
show("lora_continued", KVEventBatch(ts=1.5, events=[b], data_parallel_rank=1))
# Salt only, no LoRA; and a multimodal block (mm identifier + offset) and a prompt-embeds digest.
c = BlockStored(block_hashes=[21, 22], parent_block_hash=None, token_ids=list(range(1, 9)), block_size=4,
                lora_id=None, medium="GPU", lora_name=None,
                extra_keys=to_event_extra_keys([(("cache_salt", "s1"),), (("mm", "img-abc", 0), ("prompt_embeds", b"\x01\x02"))]),
                group_idx=0, kv_cache_spec_kind="full_attention")
show("salt_mm", KVEventBatch(ts=2.0, events=[c], data_parallel_rank=0))
# A hybrid model: a sliding-window group's store and removal, a CPU-offloaded store.
d = BlockStored(block_hashes=[31], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=4, lora_id=None, medium="GPU",
                lora_name=None, extra_keys=None, group_idx=1, kv_cache_spec_kind="sliding_window", kv_cache_spec_sliding_window=1024)
e = BlockRemoved(block_hashes=[31], medium="GPU", group_idx=1)
f = BlockStored(block_hashes=[41], parent_block_hash=None, token_ids=[1, 2, 3, 4], block_size=4, lora_id=None, medium="CPU",
                lora_name=None, extra_keys=None)
show("hybrid_offload", KVEventBatch(ts=3.0, events=[d, e, f, AllBlocksCleared()], data_parallel_rank=None))
# CPU offloading (vllm/distributed/kv_transfer/kv_connector/v1/offloading/events.py): a device store, the
# connector's bare stores to CPU (its _placeholder_stored: one per block, no tokens, block size 0), a
# self-describing store to STORAGE (its _take_stored_event), the device evicting, the CPU tier evicting.
toks = list(range(1, 17))
dev = BlockStored(block_hashes=[101, 102, 103, 104], parent_block_hash=None, token_ids=toks, block_size=4,
                  lora_id=None, medium="GPU", lora_name=None, group_idx=0, kv_cache_spec_kind="full_attention")
bare = [BlockStored(block_hashes=[h], parent_block_hash=None, token_ids=[], lora_id=None, block_size=0,
                    medium="CPU", lora_name=None, group_idx=0, locality=None, ownership=None) for h in [101, 102, 103, 104]]
full = BlockStored(block_hashes=[103, 104], parent_block_hash=102, token_ids=toks[8:16], block_size=4, lora_id=None,
                   medium="STORAGE", lora_name=None, extra_keys=None, group_idx=0, kv_cache_spec_kind="full_attention",
                   kv_cache_spec_sliding_window=None, locality="LOCAL", ownership=None)
show("offloaded", KVEventBatch(ts=1.5, events=[dev] + bare + [full, BlockRemoved(block_hashes=[102, 103, 104], medium="GPU", group_idx=0),
                                                  BlockRemoved(block_hashes=[104], medium="CPU", group_idx=0)]))
