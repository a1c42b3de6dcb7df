"""Data, on both sides: LLM Foundry dataloader sections for data-source plugins and
login-side checks of local files (pure), and the preparation of datasets and
the bundled tiny corpus (``hpc-llm data prepare``, or in the job at first use).
"""
