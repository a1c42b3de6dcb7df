"""Post-train: the trained model as a Hugging Face directory, and a generate check.

In-job only. The conversion is LLM Foundry's own ``HuggingFaceCheckpointer``
(what ``scripts/inference/convert_composer_to_hf.py`` does for MPT, but from
the live trainer): it gathers the full state dict from DDP/FSDP/HSDP ranks,
writes ``config.json`` + safetensors + tokenizer + the flattened MPT code, and
switches ``attn_impl`` to torch and ``init_device`` to cpu so the result loads
anywhere. The converter script is not part of the installed package, and
there is no public function for an in-memory trainer, hence the call to the
callback's ``_save_checkpoint`` (every rank must call it: it has barriers).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

FOLDER = "hf_model"


def export(trainer: Any, run_dir: Path, precision: str = "bfloat16") -> tuple[Path, str | None]:
    """Write the trainer's model under ``<run_dir>/hf_model/huggingface/final`` (call on every rank).

    Returns (directory, error or None), the same on every rank. The gather is
    collective; only rank 0 writes, and its outcome is shared afterwards, so a
    failing write cannot leave the other ranks waiting in a barrier.
    """
    import os

    from composer.utils import dist
    from llmfoundry.callbacks import HuggingFaceCheckpointer
    from llmfoundry.utils.huggingface_hub_utils import edit_files_for_hf_compatibility

    out = run_dir / FOLDER / "huggingface" / "final"
    saver = HuggingFaceCheckpointer(save_folder=str(run_dir / FOLDER), save_interval="1dur", precision=precision)
    error: str | None = None
    try:  # gathers the full state dict from every rank (DDP, FSDP, HSDP) into a fresh HF model
        model, tokenizer = saver._get_hf_model(trainer.state)
    except Exception as exc:  # symmetric: every rank fails the same collective
        model, tokenizer, error = None, None, f"{type(exc).__name__}: {exc}"
    if dist.get_global_rank() == 0 and error is None:
        try:  # what HuggingFaceCheckpointer._save_checkpoint does on rank 0, minus uploads/MLflow
            model.save_pretrained(
                out, max_shard_size=os.environ.get("LLM_FOUNDRY_SAVE_FOLDER_HF_MAX_SHARD_SIZE", "1GB")
            )
            if tokenizer is not None:
                tokenizer.save_pretrained(out)
            if model.config.model_type == "mpt":
                edit_files_for_hf_compatibility(str(out), saver.flatten_imports)
        except Exception as exc:
            log.exception("writing the Hugging Face model failed")
            error = f"{type(exc).__name__}: {exc}"
    return out, dist.all_gather_object(error)[0]


def generate_check(model_dir: Path, prompt: str, max_new_tokens: int) -> dict[str, Any]:
    """Load ``model_dir`` with plain transformers and generate; raises if it cannot."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    t0 = time.time()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    if device == "cuda":
        torch.cuda.empty_cache()
    # trust_remote_code: MPT's modeling code ships in the directory; without it
    # transformers picks its own (incompatible) MptForCausalLM.
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, trust_remote_code=True, torch_dtype=dtype).to(device)
    model.eval()
    enc = tokenizer(prompt, return_tensors="pt")
    # MPT's forward takes no token_type_ids (some tokenizers return them)
    inputs = {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        logits = model(**inputs).logits
        out = model.generate(
            **inputs,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
    new_tokens = int(out.shape[1] - inputs["input_ids"].shape[1])
    if not torch.isfinite(logits).all():
        raise RuntimeError("the converted model produced non-finite logits")
    if new_tokens < 1:
        raise RuntimeError("the converted model generated no tokens")
    text = tokenizer.decode(out[0][inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    del model
    return {"inference_new_tokens": new_tokens, "inference_sample": text, "inference_s": round(time.time() - t0, 3)}
