"""Config tree, typed schemas, plan arithmetic and the login-node import rule."""

import pytest
from omegaconf import OmegaConf

from hpc_llm.builtin.parallelism import hsdp_degrees
from hpc_llm.config.compose import compose
from hpc_llm.config.llmfoundry_keys import LLMFOUNDRY_VERSION, TRAIN_CONFIG_KEYS
from hpc_llm.config.plan import make_plan, parse_time_limit
from hpc_llm.config.train_config import build_train_config
from hpc_llm.config.validate import resolve_job
from hpc_llm.errors import ConfigError
from hpc_llm.paths import conf_dir


@pytest.mark.parametrize(
    "text,seconds",
    [("90", 5400), ("1:30", 90), ("01:00:00", 3600), ("2-00", 172800), ("1-02:03", 93780), ("1-00:00:05", 86405)],
)
def test_slurm_time_formats(text, seconds):
    assert parse_time_limit(text) == seconds


@pytest.mark.parametrize("text", ["abc", "1:2:3:4", "0", "-5", "1h"])
def test_bad_time_limits(text):
    with pytest.raises(ConfigError, match="resources.time"):
        parse_time_limit(text)


@pytest.mark.stack  # LLM Foundry, in this process
def test_vendored_train_keys_match_installed_llmfoundry():
    pytest.importorskip("llmfoundry")
    import llmfoundry
    from llmfoundry.utils.config_utils import TRAIN_CONFIG_KEYS as real

    assert llmfoundry.__version__ == LLMFOUNDRY_VERSION
    assert real == TRAIN_CONFIG_KEYS


def test_every_experiment_composes_and_builds_a_train_config(tmp_path):
    names = sorted(p.stem for p in (conf_dir() / "experiment").glob("*.yaml"))
    assert "mpt_tiny" in names and len(names) >= 12
    for split in ("train", "val_small"):  # C4 experiments check that the shards exist
        (tmp_path / "c4" / split).mkdir(parents=True)
        (tmp_path / "c4" / split / "index.json").write_text('{"version": 2, "shards": []}')
    for name in names:
        extra = [f"data.path={tmp_path / 'c4'}"] if name.endswith("_c4") else []
        cfg = compose([f"+experiment={name}", *extra])
        job = resolve_job(cfg, run_dir="/shared/runs/x/0")
        if job.trainer.name == "torchtitan":  # its own keys (tests/test_torchtitan.py)
            stack = job.trainer.stack_config(cfg, job, run_name="t")
            assert stack["checkpoint.folder"] == "/shared/runs/x/0/checkpoints"
            assert stack["training.seq_len"] == cfg.train.max_seq_len
            continue
        train = build_train_config(cfg, job, run_name="t")
        assert train["run_name"] == "t"
        assert train["save_folder"] == "/shared/runs/x/0/checkpoints"
        model = train["model"]
        assert model.get("max_seq_len", model.get("config_overrides", {}).get("max_seq_len")) == train["max_seq_len"]
        assert "hpc_llm_results" in train["loggers"]


def test_user_train_keys_override_plugin_fragments():
    cfg = compose(["+experiment=mpt_tiny", "+train.train_loader.num_workers=3"])
    train = build_train_config(cfg, resolve_job(cfg, "/r/0"), run_name="t")
    assert train["train_loader"]["num_workers"] == 3
    assert train["train_loader"]["name"] == "text"  # the rest still comes from the data source


def test_no_evaluator_drops_the_eval_loader():
    cfg = compose(["+experiment=mpt_tiny", "eval=none"])
    train = build_train_config(cfg, resolve_job(cfg, "/r/0"), run_name="t")
    assert "eval_loader" not in train


def test_fsdp_on_cpu_uses_fsdp2_and_hsdp_degrees_reach_the_fsdp_config():
    cfg = compose(["parallelism=hsdp", "resources.tasks_per_node=4"])
    job = resolve_job(cfg, "/r/0")
    assert job.parallelism.env(cfg.parallelism, job.plan) == {"FSDP_VERSION": "2"}
    fsdp = build_train_config(cfg, job, run_name="t")["fsdp_config"]
    assert (fsdp["data_parallel_shard_degree"], fsdp["data_parallel_replicate_degree"]) == (2, 2)


