"""The RNN-T workload: loss and gradient against brute force, gradient equivalence
across (accum, split) and ranks, multi-rank OOM agreement, joint memory vs split."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import traceback
from dataclasses import asdict, replace
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from sweep import workloads
from sweep.core.schema import PHASE_ENCODER, PHASE_JOINT
from sweep.errors import SweepError
from sweep.workloads.base import CheckContext
from sweep.workloads.rnnt import model as rnnt_model
from sweep.workloads.rnnt.config import RNNTWorkloadConfig
from sweep.workloads.rnnt.data import (
    buckets,
    corpus,
    encoder_frames,
    joint_bytes_per_cell,
    length_spec,
    parameter_count,
    size_summary,
    step_lengths,
    worst_batch_cells,
)
from sweep.workloads.rnnt.memory import DeviceOOM, MemoryBudget, configure_cpu_allocator
from sweep.workloads.rnnt.model import (
    RNNT,
    RNNTWorkload,
    SyntheticData,
    autocast_dtype,
    cpu_bf16_supported,
    rnnt_loss,
    rnnt_loss_bruteforce,
)

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
    """The resident peak (VmHWM) counts pages first touched, not bytes allocated, so it measures a step only
    in a process as fresh as a trial's. In a pytest worker, memory earlier tests freed stays resident in
    glibc's heap (mallopt's mmap threshold only applies when the heap cannot serve a request), and a joint
    served from it touched no new page: the split=8 and split=4 peaks read 0.0 and 1.8 MiB there, against
    2.9 and 5.9 fresh, and the order failed now and then in a full run. So it runs in a spawned child."""
    code = (f"import json, sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); from support.rnnt import joint_phase_peaks; "
            "from sweep.workloads.rnnt.config import RNNTWorkloadConfig; "
            f"print(json.dumps(joint_phase_peaks(RNNTWorkloadConfig(**{asdict(BIG_JOINT)!r}), (8, 4, 2, 1))))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    peaks = {int(s): b for s, b in json.loads(child.stdout.splitlines()[-1]).items()}
    mib = {s: round(b / 2**20, 1) for s, b in peaks.items()}
    assert peaks[1] > peaks[2] > peaks[4] > peaks[8] > 0, mib
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
        # Two micro-batches per rank: the first under DDP's no_sync(), the second all-reduces both.
        ddp = RNNTWorkload(TINY, CPU, rank=rank, world_size=2)
        assert isinstance(ddp.ddp, torch.nn.parallel.DistributedDataParallel)
        accumulated = ddp.gradients(per_device_batch=2, accum=2, split=2)
        if rank == 0:
            torch.save(grads, out / "grads.pt")
            torch.save(accumulated, out / "grads_accum2.pt")

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
    for file in ("grads.pt", "grads_accum2.pt"):
        two = torch.load(tmp_path / file)
        assert set(two) == set(single)
        for name, g in single.items():
            torch.testing.assert_close(two[name], g, rtol=1e-4, atol=1e-6, msg=f"{file}: {name} differs")

    for rank in (0, 1):
        outcome = (tmp_path / f"rank{rank}.txt").read_text()
        assert outcome.startswith("joint rank=1 DefaultCPUAllocator: can't allocate memory"), (rank, outcome)
        assert outcome.endswith("in phase joint"), (rank, outcome)


# -- real scale: presets, variable lengths, mixed precision

CONF = Path(__file__).resolve().parents[1] / "conf" / "workload"


def preset(name: str) -> RNNTWorkloadConfig:
    import yaml

    values = yaml.safe_load((CONF / f"{name}.yaml").read_text()) or {}
    values.pop("defaults", None)
    return RNNTWorkloadConfig(**values)


def scaled_down(cfg: RNNTWorkloadConfig) -> RNNTWorkloadConfig:
    """The preset's structure (stacking, pre/post layers, depths, length distribution) at CPU-test widths."""
    return replace(
        cfg, feat_dim=4, vocab=cfg.vocab // 1024, enc_hidden=cfg.enc_hidden // 128, pred_hidden=cfg.pred_hidden // 64,
        joint_hidden=cfg.joint_hidden // 64, enc_layers=2, duration_mean_s=0.3, duration_std_s=0.1,
        min_duration_s=0.06, max_duration_s=0.6, tokens_per_s=10.0,
    )


