"""Opens the example page (web/example) in headless Chromium and checks what it reports.

Serves the repository root on a loopback port (the page fetches its layer from tests/fixtures),
loads the page with `?report`, and waits for the line the page posts back: `ok` (the layer ran,
and its KV cache steps equal the whole sequence) or `FAILED: …`. Exits 0 only on `ok`.
Needs web/example/pkg from `wasm-bindgen --target web` (see docs/browser.md).
"""

import functools
import http.server
import subprocess
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TIMEOUT_S = 300


class Handler(http.server.SimpleHTTPRequestHandler):
    report = None
    done = threading.Event()

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        Handler.report = self.rfile.read(min(length, 1 << 16)).decode("utf-8", "replace")
        self.send_response(204)
        self.end_headers()
        Handler.done.set()

    def log_message(self, *args):
        pass


def main():
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Handler, directory=str(ROOT))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_port}/web/example/index.html?report"
    browser = subprocess.Popen(
        ["chromium", "--headless=new", "--no-sandbox", "--enable-unsafe-webgpu", "--remote-debugging-port=0", url],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        if not Handler.done.wait(TIMEOUT_S):
            print(f"the example page reported nothing in {TIMEOUT_S} s")
            return 1
    finally:
        browser.kill()
        server.shutdown()
    print(Handler.report)
    return 0 if Handler.report.startswith("ok") else 1


if __name__ == "__main__":
    sys.exit(main())
