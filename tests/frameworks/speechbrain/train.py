"""A SpeechBrain training script at test size, as SpeechBrain's recipes write one: hyperparameters in a HyperPyYAML
file (hparams.yaml beside this script), overridden from the command line, a `Brain` subclass with
`compute_forward` and `compute_objectives`, and SpeechBrain's own accumulation, the `--grad_accumulation_factor`
run option (`Brain.fit_batch` divides the loss by it and steps the optimizers on every factor-th batch). The sweep's
argv: `python train.py hparams.yaml --device=cpu --batch_size={per_device_batch} --grad_accumulation_factor={accum}`.

Independent timing: `Brain.on_fit_batch_end`, SpeechBrain's hook after each batch, when its `should_step` says
the optimizers stepped in that batch; tests/frameworks/step_times.py.
"""

import os
import sys

import speechbrain as sb
import torch
from hyperpyyaml import load_hyperpyyaml

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile  # noqa: E402


class RegressionBrain(sb.Brain):
    def compute_forward(self, batch, stage):
        x, _ = batch
        return self.modules.model(x.to(self.device))

    def compute_objectives(self, predictions, batch, stage):
        _, y = batch
        return torch.nn.functional.mse_loss(predictions, y.to(self.device))

    def on_fit_start(self):
        super().on_fit_start()
        self.step_times = StepTimesFile(rank=int(os.environ.get("RANK", 0)))

    def on_fit_batch_end(self, batch, outputs, loss, should_step):
        if should_step:
            self.step_times.mark(self.optimizer_step)


def main() -> None:
    hparams_file, run_opts, overrides = sb.parse_arguments(sys.argv[1:])
    with open(hparams_file) as f:
        hparams = load_hyperpyyaml(f, overrides)
    features, hidden = hparams["features"], hparams["hidden"]
    model = torch.nn.Sequential(torch.nn.Linear(features, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden), torch.nn.ReLU(),
                                torch.nn.Linear(hidden, 1))
    brain = RegressionBrain(modules={"model": model}, opt_class=hparams["opt_class"], hparams=hparams, run_opts=run_opts)

    samples = hparams["batch_size"] * brain.grad_accumulation_factor * hparams["steps"]
    x = torch.randn(samples, features, generator=torch.Generator().manual_seed(hparams["seed"]))
    train_set = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    brain.fit(hparams["epoch_counter"], train_set, train_loader_kwargs={"batch_size": hparams["batch_size"], "shuffle": True})


if __name__ == "__main__":
    main()
