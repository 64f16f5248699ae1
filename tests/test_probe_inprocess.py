"""The probe armed in this process (sweep.probe.install), and the built-in trial measured by it (issue 29 §2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from support.trials import JOINT_HOG, make_spec, run_in_own_process

from sweep import probe
from sweep.core.schema import RESULT_FILE, Status
from sweep.records import read_result
from sweep.workloads.rnnt.runner import PROBE_SUBDIR, run_trial


@pytest.fixture
def disarmed_after():
    """The process's probe with no hooks in, before the test and after it. Before: a built-in trial run in this
    worker by an earlier test (tests/test_racing.py) leaves the probe armed, as a warm worker keeps it between
    trials, and hooks installed then would wrap torch.cuda as it was, not as this test patches it."""
    probe.runtime().PROBE.disarm()
    yield probe.runtime().PROBE
    probe.runtime().PROBE.disarm()


def train(steps: int) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        model(torch.randn(8, 16)).sum().backward()
        opt.step()
        opt.zero_grad()


def test_install_arms_this_process_and_a_new_dir_starts_a_new_record(tmp_path, disarmed_after):
    original_backward = torch.autograd.backward
    probe.install(tmp_path / "a")
    train(4)
    probe.install(tmp_path / "b")  # the built-in's next trial in the same process
    train(3)
    a, b = probe.read_probe(tmp_path / "a"), probe.read_probe(tmp_path / "b")
    assert [s.index for s in a.steps] == [0, 1, 2, 3] and a.problems == []
    assert [s.index for s in b.steps] == [0, 1, 2]
    assert [r["step"] for r in disarmed_after.steps] == [0, 1, 2]  # kept in memory for the caller too
    disarmed_after.disarm()
    assert torch.autograd.backward is original_backward
    from torch.optim.optimizer import _global_optimizer_post_hooks, _global_optimizer_pre_hooks

    assert not _global_optimizer_pre_hooks and not _global_optimizer_post_hooks
    train(2)
    assert len(probe.read_probe(tmp_path / "b").steps) == 3  # nothing more once disarmed


def test_the_builtin_trial_is_measured_by_the_probe(tmp_path, disarmed_after):
    spec = make_spec(tmp_path)
    result = run_trial(spec)
    report = probe.read_probe(Path(spec.trial_dir) / PROBE_SUBDIR)
    assert result.status == Status.OK and result.measured_by == "probe" and result.ranks_seen == 1
    # Warm-up (1 step) then 4 timed: the trial's step times are the probe's, warm-up left out, and so are
    # the leading timed steps core/steady.py judged still warming (a busy box can make step 2 slow).
    assert len(report.steps) == 5
    assert result.warmup_steps == 1 + result.transient_steps
    assert result.step_times_s == report.step_times_s[result.warmup_steps :]
    assert len(result.step_peak_reserved_gib) == 5 and max(result.step_peak_reserved_gib) == pytest.approx(result.peak_reserved_gib)
    assert result.peak_step in range(5)
    assert read_result(Path(spec.trial_dir) / RESULT_FILE) == result


def test_the_builtin_ooms_module_is_the_probes(tmp_path):
    spec = make_spec(tmp_path, accum=1, split=1, global_batch=4, memory_gib=4 / 1024, workload=JOINT_HOG, cpu_threads=1)
    code = "import pickle, sys; from sweep.workloads.rnnt.runner import run_trial; run_trial(pickle.load(open(sys.argv[1], 'rb')))"
    proc = run_in_own_process(tmp_path, code, spec)
    assert proc.returncode == 0, proc.stderr[-3000:]
    record = read_result(Path(spec.trial_dir) / RESULT_FILE)
    assert (record.status, str(record.oom_phase), record.measured_by) == (Status.OOM, "joint", "probe")
    assert record.oom_module.startswith("joint_")  # the joint's layers: joint_enc, joint_pred, joint_out
    report = probe.read_probe(Path(spec.trial_dir) / PROBE_SUBDIR)
    assert report.oom is not None and report.oom.module == record.oom_module
    assert report.oom.message.startswith("DefaultCPUAllocator: can't allocate memory")


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU())
        self.joint = torch.nn.Linear(8, 2)

    def forward(self, x):
        return self.joint(self.encoder(x))


def test_modules_are_tracked_live_only_until_the_first_step_closes(tmp_path, disarmed_after):
    from torch.nn.modules.module import _global_forward_hooks, _global_forward_pre_hooks

    net, leaf = Net(), torch.nn.Linear(8, 8)  # the leaf is called on its own, as a root
    opt = torch.optim.SGD([*net.parameters(), *leaf.parameters()], lr=0.1)

    def step():
        net(leaf(torch.randn(4, 8))).sum().backward()
        opt.step()

    probe.install(tmp_path / "a")
    assert _global_forward_pre_hooks and _global_forward_hooks
    step()
    step()  # one optimizer: the first step closes as the second begins
    # No hook per module call is left but the container root's own (a leaf root's would slow every call for nothing).
    assert not _global_forward_pre_hooks and not _global_forward_hooks
    assert len(net._forward_hooks) == 1 and not leaf._forward_hooks and not net.encoder._forward_hooks
    probe.install(tmp_path / "b")  # a new record: its first step is tracked live again
    assert _global_forward_pre_hooks and not net._forward_hooks
    disarmed_after.disarm()
    assert not _global_forward_pre_hooks and not _global_forward_hooks and not net._forward_hooks


def test_a_backward_node_is_named_by_the_module_owning_the_nearest_parameter(tmp_path, disarmed_after):
    net = Net()
    probe.install(tmp_path)
    hidden = net.encoder(torch.randn(4, 8))
    out = net.joint(hidden)
    measured = disarmed_after
    measured.roots.add(net)  # as the live tracking of a first step records it
    assert measured._nearest_parameter_owner(out.grad_fn) == "joint"  # AddmmBackward: joint's bias one edge away
    assert measured._nearest_parameter_owner(hidden.grad_fn) == "encoder.0"  # ReluBackward, then encoder.0's Addmm
    assert measured._nearest_parameter_owner((out * 2).sum().grad_fn) == "joint"


def test_the_allocator_observer_names_the_node_backward_runs(tmp_path, disarmed_after):
    """What CUDA's allocator does on an OOM (it calls the observer where the allocation failed, here on the
    thread running a backward node), driven on the CPU: the node comes from the autograd engine itself."""
    measured = disarmed_after

    class Observed(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            return x * 2

        @staticmethod
        def backward(ctx, grad):
            measured._cuda_oom_observer(0, 1 << 40, 0, 0)
            return grad * 2

    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    probe.install(tmp_path)
    for step in range(3):
        out = net(torch.randn(4, 8))
        (Observed.apply(out) if step == 2 else out).sum().backward()
        opt.step()
    oom = probe.read_probe(tmp_path).oom
    assert oom is not None and (oom.module, oom.where, oom.step, oom.via) == ("joint", "backward", 2, "autograd node")
    assert oom.message.startswith("CUDA out of memory: tried to allocate 1099511627776 bytes")


class FakeAllocator:
    """torch.cuda's peak statistics on a CPU host: an allocation per step, freed before the next."""

    def __init__(self) -> None:
        self.allocated = self.peak = 10
        self.retries = 0  # num_alloc_retries: only ever rises, as the allocator's own

    def use(self, size: int) -> None:
        self.peak = max(self.peak, size)

    def memory_stats(self, device=None) -> dict:
        return {"allocated_bytes.all.current": self.allocated, "allocated_bytes.all.peak": self.peak,
                "reserved_bytes.all.peak": self.peak, "num_alloc_retries": self.retries}

    def reset_peak_memory_stats(self, device=None) -> None:
        self.peak = self.allocated


