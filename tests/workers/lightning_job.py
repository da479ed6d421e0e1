"""A tiny PyTorch Lightning job (randomly initialised MLP, random data, no downloads),
knowing nothing of ranksight: 4 CPU ranks, strategy ddp on gloo. Lightning drives the
optimizer with ``optimizer.step(closure)`` (forward and backward inside the closure).

Run under torchrun (``torchrun --nproc-per-node 4 lightning_job.py STEPS``) or alone
(``python lightning_job.py STEPS``: Lightning's own launcher starts ranks 1-3).
Prints ``lightning_job rank R global_step N`` on each rank at the end.
"""

import sys

import lightning as L
import torch
from lightning.pytorch.strategies import DDPStrategy
from torch import nn


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(128, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                                 nn.Linear(512, 8))  # fmt: skip

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return self.net(x).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)


def main() -> None:
    steps = int(sys.argv[1])
    L.seed_everything(0, verbose=False)
    data = torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.randn(4 * 64 * steps, 128)), batch_size=64
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=4, strategy=DDPStrategy(process_group_backend="gloo"),
        max_steps=steps, max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(Tiny(), data)
    print(f"lightning_job rank {trainer.global_rank} global_step {trainer.global_step}", flush=True)


if __name__ == "__main__":
    main()
