"""docs/examples/deploy/nginx-orbit.conf in front of a real orbit-server: TLS, the redirect
from HTTP, /metrics hidden, and a worker whose WebSocket stream goes through the proxy.

The configuration runs as written, except what a test host must change: the listen
addresses (free loopback ports instead of 80/443), the node's port and the certificate (a
self-signed one for 127.0.0.1 made here). nginx is Debian's binary: ``$ORBIT_NGINX``, else
the one scripts/test extracts into ``.orbit/tools/nginx`` (installing the package would
start a web server on port 80), else ``nginx`` on PATH.
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


def find_nginx() -> str | None:
    for candidate in (os.environ.get("ORBIT_NGINX"), str(ROOT / ".orbit/tools/nginx/usr/sbin/nginx"),
                      shutil.which("nginx")):  # fmt: skip
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@dataclass
class Proxy:
    https: str
    http: str
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


@pytest.fixture
def proxy(server, tmp_path: Path) -> Iterator[Proxy]:
    nginx = find_nginx()
    if nginx is None:
        pytest.skip("nginx is not available: run scripts/test as root (it extracts Debian's nginx "
                    "into .orbit/tools), or apt-get install nginx, or set ORBIT_NGINX")  # fmt: skip
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=127.0.0.1",
         "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=60,
    )  # fmt: skip
    https_port, http_port = free_port(), free_port()
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
    proc = subprocess.Popen([nginx, "-e", "stderr", "-p", str(tmp_path), "-c", str(tmp_path / "nginx.conf"),
                             "-g", "daemon off;"], stderr=subprocess.PIPE, text=True)  # fmt: skip
    try:
        base = f"https://127.0.0.1:{https_port}"
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, proc.communicate()[1]
            try:
                httpx.get(base + "/healthz", verify=ssl.create_default_context(cafile=str(cert)), timeout=2)
                break
            except httpx.TransportError:
                assert time.monotonic() < deadline, "nginx did not answer"
                time.sleep(0.1)
        yield Proxy(https=base, http=f"http://127.0.0.1:{http_port}", cert=cert)
    finally:
        proc.terminate()
        proc.communicate(timeout=30)


def test_the_proxy_terminates_tls_and_hides_metrics(proxy: Proxy) -> None:
    ready = httpx.get(proxy.https + "/readyz", verify=proxy.tls, timeout=10)
    assert ready.status_code == 200, ready.text
    assert httpx.get(proxy.https + "/metrics", verify=proxy.tls, timeout=10).status_code == 404
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
