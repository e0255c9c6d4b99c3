"""``ReferenceModel``: the whole DeepSeek-V4.1 text model in plain PyTorch, the oracle of every
kernel (spec §3-§8.1). Readable first: one request's rows go through the layers in order,
each layer reading and writing that request's caches (``RequestState``) in the real record
formats.

Rows. ``prefill(tokens)`` is the rows of one request at positions ``0 .. L-1``; ``decode`` is
``q_len`` rows per request at each request's own positions. Both run ``_forward`` over a
request's rows, layer by layer: a row only sees cache entries of positions <= its own
(window ``p-W+1 .. p``, compressed entries ``j < floor((p+1)/r)``), every linear is a per-row
GEMV and every other op is row-wise, so the logits of a row do not depend on how the rows
were split into calls (decode == prefill, bit for bit, on CPU) nor on the other requests of a
batch (each request is processed on its own).

Numerics (details in ``docs/reference-notes.md``): weights are dequantised exactly (FP8 and
MXFP4 values are exact in bf16/fp32); linears are fp32 GEMVs of bf16 inputs, their outputs
rounded to bf16 where the activation is bf16 (spec §5-§6) and kept fp32 where the spec says
so (compressor, router, logits); norms, RoPE, softmaxes, mHC and the MoE combine in fp32.
QAT fake-quants are model semantics: attention and the indexer read the *decoded records*.

Not graph-safe (host-side loops and ``.item()``): this is the oracle, not the engine. tp = 1
only. DSpark draft layers (``mtp.*``) are skipped; image tokens (``gate.bias_vl``, DEAD
engram tokens) are out of scope for this text-only reference.
"""

from __future__ import annotations

import torch

from dsv4_decode import formats
from dsv4_decode.config import ModelConfig

from .attention import output_projection, q_path, sparse_attention, window_kv
from .compressor import compressor_proj, latent_outputs, pool_groups
from .engram import EngramLayout, compress_tokens, engram_forward, hash_ids
from .indexer import candidate_mask, index_query, index_scores, topk_indices
from .mhc import hc_collapse, hc_expand, hc_mix
from .moe import dequant_expert, route, swiglu_expert
from .norm_rope import apply_rope, linear, rms_norm, rope_freqs
from .state import RequestState


