"""Site config directories on Hydra's search path, after the package's ``conf/``.

Hydra calls every SearchPathPlugin whenever it builds a search path: under
``python -m hpc_llm`` (``hydra.main``) and under ``hpc-llm``'s compose
(``initialize_config_dir``) alike. The directories are hpc_llm.config.site's
(``$HPC_LLM_CONFIG_PATH``, then ``~/.config/hpc_llm``); they go right after the primary
config directory, so a name the package ships is always found first, and before
``hydra.searchpath`` entries and the ConfigStore. Only hpc_llm's own primary config gets
them: another Hydra app in the same environment (``--config-path`` to another tree) is
left as it is. Slurm jobs never compose (the launcher pickles each job's composed
config), so the nodes need neither the directories nor the variable.
"""

from __future__ import annotations

from pathlib import Path

from hydra.core.config_search_path import ConfigSearchPath, SearchPathQuery
from hydra.plugins.search_path_plugin import SearchPathPlugin


def _is_hpc_llm_conf(path: str) -> bool:
    from hpc_llm.paths import conf_dir

    try:
        return Path(path.removeprefix("file://")).resolve() == conf_dir().resolve()
    except (OSError, FileNotFoundError):
        return False


class HpcLlmSiteSearchPath(SearchPathPlugin):
    def manipulate_search_path(self, search_path: ConfigSearchPath) -> None:
        from hpc_llm.config import site

        main = [e for e in search_path.get_path() if e.provider == "main"]
        if not main or not _is_hpc_llm_conf(main[0].path):
            return
        anchor = SearchPathQuery(provider="main", path=main[0].path)
        for d in reversed(site.existing_dirs()):  # each right after main: the first listed ends up first
            search_path.append(site.PROVIDER, f"file://{d}", anchor=anchor)
        site.warn_unused()
