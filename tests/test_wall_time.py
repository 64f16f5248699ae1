"""Issue 50: the figure is the speed a user trains at, samples over wall time with every stall counted, and the table
says where steps stall (core/stats.py throughput_summary and stall_note, core/table.py's `stalls` mark)."""

from __future__ import annotations

import csv
import math
import re
import sys
from pathlib import Path

import pytest
from support.results import trial_result

from sweep.core.confidence import confidence_score, leader_probability
from sweep.core.implications import leader_key
from sweep.core.measure import enough_measured
from sweep.core.ranking import SweepMeta, build_table
from sweep.core.schema import TrialResult
from sweep.core.space import enumerate_candidates
from sweep.core.stats import stall_note, throughput_summary
from sweep.core.steady import steady_steps
from sweep.core.table import STALLS_MARK, render_plain, sweep_table

GBS = 64
META = SweepMeta(sweep_id="t", machine="local", workload="command", global_batch_size=GBS, num_devices=1)


def jittered(step_s: float, n: int) -> list[float]:
    """n steps of step_s with a deterministic +-1% jitter (its mean is step_s)."""
    return [step_s * (1 + 0.01 * ((i * 7) % 5 - 2) / 2) for i in range(n)]


def stalling(wall_speed: float, n: int, every: int = 3, factor: float = 4.2) -> list[float]:
    """n steps whose every `every`-th step takes `factor` times the typical one, at a true wall-time speed of
    wall_speed samples/s: `every` steps take every * GBS / wall_speed seconds together."""
    typical = every * GBS / wall_speed / (every - 1 + factor)
    return [t * (factor if i % every == every - 1 else 1.0) for i, t in enumerate(jittered(typical, n))]


def ok(accum: int, times: list[float]) -> TrialResult:
    kept = steady_steps(times)  # as the trial processes do: leading warm-up out, the rest is the figure
    return trial_result(accum, gbs=GBS, times=kept, steps_measured=len(kept), measured_by="probe")


def table_of(results: list[TrialResult]) -> str:
    cands = enumerate_candidates(GBS, 1, [1, 2, 4], [1])
    return render_plain(sweep_table(build_table(META, cands, {r.key: r for r in results}, done=True)))


def test_three_pairs_are_ordered_by_wall_time_and_the_stalling_one_is_marked():
    """The issue's case: accum=1's typical step is the fastest (1300 samples/s) but every third step takes 4.2x as
    long, so it trains at 629 samples/s, against 867 and 907. The median step ranked it first at 99 as 1.34x."""
    truth = {1: 629.0, 2: 867.0, 4: 907.0}
    results = [ok(1, stalling(truth[1], 30)), ok(2, jittered(GBS / truth[2], 30)), ok(4, jittered(GBS / truth[4], 30))]
    by_accum = {r.accum: r for r in results}
    assert GBS / sorted(by_accum[1].step_times_s)[15] > 1.3 * truth[4]  # its median step is the fastest by far
    for accum, speed in truth.items():  # each figure is its true speed over wall time, the stalls counted
        r = by_accum[accum]
        assert r.throughput == pytest.approx(speed, rel=0.01), r
        assert r.throughput_low < speed < r.throughput_high  # and its 95% interval holds it
    assert leader_key({r.key: r for r in results}) == by_accum[4].key
    assert [r.accum for r in sorted(results, key=lambda r: -r.throughput)] == [4, 2, 1]
    # The stalling pair is marked, with how often and how long; the steady ones are not.
    note = stall_note(by_accum[1].step_times_s)
    assert re.fullmatch(r"stalls: 1 step in 3 ran 4\.2x the typical step \(the median step\); the figure counts them: "
                        r"5[0-9]% below the median step's speed", note), note
    assert stall_note(by_accum[2].step_times_s) == stall_note(by_accum[4].step_times_s) == ""
    text = table_of(results)
    lines = text.splitlines()
    assert lines[0].split()[-1] == "mark"
    row1 = next(line for line in lines[1:] if line.split()[:3] == ["3", "1", "64"])  # rank 3, accum 1, per_dev 64
    assert row1.split()[-1] == STALLS_MARK, text
    assert not any(line.split()[-1] == STALLS_MARK for line in lines[1:4] if line is not row1)
    assert "ok but stalling:" in text and "accum=1 ok: stalls: 1 step in 3 ran 4.2x" in text, text
    assert "the figure is samples over wall time, stalls included" in text  # the legend


def test_stall_every_third_step_interval_is_honest_but_not_the_independent_steps_one():
    """Periodic stalls are a near-certain count in a window (one a period), so the interval is far narrower than the
    steps taken as independent would make it; stalls at random positions keep the binomial width."""
    periodic = stalling(629.0, 30)
    scattered = sorted(periodic, key=lambda t: (t * 1e6) % 7)  # the same steps, stalls no longer at a fixed period
    _, lo_p, hi_p = throughput_summary(periodic, GBS)
    _, lo_s, hi_s = throughput_summary(scattered, GBS)
    assert math.log(hi_p / lo_p) < 0.5 * math.log(hi_s / lo_s)
    assert lo_p < 629.0 < hi_p and lo_s < 629.0 < hi_s


