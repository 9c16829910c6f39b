"""docs/examples/deploy's reverse proxies in front of a real orbit-server — nginx
(nginx-orbit.conf) and Caddy (Caddyfile): TLS, /metrics hidden, nginx's redirect from HTTP,
and a worker whose WebSocket stream goes through the proxy.

Each configuration runs as written, except what a test host must change: the listen
addresses (free loopback ports instead of 80/443), the node's port and the certificate (a
self-signed one for 127.0.0.1 made here instead of Let's Encrypt's). The binaries are
Debian's: ``$ORBIT_NGINX`` / ``$ORBIT_CADDY``, else the ones scripts/test extracts into
``.orbit/tools/`` (installing the packages would start web servers on ports 80 and 443),
else ``nginx`` / ``caddy`` on PATH.
"""

from __future__ import annotations

import os
import re
import shutil
import ssl
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from cli_support import CliTenant, server_fixture
from platform_fixtures import ROOT, free_port

from orbit.storage import DSN

pytestmark = pytest.mark.process

DEPLOY = ROOT / "docs" / "examples" / "deploy"
server = server_fixture()


def find_tool(name: str, path_in_package: str) -> str | None:
    for candidate in (os.environ.get(f"ORBIT_{name.upper()}"),
                      str(ROOT / ".orbit" / "tools" / name / path_in_package), shutil.which(name)):  # fmt: skip
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class Proxy:
    https: str
    http: str | None  # the plain-HTTP address that redirects, where the config has one
    cert: Path

    @property
    def tls(self) -> ssl.SSLContext:
        """A client context that trusts the proxy's certificate."""
        return ssl.create_default_context(cafile=str(self.cert))


def site_config(node_port: int, https_port: int, http_port: int, cert: Path, key: Path) -> str:
    """The example's configuration with the test host's addresses and certificate."""
    conf = (DEPLOY / "nginx-orbit.conf").read_text()
    conf = re.sub(r"^\s*listen \[::\]:.*\n", "", conf, flags=re.M)
    conf = conf.replace("listen 443 ssl http2;", f"listen 127.0.0.1:{https_port} ssl http2;")
    conf = conf.replace("listen 80;", f"listen 127.0.0.1:{http_port};")
    conf = conf.replace("server 127.0.0.1:8080 ", f"server 127.0.0.1:{node_port} ")
    conf = re.sub(r"ssl_certificate\s+\S+;", f"ssl_certificate {cert};", conf)
    conf = re.sub(r"ssl_certificate_key\s+\S+;", f"ssl_certificate_key {key};", conf)
    for needed in (f"127.0.0.1:{https_port} ssl", f"127.0.0.1:{http_port};", f"127.0.0.1:{node_port} ",
                   f"ssl_certificate {cert};", f"ssl_certificate_key {key};"):
        assert needed in conf, f"nginx-orbit.conf changed shape: {needed!r} not substituted"
    return conf


def caddy_config(node_port: int, https_port: int, cert: Path, key: Path) -> str:
    """The example's Caddyfile with the test host's address and certificate (and no admin
    endpoint, which would take port 2019)."""
    conf = (DEPLOY / "Caddyfile").read_text()
    conf = conf.replace("orbit.example.com {", f"https://127.0.0.1:{https_port} {{\n\ttls {cert} {key}")
    conf = conf.replace("reverse_proxy 127.0.0.1:8080 {", f"reverse_proxy 127.0.0.1:{node_port} {{")
    for needed in (f"tls {cert} {key}", f"reverse_proxy 127.0.0.1:{node_port} "):
        assert needed in conf, f"Caddyfile changed shape: {needed!r} not substituted"
    return "{\n\tadmin off\n}\n\n" + conf


def _certificate(tmp_path: Path) -> tuple[Path, Path]:
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    return cert, key


def _serve(cmd: list[str], base: str, cert: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            env=env)  # fmt: skip
    deadline = time.monotonic() + 30
    while True:
        if proc.poll() is not None:
            raise AssertionError(proc.communicate()[1][-3000:])
        try:
            httpx.get(base + "/healthz", verify=ssl.create_default_context(cafile=str(cert)), timeout=2)
            return proc
        except httpx.TransportError:
            if time.monotonic() > deadline:
                proc.kill()
                raise AssertionError(f"{cmd[0]} did not answer: {proc.communicate()[1][-3000:]}") from None
            time.sleep(0.1)