def _plan(nodes, tasks):
    return make_plan(compose([f"resources.nodes={nodes}", f"resources.tasks_per_node={tasks}"]))


def test_hsdp_degree_arithmetic():
    sec = OmegaConf.create({"shards": None, "replicas": None})
    assert hsdp_degrees(sec, _plan(4, 8)) == (8, 4)  # shard within a node, replicate across nodes
    assert hsdp_degrees(sec, _plan(1, 4)) == (2, 2)  # one node: 2 replicas
    assert hsdp_degrees(OmegaConf.create({"shards": 4, "replicas": None}), _plan(2, 8)) == (4, 4)
    with pytest.raises(ConfigError, match="replicas=3 does not divide the world size 8"):
        hsdp_degrees(OmegaConf.create({"shards": None, "replicas": 3}), _plan(1, 8))
    with pytest.raises(ConfigError, match="is not the world size"):
        hsdp_degrees(OmegaConf.create({"shards": 2, "replicas": 2}), _plan(1, 8))


def test_gpu_profile_needs_one_rank_per_gpu():
    with pytest.raises(ConfigError, match="must equal resources.gpus_per_node"):
        make_plan(compose(["cluster.device=gpu", "resources.gpus_per_node=8", "resources.tasks_per_node=2"]))


def test_each_point_of_a_sweep_gets_its_own_train_config():
    """build_train_config reuses the previous point's OmegaConf object to resolve the next
    point's interpolations (hpc_llm.config.train_config.resolve_interpolations): every point
    still gets its own values, and what a fresh resolution gives."""
    from hpc_llm.config import train_config

    points = [
        ["train.optimizer.lr=1e-4", "train.max_seq_len=64"],
        ["train.optimizer.lr=2e-4", "train.max_seq_len=128"],  # model.max_seq_len is ${..max_seq_len}
        ["train.optimizer.lr=2e-4", "train.max_seq_len=64"],
        ["train.optimizer.lr=3e-4", "train.max_seq_len=64", "+train.variables.note=plain"],  # a key more
        ["train.optimizer.lr=4e-4", "train.max_seq_len=64", "+train.variables.note=${max_seq_len}"],
        ["train.optimizer.lr=5e-4", "train.max_seq_len=32", "+train.variables.note=plain"],
    ]
    built = []
    for overrides in points:
        cfg = compose(["+experiment=mpt_tiny", *overrides])
        built.append((cfg, build_train_config(cfg, resolve_job(cfg, "/r/0"), run_name="t")))
    for (cfg, train), overrides in zip(built, points, strict=True):
        assert train["optimizer"]["lr"] == cfg.train.optimizer.lr
        assert train["model"]["max_seq_len"] == train["max_seq_len"] == cfg.train.max_seq_len
        train_config._last = None  # a fresh OmegaConf object: what every point got before the reuse
        assert build_train_config(cfg, resolve_job(cfg, "/r/0"), run_name="t") == train, overrides
    assert built[4][1]["variables"]["note"] == 64 and built[5][1]["variables"]["note"] == "plain"


def test_resolve_interpolations_matches_omegaconf():
    """Each dict, resolved after the one before it, is what OmegaConf makes of it alone."""
    from hpc_llm.config import train_config

    seq = [
        {"a": 1, "b": "${a}", "c": {"d": [1, "${...a}"], "e": "x"}, "f": "\\${a}"},
        {"a": 2, "b": "${a}", "c": {"d": [1, "${...a}"], "e": "y"}, "f": "\\${a}"},
        {"a": 3, "b": 7, "c": {"d": [1, "${...a}"], "e": "${c.d}"}, "f": "\\${a}"},  # b plain, e a container
        {"a": 4, "b": "${c.e}", "c": {"d": [1, "${...a}"], "e": "${c.d}"}, "f": "z"},
        {"a": 4, "b": "${c.e}", "c": {"d": [1, "${...a}", 5], "e": "${c.d}"}, "f": "z"},  # a list grew
        {"a": 5.0, "b": True, "c": {"d": [None, "${...a}", 5], "e": "${c.d}"}, "f": "z"},  # other types
    ]
    for merged in seq:
        expected = OmegaConf.to_container(OmegaConf.create(merged), resolve=True)
        assert train_config.resolve_interpolations(merged) == expected, merged


