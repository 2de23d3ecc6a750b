"""Bad input stops the workflow before any job runs, naming the key, file or method and what to do (real Snakemake
runs).
"""

from __future__ import annotations

import json

import pytest

from conftest import fast_config, load_default_config, snakemake, write_config
from specsweep.layout import REPORT_DATA
from specsweep.report import tex_escape
from unit.test_config import ENGINE_SIM, INVALID, two_engines


# one mistake from each layer that catches them (every one of INVALID is checked in-process by
# tests/unit/test_config.py through the same coercion, schema validation and checks the Snakefile runs)
THROUGH_SNAKEMAKE = ["tp-not-integer", "unknown-key", "duplicated-after-sweep", "tp-larger-than-gpus"]


@pytest.mark.parametrize("name,mutate,key", [i for i in INVALID if i[0] in THROUGH_SNAKEMAKE], ids=THROUGH_SNAKEMAKE)
def test_invalid_config_fails_before_any_job_naming_the_key(workflow, name, mutate, key):
    config = load_default_config()
    mutate(config)
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    output = proc.stdout
    assert key in output, output[-3000:]
    assert not (workflow / "results").exists(), "a job ran despite the invalid configuration"


ENGINE_SIM_THROUGH_SNAKEMAKE = ["unknown-key", "time-scale-word", "clock"]


@pytest.mark.parametrize(
    "name,sim,message",
    [c for c in ENGINE_SIM if c[0] in ENGINE_SIM_THROUGH_SNAKEMAKE],
    ids=ENGINE_SIM_THROUGH_SNAKEMAKE,
)
def test_a_mistake_in_an_engines_sim_block_stops_the_workflow_before_any_job(workflow, name, sim, message):
    """An engine's sim block is checked as the top-level one (tests/unit/test_config.py has every case): an unknown
    key used to be ignored, a word for time_scale failed in the job with a TypeError, and engines on clocks of
    different speeds were compared."""
    write_config(workflow, two_engines(sim))
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert f"Invalid configuration: {message}" in proc.stdout, proc.stdout[-3000:]
    assert not (workflow / "results").exists(), "a job ran despite the invalid configuration"


def test_a_calibration_an_engine_names_that_is_not_there_stops_the_workflow_before_any_job(workflow):
    write_config(workflow, two_engines({"calibration": "calibrations/gone.yaml"}))
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert "Invalid configuration: engines[1].sim.calibration: 'calibrations/gone.yaml' is neither" in proc.stdout
    assert "Traceback" not in proc.stdout and not (workflow / "results").exists()


def test_bad_user_file_stops_the_workflow_before_any_job(workflow, tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"prompt": "fine"}\nnot json at all\n')
    config = load_default_config()
    config["workloads"] = [{"name": "mine", "family": "short", "source": "file", "path": str(path), "requests": 2}]
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert f"{path}: line 2: not valid JSON" in proc.stdout
    assert not (workflow / "results").exists()


def test_mistyped_flag_in_config_fails_before_any_job_naming_the_method(workflow):
    config = load_default_config()
    config["methods"][1]["flags"] = ["--speculative-draft-attention-backnd", "fa3"]
    write_config(workflow, config)
    proc = snakemake(workflow, check=False)
    assert proc.returncode != 0
    assert "method 'dflash'" in proc.stdout and "--speculative-draft-attention-backnd" in proc.stdout
    assert not (workflow / "results").exists()


