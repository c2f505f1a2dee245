"""bmlmpi.config: every BMLMPI_* variable declared once, one truth rule, errors that name the
variable, the table in docs/environment.md generated from the declarations, and no other module
reading the environment on its own."""

import ast
from pathlib import Path

import pytest

from bmlmpi import api, config, execute, kernels, selection
from bmlmpi.topology import bcube, links, trees

dispatch, gpu = kernels.dispatch, kernels.gpu

ROOT = Path(__file__).resolve().parents[2]
SOURCES = sorted([*(ROOT / "bmlmpi").rglob("*.py"), *(ROOT / "kernels").rglob("*.py")])
ALLOWED_DIRECT_READS = {ROOT / "bmlmpi" / "config.py"}

BOOLEANS = [v.name for v in config.VARIABLES.values() if v.parse is config.parse_bool]
TRUE_SPELLINGS = ["1", "true", "TRUE", "True", "yes", "YES", "on", "On", " on ", "\ttrue\n"]
FALSE_SPELLINGS = ["0", "false", "FALSE", "False", "no", "NO", "off", "OFF", " off ", "\tno\n"]
BAD_BOOLEANS = ["2", "-1", "y", "n", "t", "f", "enable", "disabled", "truee", "o n", "1.0",
                "none"]

# Every non-boolean variable: text its parser must refuse. Variables taking free text
# (a shape, a file or preset, a program, a directory) are checked by their consumers below.
BAD_VALUES = {
    "BMLMPI_TIMEOUT": ["abc", "0", "-5", "inf", "nan", "1s"],
    "BMLMPI_TREE_LINK_PENALTY": ["x", "0", "-0.5", "1.5", "nan", "inf"],
    "BMLMPI_TREE_ARRAY_BOUND": ["x", "-1", "1.5", "1e3"],
    "BMLMPI_AUTO_BML_BYTES": ["x", "-1", "64KiB", "0.5"],
    "BMLMPI_TUNING_BLOCK": ["0", "-1", "many", "1.5"],
    "BMLMPI_TUNING_RUNOFF": ["-1", "many", "1.5"],
    "BMLMPI_SPIN": ["x", "-0.01", "inf", "nan"],
    "BMLMPI_KERNEL": ["fortran", "cupy", "numba2"],
    "BMLMPI_KERNEL_THREADS": ["0", "-2", "many", "2.5"],
    "BMLMPI_HANG_TIMEOUT": ["0", "-1", "soon", "inf"],
    "BMLMPI_HEARTBEAT": ["0", "-0.1", "x"],
    "BMLMPI_EXPECT_SIZE": ["0", "-3", "nine"],
    "BMLMPI_RANKS_PER_NODE": ["0", "-2", "x", "1.5"],
    "BMLMPI_FUSION_BYTES": ["0", "-1", "25MiB", "1.5"],
    "BMLMPI_SHM_CHUNK": ["0", "-1", "256KiB", "1.5"],
    "BMLMPI_BLOCKING": ["poll", "off", "abort", "1"],
    "BMLMPI_CHECK": ["first", "always", "1", "every"],
    "BMLMPI_TRACE_CALLS": ["-1", "many", "2.5"],
    "BMLMPI_TRACE_FILES": ["-1", "few", "1.5"],
}
FREE_TEXT = {"BMLMPI_ALGORITHM", "BMLMPI_BCUBE", "BMLMPI_LINKS", "BMLMPI_MPIEXEC",
             "BMLMPI_CACHE_DIR", "BMLMPI_TUNING", "BMLMPI_STATUS_DIR", "BMLMPI_COMPRESSION",
             "BMLMPI_TRACE_DIR", "BMLMPI_TIMELINE", "BMLMPI_TRACE_TORCH"}


def test_every_variable_is_covered_by_these_tests():
    assert set(config.VARIABLES) == set(BOOLEANS) | set(BAD_VALUES) | FREE_TEXT
    assert not set(BOOLEANS) & set(BAD_VALUES)


