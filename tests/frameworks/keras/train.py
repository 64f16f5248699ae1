"""A Keras 3 training script at test size, run on PyTorch (`KERAS_BACKEND=torch` in the environment, as Keras'
docs say to pick a backend), as Keras' guides write one: a `keras.Sequential` model, `compile` with an optimizer,
`fit` on arrays. Keras' own accumulation is the optimizer's `gradient_accumulation_steps` (it accumulates the
gradients of that many `fit` batches and applies them on the last; Keras wants it at least 2, so accum=1 leaves it
unset). The batch and the accumulation come from the command line (`--batch-size={per_device_batch}
--accum={accum}` in the sweep's argv). Keras' optimizers are its own, not `torch.optim` ones: the probe times it
by its backward passes (Keras' torch trainer calls `loss.backward()` once per batch).

Independent timing: a Keras `Callback`'s `on_train_batch_end`, on the batches where the optimizer's own step
count (`optimizer.iterations`, the applied updates) moved; tests/frameworks/step_times.py.
"""

import os
import sys

import keras
import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from step_times import StepTimesFile, batch_arguments  # noqa: E402


class StepTimes(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        self.times, self.steps = StepTimesFile(rank=0), 0

    def on_train_batch_end(self, batch, logs=None):
        steps = int(keras.ops.convert_to_numpy(self.model.optimizer.iterations))
        if steps != self.steps:  # the optimizer applied an update in this batch
            self.steps = steps
            self.times.mark(steps)


def main() -> None:
    parser = batch_arguments()
    args = parser.parse_args()
    assert keras.backend.backend() == "torch", f"run with KERAS_BACKEND=torch (the backend is {keras.backend.backend()})"

    x = np.random.default_rng(0).standard_normal((args.batch_size * args.accum * args.steps, args.features), dtype=np.float32)
    y = x.sum(axis=1, keepdims=True)
    model = keras.Sequential([keras.Input((args.features,)), keras.layers.Dense(args.hidden, activation="relu"),
                              keras.layers.Dense(args.hidden, activation="relu"), keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(learning_rate=1e-3, gradient_accumulation_steps=args.accum if args.accum > 1 else None)
    model.compile(optimizer=optimizer, loss="mse")
    model.fit(x, y, batch_size=args.batch_size, epochs=1, callbacks=[StepTimes()])


if __name__ == "__main__":
    main()
