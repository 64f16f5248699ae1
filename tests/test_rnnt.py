"""The RNN-T workload: loss and gradient against brute force, gradient equivalence
across (accum, split) and ranks, multi-rank OOM agreement, joint memory vs split."""

from __future__ import annotations

import os
import socket
import time
import traceback
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.memory import DeviceOOM, MemoryBudget, PeakMemory, configure_cpu_allocator
from sweep.core.schema import PHASE_ENCODER, PHASE_JOINT
from sweep.workloads.rnnt.model import RNNTWorkload, SyntheticData, rnnt_loss, rnnt_loss_bruteforce

CPU = torch.device("cpu")


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    # Two cores shared with other test runs: a second intra-op thread mostly waits for a core.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)

TINY = RNNTWorkloadConfig(
    feat_dim=4, frames=8, subsample=2, label_len=3, vocab=6, enc_hidden=8, enc_layers=2, pred_hidden=8, joint_hidden=8
)
# Joint output of 2 MiB per sample next to an encoder of a few KiB: the joint phase owns the memory.
BIG_JOINT = replace(TINY, frames=32, label_len=7, vocab=2048)
JOINT_HOG = replace(BIG_JOINT, vocab=8192)  # 16 MiB per joint tensor at 4 samples


@pytest.mark.parametrize("B,T,U,V", [(1, 1, 1, 2), (2, 3, 2, 4), (1, 4, 0, 3), (2, 4, 3, 5), (3, 2, 4, 6), (1, 5, 2, 3)])
def test_loss_and_gradient_match_brute_force(B, T, U, V):
    gen = torch.Generator().manual_seed(B * 1000 + T * 100 + U * 10 + V)
    logits = torch.randn(B, T, U + 1, V, dtype=torch.float64, generator=gen, requires_grad=True)
    labels = torch.randint(1, V, (B, U), generator=gen)
    weights = torch.rand(B, dtype=torch.float64, generator=gen)  # a non-uniform upstream gradient

    fast = rnnt_loss(logits.log_softmax(-1), labels)
    (grad_fast,) = torch.autograd.grad((fast * weights).sum(), logits)
    slow = rnnt_loss_bruteforce(logits.log_softmax(-1), labels)
    (grad_slow,) = torch.autograd.grad((slow * weights).sum(), logits)

    torch.testing.assert_close(fast, slow, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(grad_fast, grad_slow, rtol=1e-10, atol=1e-12)
    assert (fast > 0).all()


def test_loss_is_stable_in_float32_on_long_inputs():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 200, 41, 16, generator=gen, requires_grad=True)
    labels = torch.randint(1, 16, (2, 40), generator=gen)
    loss = rnnt_loss(logits.log_softmax(-1), labels)
    loss.sum().backward()
    ref = rnnt_loss(logits.double().log_softmax(-1), labels)
    assert torch.isfinite(logits.grad).all()
    torch.testing.assert_close(loss.double(), ref, rtol=1e-5, atol=1e-3)


def test_synthetic_global_batch_does_not_depend_on_how_it_is_cut():
    data = SyntheticData(TINY, seed=3, device=CPU, size=64)
    whole = data.batch(step_index=1, first_sample=0, count=8, global_batch=8)
    parts = [data.batch(1, first, 2, global_batch=8) for first in range(0, 8, 2)]
    torch.testing.assert_close(torch.cat([p[0] for p in parts]), whole[0])
    torch.testing.assert_close(torch.cat([p[1] for p in parts]), whole[1])
    assert whole[1].min() >= 1 and whole[1].max() < TINY.vocab  # blank (0) is never a target
    assert not torch.equal(whole[0], data.batch(2, 0, 8, 8)[0])  # the next step sees other utterances


@pytest.fixture(scope="module")
def reference_gradients():
    return RNNTWorkload(TINY, CPU).gradients(per_device_batch=8, accum=1, split=1)


