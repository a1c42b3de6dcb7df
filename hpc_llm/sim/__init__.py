"""The control plane's deterministic simulation: the real supervisor, agents, takeover and orphan
code, run against a simulated Slurm and network over thousands of fault schedules.

The layout, in the order a seed runs: :mod:`~hpc_llm.sim.scenario` draws a seed's world and
faults; :mod:`~hpc_llm.sim.run` builds it and runs the job in it on :mod:`~hpc_llm.sim.hub`'s
virtual clock; :mod:`~hpc_llm.sim.world` is the seam's simulated side (processes, signals),
:mod:`~hpc_llm.sim.net` the network, :mod:`~hpc_llm.sim.slurm` Slurm, :mod:`~hpc_llm.sim.ranks`
the training ranks; :mod:`~hpc_llm.sim.check` judges what happened. ``python -m hpc_llm.sim
--seed N`` replays a seed with its trace (docs/design/simulation.md). It runs on a developer's
machine and in CI, both sides' code on neither side's machine: the login side and the job never
import it. Needs ``greenlet`` (the test extra).
"""
