"""Small configs of the reference tests (test helpers)."""

from __future__ import annotations

from dsv4_decode.config import ModelConfig
from dsv4_decode.reference import EngramLayout


def tiny() -> ModelConfig:
    """The HF tiny config (spec §1.3): 5 layers [0, 2, 2, 1, 1], window 8, no engram."""
    return ModelConfig.preset("tiny-v41")


def tiny_indexer_engram() -> ModelConfig:
    """7 layers [0, 2, 2, 1, 1, 1, 1]: KV sources 1 (r=2) and 3 (r=1, candidate source),
    index sources 1, 3, 5 (5 = Reindex consuming 3's candidate blocks, 6 = Reuse of 5);
    index_topk 2 and 2 candidate blocks of 4 entries, so from 9 visible entries on the
    candidate blocks cut and from 3 on the top-k cuts. Engram layers 1 and 4 (tables of the
    24 smallest primes above 99 each, identity token map)."""
    cfg = tiny().replace(
        num_hidden_layers=7, compress_ratios=(0, 2, 2, 1, 1, 1, 1),
        kv_source_layer_ids=(1, 3), index_source_layer_ids=(1, 3, 5),
        candidate_source_layer_id=3, candidate_topk_blocks=2, candidate_block_size=4,
        index_topk=2, max_position_embeddings=256,
        engram_layer_ids=(1, 4), engram_num_embeddings=(0, 0), engram_vocab_size=100,
        engram_compressed_vocab_size=128, engram_head_dim=32)
    return cfg.replace(engram_num_embeddings=EngramLayout.from_config(cfg).rows)


def record_dims() -> ModelConfig:
    """V4.1 record dims (head_dim 512 with 64 rope dims, index_head_dim 128), tiny otherwise:
    4 layers [0, 2, 1, 1] so both compressor ratios write records (528 / 288 / 68 bytes)."""
    return tiny().replace(
        num_hidden_layers=4, compress_ratios=(0, 2, 1, 1), kv_source_layer_ids=(1, 2),
        index_source_layer_ids=(1, 2), candidate_source_layer_id=2, head_dim=512,
        qk_rope_head_dim=64, index_head_dim=128, num_attention_heads=2, o_groups=1,
        dspark_target_layer_ids=(0,))