# Variable lengths at test size: 6 to 60 frames (1 to 10 encoder frames), 1 to 6 tokens.
VARIED = scaled_down(preset("rnnt_base"))


@pytest.mark.parametrize("name", ["rnnt", "rnnt_base", "rnnt_large"])
def test_parameter_count_from_dimensions_matches_the_model(name):
    cfg = preset(name)
    with torch.device("meta"):  # the full-size model without allocating it
        model = RNNT(cfg)
    assert parameter_count(cfg) == sum(p.numel() for p in model.parameters())


def test_presets_have_caiman_asr_dimensions_and_published_sizes():
    base, large = preset("rnnt_base"), preset("rnnt_large")
    assert (base.enc_hidden, base.pred_hidden, base.joint_hidden, base.vocab) == (1024, 512, 768, 8704)
    assert (large.enc_hidden, large.pred_hidden, large.joint_hidden, large.vocab) == (1536, 768, 1024, 17408)
    for cfg in (base, large):
        assert (cfg.feat_dim * cfg.subsample, cfg.enc_pre_layers, cfg.enc_stack_time, cfg.enc_layers, cfg.pred_layers) == (240, 2, 2, 6, 2)
        assert cfg.lengths == "lognormal" and cfg.precision == "auto"
    # caiman-asr's docs list base at 85M and large at 196M parameters.
    assert round(parameter_count(base) / 1e6) == 85 and round(parameter_count(large) / 1e6) == 196
    assert preset("rnnt") == RNNTWorkloadConfig()  # the CPU demo stays the schema's defaults


@pytest.mark.parametrize("name", ["rnnt_base", "rnnt_large"])
def test_scaled_down_preset_shapes(name):
    cfg = scaled_down(preset(name))
    w = RNNTWorkload(cfg, CPU)
    assert w.model.encoder_pre is not None and w.model.encoder_pre.num_layers == 2 and w.model.pred_rnn.num_layers == 2
    feats, labels, frame_lens, label_lens = w.data.padded_batch(step_index=0, first_sample=0, count=4, global_batch=4)
    spec = length_spec(cfg)
    assert feats.shape == (4, spec.max_frames, cfg.feat_dim) and labels.shape == (4, spec.max_tokens)
    enc, pred = w.model.encoder_forward(feats), w.model.prediction_forward(labels)
    T = encoder_frames(spec.max_frames, cfg.subsample, cfg.enc_stack_time)
    assert enc.shape == (4, T, cfg.enc_hidden) and pred.shape == (4, spec.max_tokens + 1, cfg.pred_hidden)
    assert frame_lens.tolist() == [T] * 4 and label_lens.tolist() == [spec.max_tokens] * 4
    assert w.model.joint_forward(enc, pred).shape == (4, T, spec.max_tokens + 1, cfg.vocab)
    assert f"{T} x {spec.max_tokens + 1} x {cfg.vocab}" in size_summary(cfg)


