"""Configuration: one TOML file, environment variables as defaults, flags win.

Each setting has a built-in default; an environment variable (where it has one) overrides
the default; the TOML file overrides both; a command-line flag overrides everything.
``ranksight config show`` prints every setting with the value in force and where it came
from. The file is the first of: ``--config PATH``, ``$RANKSIGHT_CONFIG``,
``./ranksight.toml``, ``/etc/ranksight/ranksight.toml`` (an explicit path must exist).

Example (``deploy/ranksight.toml``)::

    [store]
    url = "clickhouse://ch-lb.internal:9000/ranksight"

    [agent]
    interval_s = 1.0
    otlp_endpoint = "http://otel-collector:4318"
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Any

from ranksight.ground import env
from ranksight.store.base import MAX_ATOMIC_ROWS

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

SYSTEM_FILE = "/etc/ranksight/ranksight.toml"
LOCAL_FILE = "ranksight.toml"


class ConfigError(ValueError):
    """A configuration file or variable is unreadable or holds a bad value; the message
    names the file (or variable), the key and what is wrong."""


@dataclass(frozen=True, slots=True)
class Setting:
    """One setting: its type, built-in default, environment variable and meaning."""

    kind: type
    default: Any
    env: str | None
    help: str
    lo: float | None = None
    """Smallest value allowed (numbers; None: no bound), as the command-line flag's."""
    hi: float | None = None
    """Largest value allowed (numbers; None: no bound)."""


SETTINGS: dict[str, Setting] = {
    "store.url": Setting(
        str,
        None,
        env.STORE,
        "store URL: a folder (chdb) or clickhouse://host:port/db; unset: $RANKSIGHT_HOME/store",
    ),
    "launch.spool": Setting(
        str, None, env.SPOOL_DIR, "node-local spool folder; unset: $RANKSIGHT_HOME/spool"
    ),
    "launch.level": Setting(str, "default", env.LEVEL, "hook level: off, default, detailed"),
    "launch.auto_attach": Setting(
        bool, True, env.AUTO_ATTACH, "attach hooks to workers with no code change"
    ),
    "launch.mesh": Setting(
        str, None, env.MESH, "mesh shape for auto-attached hooks (dp=2,pp=2,tp=2)"
    ),
    "launch.agent": Setting(str, "auto", None, "auto: reuse or start the node agent; never"),
    "launch.grace_s": Setting(
        float, 30.0, None, "seconds from SIGTERM to SIGKILL of a killed job", lo=0
    ),
    "agent.spool": Setting(
        str, None, env.SPOOL_DIR, "spool folder the agent reads; unset: $RANKSIGHT_HOME/spool"
    ),
    "agent.interval_s": Setting(float, 1.0, None, "seconds between batches", lo=0.05),
    "agent.batch_rows": Setting(
        int, 500_000, None, "most records in one batch", lo=1, hi=MAX_ATOMIC_ROWS
    ),
    "agent.buffer_dir": Setting(str, None, None, "disk buffer folder; unset: under the spool"),
    "agent.buffer_mb": Setting(int, 1024, None, "disk buffer bound, MiB", lo=1),
    "agent.drop": Setting(str, "drop_oldest", None, "full buffer: drop_oldest or drop_newest"),
    "agent.stats_interval_s": Setting(float, 10.0, None, "seconds between agent_stats rows", lo=0),
    "agent.collectors": Setting(str, "default", None, "node collectors: default, none, or a list"),
    "agent.stall_s": Setting(
        float, 60.0, None, "py-spy a run's ranks after this long without progress", lo=1.0
    ),
    "agent.otlp_endpoint": Setting(
        str, None, env.OTLP_ENDPOINT, "OTLP/HTTP endpoint for spans and metrics (http://host:4318)"
    ),
}
"""Every setting by ``section.name``."""


def config_path(explicit: str | None = None) -> str | None:
    """The configuration file in force (see the module doc), None if there is none.
    Raises ConfigError if an explicitly named file does not exist."""
    named = explicit or os.environ.get(env.CONFIG)
    if named:
        if not os.path.isfile(named):
            where = "--config" if explicit else f"${env.CONFIG}"
            what = "is a folder, not a TOML file" if os.path.isdir(named) else "no such file"
            raise ConfigError(f"{where} {named}: {what}")
        return named
    for path in (LOCAL_FILE, SYSTEM_FILE):
        if os.path.isfile(path):
            return path
    return None


