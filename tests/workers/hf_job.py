"""The Hugging Face Trainer on a tiny randomly initialised GPT-2 (the config built in
code: no download, no tokenizer), random token ids, knowing nothing of ranksight. Under
torchrun on CPU/gloo the Trainer (through accelerate) wraps the model in DDP.

Run: torchrun --nproc-per-node 4 hf_job.py STEPS OUT_DIR [SLEEP_MS]
SLEEP_MS: every rank sleeps that long after each step (a paced job, so a fault from
outside lands while it runs; a ``TrainerCallback``, as users add their own).
Prints ``hf_job rank R global_step N`` on each rank at the end.
"""

import sys
import time

import torch
from transformers import (
    GPT2Config,
    GPT2LMHeadModel,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int = 32, vocab: int = 256) -> None:
        gen = torch.Generator().manual_seed(0)
        self.ids = torch.randint(0, vocab, (n, length), generator=gen)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Paced(TrainerCallback):
    def __init__(self, sleep_ms: float) -> None:
        self.sleep_s = sleep_ms / 1000

    def on_step_end(self, args, state, control, **kwargs):
        time.sleep(self.sleep_s)


def main() -> None:
    steps, out = int(sys.argv[1]), sys.argv[2]
    sleep_ms = float(sys.argv[3]) if len(sys.argv) > 3 else 0.0
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=256, n_positions=64, n_embd=64, n_layer=2,
                                       n_head=2))  # fmt: skip
    args = TrainingArguments(
        output_dir=out, max_steps=steps, per_device_train_batch_size=8, use_cpu=True,
        ddp_backend="gloo", report_to=[], save_strategy="no", logging_strategy="no",
        disable_tqdm=True, dataloader_num_workers=0,
    )  # fmt: skip
    trainer = Trainer(model=model, args=args, train_dataset=Tokens(8 * 4 * steps),
                      callbacks=[Paced(sleep_ms)] if sleep_ms else None)  # fmt: skip
    trainer.train()
    rank = trainer.args.process_index
    print(f"hf_job rank {rank} global_step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