def test_a_stall_at_the_first_timed_step_is_the_trainers_not_warm_up():
    """A stall that falls on the first timed step recurs every third step: it is not trimmed as warm-up (that would
    count one stall too few); a real warm-up, slower than every stall, still is."""
    times = stalling(629.0, 30)
    first_is_stall = times[2:]  # starts at a stalled step
    assert steady_steps(first_is_stall) == first_is_stall
    cold = [times[2] * 3, times[2] * 3] + first_is_stall
    assert steady_steps(cold) == first_is_stall


def test_a_one_off_hiccup_is_not_stalls_and_does_not_swing_the_answer():
    """One slow step mid-run (a host's hiccup): counted in the figure, never called stalls, and the fastest pair stays
    the answer; it widens that pair's interval, so an adaptive trial measures longer instead of dropping the step."""
    fast = jittered(GBS / 1000.0, 24)
    hiccup = fast[:12] + [fast[12] * 3.0] + fast[13:]
    results = [ok(1, jittered(GBS / 800.0, 24)), ok(2, jittered(GBS / 830.0, 24)), ok(4, hiccup)]
    by_accum = {r.accum: r for r in results}
    assert stall_note(hiccup) == "" and stall_note(hiccup + hiccup[:6]) == ""
    assert by_accum[4].throughput == pytest.approx(GBS * 24 / sum(hiccup))  # counted: 8% below its 1000
    mapping = {r.key: r for r in results}
    assert leader_key(mapping) == by_accum[4].key
    cands = enumerate_candidates(GBS, 1, [1, 2, 4], [1])
    assert (leader_probability(mapping) or 0) > 0.9 and (confidence_score(cands, mapping) or 0) > 0
    assert STALLS_MARK not in table_of(results).split()
    # The hiccup widened the interval: timing to +-2% goes on where the same steps without it would stop.
    assert enough_measured(fast, target_precision=0.02, min_steps=8, max_steps=64)
    assert not enough_measured(hiccup, target_precision=0.02, min_steps=8, max_steps=64)


# ---------------------------------------------------------------- a real sweep on a trainer that stalls

ATTACK = Path(__file__).parent / "attack_train.py"


@pytest.mark.slow
@pytest.mark.e2e
def test_a_sweep_does_not_recommend_the_pair_whose_fastest_median_step_hides_its_stalls(tmp_path):
    """accum=1's typical step runs at 1200 samples/s, the fastest, but every third of its steps takes 4.2x as long
    (580 samples/s over wall time); accum=2 and accum=4 train steadily at 867 and 907. The sweep must not recommend
    accum=1, and its row says it stalls."""
    from support.sweep_run import run_sweep

    sweep_dir = tmp_path / "stall"
    argv = (f'["{sys.executable}","{ATTACK}","--batch={{per_device_batch}}","--accum={{accum}}","--split={{split}}",'
            f'"--global-batch={{global_batch_size}}","--marker-dir={tmp_path}","--steps=45","--attacks=1:1=stall",'
            f'"--rates=1:1=1200,2:1=867,4:1=907"]')
    proc = run_sweep([f"hydra.sweep.dir={sweep_dir}", "workload=command", f"workload.argv={argv}", f"global_batch_size={GBS}",
                      "max_in_flight=1", "trial.time_limit_s=120", "live=false", "search=grid", "accum=1,2,4", "split=1",
                      "search.drift_check=false"], cwd=tmp_path, timeout=400)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = {int(r["accum"]): r for r in csv.DictReader((sweep_dir / "trials.csv").open())}
    stalled = rows[1]
    assert stalled["status"] == "ok" and float(stalled["throughput_samples_per_s"]) < 700, stalled
    # Every third step stalls; beside two busy loops a stall can fall under 1.5x the (busier) median step and go
    # uncounted, so the note may say 1 in 4 (a fresh clone's run under load did).
    assert re.match(r"stalls: 1 step in [34] ran [34]\.\dx the typical step", stalled["stalls"]), stalled
    assert stalled["rank"] != "1"
    assert rows[2]["stalls"] == rows[4]["stalls"] == ""
    final = re.findall(r"^recommended accum=(\d+) ", proc.stdout, re.M)  # the answer, not an interim line's
    assert final and final[-1] in ("2", "4"), proc.stdout
    assert re.search(r"accum=1 ok: stalls: 1 step in [34] ran", proc.stdout), proc.stdout
    row = next(line for line in proc.stdout.splitlines() if re.match(r"\s*\d+\s+1\s+64\s+ok\s", line))
    assert row.split()[-1] == STALLS_MARK, proc.stdout