class ReferenceModel:
    """The V4.1 text model over a flat weight dict (the project's weight contract: checkpoint
    names, checkpoint storage formats; FP8 ``X.weight`` + ue8m0 ``X.scale`` per 32x32 block,
    MXFP4 routed experts, bf16 / fp32 elsewhere; ``mtp.*`` ignored).

    Non-expert FP8 weights are dequantised once at construction (to bf16, exact); routed
    experts stay in MXFP4 and only the experts a call selects are dequantised, one at a time
    (bounded memory); engram tables stay FP8 and only the looked-up rows are dequantised.

    ``trace``: set to a list to record, per cache entry written, ``(kind, layer, index,
    value)`` with ``kind`` in ``"window"`` (index = position), ``"compressed"`` /
    ``"index_key"`` (index = entry j) and ``value`` the bf16 tensor *before* its QAT
    fake-quant (for the record tests); ``None`` (default) records nothing.
    """

    _v4 = False  # ReferenceModelV4 (model_v4.py) serves model_type deepseek_v4

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], device="cpu"):
        if cfg.is_v4 != self._v4:
            raise ValueError(f"cfg: model_type {cfg.model_type!r} needs "
                             f"{'ReferenceModelV4' if cfg.is_v4 else 'ReferenceModel'}")
        self.cfg = cfg
        self.device = torch.device(device)
        self.w = self._load(weights)
        self.freqs = {t: rope_freqs(cfg, t, self.device) for t in ("main", "compress")}
        self.layout = EngramLayout.from_config(cfg) if cfg.engram_layer_ids else None
        self._check_engram()
        self.trace: list | None = None

    # ------------------------------------------------------------------ public API

    def new_request(self) -> RequestState:
        """An empty request: zeroed window rings, no compressed entries, position 0."""
        return RequestState.new(self.cfg, self.device)

    def prefill(self, token_ids: torch.Tensor, state: RequestState) -> torch.Tensor:
        """``token_ids`` int64 ``[L]`` (L >= 1) appended to ``state`` at positions
        ``state.position ..``; returns fp32 logits ``[L, vocab]`` and advances ``state`` by L.
        (Usually on a new request; a non-empty state continues it, i.e. chunked prefill.)"""
        if token_ids.dim() != 1 or token_ids.numel() == 0:
            raise ValueError(f"token_ids: need a non-empty 1-D tensor, got shape "
                             f"{tuple(token_ids.shape)}")
        return self._rows(token_ids, state)

    def decode(self, token_ids: torch.Tensor, states: list[RequestState]) -> torch.Tensor:
        """``token_ids`` int64 ``[B, q_len]`` (row k of request b is at position
        ``states[b].position + k``), ``states`` B distinct requests at their own positions.
        Returns fp32 logits ``[B, q_len, vocab]`` and advances every state by ``q_len``."""
        if token_ids.dim() != 2 or token_ids.shape[1] == 0:
            raise ValueError(f"token_ids: need [B, q_len] with q_len >= 1, got shape "
                             f"{tuple(token_ids.shape)}")
        if len(states) != token_ids.shape[0]:
            raise ValueError(f"states: got {len(states)} states for {token_ids.shape[0]} rows "
                             f"of token_ids")
        if len({id(s) for s in states}) != len(states):
            raise ValueError("states: the same RequestState appears twice in one batch")
        return torch.stack([self._rows(t, s) for t, s in zip(token_ids, states, strict=True)])

    # ------------------------------------------------------------------ weights

    def _load(self, weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        b = self.cfg.weight_block_size[0]
        out = {}
        for name, t in weights.items():
            if name.startswith("mtp.") or name.endswith(".scale"):
                continue
            scale = weights.get(name[:-len("weight")] + "scale") if name.endswith(
                ".weight") else None
            keep_raw = ".experts." in name or name.endswith("engram.embed.weight")
            if keep_raw:
                out[name] = t.to(self.device)
                if scale is not None:
                    out[name[:-len("weight")] + "scale"] = scale.to(self.device)
            elif t.dtype == torch.float8_e4m3fn:
                if scale is None:
                    raise ValueError(f"weights: FP8 tensor {name} has no companion scale")
                q = formats.dequant_fp8_weight(t.to(self.device), scale.to(self.device), b)
                out[name] = q.to(torch.bfloat16)
            else:
                out[name] = t.to(self.device)
        return out

    def _get(self, name: str) -> torch.Tensor:
        try:
            return self.w[name]
        except KeyError:
            raise ValueError(f"weights: missing tensor {name!r}") from None

    def _expert(self, layer: int, e: int):
        """(w1, w3, w2) of routed expert ``e`` of ``layer``, dequantised (fp32 when MXFP4)."""
        pre = f"layers.{layer}.ffn.experts.{e}."
        ws = []
        for n in ("w1", "w3", "w2"):
            t = self._get(pre + n + ".weight")
            if t.dtype == torch.uint8:
                t = dequant_expert(t, self._get(pre + n + ".scale"), self.cfg.expert_scale_block)
            ws.append(t)
        return ws

    def _check_engram(self):
        if self.layout is None:
            return
        for k, layer in enumerate(self.cfg.engram_layer_ids):
            rows = self._get(f"layers.{layer}.engram.embed.weight").shape[0]
            if rows != self.layout.rows[k] or self.cfg.engram_num_embeddings[k] != rows:
                raise ValueError(
                    f"engram_num_embeddings: layer {layer} table has {rows} rows, config says "
                    f"{self.cfg.engram_num_embeddings[k]}, the prime layout needs "
                    f"{self.layout.rows[k]}")

    def _trace(self, kind: str, layer: int, index: int, value: torch.Tensor):
        if self.trace is not None:
            self.trace.append((kind, layer, index, value.detach().clone()))

    # ------------------------------------------------------------------ forward

    def _rows(self, tokens: torch.Tensor, st: RequestState) -> torch.Tensor:
        """One request's rows ``tokens [T]``, one row at a time through the whole model.

        Causal math makes this the same function as processing the rows together; doing it row
        by row makes every op see the same shapes in prefill and in decode, so results do not
        depend on how rows are grouped (CPU elementwise kernels round a vectorised body and a
        scalar tail differently, and where the tail falls depends on the tensor size)."""
        cfg = self.cfg
        last = st.position + tokens.shape[0] - 1
        if last >= cfg.max_position_embeddings:
            raise ValueError(f"token_ids: positions up to {last} exceed "
                             f"max_position_embeddings = {cfg.max_position_embeddings}")
        if int(tokens.min()) < 0 or int(tokens.max()) >= cfg.vocab_size:
            raise ValueError(f"token_ids: ids must lie in [0, {cfg.vocab_size})")
        return torch.cat([self._forward(tokens[r:r + 1], st) for r in range(tokens.shape[0])])

    def _forward(self, tokens: torch.Tensor, st: RequestState) -> torch.Tensor:
        """Rows of one request: ``tokens [T]`` at positions ``st.position ..`` -> ``[T, V]``."""
        cfg, dev = self.cfg, self.device
        tokens = tokens.to(dev).long()
        t, start = tokens.shape[0], st.position
        pos = torch.arange(start, start + t, device=dev)
        ctx: dict = {"topk": {}, "cand": None, "hist": self._engram_history(tokens, st)}

        e = self._get("embed.weight")[tokens].to(torch.bfloat16)  # [T, D]
        s = e[:, None, :].expand(t, cfg.hc_mult, -1).contiguous()  # [T, N, D] bf16
        p_in = torch.zeros(t, cfg.hc_mult, device=dev)
        p_in[:, 0] = 1.0  # layer 0 collapses the (identical) streams with a one-hot
        for layer in range(cfg.num_hidden_layers):
            s, p_in = self._layer(layer, s, p_in, pos, st, ctx)
        h = rms_norm(hc_collapse(s, p_in), self._get("norm.weight"), cfg.rms_norm_eps)
        logits = linear(h, self._get("head.weight"))  # [T, V] fp32

        st.position = start + t
        if ctx["hist"] is not None:  # the last max_ngram-1 compressed ids, most recent first
            st.engram_history = ctx["hist"][-1, :-1].clone()
        return logits

    def _engram_history(self, tokens: torch.Tensor, st: RequestState):
        """``[T, max_ngram]`` compressed ids of positions p, p-1, .. per row (-1: before 0)."""
        if self.layout is None:
            return None
        m = self.cfg.engram_max_ngram_size
        seq = torch.cat((st.engram_history.flip(0), compress_tokens(tokens, self.cfg)))
        t = tokens.shape[0]
        idx = (m - 1) + torch.arange(t, device=seq.device)[:, None] - torch.arange(m,
                                                                                 device=seq.device)
        return seq[idx]

    def _layer(self, i: int, s, p_in, pos, st: RequestState, ctx: dict):
        """One decoder layer with the one-site-ahead mHC schedule (spec §4.3)."""
        cfg, pre = self.cfg, f"layers.{i}."
        eps, it, hc_eps = cfg.rms_norm_eps, cfg.hc_sinkhorn_iters, cfg.hc_eps
        if cfg.layers[i].engram:
            s = self._engram(i, s, ctx["hist"])
        pre_a, post_a, c_a = hc_mix(s, self._get(pre + "hc_attn_fn"),
                                    self._get(pre + "hc_attn_base"),
                                    self._get(pre + "hc_attn_scale"), it, hc_eps, eps)
        x = rms_norm(hc_collapse(s, p_in), self._get(pre + "attn_norm.weight"), eps)
        s = hc_expand(s, self._attention(i, x, pos, st, ctx), post_a, c_a)
        pre_f, post_f, c_f = hc_mix(s, self._get(pre + "hc_ffn_fn"),
                                    self._get(pre + "hc_ffn_base"),
                                    self._get(pre + "hc_ffn_scale"), it, hc_eps, eps)
        x = rms_norm(hc_collapse(s, pre_a), self._get(pre + "ffn_norm.weight"), eps)
        s = hc_expand(s, self._moe(i, x), post_f, c_f)
        return s, pre_f

    # ------------------------------------------------------------------ sublayers

    def _engram(self, i: int, s, hist):
        cfg, pre = self.cfg, f"layers.{i}.engram."
        k = cfg.engram_layer_ids.index(i)
        pad = int(compress_tokens(torch.tensor(cfg.engram_pad_id), cfg))
        ids = hash_ids(hist, pad, self.layout, k)  # [T, C]
        table = self._get(pre + "embed.weight")
        if table.dtype == torch.float8_e4m3fn:
            rows = formats.dequant_fp8_32(table[ids].view(torch.uint8),
                                          self._get(pre + "embed.scale")[ids])
        else:
            rows = table[ids]
        rows = rows.to(torch.bfloat16).reshape(ids.shape[0], -1)  # [T, C*dh], exact
        return engram_forward(s, rows, self._get(pre + "wkv.weight"), self._get(pre + "q_weight"),
                              self._get(pre + "k_weight"), cfg.rms_norm_eps)

    def _attention(self, i: int, x, pos, st: RequestState, ctx: dict) -> torch.Tensor:
        """Attention sublayer of layer ``i`` for one request's rows ``x [T, D]`` -> ``[T, D]``."""
        cfg, plan, pre = self.cfg, self.cfg.layers[i], f"layers.{i}.attn."
        eps, win = cfg.rms_norm_eps, cfg.sliding_window
        freqs = self.freqs[plan.rope]
        qr, q = q_path(x, self._get(pre + "wq_a.weight"), self._get(pre + "q_norm.weight"),
                       self._get(pre + "wq_b.weight"), pos, freqs, cfg.num_attention_heads, eps)

        # Window: QAT-FP8 records of this call's rows, then each row reads p-W+1 .. p.
        kv = window_kv(x, self._get(pre + "wkv.weight"), self._get(pre + "kv_norm.weight"), pos,
                       freqs, eps)
        new = formats.encode_window_record(kv)  # [T, d + d/32]
        first = int(pos[0])
        base = max(0, first - win + 1)  # oldest position any row of this call can see
        ring = st.window[i]
        old = ring[[p % win for p in range(base, first)]]  # still in the ring
        win_kv = formats.decode_window_record(torch.cat((old, new)))  # positions base .. last row
        for r, p in enumerate(pos.tolist()):
            self._trace("window", i, p, kv[r])
            ring[p % win] = new[r]

        comp, topk = None, None
        if plan.ratio > 0:
            if plan.mode == "full":
                self._compress(i, x, pos, st)
            comp = formats.decode_compressed_record(st.compressed[plan.kv_source])  # [n_total, d]
            if plan.mode in ("full", "reindex"):
                ctx["topk"][i] = self._index(i, qr, x, pos, st, ctx)
            topk = ctx["topk"][plan.index_source]

        sink = self._get(pre + "attn_sink").float()
        o = []
        for r, p in enumerate(pos.tolist()):
            keys = win_kv[max(0, p - win + 1) - base:p + 1 - base]  # p-W+1 .. p, p included
            if comp is not None:
                keys = torch.cat((keys, comp[topk[r]]))
            o.append(sparse_attention(q[r], keys, sink))
        o = apply_rope(torch.stack(o), pos, freqs, inverse=True).to(torch.bfloat16)  # [T, H, d]
        return output_projection(o, self._get(pre + "wo_a.weight"), self._get(pre + "wo_b.weight"),
                                 cfg.o_groups)

    def _compress(self, i: int, x, pos, st: RequestState):
        """KV source ``i``: pool the rows, append index-key and compressed records (§5.3)."""
        cfg, pre, r = self.cfg, f"layers.{i}.attn.", self.cfg.compress_ratios[i]
        wgate = self._get(pre + "compressor.wgate.weight") if r == 2 else None
        c, z = compressor_proj(x, self._get(pre + "compressor.wkv.weight"), wgate)
        emitted, pending = pool_groups(c, z, pos.tolist(), r, st.pending.get(i))
        if r == 2:
            st.pending[i] = pending
        for j, u in emitted:
            if j != st.compressed[i].shape[0]:
                raise ValueError(f"state: layer {i} emits entry {j} but holds "
                                 f"{st.compressed[i].shape[0]} entries")
            key, entry = latent_outputs(u, j, r, self._get(pre + "compressor.norm.weight"),
                                        self._get(pre + "indexer.wk.weight"),
                                        self._get(pre + "indexer.k_norm.weight"),
                                        self.freqs["compress"], cfg.rms_norm_eps)
            self._trace("index_key", i, j, key)
            self._trace("compressed", i, j, entry)
            key_rec = formats.encode_index_key_record(key)[None]
            st.index_keys[i] = torch.cat((st.index_keys[i], key_rec))
            entry_rec = formats.encode_compressed_record(entry)[None]
            st.compressed[i] = torch.cat((st.compressed[i], entry_rec))

    def _index(self, i: int, qr, x, pos, st: RequestState, ctx: dict) -> list[torch.Tensor]:
        """Index source ``i``: top-k entry indices per row (level-1/2 candidates, §5.4)."""
        cfg, plan, pre = self.cfg, self.cfg.layers[i], f"layers.{i}.attn.indexer."
        q, w = index_query(qr, x, self._get(pre + "wq_b.weight"),
                           self._get(pre + "weights_proj.weight"), pos, self.freqs["compress"],
                           cfg.index_n_heads)
        keys = formats.decode_index_key_record(st.index_keys[plan.kv_source])
        if plan.candidate_publisher:
            ctx["cand"] = []
        out = []
        for r, p in enumerate(pos.tolist()):
            n = (p + 1) // plan.ratio  # visible entries
            s = index_scores(q[r], w[r], keys[:n])
            if plan.candidate_publisher:
                ctx["cand"].append(candidate_mask(s, cfg.candidate_block_size,
                                                  cfg.candidate_topk_blocks))
            if plan.candidate_consumer:
                s = s.masked_fill(~ctx["cand"][r], float("-inf"))
            out.append(topk_indices(s, cfg.index_topk))
        return out

    def _moe(self, i: int, x) -> torch.Tensor:
        """MoE sublayer (§6): routed top-k experts + shared expert, fp32 combine -> bf16."""
        cfg, pre = self.cfg, f"layers.{i}.ffn."
        experts, weights = route(x, self._get(pre + "gate.weight"), self._get(pre + "gate.bias"),
                                 cfg.num_experts_per_tok, cfg.routed_scaling_factor,
                                 cfg.gate_temp, cfg.norm_topk_prob)
        return self._experts(i, x, experts, weights)

    def _experts(self, i: int, x, experts, weights) -> torch.Tensor:
        """``x [T, D]`` through the routed ``experts [T, k]`` with ``weights [T, k]`` plus the
        shared expert, fp32 combine -> bf16 ``[T, D]``."""
        cfg, pre = self.cfg, f"layers.{i}.ffn."
        lim = cfg.swiglu_limit
        out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
        # Expert-major: one expert dequantised at a time (bounded memory for long prefills);
        # a row adds its experts in ascending id order, whatever the other rows chose.
        for e in torch.unique(experts).tolist():
            rows, slots = (experts == e).nonzero(as_tuple=True)
            w1, w3, w2 = self._expert(i, e)
            out[rows] += swiglu_expert(x[rows], w1, w3, w2, lim, weights[rows, slots])
        if cfg.n_shared_experts:
            sh = pre + "shared_experts."
            out += swiglu_expert(x, self._get(sh + "w1.weight"), self._get(sh + "w3.weight"),
                                 self._get(sh + "w2.weight"), lim)
        return out.to(torch.bfloat16)