def test_padded_loss_equals_each_utterance_alone():
    gen = torch.Generator().manual_seed(7)
    B, T, U, V = 4, 6, 4, 5
    logits = torch.randn(B, T, U + 1, V, dtype=torch.float64, generator=gen, requires_grad=True)
    labels = torch.randint(1, V, (B, U), generator=gen)
    frame_lens, label_lens = torch.tensor([6, 3, 1, 4]), torch.tensor([2, 4, 0, 3])
    weights = torch.rand(B, dtype=torch.float64, generator=gen)
    padded = rnnt_loss(logits.log_softmax(-1), labels, frame_lens=frame_lens, label_lens=label_lens)
    (grad,) = torch.autograd.grad((padded * weights).sum(), logits)
    for b in range(B):
        t, u = int(frame_lens[b]), int(label_lens[b])
        alone = logits[b : b + 1, :t, : u + 1].detach().requires_grad_()
        ref = rnnt_loss_bruteforce(alone.log_softmax(-1), labels[b : b + 1, :u])
        (ref_grad,) = torch.autograd.grad(ref.sum() * weights[b], alone)
        torch.testing.assert_close(padded[b], ref[0], rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(grad[b, :t, : u + 1], ref_grad[0], rtol=1e-10, atol=1e-12)
        assert grad[b, t:].abs().sum() == 0 and grad[b, :, u + 1 :].abs().sum() == 0  # padding learns nothing


def test_lengths_are_the_same_utterances_in_the_same_order_for_every_cut():
    data = SyntheticData(VARIED, seed=3, device=CPU)
    spec = data.spec
    for step in (0, 1, 2):
        whole = data.lengths(step, 0, 16, global_batch=16)
        for count in (1, 2, 4, 8):
            parts = [data.lengths(step, first, count, 16) for first in range(0, 16, count)]
            assert [f for p in parts for f in p[0]] == whole[0] and [u for p in parts for u in p[1]] == whole[1]
    # Step 0 is the long tail on purpose: the longest bucket's longest utterances, longest first,
    # so the first rank, micro-batch and joint chunk of the first step is padded to the maximum.
    worst = data.lengths(0, 0, 16, 16)
    assert worst[0][0] == spec.max_frames and worst[0] == sorted(worst[0], reverse=True)
    frames, tokens = data.lengths(1, 0, 16, 16)
    assert len(set(frames)) > 1 and max(frames) <= min(worst[0]) and min(frames) >= spec.min_frames
    assert frames != data.lengths(2, 0, 16, 16)[0]  # the next step sees other lengths
    assert SyntheticData(VARIED, seed=3, device=CPU).lengths(1, 0, 16, 16) == (frames, tokens)  # fixed by the seed
    feats, labels, frame_lens, label_lens = data.padded_batch(1, 4, 4, 16)
    assert feats.shape[1] == max(frames[4:8]) and labels.shape[1] == max(tokens[4:8])  # padded to its longest
    assert all(feats[i, f:].abs().sum() == 0 for i, f in enumerate(frames[4:8]))


def test_default_duration_distribution_is_librispeech_shaped():
    # The corpus the buckets are cut from (each step draws from one bucket, so a few steps' mean is not the corpus's).
    spec = length_spec(replace(RNNTWorkloadConfig(), lengths="lognormal"))
    seconds = [f * spec.frame_shift_ms / 1000 for f, _ in corpus(spec, 0)]
    mean = sum(seconds) / len(seconds)
    assert len(seconds) == 281241  # LibriSpeech train-960's utterances
    assert 12.2 < mean < 12.4, mean  # LibriSpeech train-960: 960.9 h / 281,241 utterances = 12.3 s
    assert max(seconds) <= 35.0 and min(seconds) >= 0.5
    assert 0.05 < sum(s > 17 for s in seconds) / len(seconds) < 0.2  # a real tail above the mean


@pytest.mark.parametrize("num_buckets", [1, 2, 6])
def test_each_step_draws_from_one_duration_bucket_and_the_worst_batch_comes_twice(num_buckets):
    spec = length_spec(replace(VARIED, corpus_utterances=3000, num_buckets=num_buckets, stress_step=9))
    cut = buckets(spec, 3)
    assert len(cut) == num_buckets and sum(map(len, cut)) == 3000
    assert all(max(a) <= min(b) for a, b in zip(cut, cut[1:]))  # sorted by duration, bucket after bucket
    seen = set()
    for step in range(1, 30):
        if step == 9:
            continue
        batch = step_lengths(spec, 3, step, 64)
        homes = [i for i, bucket in enumerate(cut) if set(batch) <= set(bucket)]
        assert homes, f"step {step} mixes buckets"
        seen.add(homes[0])
    assert seen == set(range(num_buckets))  # every bucket comes up
    worst = step_lengths(spec, 3, 0, 64)
    assert worst == step_lengths(spec, 3, 9, 64) == tuple(sorted(corpus(spec, 3), reverse=True)[:64])
    others = [step_lengths(spec, 3, s, 64) for s in range(1, 9)]
    assert all(sum(f * u for f, u in worst) >= sum(f * u for f, u in batch) for batch in others)  # the most lattice
    assert step_lengths(replace(spec, stress_step=0), 3, 9, 64) != worst  # stress_step=0: step 0 only


@pytest.fixture(scope="module")
def varied_reference():
    return {step: RNNTWorkload(VARIED, CPU).gradients(per_device_batch=8, accum=1, split=1, step_index=step) for step in (0, 1)}


@pytest.mark.parametrize("accum,split", [(1, 2), (1, 8), (2, 1), (2, 4), (4, 2), (8, 1)])
@pytest.mark.parametrize("step", [0, 1])
def test_every_pair_gives_the_same_gradient_with_variable_lengths(varied_reference, accum, split, step):
    grads = RNNTWorkload(VARIED, CPU).gradients(per_device_batch=8 // accum, accum=accum, split=split, step_index=step)
    for name, g in grads.items():
        torch.testing.assert_close(g, varied_reference[step][name], rtol=1e-4, atol=1e-6, msg=f"{name} differs")
    assert all(g.abs().sum() > 0 for g in grads.values())


def test_varied_training_steps_run_from_the_max_length_step():
    w = RNNTWorkload(VARIED, CPU)
    for step in range(3):
        w.train_step(per_device_batch=4, accum=2, split=2, step_index=step)
    assert all(torch.isfinite(p).all() for p in w.model.parameters())


@pytest.mark.parametrize(
    "precision,device,dtype",
    [("fp32", "cpu", None), ("auto", "cpu", None), ("auto", "cuda", torch.float16), ("fp16", "cuda", torch.float16),
     ("fp32", "cuda", None), ("bf16", "cpu", torch.bfloat16), ("fp16", "cpu", torch.float16)],
)
def test_precision_picks_autocast_only_where_asked_or_on_cuda(precision, device, dtype, monkeypatch):
    monkeypatch.setattr(rnnt_model, "cpu_bf16_supported", lambda: True)  # the choice, on any CPU
    assert autocast_dtype(precision, torch.device(device)) is dtype


def test_bf16_on_a_cpu_without_bf16_kernels_names_the_value_and_the_fix(monkeypatch):
    # An AVX2-only CPU: oneDNN's LSTM would fail later with "could not create a primitive descriptor".
    monkeypatch.setattr(rnnt_model, "cpu_bf16_supported", lambda: False)
    with pytest.raises(ValueError, match=r"workload.precision=bf16 needs a CPU .*; use fp32"):
        autocast_dtype("bf16", CPU)
    # Checked before anything launches where the trials run on this host's CPU; elsewhere the trial's own
    # host decides (a Slurm node, a GPU), and its failure names the same fix.
    rnnt_workload = workloads.get("rnnt")
    bf16 = replace(TINY, precision="bf16")
    with pytest.raises(SweepError, match=r"workload.precision=bf16 needs a CPU"):
        rnnt_workload.validate(bf16, CheckContext(local_launch=True, device="cpu"))
    rnnt_workload.validate(bf16, CheckContext(local_launch=False, device="cpu"))
    rnnt_workload.validate(bf16, CheckContext(local_launch=True, device="cuda"))


def test_bad_precision_and_lengths_name_the_value():
    with pytest.raises(ValueError, match="workload.precision='fp8'"):
        autocast_dtype("fp8", CPU)
    with pytest.raises(ValueError, match="workload.lengths='uniform'"):
        length_spec(replace(TINY, lengths="uniform"))


@pytest.mark.skipif(not cpu_bf16_supported(), reason="this CPU's oneDNN has no bfloat16 kernels (e.g. AVX2 only)")
def test_bf16_autocast_step_on_cpu_when_asked():
    w = RNNTWorkload(replace(VARIED, precision="bf16"), CPU)
    assert w.amp_dtype is torch.bfloat16 and w.scaler is None
    loss = w.micro_batch(per_device_batch=4, accum=1, split=2, step_index=1, micro_index=0)
    assert torch.isfinite(loss) and all(p.grad is None or torch.isfinite(p.grad).all() for p in w.model.parameters())


def test_dry_run_names_the_worst_batch_joint_padded_and_packed():
    base = preset("rnnt_base")
    text = size_summary(base)
    padded, packed = worst_batch_cells(base, 16)
    assert packed <= padded == 16 * 327 * 70 * 8704  # the corpus's longest utterances: 19.65 s, 68-69 tokens
    assert "joint=fused packed on CUDA" in text and "the worst batch at step 0 and step 9" in text
    # fp16 logits alone (2 bytes a cell) against the reference's fp32 log-probs and gradients (10).
    assert joint_bytes_per_cell("fused", "auto", on_cuda=True) == 2 and joint_bytes_per_cell("reference", "auto", on_cuda=True) == 10
    assert joint_bytes_per_cell("fused", "auto", on_cuda=False) == 4 and joint_bytes_per_cell("reference", "fp32", on_cuda=True) == 12
    assert f"reference padded {padded * 10 / 1024**3:.2f} GiB, fused padded {padded * 2 / 1024**3:.2f} GiB" in text