@pytest.mark.parametrize("accum,split", [(1, 2), (1, 4), (1, 8), (2, 1), (2, 2), (2, 4), (4, 1), (4, 2), (8, 1)])
def test_every_pair_gives_the_same_gradient(reference_gradients, accum, split):
    grads = RNNTWorkload(TINY, CPU).gradients(per_device_batch=8 // accum, accum=accum, split=split)
    assert grads.keys() == reference_gradients.keys()
    for name, g in grads.items():
        torch.testing.assert_close(g, reference_gradients[name], rtol=1e-4, atol=1e-6, msg=f"{name} differs")
    assert any(g.abs().sum() > 0 for g in grads.values())


def test_train_step_updates_parameters_and_ends_idle():
    w = RNNTWorkload(TINY, CPU)
    before = [p.detach().clone() for p in w.model.parameters()]
    phases = []
    w.on_phase = phases.append
    w.train_step(per_device_batch=4, accum=2, split=2, step_index=0)
    assert any(not torch.equal(a, p) for a, p in zip(before, w.model.parameters()))
    assert phases[:2] == [PHASE_ENCODER, PHASE_JOINT] and phases[-2:] == ["optimizer", None]
    assert w.phase is None


def test_split_must_divide_the_per_device_batch():
    with pytest.raises(ValueError, match="not a positive multiple"):
        RNNTWorkload(TINY, CPU).train_step(per_device_batch=6, accum=1, split=4, step_index=0)


def test_joint_phase_peak_memory_falls_as_split_grows():
    configure_cpu_allocator()  # as a trial does: big tensors get their own mappings, freed on release
    w = RNNTWorkload(BIG_JOINT, CPU)
    w.warm_up(8)
    peaks, meter, previous = {}, PeakMemory(CPU), [None]

    def on_phase(phase):
        if phase == PHASE_JOINT:
            meter.rebase()  # the joint alone, above what the encoder already holds
        elif previous[0] == PHASE_JOINT:
            peaks[split] = meter.peak_bytes()
        previous[0] = phase

    w.on_phase = on_phase
    for split in (8, 4, 2, 1):
        w.gradients(per_device_batch=8, accum=1, split=split)
    mib = {s: round(b / 2**20, 1) for s, b in peaks.items()}
    assert peaks[1] > peaks[2] > peaks[4] > peaks[8], mib
    assert peaks[1] > 3 * peaks[8], mib


# -- two ranks on gloo


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_rank_worker(rank: int, port: int, out_dir: str) -> None:
    out = Path(out_dir)
    torch.set_num_threads(1)  # two processes on a small box
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        grads = RNNTWorkload(TINY, CPU, rank=rank, world_size=2).gradients(per_device_batch=4, accum=1, split=2)
        if rank == 0:
            torch.save(grads, out / "grads.pt")

        # Only rank 1 gets a budget too small for its joint output: it runs out, rank 0 does not.
        configure_cpu_allocator()
        w = RNNTWorkload(JOINT_HOG, CPU, rank=rank, world_size=2)
        w.warm_up(4)
        budget = MemoryBudget(CPU, 4 / 1024 if rank == 1 else None)
        budget.enforce()
        try:
            w.train_step(per_device_batch=4, accum=1, split=1, step_index=0)
            outcome = "no error"
        except DeviceOOM as exc:
            outcome = f"{exc.phase} rank={exc.rank} {exc}"
        finally:
            budget.lift()
        dist.barrier()  # both ranks got here: neither is stuck in a collective
        (out / f"rank{rank}.txt").write_text(outcome)
        dist.barrier()
    except BaseException:
        traceback.print_exc()
        os._exit(1)
    # Leave without gloo's teardown: it can abort ("terminate called without an active
    # exception") when the peer closes its side first, failing a rank whose work is done.
    os._exit(0)


def test_two_ranks_match_one_and_agree_on_an_oom(tmp_path):
    ctx = mp.start_processes(
        _two_rank_worker, args=(_free_port(), str(tmp_path)), nprocs=2, join=False, start_method="spawn"
    )
    deadline = time.monotonic() + 120
    while not ctx.join(timeout=1):
        if time.monotonic() > deadline:
            for p in ctx.processes:
                p.kill()
            pytest.fail("ranks did not finish in 120 s: deadlock after a one-rank OOM?")

    single = RNNTWorkload(TINY, CPU).gradients(per_device_batch=8, accum=1, split=1)
    two = torch.load(tmp_path / "grads.pt")
    for name, g in single.items():
        torch.testing.assert_close(two[name], g, rtol=1e-4, atol=1e-6, msg=f"{name} differs")

    for rank in (0, 1):
        outcome = (tmp_path / f"rank{rank}.txt").read_text()
        assert outcome.startswith("joint rank=1 DefaultCPUAllocator: can't allocate memory"), (rank, outcome)
        assert outcome.endswith("in phase joint"), (rank, outcome)
