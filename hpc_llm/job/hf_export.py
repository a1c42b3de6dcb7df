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


def export(trainer: Any, run_dir: Path, precision: str = "bfloat16") -> Path:
    """Write the trainer's model under ``<run_dir>/hf_model``; returns the HF directory."""
    from llmfoundry.callbacks import HuggingFaceCheckpointer

    saver = HuggingFaceCheckpointer(
        save_folder=str(run_dir / FOLDER), save_interval="1dur", huggingface_folder_name="final",
        precision=precision,
    )
    saver._save_checkpoint(trainer.state, trainer.logger, upload_to_save_folder=True, register_to_mlflow=False)
    return run_dir / FOLDER / "huggingface" / "final"


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
            **inputs, max_new_tokens=max_new_tokens, do_sample=False,
            pad_token_id=tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
        )
    new_tokens = int(out.shape[1] - inputs["input_ids"].shape[1])
    if not torch.isfinite(logits).all():
        raise RuntimeError("the converted model produced non-finite logits")
    if new_tokens < 1:
        raise RuntimeError("the converted model generated no tokens")
    text = tokenizer.decode(out[0][inputs["input_ids"].shape[1]:], skip_special_tokens=True)
    del model
    return {"inference_new_tokens": new_tokens, "inference_sample": text, "inference_s": round(time.time() - t0, 3)}


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
