"""The plain-PyTorch DeepSeek-V4.1 reference model (the oracle of every kernel), and the V4
model ``ReferenceModelV4`` (same API; spec §12).

```python
from dsv4_decode.reference import ReferenceModel, RequestState
model = ReferenceModel(cfg, weights, device="cpu")
state = model.new_request()
logits = model.prefill(token_ids, state)      # [L] -> fp32 [L, vocab]
logits = model.decode(token_ids, states)      # [B, q_len] -> fp32 [B, q_len, vocab]
```
"""

from .attention import output_projection, q_path, sparse_attention, window_kv
from .compressor import compressor_proj, latent_outputs, pool_groups
from .engram import EngramLayout, compress_tokens, engram_forward, hash_ids
from .indexer import candidate_mask, index_query, index_scores, topk_indices
from .mhc import hc_collapse, hc_expand, hc_mix
from .model import ReferenceModel
from .model_v4 import ReferenceModelV4, RequestStateV4
from .moe import dequant_expert, route, swiglu_expert
from .norm_rope import apply_rope, linear, rms_norm, rope_freqs
from .state import RequestState

__all__ = [
    "EngramLayout", "ReferenceModel", "ReferenceModelV4", "RequestState", "RequestStateV4",
    "apply_rope", "candidate_mask",
    "compress_tokens", "compressor_proj", "dequant_expert", "engram_forward", "hash_ids",
    "hc_collapse", "hc_expand", "hc_mix", "index_query", "index_scores", "latent_outputs",
    "linear", "output_projection", "pool_groups", "q_path", "rms_norm", "rope_freqs", "route",
    "sparse_attention", "swiglu_expert", "topk_indices", "window_kv",
]
