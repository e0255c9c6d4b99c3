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
