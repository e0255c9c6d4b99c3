"""``ReferenceModelV4``: the DeepSeek-V4 text model (spec §12) in plain PyTorch, checked against
``transformers``' ``DeepseekV4ForCausalLM`` (``tests/reference/test_reference_vs_hf_v4.py``).

It is the V4.1 ``ReferenceModel`` (weights, experts, argument checks, ``prefill`` / ``decode``
over the rows of one request) with the V4 layer: each site collapses its input with its *own*
``pre``; the final collapse is the learned ``hc_head``; sliding-window (ratio 0), CSA (ratio
4: overlapping-window compressor and an indexer with its own compressor) and HCA (ratio 128:
compressor, every visible entry attended) layers; per-head q norm; hash-routed MoE layers.
The V4-only math lives in ``v4.py``; everything else is the V4.1 modules' functions.

Visibility (as V4.1): a row at position p sees window positions ``max(0, p-W+1) .. p`` and
compressed entries ``j < floor((p+1)/r)`` (entry j pools positions ``j*r .. j*r+r-1``, RoPE'd
at ``j*r``); CSA rows see only the indexer's top-k of those. Every op is per row, so decode
(any q_len) equals prefill bit for bit on CPU.

``qat`` (default True, the released model): window entries and compressed KV entries are
read back through the V4 record (``v4.encode_window_record_v4``: e4m3 nope dims with a ue8m0
scale per 64, bf16 rope dims; needs ``head_dim - qk_rope_head_dim`` a multiple of 64); the
indexer's keys and queries go through ``v4.rotate_fp4`` (Hadamard rotation, then MXFP4/32:
the 68-byte index-key record after the rotation; needs a power-of-two ``index_head_dim``).
``qat=False`` reads the bf16 values unquantised and unrotated: HF transformers' V4
semantics, used for the cross-check.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from dsv4_decode.config import ModelConfig

from .attention import output_projection, sparse_attention, window_kv
from .indexer import index_scores, topk_indices
from .mhc import hc_collapse, hc_expand, hc_mix
from .model import ReferenceModel
from .moe import route
from .norm_rope import apply_rope, linear, rms_norm
from .v4 import (
    V4_QAT_BLOCK,
    decode_window_record_v4,
    encode_window_record_v4,
    hash_route,
    hc_head_pre,
    index_query_v4,
    pool_csa,
    pool_hca,
    q_path_v4,
    rotate_fp4,
)


@dataclass
class RequestStateV4:
    """All the caches of one V4 request, as the fp32 values attention and the indexer read
    (the decoded V4 records when ``qat``).

    position: tokens consumed. window: layer -> fp32 ``[sliding_window, d]`` ring (slot
    ``p % W``). compressed: compressed layer -> fp32 ``[n, d]``. index_keys: CSA layer -> fp32
    ``[n, di]``. open: ``(layer, "kv" | "index")`` -> fp32 ``[k, 2*c*w]`` rows ``(c | z + ape)``
    of the window still filling (k < r). prev: ``(layer, name)`` of a CSA compressor -> fp32
    ``[r, 2*w]`` = ``(Ca | za)`` of the last complete window (None before the first).
    """

    position: int
    window: dict[int, torch.Tensor]
    compressed: dict[int, torch.Tensor]
    index_keys: dict[int, torch.Tensor]
    open: dict[tuple[int, str], torch.Tensor]
    prev: dict[tuple[int, str], torch.Tensor | None] = field(default_factory=dict)

    @staticmethod
    def new(cfg: ModelConfig, device="cpu") -> RequestStateV4:
        """An empty request (position 0): zeroed window rings, no entries, no open rows."""
        d, di = cfg.head_dim, cfg.index_head_dim
        n = cfg.num_hidden_layers
        window = {i: torch.zeros(cfg.sliding_window, d, device=device) for i in range(n)}
        comp = {i: torch.zeros(0, d, device=device) for i in cfg.kv_source_layer_ids}
        keys = {i: torch.zeros(0, di, device=device) for i in cfg.index_source_layer_ids}
        opened, prev = {}, {}
        for i in cfg.kv_source_layer_ids:
            c = 2 if cfg.compress_ratios[i] == 4 else 1
            names = (("kv", d), ("index", di)) if c == 2 else (("kv", d),)
            for name, w in names:
                opened[(i, name)] = torch.zeros(0, 2 * c * w, device=device)
                if c == 2:
                    prev[(i, name)] = None
        return RequestStateV4(0, window, comp, keys, opened, prev)


class ReferenceModelV4(ReferenceModel):
    """The V4 text model over a flat weight dict in the V4 checkpoint layout
    (``weights.names_v4``; FP8 in ``cfg.weight_block_size`` blocks, MXFP4 experts). Same API
    as ``ReferenceModel``: ``new_request()``, ``prefill(tokens [L], state)`` -> fp32
    ``[L, vocab]``, ``decode(tokens [B, q_len], states)`` -> fp32 ``[B, q_len, vocab]``."""

    _v4 = True

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], device="cpu",
                 qat: bool = True):
        if not cfg.is_v4:
            raise ValueError(f"cfg: model_type {cfg.model_type!r}; ReferenceModelV4 needs "
                             f"'deepseek_v4' (use ReferenceModel for V4.1)")
        nope, di = cfg.head_dim - cfg.qk_rope_head_dim, cfg.index_head_dim
        if qat and nope % V4_QAT_BLOCK:
            raise ValueError(f"qat: the V4 record quantises the {nope} nope dims in blocks of "
                             f"{V4_QAT_BLOCK}; use head_dim - qk_rope_head_dim divisible by "
                             f"{V4_QAT_BLOCK} or qat=False")
        if qat and (di & (di - 1) or di % 32):
            raise ValueError(f"qat: the indexer's Hadamard + MXFP4/32 needs a power-of-two "
                             f"index_head_dim >= 32, got {di}; or qat=False")
        super().__init__(cfg, weights, device)
        self.qat = qat

    def new_request(self) -> RequestStateV4:
        """An empty request: zeroed window rings, no compressed entries, position 0."""
        return RequestStateV4.new(self.cfg, self.device)

    def _kv_read(self, kv: torch.Tensor) -> torch.Tensor:
        """bf16 ``[..., d]`` -> the fp32 values a cache read returns (through the record)."""
        if not self.qat:
            return kv.float()
        rd = self.cfg.qk_rope_head_dim
        return decode_window_record_v4(encode_window_record_v4(kv, rd), rd)

    # ------------------------------------------------------------------ forward

    def _forward(self, tokens: torch.Tensor, st: RequestStateV4) -> torch.Tensor:
        """Rows ``tokens [T]`` (checked by ``ReferenceModel._rows``) -> fp32 ``[T, V]``."""
        cfg, dev = self.cfg, self.device
        tokens = tokens.to(dev).long()
        t, start = tokens.shape[0], st.position
        pos = torch.arange(start, start + t, device=dev)
        e = self._get("embed.weight")[tokens].to(torch.bfloat16)  # [T, D]
        s = e[:, None, :].expand(t, cfg.hc_mult, -1).contiguous()  # [T, N, D] bf16
        for layer in range(cfg.num_hidden_layers):
            s = self._layer_v4(layer, s, pos, st, tokens)
        pre = hc_head_pre(s, self._get("hc_head_fn"), self._get("hc_head_base"),
                          self._get("hc_head_scale"), cfg.hc_eps, cfg.rms_norm_eps)
        h = rms_norm(hc_collapse(s, pre), self._get("norm.weight"), cfg.rms_norm_eps)
        st.position = start + t
        return linear(h, self._get("head.weight"))  # [T, V] fp32

    def _layer_v4(self, i: int, s, pos, st: RequestStateV4, tokens):
        """One layer; each site collapses with its own ``pre`` (no one-site-ahead)."""
        cfg, p = self.cfg, f"layers.{i}."
        eps, it, hc_eps = cfg.rms_norm_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps
        for site, norm in (("attn", "attn_norm"), ("ffn", "ffn_norm")):
            pre, post, c = hc_mix(s, self._get(p + f"hc_{site}_fn"),
                                  self._get(p + f"hc_{site}_base"),
                                  self._get(p + f"hc_{site}_scale"), it, hc_eps, eps)
            x = rms_norm(hc_collapse(s, pre), self._get(p + f"{norm}.weight"), eps)
            if site == "attn":
                y = self._attention_v4(i, x, pos, st)
            else:
                y = self._moe_v4(i, x, tokens)
            s = hc_expand(s, y, post, c)
        return s

    def _attention_v4(self, i: int, x, pos, st: RequestStateV4) -> torch.Tensor:
        """Attention of layer ``i`` for one request's rows ``x [T, D]`` -> ``[T, D]`` bf16:
        window keys, plus (CSA) the indexer's top-k or (HCA) every visible compressed entry."""
        cfg, plan, pre = self.cfg, self.cfg.layers[i], f"layers.{i}.attn."
        eps, win = cfg.rms_norm_eps, cfg.sliding_window
        freqs = self.freqs[plan.rope]
        qr, q = q_path_v4(x, self._get(pre + "wq_a.weight"), self._get(pre + "q_norm.weight"),
                          self._get(pre + "wq_b.weight"), pos, freqs, cfg.num_attention_heads,
                          eps)
        kv = self._kv_read(window_kv(x, self._get(pre + "wkv.weight"),
                                     self._get(pre + "kv_norm.weight"), pos, freqs, eps))
        first = int(pos[0])
        base = max(0, first - win + 1)  # oldest position any row of this call can see
        ring = st.window[i]
        win_kv = torch.cat((ring[[p % win for p in range(base, first)]], kv))
        for r, p in enumerate(pos.tolist()):
            ring[p % win] = kv[r]

        comp, topk = None, None
        if plan.ratio:
            self._compress(i, "kv", x, pos, st)
            comp = st.compressed[i]
            if plan.mode == "csa":
                self._compress(i, "index", x, pos, st)
                topk = self._index_v4(i, qr, x, pos, st)
        sink = self._get(pre + "attn_sink").float()
        o = []
        for r, p in enumerate(pos.tolist()):
            keys = win_kv[max(0, p - win + 1) - base:p + 1 - base]  # p-W+1 .. p
            if comp is not None:
                sel = topk[r] if topk is not None else slice(0, (p + 1) // plan.ratio)
                keys = torch.cat((keys, comp[sel]))
            o.append(sparse_attention(q[r], keys, sink))
        o = apply_rope(torch.stack(o), pos, freqs, inverse=True).to(torch.bfloat16)
        return output_projection(o, self._get(pre + "wo_a.weight"), self._get(pre + "wo_b.weight"),
                                 cfg.o_groups)

    def _compress(self, i: int, name: str, x, pos, st: RequestStateV4):
        """Feed this call's rows to compressor ``name`` ("kv": ``attn.compressor``, "index":
        ``attn.indexer.compressor``) of layer ``i``; each completed window appends one entry
        ``RoPE(RMSNorm(bf16(u)), j*r)`` (bf16; through the record for "kv", through
        ``rotate_fp4`` for "index" when ``qat``)."""
        cfg, r = self.cfg, self.cfg.compress_ratios[i]
        pre = f"layers.{i}.attn." + ("compressor." if name == "kv" else "indexer.compressor.")
        c, z = linear(x, self._get(pre + "wkv.weight")), linear(x, self._get(pre + "wgate.weight"))
        ape, key, cw = self._get(pre + "ape").float(), (i, name), c.shape[1]
        for row, p in enumerate(pos.tolist()):
            st.open[key] = torch.cat((st.open[key], torch.cat((c[row], z[row] + ape[p % r]))[None]))
            if p % r != r - 1:
                continue
            cc, zz = st.open[key][:, :cw], st.open[key][:, cw:]
            st.open[key] = st.open[key][:0]
            if r == 4:
                u = pool_csa(cc, zz, st.prev[key])
                st.prev[key] = torch.cat((cc[:, :cw // 2], zz[:, :cw // 2]), dim=1)
            else:
                u = pool_hca(cc, zz)
            j = p // r  # the pooled value is rounded to bf16 before its norm (official V4)
            latent = rms_norm(u[None].to(torch.bfloat16), self._get(pre + "norm.weight"),
                              cfg.rms_norm_eps)
            entry = apply_rope(latent, torch.tensor([j * r], device=x.device),
                               self.freqs["compress"])
            if name == "kv":
                st.compressed[i] = torch.cat((st.compressed[i], self._kv_read(entry)))
            else:
                key = rotate_fp4(entry) if self.qat else entry.float()
                st.index_keys[i] = torch.cat((st.index_keys[i], key))

    def _index_v4(self, i: int, qr, x, pos, st: RequestStateV4) -> list[torch.Tensor]:
        """CSA layer ``i``: per row the top ``index_topk`` of its visible index keys
        (ties to the lower index), ascending."""
        cfg, pre = self.cfg, f"layers.{i}.attn.indexer."
        q, w = index_query_v4(qr, x, self._get(pre + "wq_b.weight"),
                              self._get(pre + "weights_proj.weight"), pos, self.freqs["compress"],
                              cfg.index_n_heads, self.qat)
        keys = st.index_keys[i]
        return [topk_indices(index_scores(q[r], w[r], keys[:(p + 1) // 4]), cfg.index_topk)
                for r, p in enumerate(pos.tolist())]

    def _moe_v4(self, i: int, x, tokens) -> torch.Tensor:
        """MoE with hash routing (``tid2eid``) on the first ``num_hash_layers`` layers, else
        V4.1's router; the experts as ``ReferenceModel._experts``."""
        cfg, pre = self.cfg, f"layers.{i}.ffn."
        if cfg.layers[i].hash_moe:
            experts = self._get(pre + "gate.tid2eid")[tokens].long()
            weights = hash_route(x, self._get(pre + "gate.weight"), experts,
                                 cfg.routed_scaling_factor)
        else:
            experts, weights = route(x, self._get(pre + "gate.weight"),
                                     self._get(pre + "gate.bias"), cfg.num_experts_per_tok,
                                     cfg.routed_scaling_factor, cfg.gate_temp, cfg.norm_topk_prob)
        return self._experts(i, x, experts, weights)
