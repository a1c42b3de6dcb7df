"""Patches for upstream bugs that a real multi-node cluster hits (in-job only).

docs/upstream-fixes.md keeps the one numbered list of them: what
breaks, the upstream version each patch was written against, and how it is
fixed. Each patch below cites its entry there as "upstream fix N" and says
why it is written the way it is; this module keeps no numbering of its own.

The task applies them once, explicitly, in every rank before training
(:func:`apply`), never at import and never on the login node. A patch that
wraps an upstream function marks its wrapper (``_hpc_llm``), so applying it
twice never wraps the wrapper.
"""

from __future__ import annotations

import os
import random
import string
import types
from dataclasses import dataclass, fields
from typing import Any

_APPLIED = False


def _patch_signal_file_name() -> None:
    """Put the real node rank in Composer's node signal-file name (docs/upstream-fixes.md, upstream fix 1).

    The random part stays broadcast from rank 0: every rank of a node must agree on the
    name; only the node rank, which Composer took from rank 0 too, must differ per node.
    """
    from composer.utils import dist

    def get_node_signal_file_name(rng: random.Random | None = None) -> str:
        rng = rng or random.Random()
        token = ["".join(rng.choices(string.ascii_letters + string.digits, k=6))]
        dist.broadcast_object_list(token, src=0)
        return f"._signal_file_node{dist.get_node_rank()}_{token[0]}"

    dist.get_node_signal_file_name = get_node_signal_file_name


def _patch_fsdp2_hsdp() -> None:
    """Keep the HSDP degrees through Composer's FSDP2 config (docs/upstream-fixes.md, upstream fix 2).

    A subclass carries ``data_parallel_shard_degree`` / ``data_parallel_replicate_degree``
    (which ``FSDP2Config`` drops), so Composer builds the 2-D (replicate, shard) device
    mesh and ``fully_shard`` does HSDP. Without a replicate degree (FULL_SHARD) the
    original config is returned unchanged.
    """
    from composer.utils import parallelism

    base = parallelism.FSDP2Config
    if getattr(base, "_hpc_llm_hsdp", False):
        return

    @dataclass
    class HSDP2Config(base):  # type: ignore[misc, valid-type]
        hsdp_shard_degree: int = -1
        hsdp_replicate_degree: int | None = None

        @property
        def data_parallel_shard_degree(self) -> int:  # type: ignore[override]
            return self.hsdp_shard_degree

        @property
        def data_parallel_replicate_degree(self) -> int | None:  # type: ignore[override]
            return self.hsdp_replicate_degree

    original = base.from_compatible_attrs.__func__

    def from_compatible_attrs(cls: type, attrs: dict[str, Any]) -> Any:
        attrs = dict(attrs)
        shard = attrs.pop("data_parallel_shard_degree", None)
        replicate = attrs.pop("data_parallel_replicate_degree", None)
        cfg = original(cls, attrs)
        if replicate is None:
            return cfg
        kwargs = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.init}
        return HSDP2Config(**kwargs, hsdp_shard_degree=shard or -1, hsdp_replicate_degree=replicate)

    base.from_compatible_attrs = classmethod(from_compatible_attrs)
    base._hpc_llm_hsdp = True


