"""CI (.ci/run) runs the README's two commands verbatim, in order, in one clone."""

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def readme_commands() -> list[str]:
    readme = (ROOT / "README.md").read_text()
    section = readme.split("\n## The two commands\n", 1)[1].split("\n## ", 1)[0]
    return [block.strip() for block in re.findall(r"```bash\n(.*?)```", section, re.S)]


def test_ci_runs_the_readme_commands_in_order():
    commands = readme_commands()
    assert len(commands) == 2 and all("\n" not in c for c in commands)
    install_and_sweep, tests = commands
    assert ".venv/bin/pip install . " in install_and_sweep and "bmlmpi-bench" in install_and_sweep
    assert ".venv/bin/pip install -e '.[test]'" in tests
    # every test, the unit tests on every core beside the launches (tests/conftest.py)
    assert tests.endswith("-m pytest -n auto")
    res = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--print"], capture_output=True,
                         text=True, timeout=30)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == commands


def test_readme_says_what_ci_does():
    readme = " ".join((ROOT / "README.md").read_text().split())
    assert "`.ci/run` runs these two commands, verbatim" in readme
    assert "in this order, in one clone" in readme


def test_ci_checks_command_1s_venv_before_command_2():
    """Command 2 makes .venv editable; command 1's own venv is used from the root before that."""
    run = (ROOT / ".ci" / "run").read_text()
    first, check, second = (run.index('bash -euo pipefail -c "${commands[0]}"'),
                            run.index("\n.ci/after-install\n"),
                            run.index('bash -euo pipefail -c "${commands[1]}"'))
    assert first < check < second
    after = (ROOT / ".ci" / "after-install").read_text()
    assert '"editable"' in after and "jobs/sweep-mpirun.sh" in after
    for step in ("bmlmpi.Communicator", "-m bmlmpi.cli.bench", "-m bmlmpi.cli.calibrate",
                 "-m perf.baseline", ".venv/bin/bmlmpi-run -n 2 python"):
        assert step in after, step


def test_readme_gives_a_fast_test_subset():
    """Beside command 2 (every test, about 65 minutes on 2 cores) the README names the unit
    tests alone, with how many there are; the command it gives collects them."""
    readme = " ".join((ROOT / "README.md").read_text().split())
    command = ".venv/bin/python -m pytest tests/unit"
    assert f"`{command}`" in readme
    stated = re.search(r"`" + re.escape(command) + r"` \(about ([\d,]+) tests", readme)
    assert stated, "the README says how many tests the subset runs"
    res = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q",
                          "-p", "no:cacheprovider", "tests/unit"], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr[-2000:]
    collected = int(re.search(r"(\d+) tests? collected", res.stdout).group(1))
    assert abs(collected - int(stated.group(1).replace(",", ""))) <= 0.1 * collected
