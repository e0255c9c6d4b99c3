"""Our V4 weight dict -> ``transformers``' ``DeepseekV4ForCausalLM`` state dict: the one place
the checkpoint names (``names_v4``) are mapped to HF module names.

HF's eager V4 model has no FP8 / MXFP4 modules, so every quantised weight is dequantised here
(exactly: the e4m3 / e2m1 values times power-of-two scales are exact in fp32) and every
tensor is cast to ``dtype``; ``tid2eid`` becomes int64. The renames are the inverse of what
HF's ``conversion_mapping`` (``deepseek_v4``) does when it loads the released checkpoint;
routed experts are stacked into HF's ``gate_up_proj [E, 2I, D]`` (w1 rows, then w3 rows) and
``down_proj [E, D, I]``.
"""

from __future__ import annotations

import re

import torch

from .. import formats
from ..config import ModelConfig
from .names import param_table

_LEAF = [  # (our pattern, HF replacement), applied in order to the layer-local suffix
    (r"^attn_norm\.", "input_layernorm."),
    (r"^ffn_norm\.", "post_attention_layernorm."),
    (r"^hc_(attn|ffn)_(fn|base|scale)$", r"\1_hc.\2"),
    (r"^attn\.indexer\.compressor\.", "self_attn.compressor.indexer."),
    (r"^attn\.indexer\.wq_b\.", "self_attn.compressor.indexer.q_b_proj."),
    (r"^attn\.indexer\.weights_proj\.", "self_attn.compressor.indexer.scorer.weights_proj."),
    (r"^attn\.attn_sink$", "self_attn.sinks"),
    (r"^attn\.", "self_attn."),
    (r"^ffn\.shared_experts\.w1\.", "mlp.shared_experts.gate_proj."),
    (r"^ffn\.shared_experts\.w3\.", "mlp.shared_experts.up_proj."),
    (r"^ffn\.shared_experts\.w2\.", "mlp.shared_experts.down_proj."),
    (r"^ffn\.gate\.bias$", "mlp.gate.e_score_correction_bias"),
    (r"^ffn\.", "mlp."),
]
_MODULE = [  # module-level renames inside self_attn (compressor / indexer / q / kv / o)
    (r"\.wq_a\.", ".q_a_proj."), (r"\.q_norm\.", ".q_a_norm."), (r"\.wq_b\.", ".q_b_proj."),
    (r"\.wkv\.", ".kv_proj."), (r"\.wgate\.", ".gate_proj."), (r"\.wo_a\.", ".o_a_proj."),
    (r"\.wo_b\.", ".o_b_proj."), (r"\.ape$", ".position_bias"),
    (r"compressor\.norm\.", "compressor.kv_norm."), (r"indexer\.norm\.", "indexer.kv_norm."),
]
_TOP = {"embed.weight": "model.embed_tokens.weight", "head.weight": "lm_head.weight",
        "norm.weight": "model.norm.weight", "hc_head_fn": "model.hc_head.hc_fn",
        "hc_head_base": "model.hc_head.hc_base", "hc_head_scale": "model.hc_head.hc_scale"}


def hf_name(name: str) -> str:
    """Checkpoint name -> HF ``DeepseekV4ForCausalLM`` parameter / buffer name (not for
    routed experts, which HF stacks; see ``to_hf_state_dict``)."""
    if name in _TOP:
        return _TOP[name]
    m = re.match(r"layers\.(\d+)\.(.*)$", name)
    if m is None:
        raise ValueError(f"name: {name!r} is not a V4 checkpoint name")
    rest = m.group(2)
    for pat, rep in _LEAF:
        new = re.sub(pat, rep, rest)
        if new != rest:
            rest = new
            break
    for pat, rep in _MODULE:
        rest = re.sub(pat, rep, rest)
    return f"model.layers.{m.group(1)}.{rest}"


def to_hf_state_dict(cfg: ModelConfig, weights: dict[str, torch.Tensor],
                     dtype=torch.float32) -> dict[str, torch.Tensor]:
    """Our V4 weight dict (tp = 1) -> a state dict ``DeepseekV4ForCausalLM(config).
    load_state_dict(sd, strict=True)`` accepts, dequantised and cast to ``dtype``."""
    if not cfg.is_v4:
        raise ValueError(f"cfg: model_type {cfg.model_type!r} is not deepseek_v4")
    table = {p.name: p for p in param_table(cfg)}
    b, blk = cfg.weight_block_size[0], cfg.expert_scale_block
    experts: dict[int, dict[str, list[torch.Tensor]]] = {}
    out = {}
    for name, t in weights.items():
        p = table.get(name)
        if p is None:
            raise ValueError(f"weights: unexpected tensor {name!r} for this config")
        if p.is_scale:
            continue
        scale = weights.get(name[: -len("weight")] + "scale")
        if p.fmt == "fp8":
            t = formats.dequant_fp8_weight(t, scale, b)
        elif p.fmt == "fp4":
            t = formats.dequant_mxfp4(t, scale, blk)
        if p.fmt == "i32":
            out[hf_name(name)] = t.long()
        elif p.expert >= 0:
            proj = name.rsplit(".", 2)[-2]  # w1 / w2 / w3
            experts.setdefault(p.layer, {}).setdefault(proj, []).append(t.to(dtype))
        else:
            out[hf_name(name)] = t.to(dtype)
    for layer, ws in experts.items():
        pre = f"model.layers.{layer}.mlp.experts."
        out[pre + "gate_up_proj"] = torch.cat((torch.stack(ws["w1"]), torch.stack(ws["w3"])), 1)
        out[pre + "down_proj"] = torch.stack(ws["w2"])
    return out
