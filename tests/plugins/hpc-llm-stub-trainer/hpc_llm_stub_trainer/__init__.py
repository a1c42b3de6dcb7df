"""The smallest third trainer (``trainer.name=stub``): a bigram model in plain torch, trained
with DDP over gloo on the data source's text files, keeping hpc_llm's trainer contract
(docs/reference/trainers.md) through :class:`hpc_llm.job.rank.step_duties.StepDuties`.

What a third party writes: a ``Trainer`` component registered through the entry point group
``hpc_llm``, its login-side check (``validate_job``), and ``train`` in the job. Test plugin:
tests/test_trainer_contract.py holds it to the same suite as LLM Foundry and torchtitan.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpc_llm import hookimpl
from hpc_llm.errors import ConfigError
from hpc_llm.plugins.base import Trained, Trainer

SEQ = 32


@dataclass
class StubOptions:
    # seconds each step lasts at least (a test that must catch the run mid-training)
    step_s: float = 0.0


class StubTrainer(Trainer):
    name = "stub"
    description = "a bigram model in plain torch (test plugin: the trainer contract's third trainer)"
    Options = StubOptions
    warm_modules = ("torch", "torch.distributed", "hpc_llm.job.rank.task")

    def validate_job(self, cfg: Any, plan: Any) -> None:
        for key, value in (
            ("train.max_duration", cfg.train.max_duration),
            ("checkpoint.interval", cfg.checkpoint.interval),
        ):
            if not str(value).endswith("ba") or not str(value)[:-2].isdigit():
                raise ConfigError(f"{key}={value}: trainer=stub counts batches; allowed: <N>ba")

    def stack_config(self, cfg: Any, job: Any, run_name: str) -> dict[str, Any]:
        return {
            "steps": int(str(cfg.train.max_duration)[:-2]),
            "batch": int(cfg.train.global_train_batch_size),
            "lr": float(cfg.train.optimizer.lr),
            "seed": int(cfg.train.seed),
            "interval": int(str(cfg.checkpoint.interval).removesuffix("ba")),
            "folder": str(job.checkpoint.train_config(cfg.checkpoint, job.plan)["save_folder"]),
        }

    def train(self, cfg: Any, job: Any, ctx: Any) -> Trained:
        import torch
        import torch.distributed as tdist
        from tokenizers import Tokenizer

        from hpc_llm.job.rank import safe_load
        from hpc_llm.job.rank.step_duties import StepDuties

        conf = self.stack_config(cfg, job, "")
        step_s = float(self.options(cfg.trainer).step_s)
        if not tdist.is_initialized():
            tdist.init_process_group("gloo")
        world, rank = tdist.get_world_size(), tdist.get_rank()
        data = job.data.text_data(cfg.data, ctx)
        tokenizer = Tokenizer.from_file(str(Path(data.tokenizer) / "tokenizer.json"))
        lines = [json.loads(line)["text"] for line in Path(data.train).read_text().splitlines()]
        tokens = torch.tensor([t for line in lines for t in tokenizer.encode(line).ids], dtype=torch.long)
        vocab = tokenizer.get_vocab_size()
        torch.manual_seed(conf["seed"])
        bigram = torch.nn.Embedding(vocab, vocab)
        torch.nn.init.zeros_(bigram.weight)  # uniform predictions: the loss starts at log(vocab)
        model = torch.nn.parallel.DistributedDataParallel(bigram)
        optimizer = torch.optim.AdamW(model.parameters(), lr=conf["lr"])
        folder = Path(conf["folder"])
        step = 0
        saves = sorted(folder.glob("step-*.pt"), key=lambda p: int(p.stem.split("-")[1])) if folder.is_dir() else []
        if saves:  # the newest save; loaded weights-only, as every checkpoint in hpc_llm
            state = safe_load.torch_load(saves[-1], str(saves[-1]))
            model.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            step = int(state["step"])
        duties = StepDuties(ctx, conf["steps"], conf["batch"] * SEQ)
        per_rank = conf["batch"] // world

        def save(at: int) -> None:
            duties.before_save()
            if rank == 0:
                folder.mkdir(parents=True, exist_ok=True)
                tmp = folder / f".step-{at}.pt.tmp"
                state = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(), "step": at}
                torch.save(state, tmp)
                os.replace(tmp, folder / f"step-{at}.pt")
            tdist.barrier()
            duties.saved(at)

        def start_reduce(value: int) -> Any:
            flag = torch.tensor([value])
            work = tdist.all_reduce(flag, op=tdist.ReduceOp.MAX, async_op=True)
            return lambda: (work.wait(), int(flag.item()))[1]

        t0 = time.time()
        duties.started(step)
        while step < conf["steps"]:
            step += 1
            # the batch of a step depends on the step alone: a resumed run sees the same ones
            g = torch.Generator().manual_seed(conf["seed"] * 100003 + step)
            starts = torch.randint(0, len(tokens) - SEQ - 1, (conf["batch"],), generator=g)[rank * per_rank :][
                :per_rank
            ]
            x = torch.stack([tokens[s : s + SEQ] for s in starts])
            y = torch.stack([tokens[s + 1 : s + SEQ + 1] for s in starts])
            loss = torch.nn.functional.cross_entropy(model(x).view(-1, vocab), y.view(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            time.sleep(step_s)
            mean = loss.detach().clone()
            tdist.all_reduce(mean)
            duties.loss(step, float(mean) / world)
            if step % conf["interval"] == 0 or step == conf["steps"]:
                save(step)
            duties.step_ended(step, save, start_reduce)
        duties.ended(step)
        return StubTrained(step, time.time() - t0, duties.trained_tokens(step))


class StubTrained(Trained):
    def __init__(self, step: int, train_s: float, tokens: int) -> None:
        self.batch, self.train_s, self.tokens = step, train_s, tokens

    def figures(self, ctx: Any, job_s: float) -> dict[str, Any]:
        from hpc_llm.job.rank.measure import progress_figures

        out = progress_figures(ctx)
        out.update(
            batches_done=self.batch,
            train_s=round(self.train_s, 3),
            wallclock_s=round(job_s, 3),
            tokens_per_sec=self.tokens / self.train_s if self.tokens and self.train_s else None,
        )
        return out


@hookimpl
def hpc_llm_register_trainers(register: Any) -> None:
    register(StubTrainer())
