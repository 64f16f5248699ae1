"""A plain PyTorch training loop that sweep can tune: docs/tutorial.md walks through it."""

import argparse

import torch

parser = argparse.ArgumentParser()
parser.add_argument("--batch-size", type=int, default=256)  # samples per micro-batch, on each device
parser.add_argument("--accum", type=int, default=1)  # micro-batches per optimizer step
parser.add_argument("--steps", type=int, default=50)  # optimizer steps
args = parser.parse_args()

device = "cuda" if torch.cuda.is_available() else "cpu"
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(256, 1024), torch.nn.ReLU(), torch.nn.Linear(1024, 10)).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

for _step in range(args.steps):
    for _ in range(args.accum):  # one optimizer step = accum micro-batches = the global batch
        x = torch.randn(args.batch_size, 256, device=device)
        y = torch.randint(0, 10, (args.batch_size,), device=device)
        loss = torch.nn.functional.cross_entropy(model(x), y) / args.accum
        loss.backward()
    optimizer.step()
    optimizer.zero_grad()
print(f"trained {args.steps} steps of {args.batch_size * args.accum} samples: loss {loss.item() * args.accum:.3f}")