# each of these was accepted and then made the run or its plan go on for ever, or failed only inside a job
AT_CONFIG_TIME = [
    (
        "nan-temperature",
        lambda c: c["sampling"].update(temperature=float("nan")),
        "sampling.temperature: nan is not a finite number",
    ),
    (
        "infinite-timeout",
        lambda c: c.update(server={"request_timeout": float("inf")}),
        "server.request_timeout: inf is not a finite number",
    ),
    (
        "block-size",
        lambda c: c["methods"][1].update(block_size=100000),
        "methods[1].block_size: 100000 is greater than the maximum of 256",
    ),
    ("warmup", lambda c: c.update(warmup=1000000), "warmup: 1000000 is greater than the maximum of 1000"),
    (
        "poisson-rate",
        lambda c: c.update(load={"model": "poisson", "rate": 1e-300}),
        "load.rate: 1e-300 is less than the minimum of 0.001",
    ),
    (
        "max-new-tokens",
        lambda c: c["workloads"][0].update(max_new_tokens=1e9),
        "workloads[0] (short).max_new_tokens: 1000000000 leaves no room for a prompt",
    ),
    ("method-name-newline", lambda c: c["methods"][0].update(name="ar\n"), "methods[0].name: 'ar\\n' does not match"),
    ("nul-in-env", lambda c: c.update(server={"env": {"A": "x\0y"}}), "server.env.A: the value holds a NUL character"),
    # it passed the dry run, measured and cached every cell, then failed on its run record's file name
    (
        "method-name-240",
        lambda c: c["methods"][0].update(name="m" * 240),
        f"methods[0].name: '{'m' * 240}' is too long",
    ),
]


@pytest.mark.parametrize("name,mutate,message", AT_CONFIG_TIME, ids=[a[0] for a in AT_CONFIG_TIME])
def test_bad_values_stop_the_workflow_before_any_job_naming_the_key(workflow, name, mutate, message):
    config = load_default_config()
    mutate(config)
    write_config(workflow, config)
    proc = snakemake(workflow, "-n", check=False, timeout=24)  # a dry run: it used to spin in the plan
    assert proc.returncode != 0
    assert f"Invalid configuration: {message}" in proc.stdout, proc.stdout[-3000:]
    assert not (workflow / "results").exists(), "the dry run wrote the plan's memo for an invalid configuration"


def test_a_yaml_anchor_bomb_is_refused_and_never_printed(workflow):
    lines = ["bomb:", "  - &a0 [1, 1, 1, 1, 1, 1, 1, 1, 1, 1]"]
    lines += [f"  - &a{i} [{', '.join([f'*a{i - 1}'] * 10)}]" for i in range(1, 6)]  # 10^6 values in six lines
    (workflow / "config" / "bomb.yaml").write_text("\n".join(lines) + "\n")
    proc = snakemake(workflow, "-n", "--configfile", "config/config.yaml", "config/bomb.yaml", check=False, timeout=60)
    assert proc.returncode != 0
    assert "Invalid configuration: bomb: the configuration holds more than 100000 values" in proc.stdout, proc.stdout[
        -2000:
    ]
    assert len(proc.stdout) < 10_000, "the configuration was printed"


def test_schema_errors_name_the_key_without_printing_the_configuration(workflow):
    config = load_default_config()
    config["concurency"] = [1, 4]
    write_config(workflow, config)
    proc = snakemake(workflow, "-n", check=False, timeout=24)
    assert proc.returncode != 0
    assert "Invalid configuration: concurency: not a key of the configuration; known: adaptive," in proc.stdout, (
        proc.stdout[-3000:]
    )
    assert "On instance" not in proc.stdout and "Failed validating" not in proc.stdout


def test_whole_floats_seed_1e3_and_braces_in_the_title_are_taken_as_written(workflow):
    """`concurrency: [1, 2.0]` and `--config seed=1e3` used to fail blaming a method's flags; `{x}` in the report's
    title made Snakemake raise a WildcardError. Now the floats are the integers they mean and the title reaches
    the report literally."""
    config = fast_config()
    config["concurrency"] = [1, 2.0]
    config["report"] = {"title": "Sweep {x} of {model}"}
    write_config(workflow, config)
    snakemake(workflow, REPORT_DATA, "--config", "seed=1e3")
    context = json.loads((workflow / REPORT_DATA).read_text())["context"]
    assert context["title"] == tex_escape("Sweep {x} of {model}")
    cell = json.loads((workflow / "results/cells/tp1/ar/short/c2.json").read_text())
    assert cell["cell"]["concurrency"] == 2 and cell["seed"] == 1000


