"""The cross-entropy's memory by implementation (`model.loss`): Megatron-LM's of 2020 and a fused kernel
(flash-attn's xentropy, llm-foundry's default), in the workload, the simulated plan and `zsim run`."""

import json

import pytest

from tests.conftest import small_scenario
from zsim.cli import main
from zsim.workload.activations import loss_tensors, loss_work_tensors
from zsim.workload.transformer import build_workload, padded_vocab
from zsim.zero.plan import build_plan


def test_loss_tensors_closed_forms():
    """megatron keeps the fp32 softmax (4 bytes a logit) beside three copies while forward runs (e + 4 + 4);
    fused keeps the e-byte logits and a 4-byte log-sum-exp per token, and no copy; torch saves the e-byte
    log-softmax while the training loop holds the e-byte logits."""
    tokens, vocab, t = 4096, 51200, 4
    logits = tokens * vocab // t
    assert loss_tensors(tokens, vocab, t, 2) == ((4 * logits,), loss_work_tensors(tokens, vocab, t, 2), ())
    assert sum(loss_work_tensors(tokens, vocab, t, 2)) == (2 + 4 + 4) * logits
    assert loss_tensors(tokens, vocab, t, 2, "fused") == ((2 * logits, 4 * tokens), (), ())
    assert loss_tensors(tokens, vocab, t, 4, "fused") == ((4 * logits, 4 * tokens), (), ())
    assert loss_tensors(tokens, vocab, 1, 2, "torch") == ((2 * tokens * vocab,), (), (2 * tokens * vocab,))


def _head(loss: str, mp: int = 1):
    scenario = small_scenario(model={"loss": loss}, parallel={"mp": mp, "dp": 32 // mp}, zero={"stage": 1})
    workload = build_workload(scenario.model, scenario.parallel.mp, scenario.precision.dtype)
    return scenario, workload, workload.modules[-1]


@pytest.mark.parametrize("mp", [1, 2])
def test_the_fused_head_saves_the_logits_and_holds_no_copy(mp):
    scenario, workload, head = _head("fused", mp)
    m = scenario.model
    tokens, v = m.seq_len * m.micro_batch, workload.padded_vocab
    assert head.name == "head" and head.fwd_work_tensors == ()
    assert head.saved_tensors == (2 * tokens * m.hidden, 2 * tokens * v // mp, 4 * tokens)
    _, _, megatron = _head("megatron", mp)
    # what the fused kernel saves for backward less than Megatron's softmax, and none of its 10-byte copies
    assert megatron.saved_bytes - head.saved_bytes == (4 - 2) * tokens * v // mp - 4 * tokens
    assert sum(megatron.fwd_work_tensors) == 10 * tokens * v // mp


def test_only_the_head_changes():
    _, fused, _ = _head("fused")
    _, megatron, _ = _head("megatron")
    assert fused.modules[:-1] == megatron.modules[:-1]


def test_the_simulated_head_allocates_what_the_workload_says():
    """The plan's forward head op allocates the saved tensors and no work tensors under `fused`."""
    scenario, workload, head = _head("fused")
    plan = build_plan(scenario, workload)
    op = next(op for op in plan.ops if op.name.startswith("fwd/head"))
    assert not [a for a in op.allocs if a.tag.startswith("fwork")]
    assert sum(a.nbytes for a in op.allocs) == head.saved_bytes


def test_run_peak_drops_by_the_closed_form(tmp_path):
    """Where the loss holds the activation peak (a large vocabulary, few layers), the peak moves. Megatron's
    is at the end of the head's forward: the saved fp32 softmax and the three copies, 4 + 10 bytes a logit.
    The fused loss's is in the head's backward: the saved bf16 logits and their gradient (2 + 2 bytes a
    logit; llm-foundry's FusedCrossEntropyLoss writes the gradient into a new tensor), the log-sum-exp
    (4 a token), and the gradients of the head's input (e·sbh) and of its final norm (e·2h, tied head)."""
    peaks = {}
    for loss in ("megatron", "fused"):
        out = tmp_path / loss
        spec = tmp_path / f"{loss}.yaml"
        spec.write_text(
            "name: loss-" + loss + "\n"
            "model: {layers: 2, hidden: 256, heads: 4, seq_len: 512, vocab: 128000, micro_batch: 8, loss: " + loss + "}\n"
            "parallel: {dp: 8, mp: 1}\nzero: {stage: 1}\nprecision: {dtype: bf16}\n"
            "hardware: {profile: dgx-a100, nodes: 1}\n")
        assert main(["run", str(spec), "-o", str(out), "--json", str(tmp_path / f"{loss}.json")]) == 0
        peaks[loss] = json.loads((tmp_path / f"{loss}.json").read_text())["memory"]["peak_bytes"]
    tokens, v, h, e = 512 * 8, padded_vocab(128000, 1), 256, 2
    assert peaks["megatron"] - peaks["fused"] == (14 - 4) * tokens * v - 4 * tokens - e * tokens * h - e * 2 * h


def test_the_fp32_upcast_loss_saves_its_log_softmax_and_holds_two_gradients_in_backward():
    """torch-fp32 (F.cross_entropy(logits.float()), zsim's runtime and HF transformers' ForCausalLMLoss): forward
    holds the e-byte logits and their fp32 copy beside the saved fp32 log-softmax; backward holds nll_loss's
    and log_softmax's fp32 gradients at once, then the input's gradient (data/device/20261127-h200-memhist:
    three 1648 MB blocks live at h1024's head backward)."""
    from zsim.workload.activations import loss_backward_tensors

    tokens, vocab = 8192, 50304
    logits = tokens * vocab
    assert loss_tensors(tokens, vocab, 1, 2, "torch-fp32") == ((4 * logits,), (2 * logits, 4 * logits), ())
    assert loss_tensors(tokens, vocab, 1, 4, "torch-fp32") == ((4 * logits,), (4 * logits,), ())  # .float() is a no-op
    assert loss_backward_tensors(tokens, vocab, 1, "torch-fp32") == (4 * logits, 4 * logits)
    assert loss_backward_tensors(tokens, vocab, 1, "megatron") == ()
    scenario, workload, head = _head("torch-fp32")
    m = scenario.model
    sbh = 2 * m.seq_len * m.micro_batch * m.hidden
    v = workload.padded_vocab
    assert head.bwd_work_tensors == (4 * m.seq_len * m.micro_batch * v, 4 * m.seq_len * m.micro_batch * v, sbh)
    plan = build_plan(scenario, workload)
    bwd = next(op for op in plan.ops if op.name == "bwd/head")
    assert [a.nbytes for a in bwd.allocs if a.tag.startswith("dgrad")] == list(head.bwd_work_tensors)
    assert all(a.tag in bwd.frees for a in bwd.allocs if a.tag.startswith("dgrad"))


def test_the_fp32_upcast_loss_needs_whole_logits():
    from zsim.errors import ConfigError

    with pytest.raises(ConfigError, match="model.loss.*torch-fp32 with parallel.mp 2"):
        small_scenario(model={"loss": "torch-fp32"}, parallel={"mp": 2, "dp": 16}, zero={"stage": 1})