def _patch_fsdp2_gloo_average() -> None:
    """FSDP2 HSDP on Gloo: sum then divide instead of ``ReduceOp.AVG`` (docs/upstream-fixes.md,
    upstream fix 3), and a CPU stream event that exists (upstream fix 4).

    Both are needed for HSDP on CPU, so they are applied together. Summing and dividing
    afterwards is the path torch itself takes for fp16; only Gloo process groups take it,
    NCCL runs keep torch's own factors. CPU work is synchronous, so an always-complete
    ``torch.cpu.Event`` is the faithful answer where ``record_event()`` returns None.
    """
    import torch.distributed as tdist
    from torch.distributed.fsdp._fully_shard import _fsdp_collectives as coll

    original = coll._get_gradient_divide_factors
    if getattr(original, "_hpc_llm", False):
        return

    def divide_factors(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type=""):  # type: ignore[no-untyped-def]
        if tdist.get_backend(reduce_scatter_group) == "gloo":
            n = reduce_scatter_group.size() * (all_reduce_group.size() if all_reduce_group else 1)
            # predivide 1.0 (a no-op) selects ReduceOp.SUM; postdivide by n averages.
            return 1.0, float(n)
        return original(reduce_scatter_group, all_reduce_group, reduce_dtype, device_type)

    divide_factors._hpc_llm = True  # type: ignore[attr-defined]
    coll._get_gradient_divide_factors = divide_factors

    import torch

    if torch.cpu.Stream().record_event() is None:
        torch.cpu.Stream.record_event = lambda self: torch.cpu.Event()  # type: ignore[method-assign]


def _patch_sharded_load_integrations() -> None:
    """Leave ``state/integrations`` out of a sharded load (docs/upstream-fixes.md, upstream fix 5).

    The integrations (the tokenizer's files) are metadata for exporting the model, not
    training state, and they legitimately differ between the save and the resume. The
    sharded loader itself is wrapped because autoresume drops ``load_ignore_keys``, so no
    config could ask for this; the ``ignore_keys`` a caller does pass (a glob list or a
    callable) still apply.
    """
    from composer.utils import checkpoint

    original = checkpoint.load_sharded_checkpoint
    if getattr(original, "_hpc_llm", False):
        return

    def load_sharded_checkpoint(*args: Any, **kwargs: Any) -> Any:
        user = kwargs.get("ignore_keys")
        user_filter = checkpoint.glob_filter(user) if isinstance(user, list) else user

        def ignore(state_dict: dict) -> None:
            state_dict.get("state", {}).pop("integrations", None)
            if user_filter is not None:
                user_filter(state_dict)

        kwargs["ignore_keys"] = ignore
        return original(*args, **kwargs)

    load_sharded_checkpoint._hpc_llm = True  # type: ignore[attr-defined]
    checkpoint.load_sharded_checkpoint = load_sharded_checkpoint


def _patch_wandb_download() -> None:
    """W&B holds no checkpoints: downloads answer "not here" (docs/upstream-fixes.md, upstream fix 6).

    hpc_llm keeps checkpoints in its checkpoint backend, never in W&B (no
    ``log_artifacts``), so there is nothing to ask W&B for, and asking would need W&B
    initialised (autoresume asks before it is) and the network. FileNotFoundError is
    what autoresume takes for "not here".
    """
    from composer.loggers import wandb_logger

    cls = wandb_logger.WandBLogger
    if getattr(cls.download_file, "_hpc_llm", False):
        return

    def download_file(self: Any, remote_file_name: str, *args: Any, **kwargs: Any) -> None:
        raise FileNotFoundError(f"{remote_file_name}: hpc_llm keeps checkpoints in its checkpoint backend, not W&B")

    download_file._hpc_llm = True  # type: ignore[attr-defined]
    cls.download_file = download_file  # type: ignore[method-assign]