def test_boolean_variables_are_the_expected_ones():
    assert set(BOOLEANS) == {"BMLMPI_VALIDATE", "BMLMPI_CALIBRATE", "BMLMPI_RECALIBRATE",
                             "BMLMPI_CUDA_AWARE", "BMLMPI_ULFM", "BMLMPI_TOLERATE_LOST",
                             "BMLMPI_FAULT_TOLERANT", "BMLMPI_REPRODUCIBLE"}


@pytest.mark.parametrize("name", BOOLEANS)
def test_boolean_spellings(name):
    for text in TRUE_SPELLINGS:
        assert config.get(name, {name: text}) is True, text
    for text in FALSE_SPELLINGS:
        assert config.get(name, {name: text}) is False, text
    default = config.variable(name).default
    for text in ("", "  "):
        assert config.get(name, {name: text}) is default
    assert config.get(name, {}) is default
    for text in BAD_BOOLEANS:
        with pytest.raises(config.ConfigError) as err:
            config.get(name, {name: text})
        assert name in str(err.value) and repr(text.strip()) in str(err.value)


@pytest.mark.parametrize("name", sorted(BAD_VALUES))
def test_parse_errors_name_the_variable_and_the_value(name):
    for text in BAD_VALUES[name]:
        with pytest.raises(config.ConfigError) as err:
            config.get(name, {name: text})
        assert f"{name}={text!r}" in str(err.value)
    assert isinstance(config.ConfigError("x"), ValueError)


def test_values_parse_to_their_types(tmp_path):
    env = {"BMLMPI_TIMEOUT": " 7.5 ", "BMLMPI_TREE_LINK_PENALTY": "1",
           "BMLMPI_TREE_ARRAY_BOUND": "0", "BMLMPI_AUTO_BML_BYTES": "4096",
           "BMLMPI_SPIN": "0", "BMLMPI_KERNEL": "NumPy", "BMLMPI_KERNEL_THREADS": "3",
           "BMLMPI_HANG_TIMEOUT": "2", "BMLMPI_HEARTBEAT": "0.1", "BMLMPI_EXPECT_SIZE": "9",
           "BMLMPI_ALGORITHM": " Ring ", "BMLMPI_BCUBE": " 3x3 ",
           "BMLMPI_CACHE_DIR": str(tmp_path), "BMLMPI_MPIEXEC": "/opt/mpi/bin/mpiexec",
           "BMLMPI_BLOCKING": " Polled "}
    got = {name: config.get(name, env) for name in env}
    assert got == {"BMLMPI_TIMEOUT": 7.5, "BMLMPI_TREE_LINK_PENALTY": 1.0,
                   "BMLMPI_TREE_ARRAY_BOUND": 0, "BMLMPI_AUTO_BML_BYTES": 4096,
                   "BMLMPI_SPIN": 0.0, "BMLMPI_KERNEL": "numpy", "BMLMPI_KERNEL_THREADS": 3,
                   "BMLMPI_HANG_TIMEOUT": 2.0, "BMLMPI_HEARTBEAT": 0.1,
                   "BMLMPI_EXPECT_SIZE": 9, "BMLMPI_ALGORITHM": "ring",
                   "BMLMPI_BCUBE": "3x3", "BMLMPI_CACHE_DIR": tmp_path,
                   "BMLMPI_MPIEXEC": "/opt/mpi/bin/mpiexec", "BMLMPI_BLOCKING": "polled"}
    assert config.get("BMLMPI_CACHE_DIR", {"BMLMPI_CACHE_DIR": "~/x"}) == Path.home() / "x"
    assert config.get("BMLMPI_TUNING", {"BMLMPI_TUNING": "~/t.jsonl"}) == Path.home() / "t.jsonl"
    with pytest.raises(KeyError, match="BMLMPI_NOPE"):
        config.get("BMLMPI_NOPE")


