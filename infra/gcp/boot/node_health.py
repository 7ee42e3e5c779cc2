"""ftfleet's node health agent on GCP: GET /healthz answers whether this node can run
the job, from boot to shutdown, whether or not a training step is running.

The managed instance groups' auto-healing probes it (infra/gcp/fleet.py). The trainer's
own port is closed during rendezvous, while the trainer restarts and after a run has
finished, so probing it would recreate healthy nodes; this agent runs beside the
trainer as its own systemd service (installed by the startup script, started at every
boot) and checks only what the node itself provides:

* the GPUs: ``nvidia-smi`` lists FTFLEET_HEALTH_GPUS of them;
* the checkpoint file system: FTFLEET_HEALTH_MOUNT is a mount point (/proc/mounts);
* the container runtime: ``docker info`` answers;
* the boot: the startup script has not left FTFLEET_HEALTH_BOOT_FAILED (it writes the
  failed step there; /run is empty again after a reboot). A node that cannot finish
  its setup cannot run the job either, and is replaced after the group's initial delay.

200 with ``{"healthy": true}`` when all hold; 503 with each failed check's reason
otherwise. Results are cached for CACHE_SECONDS so probes from several health checkers
cost one round of checks. Standard library only: it runs on the node image's python3.
"""

from __future__ import annotations

import http.server
import json
import os
import subprocess
import threading
import time

CACHE_SECONDS = 10.0
COMMAND_TIMEOUT = 10.0


def _run(argv: list[str]) -> tuple[int, str]:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT, check=False)
    except FileNotFoundError:
        return 127, f"{argv[0]} is not installed"
    except subprocess.TimeoutExpired:
        return 124, f"{argv[0]} did not answer within {COMMAND_TIMEOUT:g} s"
    return done.returncode, (done.stdout if done.returncode == 0 else done.stderr).strip()


def problems(gpus: int, mount: str, mounts_file: str = "/proc/mounts", boot_failed: str = "") -> dict[str, str]:
    """Check name -> what is wrong, for each check that fails (empty: healthy)."""
    found: dict[str, str] = {}
    if boot_failed and os.path.exists(boot_failed):
        with open(boot_failed, encoding="utf-8", errors="replace") as f:
            found["boot"] = f.read(300).strip() or "the startup script failed"
    rc, out = _run(["nvidia-smi", "--query-gpu=uuid", "--format=csv,noheader"])
    seen = len([line for line in out.splitlines() if line.strip()]) if rc == 0 else 0
    if rc != 0:
        found["gpus"] = f"nvidia-smi failed: {out[:200]}"
    elif seen != gpus:
        found["gpus"] = f"{seen} GPUs visible, expected {gpus}"
    try:
        with open(mounts_file, encoding="utf-8") as f:
            mounted = any(line.split()[1:2] == [mount] for line in f)
    except OSError as exc:
        mounted, found["mount"] = False, f"cannot read {mounts_file}: {exc}"
    if not mounted and "mount" not in found:
        found["mount"] = f"{mount} is not mounted"
    rc, out = _run(["docker", "info", "--format", "{{.ServerVersion}}"])
    if rc != 0:
        found["docker"] = f"docker does not answer: {out[:200]}"
    return found


class Checker:
    def __init__(self, gpus: int, mount: str, mounts_file: str, boot_failed: str):
        self._args = (gpus, mount, mounts_file, boot_failed)
        self._lock = threading.Lock()
        self._at, self._last = float("-inf"), {}

    def __call__(self) -> dict[str, str]:
        with self._lock:
            if time.monotonic() - self._at >= CACHE_SECONDS:
                self._last, self._at = problems(*self._args), time.monotonic()
            return self._last


def serve(port: int, checker: Checker) -> http.server.ThreadingHTTPServer:
    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args) -> None:  # the health checkers probe every few seconds
            pass

        def do_GET(self) -> None:
            if self.path.split("?")[0] != "/healthz":
                self.send_error(404)
                return
            found = checker()
            body = json.dumps({"healthy": not found, "problems": found}).encode()
            self.send_response(503 if found else 200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return http.server.ThreadingHTTPServer(("", port), Handler)


def main() -> None:
    env = os.environ
    checker = Checker(
        int(env["FTFLEET_HEALTH_GPUS"]),
        env["FTFLEET_HEALTH_MOUNT"],
        env.get("FTFLEET_HEALTH_MOUNTS_FILE", "/proc/mounts"),
        env.get("FTFLEET_HEALTH_BOOT_FAILED", ""),
    )
    serve(int(env["FTFLEET_HEALTH_PORT"]), checker).serve_forever()


if __name__ == "__main__":
    main()
