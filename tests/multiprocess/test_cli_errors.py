"""Bad input gets one clear line naming what is wrong, and a documented exit code."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ranksight.store.server import free_port


def cli(*args: str, home: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RANKSIGHT_HOME": home}
    env.pop("RANKSIGHT_STORE", None)
    return subprocess.run(
        [sys.executable, "-m", "ranksight.cli", *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


@pytest.fixture(scope="module")
def run_store(tmp_path_factory) -> str:
    """A chdb store with one small synthetic run, ``slow``, whose rank 3 is slow."""
    from ranksight.store import open_store
    from ranksight.synthetic import SynthConfig, write_synthetic

    url = str(tmp_path_factory.mktemp("store"))
    store = open_store(url)
    store.init_schema()
    cfg = SynthConfig(dp=2, tp=2, pp=2, steps=12, run_id="slow", faults=("slow:rank=3,factor=2",))
    write_synthetic(store, cfg)
    return url


def one_error_line(out: subprocess.CompletedProcess) -> str:
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    return lines[0]


@pytest.mark.parametrize(
    "url", ["foo://bar/db", "clickhouse://host:notaport/db", "clickhouse://127.0.0.1:9000"]
)
def test_garbage_store_url(tmp_path, url):
    out = cli("runs", "--store", url, home=str(tmp_path))
    assert out.returncode == 1
    line = one_error_line(out)
    assert line.startswith("error:") and url.split("/")[0] in line


def test_an_error_quotes_the_input_as_given(tmp_path, run_store):
    """A path or run id holding ``:name:`` (rich's emoji codes) or ``[tag]`` is printed as
    typed, not as an emoji or a style."""
    where = str(tmp_path / "a:cd:b [bold]c")
    line = one_error_line(cli("runs", "--store", where, home=str(tmp_path)))
    assert line.startswith(f"error: no store at {where} ")
    out = cli("report", "--run", "x:smile:y", "--store", run_store, home=str(tmp_path))
    assert out.returncode == 1
    assert one_error_line(out).startswith("error: unknown run 'x:smile:y' ")


def test_import_names_a_refused_file_whose_path_looks_like_markup(tmp_path):
    """A refused file under ``a[/b]`` (rich reads ``[/b]`` as a closing tag) is named as it
    is, beside the good dump imported, not a MarkupError traceback."""
    import pickle
    import shutil

    folder = tmp_path / "in" / "a["
    folder.mkdir(parents=True)
    good = os.path.join(
        os.path.dirname(os.path.dirname(__file__)),
        "data",
        "fr",
        "nccl_h200x2",
        "nccl_trace_rank_0.gz",
    )
    shutil.copy(good, folder)
    bad = folder / "b]nccl_trace_rank_1"
    bad.write_bytes(pickle.dumps({"version": [2, 10], "entries": 5, "pg_config": 7}))
    store = str(tmp_path / "store")
    out = cli("import", str(tmp_path / "in"), "--store", store, "--no-report", home=str(tmp_path))
    assert out.returncode == 0, out.stderr
    assert one_error_line(out).startswith(f"error: could not import {bad} (flight_recorder")
    assert f"{folder / 'nccl_trace_rank_0.gz'}: flight_recorder rank 0" in out.stdout


def test_unreachable_server_is_named(tmp_path):
    port = free_port()  # nobody listens on it
    out = cli(
        "report", "--run", "x", "--store", f"clickhouse://127.0.0.1:{port}/db", home=str(tmp_path)
    )
    assert out.returncode == 1
    assert f"127.0.0.1:{port}" in one_error_line(out)


def test_unknown_run_id(tmp_path):
    from ranksight.store import open_store

    open_store(str(tmp_path / "s")).init_schema()
    out = cli("report", "--run", "no-such-run", "--store", str(tmp_path / "s"), home=str(tmp_path))
    assert out.returncode == 1
    assert "unknown run 'no-such-run'" in one_error_line(out)


@pytest.mark.parametrize("command", [("runs",), ("report", "--run", "x")])
def test_a_missing_store_folder_is_an_error_not_a_new_store(tmp_path, command):
    missing = tmp_path / "typo" / "store"
    out = cli(*command, "--store", str(missing), home=str(tmp_path))
    assert out.returncode == 1
    assert f"no store at {missing}" in one_error_line(out)
    assert not (tmp_path / "typo").exists()


def test_password_never_printed(tmp_path):
    out = cli("runs", "--store", "clickhouse://u:s3cret@127.0.0.1:1/db", home=str(tmp_path))
    assert out.returncode == 1 and "s3cret" not in out.stderr + out.stdout


@pytest.mark.parametrize("spec", ["bogus:rank=1", "slow:rank=1", "slow:rank=99,factor=2"])
def test_bad_fault_spec_is_a_usage_error(tmp_path, spec):
    out = cli("demo", "--inject", spec, home=str(tmp_path))
    assert out.returncode == 2
    assert spec in one_error_line(out)


def test_bad_report_format(tmp_path):
    out = cli(
        "report",
        "--run",
        "x",
        "--format",
        "yaml",
        "--store",
        str(tmp_path / "s"),
        home=str(tmp_path),
    )
    assert out.returncode == 2 and "yaml" in one_error_line(out)


def test_agent_once_with_the_store_down_exits_1_and_keeps_the_records(tmp_path):
    port = free_port()  # nobody listens on it
    spool = tmp_path / "spool"
    spool.mkdir()
    out = cli("agent", "--once", "--spool", str(spool), "--collectors", "none",
              "--store", f"clickhouse://127.0.0.1:{port}/db", home=str(tmp_path))  # fmt: skip
    assert out.returncode == 1
    assert f"cannot reach ClickHouse at 127.0.0.1:{port}" in out.stderr
    assert "stays in the disk buffer" in out.stderr


@pytest.mark.parametrize(
    "args, names",
    [(("demo", "--steps", "garbage"), "'--steps'"), (("report",), "'--run'"),
     (("report", "--run", "x", "--bogus"), "--bogus"), (("nosuch",), "'nosuch'")],
)  # fmt: skip
def test_usage_errors_are_one_line_naming_the_option(tmp_path, args, names):
    out = cli(*args, home=str(tmp_path))
    assert out.returncode == 2
    line = one_error_line(out)
    assert line.startswith("error: ") and names in line and "--help' " not in line
    assert line.endswith("--help')") and "╭" not in out.stderr


def test_a_step_window_outside_the_run_names_the_steps_it_has(tmp_path, run_store):
    out = cli("report", "--run", "slow", "--steps", "100:200", "--no-save", "--store", run_store,
              home=str(tmp_path))  # fmt: skip
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    assert "analyzed steps 100-200 only: none of them is recorded, this run has steps 0-11" in text


def test_version(tmp_path):
    from ranksight import __version__

    out = cli("--version", home=str(tmp_path))
    assert out.returncode == 0 and out.stdout.strip() == f"ranksight {__version__}"


def test_since_without_a_unit_is_a_usage_error(tmp_path):
    out = cli("report", "--run", "x", "--since", "10", "--store", str(tmp_path), home=str(tmp_path))
    assert out.returncode == 2
    line = one_error_line(out)
    assert "--since '10'" in line and "10s, 10m, 10h or 10d" in line


@pytest.mark.parametrize(
    "args",
    [("--help",), ("runs",), ("report", "--run", "slow"),
     ("report", "--run", "slow", "--format", "json"),
     ("report", "--run", "slow", "--format", "markdown")],
)  # fmt: skip
def test_a_closed_stdout_ends_quietly(tmp_path, run_store, args):
    """``ranksight ... | head`` once head has gone: exit 141 (as git), nothing on stderr."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # every write to stdout fails with EPIPE
    env = {**os.environ, "RANKSIGHT_HOME": str(tmp_path), "RANKSIGHT_STORE": run_store}
    try:
        out = subprocess.run([sys.executable, "-m", "ranksight.cli", *args], stdout=write_end,
                             stderr=subprocess.PIPE, text=True, timeout=120, env=env)  # fmt: skip
    finally:
        os.close(write_end)
    assert (out.returncode, out.stderr) == (141, "")


def _command_paths(command, path=()):
    """Every command of the ``ranksight`` click tree, as argument tuples."""
    yield path
    for name, sub in getattr(command, "commands", {}).items():
        yield from _command_paths(sub, (*path, name))


def test_help_shows_no_type_for_on_off_flags():
    import typer
    from typer.testing import CliRunner

    from ranksight.cli import app

    runner = CliRunner()
    paths = list(_command_paths(typer.main.get_command(app)))
    assert ("agent",) in paths and ("db", "init") in paths
    for path in paths:
        out = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"})
        assert out.exit_code == 0, (path, out.output)
        assert "<bool>" not in out.output, (path, out.output)
    agent_help = runner.invoke(app, ["agent", "--help"], env={"COLUMNS": "200"}).output
    assert "--once" in agent_help and "--no-once" not in agent_help
    assert "<float" in agent_help  # options that take a value still show its type


def test_import_names_each_skipped_or_refused_file_in_a_sentence(tmp_path):
    import shutil

    folder = tmp_path / "in"
    folder.mkdir()
    dumps = os.path.join(os.path.dirname(os.path.dirname(__file__)), "data", "import", "nccl_hang")
    shutil.copy(os.path.join(dumps, "fr_rank0.json.gz"), folder)
    (folder / "notes.txt").write_text("hello\n")
    (folder / "fr_rank7.json").write_text('{"entries": 5}')
    out = cli(
        "import", str(folder), "--no-report", "--store", str(tmp_path / "s"), home=str(tmp_path)
    )
    assert out.returncode == 0, out.stderr
    assert f"skipped {folder / 'notes.txt'}: text with no watchdog" in out.stdout
    assert (
        f"error: could not import {folder / 'fr_rank7.json'} (flight_recorder rank 7): not a"
        in out.stderr
    )
    assert f"{folder / 'fr_rank0.json.gz'}: flight_recorder rank 0: " in out.stdout
    assert "rows written per table: collectives 25, fr_dumps 1," in out.stdout  # not '1 fr_dumps'
    assert ": -:" not in out.stdout + out.stderr and "skipped: " not in out.stdout


def test_counts_of_one_are_singular(tmp_path, run_store):
    from ranksight.ground.words import counted

    assert counted(1, "step") == "1 step" and counted(0, "step") == "0 steps"
    assert counted(2, "entry", "entries") == "2 entries"
    assert counted(1024, "row", spec=",") == "1,024 rows"
    env = ("--store", run_store)
    for fmt in ("text", "markdown"):
        out = cli(
            "report", "--run", "slow", "--steps", "8", "--format", fmt, *env, home=str(tmp_path)
        )
        assert out.returncode == 0, out.stderr
        assert "1 step analyzed" in out.stdout and "1 steps" not in out.stdout


def test_import_of_an_empty_folder_names_it_and_what_was_looked_for(tmp_path):
    folder = tmp_path / "dumps"
    folder.mkdir()
    (folder / ".hidden").write_text("WorkNCCL(SeqNum=1, OpType=ALLREDUCE) timeout")
    out = cli("import", str(folder), "--store", str(tmp_path / "s"), home=str(tmp_path))
    assert out.returncode == 1
    line = one_error_line(out)
    assert f"no files in {folder}" in line and "Flight Recorder dumps, Kineto traces" in line
    (folder / "notes.txt").write_text("hello\n")
    out = cli("import", str(folder), "--store", str(tmp_path / "s"), home=str(tmp_path))
    assert out.returncode == 1
    assert f"nothing could be imported from {folder}: no file there (1 file found" in out.stderr


def test_markdown_report_has_the_waits_table_of_the_text_report(tmp_path, run_store):
    import re

    def report(fmt: str) -> str:
        out = cli(
            "report", "--run", "slow", "--format", fmt, "--store", run_store, home=str(tmp_path)
        )
        assert out.returncode == 3, out.stderr
        return out.stdout

    text, markdown = report("text"), report("markdown")
    row = r"[│|] ((?:\w+ group|in \w+)) +[│|] +(\d+) [│|]"
    waits = re.findall(row, text)
    assert {"pp group", "in all_reduce"} <= {by for by, _ in waits}, text
    assert re.findall(row, markdown) == waits
    victims = re.search(r"victims \(waited directly\): (.+)", text).group(1)
    assert f"Victims (waited directly): {victims}." in markdown


@pytest.mark.parametrize(
    "flag, under",
    [("--spool", ""), ("--spool", "sub"), ("--buffer-dir", ""), ("--buffer-dir", "a/b")],
)
def test_agent_folder_options_that_are_files_are_named(tmp_path, flag, under):
    afile = tmp_path / "afile"
    afile.write_text("x")
    path = afile / under if under else afile
    args = {"--spool": str(tmp_path / "spool"), flag: str(path)}
    out = cli("agent", "--once", "--collectors", "none", "--store", str(tmp_path / "s"),
              *[x for kv in args.items() for x in kv], home=str(tmp_path))  # fmt: skip
    assert out.returncode == 2
    line = one_error_line(out)
    assert line.startswith(f"error: {flag} {path}: ") and "Errno" not in line
    want = "is a file, not a folder" if not under else f"cannot be made: {afile} is a file"
    assert want in line


def test_a_spool_from_the_environment_names_the_setting(tmp_path):
    afile = tmp_path / "afile"
    afile.write_text("x")
    env_cli = {**os.environ, "RANKSIGHT_HOME": str(tmp_path), "RANKSIGHT_SPOOL_DIR": str(afile)}
    env_cli.pop("RANKSIGHT_STORE", None)
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "agent", "--once", "--collectors", "none"],
        capture_output=True, text=True, timeout=120, env=env_cli,
    )  # fmt: skip
    assert out.returncode == 2
    assert f"setting agent.spool {afile}: is a file, not a folder" in one_error_line(out)