def test_unset_variables_give_their_defaults(monkeypatch):
    for name in config.VARIABLES:
        monkeypatch.delenv(name, raising=False)
    assert execute.timeout_from_env() == execute.DEFAULT_TIMEOUT == 120.0
    assert execute.spin_seconds() == 0.05
    assert api._validation_enabled(None) is True
    assert selection.calibration_wanted("auto") is True
    assert selection.env_algorithm() is None and selection.tree_array_bound() is None
    assert selection.choose(64 * 1024, 1, 4) == "bml" and selection.choose(64 * 1024 - 1, 1, 4) == \
        "native"
    assert trees.link_penalty() == trees.DEFAULT_PENALTY == 0.7
    assert links.links_from_env() is None
    assert bcube.resolve_shape(12) == (2, 2, 3)
    dispatch.set_kernel_mode(None)
    assert dispatch.kernel_mode() == "auto"


# -- the switches reach the code that uses them ------------------------------------------------

@pytest.mark.parametrize("text, expected", [("off", False), ("OFF", False), ("no", False),
                                            ("0", False), ("on", True), ("Yes", True)])
def test_validate_switch(monkeypatch, text, expected):
    monkeypatch.setenv("BMLMPI_VALIDATE", text)
    assert api._validation_enabled(None) is expected
    assert api._validation_enabled(not expected) is (not expected)  # the argument wins


@pytest.mark.parametrize("text, expected", [("off", False), ("Off", False), ("false", False),
                                            ("on", True), ("1", True)])
def test_calibrate_switch(monkeypatch, text, expected):
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)
    monkeypatch.setenv("BMLMPI_CALIBRATE", text)
    assert selection.calibration_wanted("auto") is expected


def test_cuda_aware_switch(monkeypatch):
    for text, expected in (("on", True), ("Off", False), ("YES", True), ("no", False)):
        monkeypatch.setenv("BMLMPI_CUDA_AWARE", text)
        assert gpu.cuda_aware_mpi() is expected


@pytest.mark.parametrize("name, call", [
    ("BMLMPI_VALIDATE", lambda: api._validation_enabled(None)),
    ("BMLMPI_CALIBRATE", lambda: selection.calibration_wanted("auto")),
    ("BMLMPI_CUDA_AWARE", gpu.cuda_aware_mpi),
])
def test_bad_switch_is_an_error_where_it_is_used(monkeypatch, name, call):
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)
    monkeypatch.setenv(name, "maybe")
    with pytest.raises(config.ConfigError, match=f"{name}='maybe'"):
        call()


@pytest.mark.parametrize("name, text, call", [
    ("BMLMPI_TIMEOUT", "soon", execute.timeout_from_env),
    ("BMLMPI_TIMEOUT", "-1", execute.timeout_from_env),
    ("BMLMPI_SPIN", "fast", execute.spin_seconds),
    ("BMLMPI_TREE_ARRAY_BOUND", "big", selection.tree_array_bound),
    ("BMLMPI_AUTO_BML_BYTES", "64k", lambda: selection.choose(1 << 20, 4, 4)),
    ("BMLMPI_TREE_LINK_PENALTY", "2", trees.link_penalty),
    ("BMLMPI_ALGORITHM", "nonsense", selection.env_algorithm),
])
def test_bad_values_are_errors_where_they_are_used(monkeypatch, name, text, call):
    monkeypatch.delenv("BMLMPI_ALGORITHM", raising=False)
    monkeypatch.setenv(name, text)
    with pytest.raises(config.ConfigError, match=f"{name}={text!r}"):
        call()


def test_explicit_arguments_still_win(monkeypatch):
    monkeypatch.setenv("BMLMPI_TIMEOUT", "soon")
    assert execute.timeout_from_env(3) == 3.0
    monkeypatch.setenv("BMLMPI_TREE_LINK_PENALTY", "2")
    assert trees.link_penalty(0.5) == 0.5


# -- documentation and structure ---------------------------------------------------------------

