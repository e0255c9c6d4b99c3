"""The command line: --help everywhere, info's numbers, generate on the tiny model."""

import subprocess
import sys

import pytest

from dsv4_decode import cli


@pytest.mark.parametrize("argv", [["--help"], ["info", "--help"], ["generate", "--help"],
                                  ["bench", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(argv)
    assert e.value.code == 0
    assert "usage" in capsys.readouterr().out


def test_bad_rows_argument_is_a_clear_error(capsys):
    with pytest.raises(SystemExit):
        cli.main(["info", "--rows", "1,x"])
    assert "comma-separated integers" in capsys.readouterr().err


def test_info_v41_flash_tp4(capsys):
    assert cli.main(["info", "--preset", "v41-flash", "--tp", "4", "--rows", "1,6",
                     "--context", "131072"]) == 0
    out = capsys.readouterr().out
    assert "heads=16" in out and "moe_inter=576" in out
    assert "byte floor" in out


def test_generate_tiny_on_cpu():
    # a subprocess, as a user runs it: the console entry point's module
    r = subprocess.run([sys.executable, "-m", "dsv4_decode.cli", "generate", "--preset",
                        "tiny-v41", "--max-new-tokens", "4", "--device", "cpu",
                        "--ignore-eos"], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "generated ids (4)" in r.stdout and "ms/step" in r.stdout


def test_generate_rejects_out_of_vocab_prompt():
    with pytest.raises(SystemExit, match="outside"):
        cli.main(["generate", "--preset", "tiny-v41", "--prompt-ids", "5,999", "--device", "cpu"])


def test_generate_from_a_checkpoint_folder_with_a_tokenizer(tmp_path):
    """`generate --model DIR` on a synthetic released-layout checkpoint (2 shards + index) with
    a word-level tokenizer.json: text in, text out, and the same tokens as the same weights
    given directly."""
    tokenizers = pytest.importorskip("tokenizers")
    import torch

    from dsv4_decode import weights
    from dsv4_decode.config import ModelConfig
    from dsv4_decode.reference import ReferenceModel

    cfg = ModelConfig.preset("tiny-v41")
    params = weights.random_weights(cfg, seed=3)
    weights.save_checkpoint(tmp_path, cfg, params, shards=2)
    vocab = {f"w{i}": i for i in range(cfg.vocab_size)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="w0"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    tok.decoder = tokenizers.decoders.WordPiece()  # joins with spaces
    tok.save(str(tmp_path / "tokenizer.json"))

    r = subprocess.run([sys.executable, "-m", "dsv4_decode.cli", "generate", "--model",
                        str(tmp_path), "--prompt", "w5 w7 w9", "--max-new-tokens", "3",
                        "--device", "cpu", "--ignore-eos"], capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    assert "prompt ids (3): [5, 7, 9]" in r.stdout and "text: 'w" in r.stdout

    model = ReferenceModel(cfg, params)
    st = model.new_request()
    logits = model.prefill(torch.tensor([5, 7, 9]), st)
    want = [int(logits[-1].argmax())]
    for _ in range(2):
        want.append(int(model.decode(torch.tensor([[want[-1]]]), [st])[0, -1].argmax()))
    assert f"generated ids (3): {want}" in r.stdout
