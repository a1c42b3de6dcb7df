"""The rendezvous ports every rank of a job agrees on without talking (both sides, stdlib only).

MASTER_PORT = PORT_BASE + job id % PORT_SPAN (the batch script computes the same); an agent that
names a free port for a generation picks it from the same range. 20000-31999 stays below Linux's
ephemeral range (32768-60999), where an outgoing connection of any process on the node could
already hold it. Apart from :mod:`hpc_llm.config.plan` because the job side needs these two
numbers and nothing else of the plan (which imports omegaconf): this module is stdlib only.
"""

PORT_BASE = 20000
PORT_SPAN = 12000