def _stop(proc: subprocess.Popen[str]) -> None:
    proc.terminate()
    proc.communicate(timeout=30)


@pytest.fixture(params=["nginx", "caddy"])
def proxy(request: pytest.FixtureRequest, server, tmp_path: Path) -> Iterator[Proxy]:
    name = request.param
    exe = find_tool(name, "usr/sbin/nginx" if name == "nginx" else "usr/bin/caddy")
    if exe is None:
        pytest.skip(f"{name} is not available: run scripts/test as root (it extracts Debian's {name} "
                    f"into .orbit/tools), or set ORBIT_{name.upper()}")  # fmt: skip
    cert, key = _certificate(tmp_path)
    https_port = free_port()
    base = f"https://127.0.0.1:{https_port}"
    if name == "caddy":
        (tmp_path / "Caddyfile").write_text(caddy_config(server.port, https_port, cert, key))
        env = {**os.environ, "HOME": str(tmp_path), "XDG_DATA_HOME": str(tmp_path / "data"),
               "XDG_CONFIG_HOME": str(tmp_path / "config")}  # fmt: skip
        proc = _serve([exe, "run", "--adapter", "caddyfile", "--config", str(tmp_path / "Caddyfile")],
                      base, cert, env)  # fmt: skip
        http = None
    else:
        http_port = free_port()
        temp = tmp_path / "nginx-temp"
        temp.mkdir()
        (tmp_path / "nginx.conf").write_text(f"""
user root;
worker_processes 1;
pid {tmp_path}/nginx.pid;
error_log stderr warn;
events {{ worker_connections 256; }}
http {{
    access_log off;
    client_body_temp_path {temp}/body;
    proxy_temp_path {temp}/proxy;
    fastcgi_temp_path {temp}/fastcgi;
    uwsgi_temp_path {temp}/uwsgi;
    scgi_temp_path {temp}/scgi;
{site_config(server.port, https_port, http_port, cert, key)}
}}
""")
        proc = _serve([exe, "-e", "stderr", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                       "-g", "daemon off;"], base, cert)  # fmt: skip
        http = f"http://127.0.0.1:{http_port}"
    try:
        yield Proxy(https=base, http=http, cert=cert)
    finally:
        _stop(proc)


def test_the_proxy_terminates_tls_and_hides_metrics(proxy: Proxy) -> None:
    ready = httpx.get(proxy.https + "/readyz", verify=proxy.tls, timeout=10)
    assert ready.status_code == 200, ready.text
    assert httpx.get(proxy.https + "/metrics", verify=proxy.tls, timeout=10).status_code == 404
    if proxy.http is not None:
        redirect = httpx.get(proxy.http + "/readyz", timeout=10)
        assert redirect.status_code == 301
        assert redirect.headers["location"] == "https://127.0.0.1/readyz"


def test_a_worker_streams_through_the_proxy(proxy: Proxy, server, dsn: DSN) -> None:
    t = CliTenant.bootstrap(server, dsn)
    t.add_queue("hello")
    auth = {"Authorization": f"Bearer {t.key}"}
    r = httpx.post(f"{proxy.https}/v1/namespaces/{t.namespace}/tasks", headers=auth,
                   json={"queue": "hello", "kind": "greet", "payload": {"name": "Ada"}},
                   verify=proxy.tls, timeout=10)  # fmt: skip
    assert r.status_code == 201, r.text
    # The quick start's worker, with the proxy's address: its session's stream is a
    # WebSocket upgrade through nginx, over TLS (trusting the test's certificate).
    env = {**t.env, "ORBIT_URL": proxy.https, "ORBIT_NAMESPACE": t.namespace,
           "SSL_CERT_FILE": str(proxy.cert)}  # fmt: skip
    worker = subprocess.run([sys.executable, str(ROOT / "docs/examples/quickstart/worker.py"), "--until-idle"],
                            env=env, capture_output=True, text=True, timeout=90, check=False)  # fmt: skip
    assert worker.returncode == 0, worker.stderr[-3000:]
    assert "worker stream open" in worker.stderr and "greeting Ada" in worker.stderr, worker.stderr[-3000:]
    done = httpx.get(f"{proxy.https}/v1/namespaces/{t.namespace}/tasks/{r.json()['id']}", headers=auth,
                     verify=proxy.tls, timeout=10).json()  # fmt: skip
    assert done["state"] == "SUCCEEDED" and done["result"] == {"greeting": "Hello, Ada!"}