def test_hydra_files_of_a_sweep_are_what_pyyaml_writes_for_each_point(tmp_path):
    """The .hydra/ files (hpc_llm.launch.hydra_files) reuse the previous point's YAML nodes for a
    section whose data did not change: every point's files are still the whole dump of its own
    config (OmegaConf's representer on libyaml's emitter, which folds long lines as libyaml
    does), value types included (1, 1.0, true and "1" are equal in Python, not in YAML), and
    read back as the config."""
    import yaml

    from hpc_llm.launch.hydra_files import _OPTIONS, HydraFiles, _YamlDumper

    points = [
        ["train.optimizer.lr=1e-4"],
        ["train.optimizer.lr=2e-4"],
        ["train.optimizer.lr=2e-4", "+train.variables.x=1"],
        ["train.optimizer.lr=2e-4", "+train.variables.x=1.0"],
        ["train.optimizer.lr=2e-4", "+train.variables.x=true"],
        ["train.optimizer.lr=2e-4", "+train.variables.x='1'"],
        ["train.optimizer.lr=2e-4", "+train.variables.x=${max_seq_len}"],
        ["train.optimizer.lr=-0.0"],
        ["train.optimizer.lr=0.0", "resources.nodes=2"],
    ]
    files = HydraFiles()
    for i, overrides in enumerate(points):
        cfg = compose(["+experiment=mpt_tiny", *overrides])
        files.write(OmegaConf.to_container(cfg, resolve=False, enum_to_str=True), tmp_path / str(i))
        content = OmegaConf.to_container(cfg, resolve=False, enum_to_str=True)
        assert isinstance(content, dict)
        hydra = content.pop("hydra")
        for name, data in (("config", content), ("hydra", {"hydra": hydra}), ("overrides", hydra["overrides"]["task"])):
            text = (tmp_path / str(i) / f".{name}.yaml"[1:]).read_text()
            assert text == yaml.dump(data, Dumper=_YamlDumper, **_OPTIONS), (name, overrides)
            assert OmegaConf.create(yaml.safe_load(text)) == OmegaConf.create(data)
        assert OmegaConf.load(tmp_path / str(i) / "config.yaml").train.optimizer.lr == cfg.train.optimizer.lr


def test_a_job_payload_pickles_its_config_by_value_where_the_job_could_not_import_it():
    """write_payload's config pickle is cloudpickle's bytes: from the C pickler where the two
    agree, from cloudpickle where plain pickle would name a class of the app's __main__."""
    import dataclasses
    import pickle
    import sys

    import cloudpickle

    from hpc_llm.rundir.payload import _dumps

    cfg = compose(["+experiment=mpt_tiny"])
    assert _dumps(cfg) == cloudpickle.dumps(cfg)
    main = sys.modules["__main__"]
    Conf = dataclasses.make_dataclass("Conf", [("lr", float, 0.1)])
    Conf.__module__ = "__main__"
    main.Conf = Conf  # type: ignore[attr-defined]
    try:
        structured = OmegaConf.structured(Conf)
        assert b"__main__" in pickle.dumps(structured)  # what the job could not import
        assert _dumps(structured) == cloudpickle.dumps(structured)
        del main.Conf  # type: ignore[attr-defined]
        assert cloudpickle.loads(_dumps(structured)).lr == 0.1  # by value: no __main__.Conf needed
    finally:
        main.__dict__.pop("Conf", None)


