"""``python -m hpc_llm.job.agent <payload>``: the node's agent (the agent step's task)."""

from hpc_llm.job.agent.loop import main

main()