@pytest.mark.parametrize("folder", ["", "/", "//"], ids=["empty", "root", "double-slash"])
def test_a_cache_dir_at_the_filesystem_root_stops_the_workflow_before_any_write(workflow, folder):
    """`cache_dir: ""` wrote journals to /journal, and `cache_dir: "/"` made a dry run write /plan/<digest>.json."""
    config = load_default_config()
    config["cache_dir"] = folder
    write_config(workflow, config)
    proc = snakemake(workflow, "-n", check=False, timeout=24)
    assert proc.returncode != 0
    assert "Invalid configuration: cache_dir: " in proc.stdout, proc.stdout[-3000:]
    assert not (workflow / "results").exists()


def test_a_dry_run_writes_only_into_results_and_the_cache(workflow, tmp_path):
    config = load_default_config()
    config["cache_dir"] = str(tmp_path / "cache")
    write_config(workflow, config)

    def files():
        return {p for p in tmp_path.rglob("*") if p.is_file()}

    before = files()
    snakemake(workflow, "-n")
    written = files() - before
    allowed = (workflow / "results", workflow / ".snakemake", tmp_path / "cache")
    assert any(p.is_relative_to(tmp_path / "cache" / "plan") for p in written)  # the plan's memo
    assert [p for p in written if not any(p.is_relative_to(a) for a in allowed)] == []


def test_a_key_given_twice_in_a_config_file_stops_the_workflow_naming_file_line_and_key(workflow):
    path = write_config(workflow, load_default_config())
    first = path.read_text().splitlines().index("warmup: 2") + 1
    path.write_text(path.read_text() + "warmup: 5\n")  # YAML keeps the last one silently
    proc = snakemake(workflow, "-n", check=False, timeout=24)
    assert proc.returncode != 0
    lines = len(path.read_text().splitlines())
    assert (
        f"Invalid configuration: config/config.yaml: line {lines}: duplicated key 'warmup' (first given at line "
        f"{first})"
    ) in proc.stdout, proc.stdout[-3000:]
    assert not (workflow / "results").exists()


def dry_run_of_prompt_file(workflow, path, requests: int):
    """A dry run of one workload read from the prompt file ``path``, at concurrency 1."""
    config = load_default_config()
    config["workloads"] = [
        {"name": "mine", "family": "short", "source": "file", "path": str(path), "requests": requests}
    ]
    config["concurrency"] = [1]
    write_config(workflow, config)
    return snakemake(workflow, "-n", check=False, timeout=24)


def test_undecodable_prompt_file_stops_the_workflow_naming_file_and_line(workflow, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes(b'{"prompt": "fine"}\n{"prompt": "fine too"}\n{"prompt": "caf\xe9"}\n')
    proc = dry_run_of_prompt_file(workflow, path, 2)
    assert proc.returncode != 0
    assert f"{path}: line 3: not valid UTF-8 (byte 0xe9 at column 16)" in proc.stdout, proc.stdout[-3000:]
    assert not (workflow / "results").exists()


def test_repeated_prompts_are_counted_once_with_a_warning(workflow, tmp_path):
    """Twenty identical lines were twenty distinct sessions; now one prompt, said so, and a cell asking for more
    distinct sessions than the file has is refused before any job."""
    path = tmp_path / "twenty.jsonl"
    path.write_text(
        "".join(json.dumps({"prompt": "Summarise the plot of Hamlet."}) + "\n" for _ in range(20))
        + "".join(json.dumps({"prompt": f"What is {i} squared?"}) + "\n" for i in range(3))
    )
    proc = dry_run_of_prompt_file(workflow, path, 8)
    assert proc.returncode != 0
    assert "19 entries repeat an earlier entry's first turn" in proc.stdout, proc.stdout[-3000:]
    assert "cell mine at concurrency 1 (workloads[0]): needs 8 sessions but its source has 4 distinct" in proc.stdout
    proc = dry_run_of_prompt_file(workflow, path, 4)
    assert proc.returncode == 0 and "19 entries repeat an earlier entry's first turn" in proc.stdout
