"""scripts/fairseq_speed.py: the real command lines timed on equal work.

Its end-to-end run is the CPU smoke of ``tests/test_gpu_check.py``; here, what its
``fairseq-generate`` flags mean to fairseq itself.
"""

from __future__ import annotations

import pytest
from fairseq import options

from recurnmt.experiments.experiment import decoding_flags
from tests.script_modules import load_script


def _script():
    return load_script("fairseq_speed")


def _generation_args(flags: list[str]):
    parser = options.get_generation_parser()
    return options.parse_args_and_arch(parser, ["data-bin", "--path", "x.pt", *flags])


def test_every_hypothesis_has_the_same_length_and_every_nth_batch_is_translated():
    flags = decoding_flags(4, 1.0, "cpu") + _script().generation_flags(32, 2)
    args = _generation_args(flags)
    # fairseq's beam search forbids the end of sentence before min_len and forces it at
    # max_len_a * source length + max_len_b: 32 tokens whatever the model predicts
    assert (args.min_len, args.max_len_a, args.max_len_b) == (32, 0, 32)
    # fairseq_cli/generate.py shards its batches by these (not by --num-shards)
    assert (args.distributed_world_size, args.distributed_rank) == (2, 0)


def test_length_zero_keeps_the_models_own_lengths_and_one_shard_the_whole_set():
    assert _script().generation_flags(0, 1) == []
    args = _generation_args(decoding_flags(4, 1.0, "cpu"))
    assert (args.min_len, args.max_len_a, args.max_len_b) == (1, 1.5, 10)


@pytest.mark.parametrize("flag", [["--gen-len", "-1"], ["--gen-shards", "0"]])
def test_impossible_generation_settings_are_refused(flag):
    with pytest.raises(ValueError, match=f"^{' '.join(flag)}:"):
        _script().parse_args(["--device", "cpu", "--dtype", "fp32", *flag])