def test_docs_table_is_the_declared_variables():
    page = (ROOT / "docs" / "environment.md").read_text()
    table = config.markdown_table()
    assert table in page, "docs/environment.md's table differs from bmlmpi.config:\n" + table
    rows = [line for line in page.splitlines() if line.startswith("| `BMLMPI_")]
    assert [r.split("`")[1] for r in rows] == list(config.VARIABLES)
    for v in config.VARIABLES.values():
        assert v.meaning and v.default_text
        if isinstance(v.default, int | float) and not isinstance(v.default, bool):
            assert v.default_text.split(" (")[0] in (f"{v.default:g}", str(v.default))
        elif isinstance(v.default, str):
            assert v.default_text == v.default
        elif isinstance(v.default, bool):
            assert v.default_text == ("on" if v.default else "off")


def _is_config(node: ast.AST) -> bool:
    return isinstance(node, ast.Name) and node.id == "config"


def _direct_reads(tree: ast.AST) -> list[tuple[int, str]]:
    """BMLMPI_* names read from a mapping (``x.get("BMLMPI_…")``, ``x["BMLMPI_…"]``,
    ``os.getenv("BMLMPI_…")``, ``"BMLMPI_…" in x``) anywhere in the module."""
    found = []

    def name_of(node):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("BMLMPI_"):
            return node.value
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "getenv", "pop", "setdefault", "__getitem__") \
                and not _is_config(node.func.value) and node.args and name_of(node.args[0]):
            found.append((node.lineno, name_of(node.args[0])))
        elif isinstance(node, ast.Subscript) and name_of(node.slice):
            found.append((node.lineno, name_of(node.slice)))
        elif isinstance(node, ast.Compare) and name_of(node.left) \
                and any(isinstance(op, ast.In | ast.NotIn) for op in node.ops):
            found.append((node.lineno, name_of(node.left)))
    return found


