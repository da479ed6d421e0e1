"""A tiny PyTorch Lightning job (randomly initialised MLP, random data, no downloads),
knowing nothing of ranksight: 4 CPU ranks, strategy ddp on gloo. Lightning drives the
optimizer with ``optimizer.step(closure)`` (forward and backward inside the closure).

Run under torchrun (``torchrun --nproc-per-node 4 lightning_job.py STEPS [SLEEP_MS]``) or
alone (``python lightning_job.py STEPS [SLEEP_MS]``: Lightning's own launcher starts ranks
1-3). SLEEP_MS: every rank sleeps that long after each batch (a paced job, so a fault from
outside lands while it runs).
Prints ``lightning_job rank R global_step N`` on each rank at the end.
"""

import sys
import time

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn


class Tiny(L.LightningModule):
    def __init__(self, sleep_ms: float = 0.0) -> None:
        super().__init__()
        self.sleep_s = sleep_ms / 1000
        self.net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 8))  # fmt: skip

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if self.sleep_s:
            time.sleep(self.sleep_s)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


def main() -> None:
    steps = int(sys.argv[1])
    sleep_ms = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(4 * 64 * steps, 128)), batch_size=64
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=4, strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=steps, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(sleep_ms), data)
    print(f"lightning_job rank {trainer.global_rank} global_step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
