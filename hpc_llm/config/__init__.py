"""Compose and check, on the login node: the first stage of every run.

Typed schemas and their ConfigStore registration, login-side validation (a
composed config -> a ResolvedJob, or one ConfigError line), the JobPlan every
later stage agrees on, the LLM Foundry train config a job will run, model
FLOPs, experiment trackers, and Hydra's errors as one line. Pure: no training
stack (the job imports these too).
"""
