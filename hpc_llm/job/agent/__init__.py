"""The agent: one process per node, started once per allocation, in the job.

``python -m hpc_llm.job.agent <payload>`` (:mod:`hpc_llm.job.agent.loop`) runs
as the node's task of the allocation's one agent step (inside the container
when there is one): it connects to the supervisor (:mod:`hpc_llm.job.wire`),
imports the training stack once (:mod:`~hpc_llm.job.agent.warm`), and then,
for each generation the supervisor starts, forks the node's ranks from that
warm process (:mod:`~hpc_llm.job.agent.forker`), passes stop signals to them,
reports how each ended and kills them when told. Between generations nothing
is imported again: a restart in place costs a fork, not a cold start. It
keeps its ranks' heartbeats and the generation's fence on a shared-memory
board (:mod:`hpc_llm.job.heartbeat`) and removes the node-local scratch when
the allocation ends. What it needs of its node (its board file, a free port, the
ranks' environment) is :mod:`~hpc_llm.job.agent.node`; what it does when its
supervisor is gone without an ``end`` (a dead batch host) is
:mod:`~hpc_llm.job.agent.orphan`.
"""
