"""DSN parsing: ``mysql://USER[:PASS]@HOST[:PORT]/DB[?unix_socket=/path]`` and ``ORBIT_DSN``."""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import TypedDict
from urllib.parse import parse_qs, quote, unquote, urlsplit

DEFAULT_DSN = "mysql://root@127.0.0.1:3306/orbit"


class ConnectKwargs(TypedDict, total=False):
    """The connection keywords of a DSN, as aiomysql's and PyMySQL's ``connect`` take them."""

    user: str
    password: str
    host: str
    port: int
    unix_socket: str
    db: str


@dataclass(frozen=True, slots=True)
class DSN:
    """A parsed connection string. ``unix_socket`` wins over host/port when set."""

    user: str = "root"
    password: str = ""
    host: str = "127.0.0.1"
    port: int = 3306
    database: str = "orbit"
    unix_socket: str | None = None

    @classmethod
    def parse(cls, text: str) -> DSN:
        """Parse ``mysql://`` (or ``mariadb://``) URLs; raise ValueError naming the bad part."""
        parts = urlsplit(text.strip())
        if parts.scheme not in ("mysql", "mariadb"):
            raise ValueError(f"DSN scheme must be mysql:// (got {parts.scheme or 'none'!r})")
        database = unquote(parts.path.lstrip("/"))
        if not database or "/" in database:
            raise ValueError("DSN must name exactly one database: mysql://user@host:port/DB")
        query = parse_qs(parts.query)
        unknown = set(query) - {"unix_socket"}
        if unknown:
            raise ValueError(f"unknown DSN option(s): {', '.join(sorted(unknown))}")
        try:
            port = parts.port or 3306
        except ValueError as exc:
            raise ValueError(f"DSN port is not a number: {exc}") from None
        return cls(
            user=unquote(parts.username or "root"),
            password=unquote(parts.password or ""),
            host=parts.hostname or "127.0.0.1",
            port=port,
            database=database,
            unix_socket=query.get("unix_socket", [None])[0],
        )

    @classmethod
    def from_env(cls, explicit: str | None = None) -> DSN:
        """The explicit value, else ``$ORBIT_DSN``, else :data:`DEFAULT_DSN`."""
        return cls.parse(explicit or os.environ.get("ORBIT_DSN") or DEFAULT_DSN)

    def with_database(self, database: str) -> DSN:
        return replace(self, database=database)

    def url(self, *, hide_password: bool = True) -> str:
        auth = quote(self.user, safe="")
        if self.password:
            auth += ":" + ("***" if hide_password else quote(self.password, safe=""))
        text = f"mysql://{auth}@{self.host}:{self.port}/{quote(self.database, safe='')}"
        if self.unix_socket:
            text += f"?unix_socket={quote(self.unix_socket)}"
        return text

    def connect_kwargs(self, *, with_database: bool = True) -> ConnectKwargs:
        """Keyword arguments for aiomysql/pymysql ``connect``."""
        kw: ConnectKwargs = {"user": self.user, "password": self.password}
        if self.unix_socket:
            kw["unix_socket"] = self.unix_socket
        else:
            kw["host"] = self.host
            kw["port"] = self.port
        if with_database:
            kw["db"] = self.database
        return kw

    def __str__(self) -> str:
        return self.url()
