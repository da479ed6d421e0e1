"""Open a store from its URL.

=====================================================  ==========================================
URL                                                    store
=====================================================  ==========================================
``None`` or ``""``                                     ``$RANKSIGHT_STORE`` if set, else chdb at
                                                       ``$RANKSIGHT_HOME/store`` (home default
                                                       ``./.ranksight``)
``/a/folder``, ``rel/folder``                          chdb, that folder
``chdb:///abs/folder``, ``chdb:rel``, ``file:...``     chdb, that folder
``clickhouse://[user[:password]@]host[:port]/db``      ClickHouse server, native protocol (port
                                                       9000)
``clickhouses://...``                                  the same over TLS (port 9440)
``memory:``                                            a new store in RAM, gone when the process
                                                       ends (``store/memory.py``)
=====================================================  ==========================================

User and password not in the URL come from ``$RANKSIGHT_CH_USER`` and
``$RANKSIGHT_CH_PASSWORD``, else the first line of the file ``$RANKSIGHT_CH_PASSWORD_FILE``
(refused if other users may read it); defaults ``default`` and empty. Percent-escapes in
them are decoded. A URL with a password is for the environment (``$RANKSIGHT_STORE``),
never for a command line, where every user of the host can read it: the CLI refuses one
(:func:`refuse_password`). TLS: ``clickhouses://``, verified against the system's CAs or
``$RANKSIGHT_CH_CA_CERTS``. A URL's password is read in one place (:func:`split_password`);
an agent ranksight starts gets it by environment, never on its command line, and the
training job never gets it (``ranksight/launcher/processes.py``). Passwords never appear in errors or
logs (:func:`redact`).
Compression of a server's traffic: lz4, or ``$RANKSIGHT_CH_COMPRESSION`` (``lz4``, ``none``).
"""

from __future__ import annotations

import ipaddress
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit

from ranksight.ground import env
from ranksight.store.errors import StoreError

if TYPE_CHECKING:
    from ranksight.store.base import Store

CH_USER = env.CH_USER
CH_PASSWORD = env.CH_PASSWORD

_SERVER_SCHEMES = {"clickhouse": 9000, "clickhouses": 9440}
_FOLDER_SCHEMES = ("chdb", "file")
MEMORY = "memory:"
"""The URL of a new in-memory store (:mod:`ranksight.store.memory`)."""
_DATABASE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def open_store(url: str | None = None, connect: bool = True) -> Store:
    """The store ``url`` names (see the module doc for the forms).

    With ``connect`` (default) a server store is contacted at once, so an unreachable
    server raises StoreError "cannot reach ClickHouse at host:port (...)" within about
    3 s; without it the first call does. A chdb folder is not touched until used.
    Raises StoreError naming the URL (password hidden) and what is wrong with it.
    """
    url = url or default_store_url()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in _SERVER_SCHEMES:
        return _server_store(url, scheme, connect)
    if scheme in _FOLDER_SCHEMES:
        return _folder_store(url, _folder_of(url, scheme))
    if url == MEMORY:
        from ranksight.store.memory import MemoryStore

        return MemoryStore(MEMORY)
    if "://" in url:
        known = ", ".join([*_SERVER_SCHEMES, *_FOLDER_SCHEMES])
        raise StoreError(f"{redact(url)}: unknown store scheme {scheme!r} (known: {known})")
    return _folder_store(url, url)


def default_store_url() -> str:
    """``$RANKSIGHT_STORE`` if set, else the folder ``$RANKSIGHT_HOME/store`` (home
    default ``./.ranksight``)."""
    home = os.environ.get(env.HOME) or env.DEFAULT_HOME
    return os.environ.get(env.STORE) or str(Path(home) / "store")


def refuse_password(url: str | None, where: str = "--store") -> None:
    """Raise StoreError if ``url`` (given on a command line as ``where``) holds a password."""
    if url and split_password(url)[1]:
        raise StoreError(
            f"{redact(url)}: a password in {where} is visible to every user of this host; "
            f"set ${CH_PASSWORD} or ${env.CH_PASSWORD_FILE} instead"
        )


def password_from_env() -> str:
    """``$RANKSIGHT_CH_PASSWORD``, else the first line of ``$RANKSIGHT_CH_PASSWORD_FILE``,
    else ``""``. Raises StoreError if the file cannot be read or other users may read it."""
    if os.environ.get(CH_PASSWORD):
        return os.environ[CH_PASSWORD]
    path = os.environ.get(env.CH_PASSWORD_FILE)
    if not path:
        return ""
    try:
        if os.stat(path).st_mode & 0o077:
            raise StoreError(
                f"password file {path} (${env.CH_PASSWORD_FILE}) may be read by other users; "
                "chmod 600 it"
            )
        with open(path) as handle:
            return handle.readline().rstrip("\r\n")
    except OSError as exc:
        raise StoreError(
            f"cannot read the password file {path} (${env.CH_PASSWORD_FILE}): {exc.strerror}"
        ) from None


def split_password(url: str) -> tuple[str, str | None]:
    """``(url without its password, the password)`` of a ``scheme://`` URL; the password
    percent-decoded, None where the URL gives none (the URL then comes back unchanged; so
    does a folder). The user info ends at the URL's last ``@`` and the password at its
    first ``:``, so a raw ``/``, ``@`` or ``:`` in a password is taken whole. This is the
    one place a URL's password is read: the store, the launcher and the agents it starts
    all go through it. Raises StoreError (the password masked) for white space in the
    password: percent-encode it (``%20``) or use ``$RANKSIGHT_CH_PASSWORD``."""
    scheme, sep, rest = url.partition("://")
    user_info, at, host = rest.rpartition("@")
    user, colon, password = user_info.partition(":")
    if not sep or not at or not colon or "/" in user:
        return url, None
    public = f"{scheme}://{user}@{host}" if user else f"{scheme}://{host}"
    if any(c.isspace() for c in password):
        raise StoreError(
            f"{scheme}://{user}:***@{host}: white space in the password; percent-encode it "
            f"(%20) or set ${CH_PASSWORD} instead"
        )
    return public, unquote(password)


