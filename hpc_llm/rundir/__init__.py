"""The run directory, on both sides: where the login node hands a run to the job
and the job hands results back.

:class:`hpc_llm.rundir.layout.RunDir` names every path in it; the payload is what
the ranks run; provenance and the code snapshot say what was submitted; the
record (results.json, attempts) says what happened. No training stack here.
"""
