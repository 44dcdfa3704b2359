"""Unit tests of the workload formulas against hand-computed cases."""

import pytest

from zsim.config.model_section import ModelSection
from zsim.workload.parameters import block_params, total_params
from zsim.workload.transformer import build_workload, padded_vocab


def model(**kw):
    base = dict(layers=2, hidden=8, heads=2, seq_len=4, vocab=10, micro_batch=3)
    base.update(kw)
    return ModelSection(**base)


def test_block_params_whole_layer_is_12h2_plus_13h():
    # h = 8: QKV 3·64+24, proj 64+8, MLP 4·64+32 and 4·64+8, LN 32 -> 768 + 104 = 872
    assert block_params(8) == 12 * 64 + 13 * 8 == 872


def test_block_params_under_mp_splits_matmuls_and_keeps_replicated_terms():
    # t = 2: 12h²/2 + 7h/2 + 6h = 384 + 28 + 48
    assert block_params(8, 2) == 460
    # Summed over the MP ranks, the unique parameters plus the replicated ones: 2·460 = 872 + 6h(2-1)
    assert 2 * block_params(8, 2) == block_params(8) + 6 * 8


def test_padded_vocab_follows_megatron():
    assert padded_vocab(50257, 1) == 50304
    assert padded_vocab(50257, 8) == 51200
    assert padded_vocab(51200, 16) == 51200


def test_total_params_of_megatron_1t_config():
    # Narayanan et al. 2021, Table 1: 128 layers, h = 25600 -> "1008.0B" parameters
    m = ModelSection(layers=128, hidden=25600, heads=160, seq_len=2048, vocab=51200, micro_batch=1)
    assert round(total_params(m) / 1e9, 1) == 1008.0
    # The closed form 12lh²(1 + 13/12h + (V+s)/12lh) + 2h
    l, h, v, s = 128, 25600, 51200, 2048
    assert total_params(m) == round(12 * l * h * h * (1 + 13 / (12 * h) + (v + s) / (12 * l * h))) + 2 * h


def test_workload_flops_and_activation_bytes_by_hand():
    w = build_workload(model(), mp=1)
    blk = w.blocks[0]
    b, s, h, a = 3, 4, 8, 2
    assert blk.fwd_flops == 24 * b * s * h * h + 4 * b * s * s * h  # 13824 + 1536
    assert blk.bwd_flops == 2 * blk.fwd_flops
    assert blk.saved_bytes == int(s * b * h * (34 + 5 * a * s / h))  # K22 eq. 1 at t = 1: 96·39
    assert blk.checkpoint_bytes == 2 * s * b * h
    assert blk.mp_allreduces_fwd == 0 and blk.mp_allreduce_bytes == 0
    head = w.modules[-1]
    v = padded_vocab(10, 1)
    assert head.fwd_flops == 2 * b * s * h * v
    assert w.params_per_mp_rank == w.total_params  # no MP: one rank holds everything


def test_workload_under_mp_divides_and_adds_mp_allreduces():
    w1, w2 = build_workload(model(), 1), build_workload(model(), 2)
    b1, b2 = w1.blocks[0], w2.blocks[0]
    assert b2.fwd_flops == pytest.approx(b1.fwd_flops / 2)
    b, s, h, a = 3, 4, 8, 2
    assert b2.saved_bytes == int(s * b * h * (10 + 24 / 2 + 5 * a * s / (h * 2)))  # K22 eq. 2
    assert b2.checkpoint_bytes == b1.checkpoint_bytes  # layer inputs are replicated across MP
    assert (b2.mp_allreduces_fwd, b2.mp_allreduces_bwd, b2.mp_allreduce_bytes) == (2, 2, 2 * s * b * h)
    # Ψ changes only through the vocabulary padding (128·t rows): 256 rows at t = 2, 128 at t = 1.
    assert w2.padded_vocab == 256 and w1.padded_vocab == 128
    assert w2.total_params - w1.total_params == (256 - 128) * 8
