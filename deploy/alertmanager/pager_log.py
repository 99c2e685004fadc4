"""A stand-in pager for docker-compose.yml: Alertmanager's webhook receiver
that prints one line per alert in each notification, so routing by severity
can be seen without an account anywhere (`docker compose logs -f pager-log`).

POST /page and POST /ticket: Alertmanager webhook payloads (version 4);
the path is the receiver that was chosen. Every other GET path serves the
repository's README.md and docs/ (mounted at /srv/docs), so the alerts'
runbook_url resolves with the default RUNBOOK_BASE_URL (docker-compose.yml).
GET /healthz: 200, for the compose health check.
"""

import functools
import http.server
import json
import os
import sys
import threading

PORT = int(os.environ.get("PAGER_LOG_PORT", "9095"))
DOCS = os.environ.get("PAGER_LOG_DOCS", "/srv/docs")

# Notifications for different groups arrive at once, each on its own
# thread; print() writes a line and its newline separately, so without
# this lock two alerts' lines interleave into one.
PRINT_LOCK = threading.Lock()


def log_line(line):
    with PRINT_LOCK:
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


class Handler(http.server.SimpleHTTPRequestHandler):
    extensions_map = {
        **http.server.SimpleHTTPRequestHandler.extensions_map,
        ".md": "text/plain; charset=utf-8",
    }

    def do_GET(self):
        if self.path == "/healthz":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok\n")
            return
        super().do_GET()

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = self.rfile.read(length)
        receiver = self.path.strip("/") or "?"
        try:
            payload = json.loads(body)
        except ValueError:
            log_line(f"{receiver}: not JSON: {body[:200]!r}")
            self.send_response(400)
            self.end_headers()
            return
        for alert in payload.get("alerts", []):
            labels = alert.get("labels", {})
            annotations = alert.get("annotations", {})
            log_line(
                f"[{receiver}] {alert.get('status', '?').upper()} "
                f"{labels.get('alertname', '?')} severity={labels.get('severity', '?')}: "
                f"{annotations.get('summary', '')} | fix: {annotations.get('fix', '')} "
                f"| runbook: {annotations.get('runbook_url', '')}"
            )
        self.send_response(200)
        self.end_headers()

    def log_message(self, format, *args):
        # Only the alert lines above; no access log.
        pass


if __name__ == "__main__":
    handler = functools.partial(Handler, directory=DOCS)
    server = http.server.ThreadingHTTPServer(("0.0.0.0", PORT), handler)
    print(f"pager-log listening on :{PORT}", file=sys.stderr, flush=True)
    server.serve_forever()