def _config_reads(tree: ast.AST) -> set[str]:
    """Names passed to ``config.get``/``config.text``/``config.variable``."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and _is_config(node.func.value) \
                and node.args and isinstance(node.args[0], ast.Constant):
            names.add(node.args[0].value)
    return names


def test_only_config_reads_the_environment():
    offenders = []
    for path in SOURCES:
        if path in ALLOWED_DIRECT_READS:
            continue
        tree = ast.parse(path.read_text(), str(path))
        offenders += [f"{path.relative_to(ROOT)}:{line}: {name}"
                      for line, name in _direct_reads(tree)]
    assert not offenders, "read these through bmlmpi.config:\n" + "\n".join(offenders)


def test_the_scan_would_catch_a_direct_read():
    tree = ast.parse('import os\nos.environ.get("BMLMPI_X", "")\nos.getenv("BMLMPI_Y")\n'
                     'os.environ["BMLMPI_Z"]\n"BMLMPI_W" in os.environ\n'
                     'config.get("BMLMPI_TIMEOUT")\n')
    assert [n for _, n in _direct_reads(tree)] == ["BMLMPI_X", "BMLMPI_Y", "BMLMPI_Z",
                                                   "BMLMPI_W"]


def test_every_declared_variable_is_read_and_every_read_is_declared():
    read = set()
    for path in SOURCES:
        tree = ast.parse(path.read_text(), str(path))
        read |= _config_reads(tree)
        if path.name == "config.py":  # helpers there (cache_dir) read through get()
            read |= {n.args[0].value for n in ast.walk(tree) if isinstance(n, ast.Call)
                     and isinstance(n.func, ast.Name) and n.func.id == "get"
                     and n.args and isinstance(n.args[0], ast.Constant)}
        if path in ALLOWED_DIRECT_READS:
            read |= {name for _, name in _direct_reads(tree)}
            # ft.py reads some names through a helper taking the name as its first argument
            read |= {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant)
                     and isinstance(n.value, str) and n.value in config.VARIABLES}
    assert read - set(config.VARIABLES) == set(), "read but not declared"
    assert set(config.VARIABLES) - read == set(), "declared but never read"


def test_config_is_a_leaf_module():
    tree = ast.parse((ROOT / "bmlmpi" / "config.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            assert node.level == 0 and not (node.module or "").startswith("bmlmpi"), \
                ast.dump(node)
        elif isinstance(node, ast.Import):
            assert not any(a.name.startswith("bmlmpi") for a in node.names)


def test_kernel_modes_come_from_config():
    assert dispatch.MODES == config.KERNEL_MODES


def test_describe_reports_values_and_errors():
    text = config.describe({"BMLMPI_VALIDATE": "Off", "BMLMPI_SPIN": "x"})
    lines = dict(line.split(" = ", 1) for line in text.splitlines())
    assert set(lines) == set(config.VARIABLES)
    assert lines["BMLMPI_VALIDATE"] == "False (set: 'Off')"
    assert lines["BMLMPI_SPIN"].startswith("ERROR: BMLMPI_SPIN='x'")
    assert lines["BMLMPI_TIMEOUT"] == "120 (default)"


# -- names nothing reads -------------------------------------------------------------------

def test_unknown_names_get_the_nearest_known_one():
    env = {"BMLMPI_ALGORTHM": "ring", "BMLMPI_TIMEOUT": "5", "BMLMPI_RANKS": "4",
           "BMLMPI_HANG_TIMOUT": "3", "BMLMPI_ZZZZZZ": "1", "OTHER_ALGORTHM": "x"}
    assert config.unknown_variables(env) == [
        ("BMLMPI_ALGORTHM", "BMLMPI_ALGORITHM"), ("BMLMPI_HANG_TIMOUT", "BMLMPI_HANG_TIMEOUT"),
        ("BMLMPI_ZZZZZZ", None)]


def test_job_and_test_names_are_known():
    """Every BMLMPI_* name the repository's scripts, tests and perf tools use is known."""
    import re
    used = set()
    for folder in ("jobs", "tests", "perf", ".ci"):
        for path in (ROOT / folder).rglob("*"):
            if path.is_file() and path.suffix in ("", ".py", ".sh", ".sbatch", ".md"):
                used |= set(re.findall(r"\bBMLMPI_[A-Z0-9_]*[A-Z0-9]\b", path.read_text(
                    errors="replace")))
    fixtures = {"BMLMPI_X", "BMLMPI_Y", "BMLMPI_Z", "BMLMPI_W", "BMLMPI_NOPE",
                "BMLMPI_ALGORTHM", "BMLMPI_HANG_TIMOUT", "BMLMPI_ZZZZZZ"}
    assert not {n for n, _ in config.unknown_variables(dict.fromkeys(used, "1"))} - fixtures


def test_warning_on_rank_zero_only(caplog):
    env = {"BMLMPI_ALGORTHM": "ring"}
    with caplog.at_level("WARNING", logger="bmlmpi"):
        config.warn_unknown({**env, "OMPI_COMM_WORLD_RANK": "1"})
        config.warn_unknown({**env, "PMI_RANK": "2"})
        assert not caplog.records
        config.warn_unknown({**env, "OMPI_COMM_WORLD_RANK": "0"})
    assert [r.getMessage() for r in caplog.records] == [
        "bmlmpi: BMLMPI_ALGORTHM is not a bmlmpi variable and is ignored; did you mean "
        "BMLMPI_ALGORITHM? (python -m bmlmpi.config lists them)"]


def test_the_first_read_of_the_environment_warns_once(monkeypatch, caplog):
    monkeypatch.setattr(config, "_environment_checked", False)
    monkeypatch.setenv("BMLMPI_ALGORTHM", "ring")
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    with caplog.at_level("WARNING", logger="bmlmpi"):
        assert config.get("BMLMPI_ALGORITHM") is None
        config.get("BMLMPI_TIMEOUT")
    assert len([r for r in caplog.records if "BMLMPI_ALGORTHM" in r.getMessage()]) == 1
