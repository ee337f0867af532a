"""A Jupyter server for the tests that need one (tests/test_lab.py, tests/test_browser.py).

:func:`serve` starts ``python -m <app>`` (``jupyter_server`` or ``jupyterlab``) on a free local port
with a random token, serving ``root``, with its config, data, runtime and IPython folders under
``run_dir`` so that nothing it writes touches the user's own; it waits (up to 90 s) until the REST
API answers, yields ``(base_url, token)``, and always stops the server: the API's shutdown (which
also shuts its kernels down), then its process group if it lingers."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def request(base, token, path, method="GET", body=None, timeout=30):
    """(status, JSON body) of one REST call; an HTTP error fails the test with the server's answer."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"{base}{path}", data=data, method=method,
                                 headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{method} {path}: {e.code} {e.read()[:500]!r}") from None


@contextlib.contextmanager
def serve(app: str, root, run_dir, env: dict | None = None, args=(), unset=()):
    """``app`` serving ``root``; ``env``: variables added to this process's environment, ``unset``: names
    taken out of it (a learner's lab has no ``TRITON_INTERPRET``)."""
    run_dir = os.fspath(run_dir)
    env = dict(os.environ, **(env or {}), JUPYTER_CONFIG_DIR=os.path.join(run_dir, "config"),
               JUPYTER_DATA_DIR=os.path.join(run_dir, "data"), JUPYTER_RUNTIME_DIR=os.path.join(run_dir, "runtime"),
               IPYTHONDIR=os.path.join(run_dir, "ipython"))
    for name in ("JUPYTER_PATH", *unset):
        env.pop(name, None)
    token, port = secrets.token_hex(16), free_port()
    base, log_path = f"http://127.0.0.1:{port}", os.path.join(run_dir, "server.log")
    os.makedirs(run_dir, exist_ok=True)
    with open(log_path, "a") as log:
        server = subprocess.Popen(
            [sys.executable, "-m", app, "--no-browser", "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
             "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
             *args] + (["--allow-root"] if os.geteuid() == 0 else []),   # CI containers run as root
            cwd=root, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + 90
            while True:
                assert server.poll() is None, f"{app} exited early:\n{open(log_path).read()}"
                try:
                    if request(base, token, "/api/status", timeout=5)[0] == 200:
                        break
                except OSError:
                    pass
                assert time.monotonic() < deadline, f"{app} is silent:\n{open(log_path).read()}"
                time.sleep(0.5)
            yield base, token
        finally:
            try:
                request(base, token, "/api/shutdown", "POST", timeout=5)
                server.wait(timeout=20)
            except (OSError, AssertionError, subprocess.TimeoutExpired):
                pass
            if server.poll() is None:
                os.killpg(server.pid, signal.SIGTERM)
                try:
                    server.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    os.killpg(server.pid, signal.SIGKILL)
                    server.wait()
