# hpc_llm training image for H100 nodes, for enroot and pyxis (container=pyxis): the same
# stack as containers/h100.def (CUDA 12.6, torch 2.7.0, LLM Foundry 0.22.0, flash-attn
# 2.7.4.post1, hpc_llm itself). Pins match pyproject.toml's `train` extra
# (tests/test_containers.py checks).
#
# Build it where Docker runs, from the repository root, and turn it into the squashfs enroot
# unpacks (enroot reads the local Docker daemon with dockerd://):
#   docker build -f containers/h100.Dockerfile -t hpc_llm-h100 .
#   enroot import -o /shared/images/hpc_llm-h100.sqsh dockerd://hpc_llm-h100
# then train in it:
#   python -m hpc_llm +experiment=mpt7b_dolly cluster=h100 hydra/launcher=slurm \
#       container=pyxis container.image=/shared/images/hpc_llm-h100.sqsh
# A registry works too: push it and set container.image='REGISTRY#hpc_llm-h100:TAG' (every
# node then imports it at every step: a squashfs on a shared filesystem starts faster).
FROM nvidia/cuda:12.6.3-cudnn-devel-ubuntu22.04

ENV DEBIAN_FRONTEND=noninteractive
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3.11-dev git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

COPY pyproject.toml README.md /opt/hpc_llm/src/
COPY hpc_llm /opt/hpc_llm/src/hpc_llm
COPY hydra_plugins /opt/hpc_llm/src/hydra_plugins
COPY conf /opt/hpc_llm/src/conf
COPY sbatch_templates /opt/hpc_llm/src/sbatch_templates
COPY containers /opt/hpc_llm/src/containers
COPY constraints /opt/hpc_llm/src/constraints

RUN python3.11 -m venv /opt/hpc_llm/venv \
    && . /opt/hpc_llm/venv/bin/activate \
    && pip install --no-cache-dir --upgrade pip "setuptools<81" wheel packaging ninja \
    && pip install --no-cache-dir torch==2.7.0 \
    && pip install --no-cache-dir "/opt/hpc_llm/src[train]" -c /opt/hpc_llm/src/constraints/llmfoundry.txt \
    && MAX_JOBS=8 pip install --no-cache-dir --no-build-isolation flash-attn==2.7.4.post1 \
    && python -c "import torch, composer, llmfoundry, streaming, hpc_llm; assert torch.__version__.startswith('2.7.0')"

# enroot keeps ENV in the image's /etc/environment: pyxis gives every task this PATH, so
# container.python=python3 is the venv's
ENV PATH=/opt/hpc_llm/venv/bin:$PATH \
    PYTHONNOUSERSITE=1 \
    HF_HUB_DISABLE_TELEMETRY=1

LABEL org.hpc_llm.image=h100 \
      org.hpc_llm.version=0.1.0 \
      org.hpc_llm.torch=2.7.0 \
      org.hpc_llm.llm-foundry=0.22.0 \
      org.hpc_llm.mosaicml=0.32.1
