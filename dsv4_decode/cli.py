"""The ``dsv4-decode`` command line: ``info``, ``generate`` and ``bench``.

Run ``dsv4-decode <command> --help`` for each command's options.
"""

from __future__ import annotations

import argparse
import importlib
import sys
import time

BENCH_OPS = ("topk", "sparse_attn", "moe")


def _parse_ints(text: str) -> list[int]:
    try:
        return [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected comma-separated integers, got {text!r}") from None


def _load_config(args):
    from dsv4_decode.config import ModelConfig

    if getattr(args, "model", None):
        return ModelConfig.from_hf(args.model)
    return ModelConfig.preset(args.preset)


# ----------------------------------------------------------------------------- info


def cmd_info(args) -> int:
    from dsv4_decode.bench import roofline

    cfg = _load_config(args)
    shapes = cfg.rank_shapes(args.tp)
    print(cfg.describe())
    print(f"\nper-rank shapes at tp={args.tp}: {shapes}")
    print(roofline.format_param_table(cfg, args.tp))
    print()
    print(roofline.format_step_floor(cfg, args.tp, args.rows, args.context))
    return 0


# ----------------------------------------------------------------------------- generate


def _pick_device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("--device cuda: no CUDA device is available")
    return name


def cmd_generate(args) -> int:
    import torch

    from dsv4_decode import weights
    from dsv4_decode.reference import ReferenceModel, ReferenceModelV4

    device = _pick_device(args.device)
    tokenizer = None
    if args.model:
        cfg, params = weights.load(args.model, device=device, dequantize=False)
        tokenizer = weights.load_tokenizer(args.model)
    else:
        cfg = _load_config(args)
        params = weights.random_weights(cfg, seed=args.seed, device=device, progress=True)
    if args.prompt is not None:
        if tokenizer is None:
            raise SystemExit("--prompt needs a tokenizer.json in --model DIR; use --prompt-ids")
        ids = tokenizer.encode(args.prompt).ids
    else:
        ids = args.prompt_ids
    if not ids:
        raise SystemExit("the prompt is empty")
    bad = [t for t in ids if not 0 <= t < cfg.vocab_size]
    if bad:
        raise SystemExit(f"--prompt-ids: ids {bad} are outside [0, {cfg.vocab_size})")
    if len(ids) + args.max_new_tokens > cfg.max_position_embeddings:
        raise SystemExit(f"--max-new-tokens: prompt + new tokens exceed max_position_embeddings "
                         f"{cfg.max_position_embeddings}")

    model = (ReferenceModelV4 if cfg.is_v4 else ReferenceModel)(cfg, params, device=device)
    state = model.new_request()
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    with torch.inference_mode():
        t0 = time.perf_counter()
        logits = model.prefill(torch.tensor(ids, device=device), state)
        sync()
        prefill_s = time.perf_counter() - t0
        out: list[int] = []
        step_s: list[float] = []
        nxt = int(logits[-1].argmax())
        for _ in range(args.max_new_tokens):
            out.append(nxt)
            if nxt == cfg.eos_token_id and not args.ignore_eos:
                break
            t0 = time.perf_counter()
            logits = model.decode(torch.tensor([[nxt]], device=device), [state])
            sync()
            step_s.append(time.perf_counter() - t0)
            nxt = int(logits[0, -1].argmax())
    print(f"model: {cfg.model_type} layers={cfg.num_hidden_layers} D={cfg.hidden_size} "
          f"device={device} (reference path)")
    print(f"prompt ids ({len(ids)}): {ids}")
    print(f"generated ids ({len(out)}): {out}")
    if tokenizer is not None:
        print(f"text: {tokenizer.decode(out)!r}")
    per_step = 1e3 * sum(step_s) / len(step_s) if step_s else float("nan")
    print(f"prefill {1e3 * prefill_s:.1f} ms; decode {per_step:.2f} ms/step over "
          f"{len(step_s)} steps")
    return 0


# ----------------------------------------------------------------------------- bench


def cmd_bench(args, rest: list[str]) -> int:
    if args.op == "plot":
        from dsv4_decode.bench import plot

        return plot.main(rest) or 0
    module = importlib.import_module(f"dsv4_decode.bench.{args.op}")
    return module.main(rest) or 0


# ----------------------------------------------------------------------------- parser


def build_parser() -> argparse.ArgumentParser:
    from dsv4_decode.config import PRESETS

    p = argparse.ArgumentParser(
        prog="dsv4-decode",
        description="A latency-specialized decode step for DeepSeek-V4.1 on NVIDIA GPUs.")
    sub = p.add_subparsers(dest="command", required=True)

    def model_args(sp, default_preset):
        g = sp.add_mutually_exclusive_group()
        g.add_argument("--preset", choices=PRESETS, default=default_preset,
                       help=f"a built-in config with random weights (default {default_preset})")
        g.add_argument("--model", metavar="DIR",
                       help="a Hugging Face checkpoint folder (config.json + safetensors)")

    sp = sub.add_parser("info", help="config, parameter counts and the HBM byte floor of a step",
                        description="Print the config and layer schedule, parameter counts and "
                        "bytes by component per TP rank, and the per-rank HBM byte floor of one "
                        "decode step (spec §11), all computed from the config.")
    model_args(sp, "v41-flash")
    sp.add_argument("--tp", type=int, default=4, help="tensor-parallel ranks (1, 2, 4, 8)")
    sp.add_argument("--rows", type=_parse_ints, default=[1, 6, 48, 192],
                    help="rows per step, comma-separated; a multiple of 6 means requests x 6 "
                    "speculative rows, else one row per request (default 1,6,48,192)")
    sp.add_argument("--context", type=int, default=131072,
                    help="context length per request in tokens (default 131072)")

    sp = sub.add_parser("generate", help="prefill + greedy decode with the reference model",
                        description="Run prefill and greedy decode on the reference model and "
                        "print the tokens and the time per decode step.")
    model_args(sp, "tiny-v41")
    sp.add_argument("--prompt-ids", type=_parse_ints, default=[1, 2, 3],
                    help="prompt token ids, comma-separated (default 1,2,3)")
    sp.add_argument("--prompt", help="prompt text (needs --model DIR with tokenizer.json)")
    sp.add_argument("--max-new-tokens", type=int, default=16)
    sp.add_argument("--device", default="auto", help="auto (cuda if present), cpu or cuda")
    sp.add_argument("--seed", type=int, default=0, help="seed of the random weights of a preset")
    sp.add_argument("--ignore-eos", action="store_true", help="keep going past the eos token")

    sp = sub.add_parser("bench", help="benchmark one op on the GPU (see `bench OP --help`)",
                        description="Benchmark an op against its baselines and byte floor; "
                        "rows are appended to benchmarks/results/<op>.csv. `bench plot` draws "
                        "the CSVs as PNG charts.", add_help=True)
    sp.add_argument("op", choices=(*BENCH_OPS, "plot"), help="the op to measure, or plot")
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    if len(argv) >= 2 and argv[0] == "bench" and argv[1] in (*BENCH_OPS, "plot"):
        # the op's own parser handles the rest (including its --help)
        return cmd_bench(argparse.Namespace(op=argv[1]), argv[2:])
    args = parser.parse_args(argv)
    return {"info": cmd_info, "generate": cmd_generate}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
