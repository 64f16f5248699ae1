"""The fused joint loss (workload.joint=fused): the same values and gradients as the reference loss
and the brute force, padded and packed; its gradient lands in the logits' own buffer; the workload
trains to the same gradients with either joint."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from sweep.errors import SweepError
from sweep.workloads import get as get_workload
from sweep.workloads.base import CheckContext
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.fused import fused_rnnt_loss, valid_cells
from sweep.workloads.rnnt.loss import rnnt_loss, rnnt_loss_bruteforce
from sweep.workloads.rnnt.model import RNNTWorkload

CPU = torch.device("cpu")
EXACT = {"rtol": 1e-10, "atol": 1e-12}

# (B, T, U, V, frame_lens, label_lens): None = every utterance fills the lattice.
CASES = [
    (1, 1, 1, 2, None, None),
    (2, 3, 2, 4, None, None),
    (1, 4, 0, 3, None, None),
    (3, 2, 4, 6, None, None),
    (4, 6, 4, 5, [6, 3, 1, 4], [2, 4, 0, 3]),
    (3, 5, 3, 7, [5, 5, 2], [3, 1, 3]),
    (2, 4, 2, 3, [1, 4], [0, 2]),
]


def _inputs(B, T, U, V, seed):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(B, T, U + 1, V, dtype=torch.float64, generator=gen, requires_grad=True)
    labels = torch.randint(1, V, (B, U), generator=gen)
    weights = torch.rand(B, dtype=torch.float64, generator=gen)  # a non-uniform upstream gradient
    return logits, labels, weights


@pytest.mark.parametrize("layout", ["padded", "packed"])
@pytest.mark.parametrize("chunk_bytes", [8, 10**9])  # the fewest rows a chunk may hold, and one chunk
@pytest.mark.parametrize("B,T,U,V,frames,tokens", CASES)
def test_fused_matches_the_reference_and_the_brute_force(B, T, U, V, frames, tokens, layout, chunk_bytes):
    logits, labels, weights = _inputs(B, T, U, V, seed=B * 1000 + T * 100 + U * 10 + V)
    frame_lens = torch.tensor(frames) if frames else torch.full((B,), T)
    label_lens = torch.tensor(tokens) if tokens else torch.full((B,), U)
    lengths = {"frame_lens": frame_lens, "label_lens": label_lens} if frames else {}

    reference = rnnt_loss(logits.log_softmax(-1), labels, **lengths)
    (grad_reference,) = torch.autograd.grad((reference * weights).sum(), logits)
    # The fused loss overwrites its input with the gradient: hand it a copy (as the joint's Linear does).
    if layout == "padded":
        fused = fused_rnnt_loss(logits * 1, labels, chunk_bytes=chunk_bytes, **lengths)
    else:
        cells = valid_cells(frame_lens, label_lens, T, U + 1)
        assert len(cells) == int((frame_lens * (label_lens + 1)).sum())
        fused = fused_rnnt_loss(logits.reshape(-1, V)[cells], labels, frame_lens, label_lens, cells=cells, chunk_bytes=chunk_bytes)
    (grad_fused,) = torch.autograd.grad((fused * weights).sum(), logits)

    torch.testing.assert_close(fused, reference, **EXACT)
    torch.testing.assert_close(grad_fused, grad_reference, **EXACT)
    for b in range(B):  # and each utterance alone, by enumerating its alignments
        t, u = int(frame_lens[b]), int(label_lens[b])
        alone = logits[b : b + 1, :t, : u + 1].detach().log_softmax(-1)
        torch.testing.assert_close(fused[b], rnnt_loss_bruteforce(alone, labels[b : b + 1, :u])[0], **EXACT)
        assert grad_fused[b, t:].abs().sum() == 0 and grad_fused[b, :, u + 1 :].abs().sum() == 0  # padding learns nothing


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_the_gradient_is_written_into_the_logits_buffer(dtype):
    gen = torch.Generator().manual_seed(1)
    B, T, U, V = 2, 7, 3, 33
    source = torch.randn(B, T, U + 1, V, generator=gen, requires_grad=True)
    logits = (source * 1).to(dtype)  # the half-precision logits autocast's Linear gives
    labels = torch.randint(1, V, (B, U), generator=gen)
    seen = {}
    logits.register_hook(lambda g: seen.update(ptr=g.data_ptr(), dtype=g.dtype))
    buffer = logits.data_ptr()
    fused_rnnt_loss(logits, labels, chunk_bytes=4 * V * 5).sum().backward()
    assert seen == {"ptr": buffer, "dtype": dtype}  # no separate gradient tensor
    reference = rnnt_loss(source.detach().double().log_softmax(-1), labels)
    torch.testing.assert_close(fused_rnnt_loss(source.detach().to(dtype), labels).double(), reference, rtol=2e-2, atol=2e-2)


def test_packed_logits_need_their_cells():
    with pytest.raises(ValueError, match="packed logits"):
        fused_rnnt_loss(torch.zeros(5, 4), torch.ones(1, 2, dtype=torch.long))


TINY_VARIED = RNNTWorkloadConfig(
    feat_dim=4, subsample=2, vocab=12, enc_hidden=8, enc_layers=2, pred_hidden=8, joint_hidden=8, lengths="lognormal",
    duration_mean_s=0.3, duration_std_s=0.1, min_duration_s=0.06, max_duration_s=0.6, tokens_per_s=10.0,
    corpus_utterances=2000,
)


@pytest.fixture(scope="module")
def reference_joint_gradients():
    torch.set_num_threads(1)
    return {step: RNNTWorkload(TINY_VARIED, CPU).gradients(8, 1, 1, step_index=step) for step in (0, 1)}


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("accum,split", [(1, 1), (1, 4), (2, 2)])
@pytest.mark.parametrize("step", [0, 1])
def test_the_fused_joint_trains_to_the_reference_gradient(reference_joint_gradients, packed, accum, split, step):
    cfg = replace(TINY_VARIED, joint="fused", packed_joint=packed, joint_chunk_mib=0.0001)
    grads = RNNTWorkload(cfg, CPU).gradients(8 // accum, accum, split, step_index=step)
    for name, g in grads.items():
        torch.testing.assert_close(g, reference_joint_gradients[step][name], rtol=1e-4, atol=1e-6, msg=f"{name} differs")


@pytest.mark.parametrize(
    "changes,message",
    [({"joint": "apex"}, "workload.joint='apex' is not valid: expected one of reference, fused"),
     ({"packed_joint": True}, "workload.packed_joint=true needs workload.joint=fused"),
     ({"num_buckets": 0}, "workload.num_buckets=0"),
     ({"stress_step": -1}, "workload.stress_step=-1")],
)
def test_bad_joint_settings_name_the_value(changes, message):
    context = CheckContext(device="cpu", local_launch=True)
    with pytest.raises(SweepError, match=message.replace("(", r"\(")):
        get_workload("rnnt").validate(replace(TINY_VARIED, **changes), context)


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device: torch.cuda.is_available() is False on this host")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("packed", [False, True])
def test_on_cuda_the_fused_joint_matches_and_holds_about_two_bytes_a_cell(packed):
    """Under the recipe's fp16 autocast on a real GPU: gradients as close to the fp32 reference joint's
    as the fp16 reference joint's are (elementwise, fp16 rounding differs wherever a gradient sums to
    near zero, so the measure is the relative error over the whole tensor), and the CUDA allocator's
    peak over one chunk's joint and loss at most 2.5 bytes a lattice cell above what the chunk's
    inputs and the weight gradients hold (the slope over two lattice sizes)."""
    cuda = torch.device("cuda")
    cfg = replace(TINY_VARIED, vocab=8704, joint_hidden=64, enc_hidden=64, pred_hidden=64, precision="fp16", joint_chunk_mib=4.0)
    fused = RNNTWorkload(replace(cfg, joint="fused", packed_joint=packed), cuda)
    reference = RNNTWorkload(cfg, cuda)
    exact = RNNTWorkload(replace(cfg, precision="fp32"), cuda)
    reference.model.load_state_dict(fused.model.state_dict())
    exact.model.load_state_dict(fused.model.state_dict())
    gen = torch.Generator().manual_seed(0)
    peaks = []
    for frames in (64, 128):
        B, U = 4, 16
        enc = torch.randn(B, frames, 64, generator=gen).to(cuda)
        pred = torch.randn(B, U + 1, 64, generator=gen).to(cuda)
        labels = torch.randint(1, cfg.vocab, (B, U), generator=gen).to(cuda)
        frame_lens, label_lens = torch.tensor([frames, frames // 2, frames, 3]), torch.tensor([U, U, 4, 1])
        grads = {}
        for name, w in (("exact", exact), ("reference", reference), ("fused", fused)):
            w.model.zero_grad(set_to_none=True)
            e, p = enc.clone().requires_grad_(), pred.clone().requires_grad_()
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
            w.joint_and_loss(e, p, labels, 1 / 64, frame_lens, label_lens)  # GradScaler: 2**16 / 64 a cell at most
            torch.cuda.synchronize()
            if w is fused:
                cells = (len(valid_cells(frame_lens, label_lens, frames, U + 1)) if packed else B * frames * (U + 1)) * cfg.vocab
                peaks.append((cells, torch.cuda.max_memory_allocated() - base))
            scale = w.scaler.get_scale() if w.scaler is not None else 1.0
            grads[name] = e.grad.double() / scale
        error = {name: float((grads[name] - grads["exact"]).norm() / grads["exact"].norm()) for name in ("reference", "fused")}
        assert error["fused"] <= max(2 * error["reference"], 1e-3), error
    (c0, p0), (c1, p1) = peaks
    assert (p1 - p0) / (c1 - c0) <= 2.5