def _coerce(value: Any, setting: Setting, where: str) -> Any:
    """``value`` as the setting's type, within its bounds; ConfigError naming ``where``
    if it is not one or is out of bounds."""
    value = _as_kind(value, setting, where)
    if isinstance(value, float) and not math.isfinite(value):
        raise ConfigError(f"{where}: {value!r} is not a finite number")
    too_low = setting.lo is not None and value < setting.lo
    if too_low or (setting.hi is not None and value > setting.hi):
        bounds = " and ".join(
            f"{word} {int(b) if setting.kind is int else format(b, 'g')}"
            for word, b in (("at least", setting.lo), ("at most", setting.hi))
            if b is not None
        )
        raise ConfigError(f"{where}: {value!r} is out of range (want {bounds})")
    return value


def _as_kind(value: Any, setting: Setting, where: str) -> Any:
    """``value`` as the setting's type; ConfigError naming ``where`` if it is not one."""
    kind = setting.kind
    if isinstance(value, str) and kind is not str:
        text = value.strip().lower()
        if kind is bool and text in ("1", "true", "yes", "on", "0", "false", "no", "off"):
            return text in ("1", "true", "yes", "on")
        if kind is not bool:
            try:
                return kind(text)
            except ValueError:
                pass
    elif kind is float and isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    elif isinstance(value, kind) and not (kind is int and isinstance(value, bool)):
        return value
    raise ConfigError(f"{where}: want {kind.__name__}, got {value!r}")


def read_file(path: str) -> dict[str, Any]:
    """The settings in TOML file ``path`` as ``{"section.name": value}``. Raises
    ConfigError for bad TOML, an unknown section or key, or a value of the wrong type."""
    try:
        with open(path, "rb") as f:
            doc = tomllib.load(f)
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    out = {}
    for section, body in doc.items():
        if not isinstance(body, dict):
            raise ConfigError(f"{path}: top-level key {section!r}: settings go in [sections]")
        for name, value in body.items():
            key = f"{section}.{name}"
            if key not in SETTINGS:
                known = ", ".join(k for k in SETTINGS if k.startswith(section + ".")) or ", ".join(
                    sorted({k.split(".")[0] for k in SETTINGS})
                )
                raise ConfigError(f"{path}: unknown setting {key!r} (known: {known})")
            out[key] = _coerce(value, SETTINGS[key], f"{path}: {key}")
    return out


def load_settings(path: str | None = None, flags: dict[str, Any] | None = None) -> dict[str, Any]:
    """Every setting's value in force: flags (non-None values of ``flags``) over the file
    over environment variables over built-in defaults. Raises ConfigError."""
    return {k: v for k, (v, _) in resolve(path, flags).items()}


def resolve(
    path: str | None = None, flags: dict[str, Any] | None = None
) -> dict[str, tuple[Any, str]]:
    """Like :func:`load_settings`, with where each value came from: ``flag``, the file's
    path, ``$VARIABLE`` or ``default``. Raises ConfigError."""
    file = config_path(path)
    from_file = read_file(file) if file else {}
    out = {}
    for key, setting in SETTINGS.items():
        value, source = setting.default, "default"
        raw = os.environ.get(setting.env) if setting.env else None
        if raw:
            value, source = _coerce(raw, setting, f"${setting.env}"), f"${setting.env}"
        if key in from_file:
            value, source = from_file[key], str(file)
        flag = (flags or {}).get(key)
        if flag is not None:
            value, source = _coerce(flag, setting, f"flag for {key}"), "flag"
        out[key] = (value, source)
    return out


def show(path: str | None = None, flags: dict[str, Any] | None = None) -> str:
    """The settings in force as TOML, each line commented with its source (unset values
    commented out), passwords in store URLs masked (``store/url.py:redact``). Raises
    ConfigError."""
    from ranksight.store.url import redact

    lines: list[str] = []
    section: str | None = None
    for key, (value, source) in resolve(path, flags).items():
        head, name = key.split(".", 1)
        if head != section:
            lines += ([""] if lines else []) + [f"[{head}]"]
            section = head
        if value is None:
            lines.append(f"# {name} = ...  # unset ({source}): {SETTINGS[key].help}")
        else:
            text = json.dumps(value) if not isinstance(value, bool) else str(value).lower()
            lines.append(f"{name} = {redact(text)}  # {source}")
    return "\n".join(lines) + "\n"


def from_context(ctx: Any, path: str | None, params: dict[str, str]) -> dict[str, Any]:
    """For a click/typer command: ``param -> value``, the flag's value where it was given
    on the command line, else the setting ``params[param]`` in force. Raises ConfigError."""
    given = {  # compared by name: typer may carry its own copy of click's enum
        key: ctx.params[param]
        for param, key in params.items()
        if getattr(ctx.get_parameter_source(param), "name", "") == "COMMANDLINE"
    }
    values = load_settings(path, given)
    return {param: values[key] for param, key in params.items()}
