"""A sweep whose drift check waits for a go-ahead, for the tests that stop it there (tests/test_drift.py,
bench/reliability_validity.py)."""

from __future__ import annotations

# The sweep's two trials run at once; every later start (a re-timing) waits for the test's `go` file first, so that
# the test can kill or stop the sweep while its drift check's re-timing runs. accum=1 split=2 leads split=1 by 9%.
RETIMING_WAITS = """
import os, sys, time
accum, split, gbs = (int(a.split("=")[1]) for a in sys.argv[1:4])
here = os.path.dirname(os.path.abspath(__file__))
fd = os.open(os.path.join(here, "starts"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
os.write(fd, b"x"); os.close(fd)
if os.path.getsize(os.path.join(here, "starts")) > 2:
    with open(os.path.join(here, "retiming.tmp"), "w") as f:
        f.write(str(os.getpid()))
    os.replace(os.path.join(here, "retiming.tmp"), os.path.join(here, "retiming"))
    deadline = time.time() + 60
    while not os.path.exists(os.path.join(here, "go")) and time.time() < deadline:
        time.sleep(0.05)
for epoch in range(1, 6):
    tput = 1000.0 * (1 + split / 10) / accum * (1 + 0.001 * epoch)
    print(f"DLL 2024-01-02 10:11:1{epoch}.123456 - epoch {epoch:4d} | train_avg_throughput-audio-samples-per-sec : {tput:8.2f} | train_avg_took : {gbs / tput:6.2f}", flush=True)
"""


def retiming_sweep(tmp_path):
    """The sweep's arguments and environment, and its dir: two trials, then a drift check that waits for `go`."""
    import sys
    from pathlib import Path

    script = tmp_path / "train.py"
    script.write_text(RETIMING_WAITS)
    argv = f'workload.argv=["{sys.executable}","{script}","--accum={{accum}}","--split={{split}}","--global_batch_size={{global_batch_size}}"]'
    sweep_dir = tmp_path / "s"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).parents[2] / "src"), "HOME": str(tmp_path), "PYTHONUNBUFFERED": "1"}
    args = ["workload=command", argv, "search=grid", "accum=1", "split=1,2", "search.racing=false", "trial.time_limit_s=60",
            f"hydra.sweep.dir={sweep_dir}"]
    return args, env, sweep_dir