def fake_cuda(monkeypatch) -> FakeAllocator:
    """torch.cuda as the probe sees it, its allocator statistics played by a FakeAllocator (no GPU needed)."""
    fake = FakeAllocator()
    for module in (torch.cuda.memory, torch.cuda):
        monkeypatch.setattr(module, "memory_stats", fake.memory_stats)
        monkeypatch.setattr(module, "reset_peak_memory_stats", fake.reset_peak_memory_stats)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
    return fake


def test_the_trainer_reads_its_own_cuda_peaks_though_the_probe_resets_them_each_step(tmp_path, monkeypatch, disarmed_after):
    """The probe reads and resets the allocator's peaks at every step; the trainer's max_memory_allocated
    is still the largest since its own last reset (tests/test_probe_gpu.py checks it on a real card)."""
    fake = fake_cuda(monkeypatch)
    probe.install(tmp_path / "probe")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    seen = []
    for step, size in enumerate([100, 300, 200, 500, 100, 150]):
        fake.use(size)
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
        seen.append(torch.cuda.max_memory_allocated())
        if step == 2:
            torch.cuda.reset_peak_memory_stats()  # the trainer's own window starts again
    probe.install(tmp_path / "next")  # closes the first record
    assert seen == [100, 300, 300, 500, 500, 500]
    assert [s.peak_bytes for s in probe.read_probe(tmp_path / "probe").steps] == [100, 300, 200, 500, 100, 150]
    disarmed_after.disarm()
    assert torch.cuda.memory_stats == fake.memory_stats  # the view is taken out with the hooks


