"""A tiny real Lightning trainer for the two-node Slurm tests (tests/test_slurm_nodes.py), run by the +sweep=lightning
preset's own line: `python THIS data.micro_batch_size=... trainer.devices={nproc_per_node} trainer.num_nodes={nodes} ...`
(NeMo-style dot-list overrides) with the preset's workload.env (MASTER_ADDR, MASTER_PORT, NODE_RANK, SLURM_JOB_NAME).

Lightning starts this node's ranks itself (its subprocess launcher: the process sweep started is local rank 0),
DDP over gloo on CPU. Each rank writes what it saw to $SWEEP_TRIAL_DIR/rank<R>.json after every optimizer step, as
tests/nodes_train.py does: its host, node, world size and the end time of each step. Each micro-batch sleeps
data.micro_s, so a step's time is known and steady on a busy 2-core box.
"""

import json
import os
import socket
import sys
import time

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from omegaconf import OmegaConf

DEFAULTS = {
    "data": {"micro_batch_size": 4, "samples": 4096, "features": 32, "micro_s": 0.01},
    "trainer": {"devices": 1, "num_nodes": 1, "max_steps": 30, "accumulate_grad_batches": 1},
}


class Tiny(L.LightningModule):
    def __init__(self, features: int, micro_s: float) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(features, features), torch.nn.ReLU(), torch.nn.Linear(features, 1))
        self.micro_s = micro_s

    def training_step(self, batch, batch_idx):
        x, y = batch
        time.sleep(self.micro_s)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class RankRecord(L.Callback):
    """The rank's own clock: the end of every optimizer step (global_step moved), written after each."""

    def on_train_start(self, trainer, pl_module):
        self.ends, self.steps_seen = [time.time()], trainer.global_step
        self.path = os.path.join(os.environ["SWEEP_TRIAL_DIR"], f"rank{trainer.global_rank}.json")

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.global_step == self.steps_seen:
            return  # a micro-batch inside an accumulation: no optimizer step yet
        self.steps_seen = trainer.global_step
        self.ends.append(time.time())
        record = {"rank": trainer.global_rank, "node": trainer.node_rank, "host": socket.gethostname(), "world": trainer.world_size,
                  "ends": self.ends}
        with open(self.path + ".tmp", "w") as f:
            json.dump(record, f)
        os.replace(self.path + ".tmp", self.path)


def main() -> None:
    cfg = OmegaConf.merge(OmegaConf.create(DEFAULTS), OmegaConf.from_dotlist(sys.argv[1:]))
    x = torch.randn(cfg.data.samples, cfg.data.features, generator=torch.Generator().manual_seed(0))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)), batch_size=cfg.data.micro_batch_size)
    trainer = L.Trainer(**OmegaConf.to_container(cfg.trainer), accelerator="cpu", strategy=DDPStrategy(process_group_backend="gloo"),
                        logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        callbacks=[RankRecord()])
    trainer.fit(Tiny(cfg.data.features, cfg.data.micro_s), loader)


if __name__ == "__main__":
    main()