_USER_INFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://[^\s:/@]*:)\S*@")


def redact(text: str) -> str:
    """``text`` (a URL, or a message holding URLs) with every URL's password replaced by
    ``***``: ``clickhouse://user:***@host:port/db``. Every store URL ranksight prints or
    logs goes through here. A password runs to the last ``@`` before white space (as in
    :func:`split_password`, which refuses white space in one)."""
    return _USER_INFO.sub(r"\1***@", text)


def _folder_of(url: str, scheme: str) -> str:
    """The folder in a ``chdb:``/``file:`` URL."""
    rest = url[len(scheme) + 1 :]
    if rest.startswith("//"):
        rest = rest[2:]
        if rest.startswith("localhost/"):
            rest = rest[len("localhost") :]
    if not rest:
        raise StoreError(f"{url}: no folder given (e.g. chdb:///abs/folder)")
    return unquote(rest)


def _folder_store(url: str, folder: str) -> Store:
    """A ChdbStore at ``folder``. Raises StoreError if ``folder`` cannot be a folder."""
    from ranksight.ground.folders import folder_problem
    from ranksight.store.chdb_store import ChdbStore

    problem = folder_problem(folder)
    if problem:
        raise StoreError(f"{url}: {problem} (a chdb store is a folder)")
    return ChdbStore(Path(folder).expanduser(), url=url)


def _server_store(url: str, scheme: str, connect: bool) -> Store:
    """A ClickHouseStore for a ``clickhouse(s)://`` URL, pinged if ``connect``."""
    from ranksight.store.clickhouse_store import ClickHouseStore

    shown = redact(url)
    public, password = split_password(url)
    parts = urlsplit(public)
    try:
        port = parts.port or _SERVER_SCHEMES[scheme]
    except ValueError:
        raise StoreError(f"{shown}: bad port (want a number 1-65535)") from None
    if not parts.hostname:
        raise StoreError(f"{shown}: no host (want {scheme}://host[:port]/database)")
    database = parts.path.strip("/")
    if not database:
        raise StoreError(f"{shown}: no database (want {scheme}://host[:port]/database)")
    if not _DATABASE.match(database):
        raise StoreError(f"{shown}: database {database!r} is not a plain name (letters, digits, _)")
    if parts.query or parts.fragment:
        raise StoreError(f"{shown}: options after '?' or '#' are not supported")
    compression = os.environ.get(env.CH_COMPRESSION) or None
    if compression not in (None, "lz4", "none"):
        raise StoreError(
            f"${env.CH_COMPRESSION} is {compression!r}: want lz4 or none (store {shown})"
        )
    store = ClickHouseStore(
        parts.hostname,
        port,
        database,
        user=unquote(parts.username or "") or os.environ.get(CH_USER) or "default",
        password=password or password_from_env(),
        secure=scheme == "clickhouses",
        ca_certs=os.environ.get(env.CH_CA_CERTS) or None,
        url=shown,
        compression=compression,
    )
    if connect:
        store.ping()
    return store


def missing_store(store: Store, url: str | None) -> str:
    """Why ``store`` (opened from ``url``, None = the default) cannot be read, for the
    commands that only read (``runs``, ``report``, ``ui``): a chdb folder that is not
    there names the path, where opening it would make a new empty store at a mistyped
    path. ``""`` if it is there, or for a server store (whose database is checked on
    connect)."""
    folder = getattr(store, "folder", None)
    if folder is None or os.path.isdir(folder):
        return ""
    return (
        f"no store at {folder} (--store {redact(url or default_store_url())!r}): check the "
        "path, or record a run there first (e.g. 'ranksight demo --store ...')"
    )


def canonical_target(url: str | None) -> str:
    """One spelling of the place store URL ``url`` names (None: the default store), for
    whatever is kept per store (the node agent's offsets and delivered batches): a chdb
    folder as ``chdb://`` and its real path (``chdb:///abs``, ``/abs`` and ``/abs/`` are
    one); a server as ``scheme://host:port/database``, the port filled in, the host in
    lower case with ``localhost``, ``127.0.0.1`` and ``::1`` as ``localhost``, without user
    or password (they name who writes, not where). Names are not looked up in DNS: a
    record that changes must not make a store another. Raises StoreError for a folder
    URL without a folder, or a bad port."""
    url = url or default_store_url()
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme in _SERVER_SCHEMES:
        parts = urlsplit(split_password(url)[0])
        try:
            port = parts.port or _SERVER_SCHEMES[scheme]
        except ValueError:
            raise StoreError(f"{redact(url)}: bad port (want a number 1-65535)") from None
        return f"{scheme}://{_canonical_host(parts.hostname or '')}:{port}/{parts.path.strip('/')}"
    folder = _folder_of(url, scheme) if scheme in _FOLDER_SCHEMES else url
    return "chdb://" + os.path.realpath(os.path.expanduser(folder))


def _canonical_host(host: str) -> str:
    """``host`` lower case, an IP address in its short form, loopback as ``localhost``."""
    host = host.lower().rstrip(".")
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    return "localhost" if address in _LOOPBACK else address.compressed


_LOOPBACK = (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