def test_allocator_retries_in_timed_steps_reach_the_result_and_put_the_pair_at_risk(tmp_path, monkeypatch, disarmed_after):
    """The probe's per-step retries (num_alloc_retries' rise) through the command workload's fields and the
    built-in's _record_memory to at_risk; tests/test_probe_gpu.py checks the count on a real card."""
    from types import SimpleNamespace

    from sweep.core.growth import RETRIES_PREFIX, at_risk, retries_note
    from sweep.core.schema import TrialResult
    from sweep.workloads.command.probed import ProbeFollower
    from sweep.workloads.rnnt.runner import _record_memory

    fake = fake_cuda(monkeypatch)
    fake.retries = 5  # start-up's: they land in step 0, which never counts
    probe.install(tmp_path / "probe")
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for retried in [2, 0, 0, 1, 0, 3]:  # steps 0 and 1 are warm-up; steps 2 to 5 are timed
        fake.use(100)
        fake.retries += retried
        model(torch.randn(2, 4)).sum().backward()
        opt.step()
        opt.zero_grad()
    probe.install(tmp_path / "next")  # closes the first record
    report = probe.read_probe(tmp_path / "probe")
    assert report.step_retries == [7, 0, 0, 1, 0, 3]
    follower = ProbeFollower(tmp_path / "probe", warmup_steps=2, global_batch_size=8, tokens_per_sample=None, unit="samples/s")
    follower.report = report
    pair = dict(accum=1, split=1, per_device_batch=8, joint_batch=8, global_batch_size=8, num_devices=1, status=Status.OK)
    command = TrialResult(**pair, **follower.ok_fields(), **follower.memory_fields("cuda", 80.0))
    assert command.step_alloc_retries == [7, 0, 0, 1, 0, 3] and at_risk(command)
    assert retries_note(command).startswith(f"{RETRIES_PREFIX}: 4 retries at steps 3, 5 of 6")
    # The built-in's result, from the same report (a CPU baseline: no device properties to read on this host).
    builtin = TrialResult(**pair, warmup_steps=2)
    baseline = SimpleNamespace(device=torch.device("cpu"), used_above=lambda b: b, counted_above=lambda b: b)
    _record_memory(builtin, report, {}, baseline, 1.0, 0.05)
    assert builtin.step_alloc_retries == [7, 0, 0, 1, 0, 3] and at_risk(builtin) and not builtin.tight
    # The same trial with retries only in warm-up is not at risk.
    builtin.step_alloc_retries = [7, 2, 0, 0, 0, 0]
    assert not at_risk(builtin)
    disarmed_after.disarm()


class Exhausting(torch.nn.Module):
    """A layer that runs out of memory on its second call (an out-of-memory error as the CPU allocator words it)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        if self.calls == 2:
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1099511627776 bytes.")
        return x


def test_after_an_oom_the_probe_keeps_no_model_or_optimizer_alive(tmp_path, disarmed_after):
    """A warm worker runs its next trial in the same process only if the last one's memory is all given back
    (launch/worker.py): the probe's record of where the OOM happened must not hold the model."""
    import gc
    import weakref

    probe.install(tmp_path / "probe")
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), Exhausting(), torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(RuntimeError, match="can't allocate memory"):
        for _ in range(2):  # the OOM comes in the second step, while modules are still tracked live
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
    refs = [weakref.ref(model), weakref.ref(opt)]
    del model, opt
    gc.collect()
    assert [ref() for ref in refs] == [None, None]
    oom = disarmed_after.ooms[-1]
    assert (oom["module"], oom["step"]) == ("1", 1)
