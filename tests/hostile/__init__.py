"""A corpus of hostile checkpoint files (issue #54): pickles crafted opcode by opcode, each with a
canary it would delete, write or run, put into every container a checkpoint reader takes (DCP's
``.metadata``, its non-tensor and tensor entries, a ``torch.save`` zip's ``data.pkl``, a Composer
checkpoint, torchtitan's dataloader state), and a runner that hands every file to every reader of
the environment it runs in (:mod:`tests.hostile.readers`, run by ``tests/test_hostile_files.py``
in LLM Foundry's and in torchtitan's venv).
"""
