"""torchtitan as hpc_llm's trainer (``trainer=torchtitan``; in-job only, in torchtitan's own
environment): its upstream fixes (:mod:`.compat`), the run's config applied to torchtitan's
(:mod:`.run`) and the check before the queue (:mod:`.check`)."""
