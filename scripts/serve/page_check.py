"""Drives the chat page of a running `turbospark serve` in headless
Chromium over the DevTools protocol (a minimal WebSocket client, standard
library only): loads PAGE_URL, types QUESTION, sends it, waits until the
streamed answer is complete and the live panel has updated, prints the
answer as JSON ({"answer", "panel_live", "rate", "active"}) and saves a
screenshot to SCREENSHOT.

Usage: page_check.py CHROMIUM PAGE_URL QUESTION SCREENSHOT [TIMEOUT_S]
"""

import base64
import json
import os
import re
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.request

browser, url, question, shot = sys.argv[1:5]
timeout = float(sys.argv[5]) if len(sys.argv) > 5 else 120.0


class Ws:
    """A WebSocket client for text frames (RFC 6455), enough for CDP."""

    def __init__(self, ws_url):
        m = re.match(r"ws://([^:/]+):(\d+)(/.*)", ws_url)
        host, port, path = m.group(1), int(m.group(2)), m.group(3)
        self.s = socket.create_connection((host, port), timeout=timeout)
        key = base64.b64encode(os.urandom(16)).decode()
        self.s.sendall((f"GET {path} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\n"
                        f"Connection: Upgrade\r\nSec-WebSocket-Key: {key}\r\n"
                        "Sec-WebSocket-Version: 13\r\n\r\n").encode())
        head = b""
        while b"\r\n\r\n" not in head:
            head += self.s.recv(1)
        if b" 101 " not in head.split(b"\r\n")[0]:
            raise RuntimeError(head)
        self.next_id = 0

    def _recv_exact(self, n):
        b = b""
        while len(b) < n:
            chunk = self.s.recv(n - len(b))
            if not chunk:
                raise RuntimeError("websocket closed")
            b += chunk
        return b

    def send(self, text):
        data = text.encode()
        mask = os.urandom(4)
        n = len(data)
        head = bytes([0x81])
        if n < 126:
            head += bytes([0x80 | n])
        elif n < 65536:
            head += bytes([0x80 | 126]) + struct.pack(">H", n)
        else:
            head += bytes([0x80 | 127]) + struct.pack(">Q", n)
        self.s.sendall(head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

    def recv(self):
        msg = b""
        while True:
            b0, b1 = self._recv_exact(2)
            n = b1 & 0x7F
            if n == 126:
                n = struct.unpack(">H", self._recv_exact(2))[0]
            elif n == 127:
                n = struct.unpack(">Q", self._recv_exact(8))[0]
            msg += self._recv_exact(n)
            if b0 & 0x80:
                return msg.decode()

    def call(self, method, **params):
        self.next_id += 1
        self.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            v = json.loads(self.recv())
            if v.get("id") == self.next_id:
                if "error" in v:
                    raise RuntimeError(v["error"])
                return v["result"]


profile = tempfile.mkdtemp(prefix="serve-page-")
proc = subprocess.Popen(
    [browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
     f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1100,700",
     "about:blank"],
    stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
try:
    port = None
    t0 = time.time()
    while port is None and time.time() - t0 < 30:
        line = proc.stderr.readline()
        m = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", line)
        if m:
            port = int(m.group(1))
    if port is None:
        raise RuntimeError("chromium did not open its DevTools port")
    pages = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list"))
    ws = Ws(next(p for p in pages if p["type"] == "page")["webSocketDebuggerUrl"])

    def js(expr):
        r = ws.call("Runtime.evaluate", expression=expr, returnByValue=True, awaitPromise=True)
        return r["result"].get("value")

    ws.call("Page.enable")
    ws.call("Page.navigate", url=url)
    t0 = time.time()
    while js("document.readyState") != "complete" and time.time() - t0 < 30:
        time.sleep(0.1)
    js(f"document.getElementById('q').value = {json.dumps(question)};"
       "document.getElementById('send').click(); true")
    state = {}
    while time.time() - t0 < timeout:
        state = js("""(() => {
            const a = document.getElementById('answer-1');
            const p = document.getElementById('panel');
            return {answer: a ? a.textContent : null, done: !!(a && a.dataset.done),
                    panel_live: p.dataset.live === '1',
                    rate: document.getElementById('rate').textContent,
                    active: document.getElementById('active').textContent};
        })()""")
        if state["done"] and state["panel_live"]:
            break
        time.sleep(0.2)
    time.sleep(0.6)  # one more poll of the panel before the picture
    png = ws.call("Page.captureScreenshot", format="png")["data"]
    with open(shot, "wb") as f:
        f.write(base64.b64decode(png))
    print(json.dumps(state))
    sys.exit(0 if state.get("done") else 1)
finally:
    proc.kill()
    proc.wait()