@pytest.mark.parametrize("command", [("runs",), ("report", "--run", "x"), ("import", "in")])
def test_a_store_folder_that_is_a_file_is_named(tmp_path, command):
    afile = tmp_path / "afile"
    afile.write_text("x")
    out = cli(*command, "--store", str(afile), home=str(tmp_path))
    assert out.returncode == 1
    line = one_error_line(out)
    assert f"{afile}: is a file, not a folder (a chdb store is a folder)" in line


def test_a_config_that_is_a_folder_is_named(tmp_path):
    out = cli("agent", "--once", "--config", str(tmp_path), home=str(tmp_path))
    assert out.returncode == 2
    assert f"--config {tmp_path}: is a folder, not a TOML file" in one_error_line(out)


@pytest.mark.parametrize(
    "endpoint, env_var",
    [("notaurl", None), ("collector:4318", None), ("grpc://collector:4317", None),
     (None, "notaurl")],
)  # fmt: skip
def test_agent_refuses_an_otlp_endpoint_it_cannot_send_to(tmp_path, endpoint, env_var):
    spool = tmp_path / "spool"
    env_cli = {**os.environ, "RANKSIGHT_HOME": str(tmp_path)}
    env_cli.pop("RANKSIGHT_STORE", None)
    env_cli.pop("RANKSIGHT_OTLP_ENDPOINT", None)
    env_cli["OTEL_EXPORTER_OTLP_ENDPOINT"] = env_var or ""
    args = ["--otlp-endpoint", endpoint] if endpoint else []
    out = subprocess.run(
        [sys.executable, "-m", "ranksight.cli", "agent", "--once", "--spool", str(spool), "--collectors",
         "none", "--store", str(tmp_path / "s"), *args],
        capture_output=True, text=True, timeout=120, env=env_cli,
    )  # fmt: skip
    assert out.returncode == 2
    where = (
        f"--otlp-endpoint {endpoint!r}" if endpoint else "$OTEL_EXPORTER_OTLP_ENDPOINT 'notaurl'"
    )
    assert one_error_line(out).startswith(f"error: {where}: ")


def test_a_missing_import_path_exits_as_a_missing_store_does(tmp_path):
    store = cli("runs", "--store", str(tmp_path / "nostore"), home=str(tmp_path))
    path = cli(
        "import", str(tmp_path / "nofile"), "--store", str(tmp_path / "s"), home=str(tmp_path)
    )
    assert store.returncode == path.returncode == 1
    assert "nofile" in one_error_line(path) and "nostore" in one_error_line(store)


def test_runs_lists_when_each_run_started(tmp_path, run_store):
    import re

    out = cli("runs", "--store", run_store, home=str(tmp_path))
    assert out.returncode == 0 and "started (UTC)" in out.stdout
    row = next(ln for ln in out.stdout.splitlines() if "slow" in ln)
    assert re.search(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d", row), row
