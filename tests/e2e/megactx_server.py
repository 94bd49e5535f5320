"""Starts `megactx serve` on loopback for an end-to-end test and stops it.

The server prints "megactx serving NAME at http://HOST:PORT" once it listens;
--port 0 lets the OS pick a free port, so parallel tests never collide.
"""
import os
import re
import signal
import subprocess
import threading


class MegactxServer:
    def __init__(self, megactx, model, *extra_args, name="default", timeout=300,
                 kv_memory="256MiB"):
        self.megactx = megactx
        # kv_memory None: the server's own default (on GPUs what
        # --gpu-memory-utilization leaves).
        budget = ["--kv-memory", kv_memory] if kv_memory is not None else []
        self.command = [megactx, "serve", "--model", model, "--host", "127.0.0.1", "--port", "0",
                        "--served-model-name", name, *budget, *extra_args]
        self.timeout = timeout
        self.url = None
        self.process = None
        self.log = []

    def __enter__(self):
        self.process = subprocess.Popen(self.command, stdout=subprocess.PIPE,
                                        stderr=subprocess.PIPE, text=True)
        # Keep stderr drained so the server never blocks on a full pipe.
        threading.Thread(target=self._drain, args=(self.process.stderr,), daemon=True).start()
        found = {}

        def wait_for_url():
            for line in self.process.stdout:
                match = re.search(r"at (http://\S+)", line)
                if match:
                    found["url"] = match.group(1)
                    return

        waiter = threading.Thread(target=wait_for_url, daemon=True)
        waiter.start()
        waiter.join(self.timeout)
        if "url" not in found:
            self.__exit__(None, None, None)
            raise RuntimeError("megactx serve did not start:\n" + "".join(self.log[-50:]))
        self.url = found["url"]
        return self

    def _drain(self, stream):
        for line in stream:
            self.log.append(line)

    def __exit__(self, *exc):
        if self.process and self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        if self.process:
            for stream in (self.process.stdout, self.process.stderr):
                if stream:
                    stream.close()
        return False


def run_megactx(megactx, *args):
    """Runs a megactx subcommand and returns its stdout (raises on failure)."""
    result = subprocess.run([megactx, *args], capture_output=True, text=True, timeout=600,
                            env=dict(os.environ))
    if result.returncode != 0:
        raise RuntimeError(f"megactx {' '.join(args)} failed: {result.stderr}")
    return result.stdout
