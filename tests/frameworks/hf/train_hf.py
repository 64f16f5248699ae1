"""A Hugging Face `Trainer` script at test size: a 2-layer GPT-2 built from a config (nothing downloaded) on
random tokens, its TrainingArguments taken from the command line as run_clm.py takes them (HfArgumentParser),
so the +sweep=hf preset's flags apply unchanged. An eval runs before training (eval_on_start) as in the issue.

Independent timing: a TrainerCallback's on_step_end, called by the Trainer after each optimizer step, writes
the step times (tests/frameworks/step_times.py).
"""

import os
import sys
from dataclasses import dataclass, field

import torch
from transformers import GPT2Config, GPT2LMHeadModel, HfArgumentParser, Trainer, TrainerCallback, TrainingArguments

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile  # noqa: E402


@dataclass
class ModelArguments:
    n_layer: int = field(default=2, metadata={"help": "transformer blocks"})
    n_embd: int = field(default=64, metadata={"help": "hidden size"})
    seq_len: int = field(default=64, metadata={"help": "tokens per sample"})
    samples: int = field(default=4096, metadata={"help": "random training samples"})


class RandomTokens(torch.utils.data.Dataset):
    def __init__(self, samples: int, seq_len: int, vocab: int, seed: int) -> None:
        self.ids = torch.randint(0, vocab, (samples, seq_len), generator=torch.Generator().manual_seed(seed))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class StepTimesCallback(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.times = StepTimesFile(args.process_index)

    def on_step_end(self, args, state, control, **kwargs):
        self.times.mark(state.global_step)


def main() -> None:
    model_args, training_args = HfArgumentParser((ModelArguments, TrainingArguments)).parse_args_into_dataclasses()
    config = GPT2Config(n_layer=model_args.n_layer, n_embd=model_args.n_embd, n_head=2, n_positions=model_args.seq_len, vocab_size=512)
    model = GPT2LMHeadModel(config)
    train = RandomTokens(model_args.samples, model_args.seq_len, config.vocab_size, seed=0)
    evaluation = RandomTokens(32, model_args.seq_len, config.vocab_size, seed=1)
    trainer = Trainer(model=model, args=training_args, train_dataset=train, eval_dataset=evaluation, callbacks=[StepTimesCallback()])
    trainer.train()
    # Under torchrun the Trainer leaves its gloo process group up. torch's distributed docs ask every
    # rank to destroy it: at interpreter exit its worker threads can otherwise abort the rank (SIGABRT,
    # "terminate called without an active exception") after training has finished.
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
