"""The ``.hydra/`` files of a job (config.yaml, hydra.yaml, overrides.yaml), as Hydra's
``run_job`` writes them, written fast for the many points of a sweep.

What ``hydra.core.utils._save_config`` writes: ``OmegaConf.to_yaml`` of the config, which is
PyYAML's dump with OmegaConf's string representer (a string that reads as a bool or number is
quoted). PyYAML builds the document in two steps: a representer (pure Python, ~3 ms for a job
config) turns the data into a node graph, and an emitter writes it (libyaml's, with CDumper).
The points of a sweep differ in a few values: a section whose data is exactly the previous
point's (the same pickle: same types, values and order) reuses that point's nodes, and only
what changed is represented anew.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import yaml
from omegaconf._utils import OmegaConfDumper
from yaml.nodes import MappingNode, Node

#: mappings this deep (the document is depth 0) keep their nodes from one point to the next
_DEPTH = 3


class _YamlDumper(yaml.CDumper):
    """OmegaConf's YAML dumper on libyaml's emitter: hydra's own ``_save_config`` writes the
    .hydra/ files with the pure-Python one, ~15 ms a file; a 100-point sweep writes 300."""


_YamlDumper.add_representer(str, OmegaConfDumper.str_representer)  # type: ignore[arg-type]

_OPTIONS: dict[str, Any] = {"default_flow_style": False, "allow_unicode": True, "sort_keys": False}


class HydraFiles:
    """Writes the .hydra/ files of one sweep's jobs; keeps the last nodes of each section."""

    def __init__(self) -> None:
        #: by file and path of keys: (the section's pickle, its node)
        self._kept: dict[tuple[str, tuple[str, ...]], tuple[bytes, Node]] = {}

    def write(self, content: dict[Any, Any], output_dir: Path) -> None:
        """``content``: the job config as plain data (``OmegaConf.to_container(cfg, resolve=False,
        enum_to_str=True)``), hydra node included; what run_job writes, from it."""
        hydra_node = content.pop("hydra")
        output_dir.mkdir(parents=True, exist_ok=True)
        self._save(content, "config.yaml", output_dir)
        self._save({"hydra": hydra_node}, "hydra.yaml", output_dir)
        self._save(hydra_node["overrides"]["task"], "overrides.yaml", output_dir)  # Hydra saves a list here too

    def _save(self, data: Any, filename: str, output_dir: Path) -> None:
        out = io.StringIO()
        dumper = _YamlDumper(out, **_OPTIONS)
        try:
            dumper.open()
            dumper.serialize(self._node(dumper, data, filename, ()))
            dumper.close()
        finally:
            dumper.dispose()
        (output_dir / filename).write_text(out.getvalue(), encoding="utf-8")

    def _node(self, dumper: _YamlDumper, data: Any, filename: str, path: tuple[str, ...]) -> Node:
        """``dumper.represent_data(data)``, reusing the last nodes of an unchanged section."""
        if type(data) is not dict or len(path) > _DEPTH:
            return dumper.represent_data(data)
        key = (filename, path)
        if path:
            try:
                pickled = pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)
            except (pickle.PicklingError, AttributeError, TypeError):
                return dumper.represent_data(data)
            kept = self._kept.get(key)
            if kept is not None and kept[0] == pickled:
                return kept[1]
        # SafeRepresenter.represent_mapping with default_flow_style=False and sort_keys=False:
        # each key and value represented in order, the mapping in block style
        items: list[tuple[Node, Node]] = []
        for k, v in data.items():
            items.append((dumper.represent_data(k), self._node(dumper, v, filename, (*path, str(k)))))
        node = MappingNode("tag:yaml.org,2002:map", items, flow_style=False)
        if path:
            self._kept[key] = (pickled, node)
        return node
