"""python -m hpc_llm: see hpc_llm/app.py."""

from hpc_llm.app import main

main()