def _patch_streaming_epoch_boundary() -> None:
    """At an epoch boundary, save the epoch that comes next (docs/upstream-fixes.md, upstream fix 7).

    Composer asks for the state at sample 0 after an epoch's iteration finished; the
    resumed run must iterate the next epoch's order, as the uninterrupted run does.
    """
    from streaming.base.dataset import StreamingDataset

    original = StreamingDataset.state_dict
    if getattr(original, "_hpc_llm", False):
        return

    def state_dict(self: Any, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        state = original(self, num_samples, from_beginning)
        # next_epoch is set when an epoch's iteration starts: past the reported epoch means
        # that epoch is done, and sample 0 is the start of the next one
        if from_beginning and num_samples == 0 and self.next_epoch > state["epoch"]:
            state = dict(state, epoch=self.next_epoch)
        return state

    state_dict._hpc_llm = True  # type: ignore[attr-defined]
    StreamingDataset.state_dict = state_dict  # type: ignore[method-assign]


def _patch_cpu_model_query() -> None:
    """Ask for the CPU model once per process (docs/upstream-fixes.md, upstream fix 20).

    Composer's Trainer logs ``get_composer_env_dict()`` at every construction, and its
    ``get_cpu_model`` calls py-cpuinfo's ``get_cpu_info()``, which starts a Python
    subprocess to run CPUID: about a second of a rank's start here, on every restart.
    The CPU does not change under a running process: the answer is kept after the first
    call (in the node's agent, before it forks the ranks, so they never pay it).
    """
    from composer.utils import collect_env

    original = collect_env.get_cpu_model
    if getattr(original, "_hpc_llm", False):
        return
    known: list[str] = []

    def get_cpu_model() -> str:
        if not known:
            known.append(original())
        return known[0]

    get_cpu_model._hpc_llm = True  # type: ignore[attr-defined]
    collect_env.get_cpu_model = get_cpu_model


def _patch_remote_uploader() -> None:
    """Stage an upload by hard link, and survive a store outage (docs/upstream-fixes.md, upstream fix 13).

    Composer's ``RemoteUploader.upload_file_async`` copies every file it uploads into its staging
    folder (a second local write of each save, while training waits) and its worker tries an
    upload 3 times within seconds (a store down for a minute failed the run at the next batch).
    The patched method stages by hard link and submits :func:`hpc_llm.job.rank.remote_saves.upload_staged`,
    which keeps trying while the store's errors are transient (s3; other stores keep Composer's
    worker), and notes each ``(remote name, future, bytes)`` for :class:`~hpc_llm.job.rank.remote_saves.RemoteSaves`.
    """
    from composer.utils import remote_uploader

    cls = remote_uploader.RemoteUploader
    if getattr(cls.upload_file_async, "_hpc_llm", False):
        return
    from hpc_llm.job.rank import remote_saves

    def upload_file_async(self: Any, remote_file_name: str, file_path: Any, overwrite: bool) -> Any:
        staged = remote_saves.stage(self, file_path)
        size = os.path.getsize(staged)
        future = self.upload_executor.submit(
            remote_saves.upload_staged,
            remote_backend_name=self.remote_backend_name,
            backend_kwargs=self.backend_kwargs,
            remote_file_name=remote_file_name,
            local_file_path=staged,
            overwrite=overwrite,
            num_attempts=self.num_attempts,
        )
        self.futures.append(future)
        submitted = getattr(self, remote_saves.SUBMITTED, None)
        if submitted is None:
            submitted = []
            setattr(self, remote_saves.SUBMITTED, submitted)
        submitted.append((remote_file_name, future, size))
        return future

    upload_file_async._hpc_llm = True  # type: ignore[attr-defined]
    cls.upload_file_async = upload_file_async  # type: ignore[method-assign]


def _patch_safe_checkpoint_loads() -> None:
    """Load checkpoints so that they cannot run code (docs/upstream-fixes.md, upstream fixes 21
    and 22): Composer's monolithic load weights-only with its types allowed, and torch DCP's
    ``.metadata`` and non-tensor entries through :mod:`hpc_llm.job.rank.safe_load`.

    Composer's loader is replaced where its callers look it up (a module attribute); DCP's two
    readers are methods of the classes every reader and planner derives from (Composer's
    ``FileSystemReaderWithValidation`` calls the base ``read_metadata``). The bodies around the
    unpickling are torch 2.7's own.
    """
    from composer.utils import checkpoint as ckpt

    from hpc_llm.job.rank import safe_load

    if getattr(ckpt._torch_load_with_validation, "_hpc_llm", False):
        return

    def torch_load_with_validation(checkpoint_filepath: Any, map_location: str) -> Any:
        path = ckpt._ensure_valid_checkpoint(checkpoint_filepath)
        return safe_load.torch_load(path, str(path), map_location)

    torch_load_with_validation._hpc_llm = True  # type: ignore[attr-defined]
    ckpt._torch_load_with_validation = torch_load_with_validation
    load_checkpoint = ckpt.load_checkpoint

    def load_checkpoint_naming_it(path: str, *args: Any, **kwargs: Any) -> Any:
        # Composer reads a local copy (a download, a temp file): the refusal names the path given too
        try:
            return load_checkpoint(path, *args, **kwargs)
        except BaseException as exc:
            inner = safe_load.unwrap(exc)
            if isinstance(inner, safe_load.UnsafeCheckpoint):
                raise safe_load.named(str(path), inner) from None
            raise

    ckpt.load_checkpoint = load_checkpoint_naming_it

    # Composer's newer checkpoint API took the loader by name at its import, and reads its
    # resumption file with pickle.load: neither the Trainer nor LLM Foundry calls it, but a
    # callback might. Its module's `pickle` is the one name that call looks up.
    from composer.checkpoint import load as new_api

    new_api._torch_load_with_validation = torch_load_with_validation
    new_api.pickle = types.SimpleNamespace(  # type: ignore[assignment]
        load=lambda f: safe_load.unpickle(f, str(getattr(f, "name", "a resumption file")), safe_load.RESUMPTION_GLOBALS)
    )

    # torch 2.7's reader names .metadata from its path
    safe_load.patch_dcp_reads(lambda reader, kwargs: reader.fs.concat_path(reader.path, ".metadata"))


def _patch_safe_algorithm_loads() -> None:
    """Composer ``eval``s the repr of each required-on-load algorithm a checkpoint names
    (docs/upstream-fixes.md, upstream fix 26): only a call of that algorithm with literal
    arguments is let through to it (:func:`hpc_llm.job.rank.safe_load.check_algorithms`).

    Checked before Composer's own method runs, outside the bare ``except:`` around its eval,
    which would take a refusal for "recreating the algorithm failed" and go on."""
    from composer import algorithms
    from composer.core import Algorithm, State

    from hpc_llm.job.rank import safe_load

    original = State._apply_required_algorithms
    if getattr(original, "_hpc_llm", False):
        return

    def apply_required_algorithms(
        self: Any, state_dict: dict[str, Any], logger: Any, exclude_algorithms: Any = None, algorithm_passes: Any = None
    ) -> Any:
        def evaluated(name: str) -> bool:
            # every entry Composer's own test (hasattr, required_on_load, not excluded) lets
            # through to its eval: anything it names that is not an algorithm class is checked
            # too, and only an algorithm class's own required_on_load is called
            if not hasattr(algorithms, name) or name in (exclude_algorithms or []):
                return False
            found = getattr(algorithms, name)
            return not (isinstance(found, type) and issubclass(found, Algorithm)) or bool(found.required_on_load())

        safe_load.check_algorithms(state_dict.get("algorithms"), evaluated)
        return original(self, state_dict, logger, exclude_algorithms, algorithm_passes)

    apply_required_algorithms._hpc_llm = True  # type: ignore[attr-defined]
    State._apply_required_algorithms = apply_required_algorithms  # type: ignore[method-assign]


def apply() -> None:
    global _APPLIED
    if _APPLIED:
        return
    _patch_signal_file_name()
    _patch_fsdp2_hsdp()
    _patch_fsdp2_gloo_average()
    _patch_sharded_load_integrations()
    _patch_wandb_download()
    _patch_streaming_epoch_boundary()
    _patch_cpu_model_query()
    _patch_remote_uploader()
    _patch_safe_checkpoint_loads()
    _patch_safe_algorithm_loads()
    _APPLIED = True
