"""The supervisor: one process per allocation, on the batch host, in the job. Stdlib only.

By concern, in the order a stop goes through them::

    main.py        Supervisor: per generation, watch -> decide -> act; the process's entry point
    agents.py      the agent step, the fleet, the layout: start, signal, kill a generation
    fleet.py       the agents over TCP (an I/O thread): liveness, probes, heartbeats -> events.py
    watch.py       one generation's loop over the fleet's events, until every rank is gone
    timing.py      when to pass Slurm's stop signal on, and why it came (an injected clock)
    hang_watch.py  a silent rank, a stuck collective, a storage stall, from the heartbeats
    generation.py  which ranks started and how each ended; what the loop saw (GenerationEnd)
    facts.py       the facts of a stop, for the policy: what it saw, and Slurm's word
    policy.py      what a stop means: the decision table (pure); stop.py: its inputs and output;
                   classify.py: whose fault a failure was; history.py: streaks and blame
    act.py         carry the decision out: done, restart, swap, requeue (hpc_llm.slurm.requeue), fail
    lost.py        book an allocation that ended with nobody there to record it
    options.py     the policy and timings the batch script passes
    agent_step.py  the one srun step of agents: its command, start, abort

It asks Slurm through :mod:`hpc_llm.slurm` (:mod:`~hpc_llm.slurm.allocation`,
:mod:`~hpc_llm.slurm.requeue`): no training stack, nothing third-party on the batch host.
"""