def test_memoised_interpolation_parser_resolves_as_omegaconf_does():
    """hpc_llm.config.interpolation_cache: one parse tree per string, shared by every node that
    holds it; each node still resolves against its own config, and a bad one still raises."""
    from omegaconf.errors import GrammarParseError

    from hpc_llm.config import interpolation_cache

    interpolation_cache.install()
    a = OmegaConf.create({"x": 1, "y": "${x}", "z": "a-${x}-${y}"})
    b = OmegaConf.create({"x": 2, "y": "${x}", "z": "a-${x}-${y}"})
    assert (a.y, a.z, b.y, b.z) == (1, "a-1-1", 2, "a-2-2")
    a.x = 3
    assert (a.z, b.z) == ("a-3-3", "a-2-2")
    for _ in range(2):  # not cached as a success
        with pytest.raises(GrammarParseError):
            _ = OmegaConf.create({"bad": "${x"}).bad


#: 3 nodes of 2 ranks that may go on with 2 (resources.min_nodes)
SHRINKS = ["+experiment=mpt_tiny", "resources.nodes=3", "resources.tasks_per_node=2", "resources.min_nodes=2"]


def test_a_run_that_may_shrink_is_checked_at_every_size_and_keeps_its_data_order():
    cfg = compose([*SHRINKS, "train.global_train_batch_size=24", "train.device_train_microbatch_size=2"])
    job = resolve_job(cfg, "/r/0")
    assert (job.plan.nodes, job.plan.least_nodes, job.plan.full_nodes) == (3, 2, 3)
    train = build_train_config(cfg, job, run_name="t")
    # Streaming's order is fixed by num_canonical_nodes: from the submitted nodes, at any size
    assert train["train_loader"]["dataset"]["num_canonical_nodes"] == 3
    shrunk = resolve_job(cfg, "/r/0", nodes_now=2)
    assert (shrunk.plan.nodes, shrunk.plan.world_size, shrunk.plan.full_nodes) == (2, 4, 3)
    assert build_train_config(cfg, shrunk, run_name="t")["train_loader"]["dataset"]["num_canonical_nodes"] == 3
    assert build_train_config(cfg, shrunk, run_name="t")["global_train_batch_size"] == 24
    with pytest.raises(ConfigError, match=r"this allocation trains on 1 node\(s\), but the run allows 2 to 3"):
        resolve_job(cfg, "/r/0", nodes_now=1)
    # no min_nodes: Streaming's own default, as before
    plain = compose(["+experiment=mpt_tiny"])
    assert (
        "num_canonical_nodes"
        not in build_train_config(plain, resolve_job(plain, "/r/0"), run_name="t")["train_loader"]["dataset"]
    )


def test_hsdp_replicas_follow_the_nodes_a_run_shrinks_to():
    cfg = compose([*SHRINKS, "parallelism=hsdp", "train.global_train_batch_size=12"])
    for nodes, degrees in ((None, (2, 3)), (2, (2, 2))):
        job = resolve_job(cfg, "/r/0", nodes_now=nodes)
        fsdp = build_train_config(cfg, job, run_name="t")["fsdp_config"]
        assert (fsdp["data_parallel_shard_degree"], fsdp["data_parallel_replicate_degree"]) == degrees


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["resources.min_nodes=4"], "resources.min_nodes=4: must be an integer from 1 to resources.nodes=3"),
        (["resources.min_nodes=0"], "resources.min_nodes=0: must be an integer from 1 to resources.nodes=3"),
        (
            ["train.global_train_batch_size=6"],
            "resources.min_nodes=2: at 2 node(s), which the run may shrink to, train.global_train_batch_size=6 "
            "is not divisible by the world size 4",
        ),
        (
            ["parallelism=hsdp", "parallelism.replicas=3", "train.global_train_batch_size=12"],
            "resources.min_nodes=2: at 2 node(s), which the run may shrink to, parallelism.replicas=3 does not "
            "divide the world size 4",
        ),
    ],
    ids=["above-nodes", "zero", "batch-does-not-divide", "hsdp-replicas-do-not-divide"],
)
def test_a_min_nodes_the_run_cannot_shrink_to_is_refused_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        resolve_job(compose([*SHRINKS, *overrides]), "/r/0")
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)
