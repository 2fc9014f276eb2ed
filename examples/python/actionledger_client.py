"""A small client for the actionledger HTTP API, standard library only (Python 3.9+).

Every answer is a dict. A gate refusal (``{"ok": false, ...}`` with status 200) is returned as it is: it is an
answer for the model to read. Transport and caller errors (401, 403, 404, 409, 413, 415, 422, 429, 5xx) raise
``ApiError`` with the structured body's code; 429 and 503 carry ``retry_after_s`` when the server sent one.
"""

import json
import time
import urllib.error
import urllib.parse
import urllib.request


class ApiError(Exception):
    """An HTTP error answer: ``status``, ``code`` (the stable error code), ``message``, ``details``."""

    def __init__(self, status, body):
        self.status = status
        self.code = body.get("error", "http_%d" % status)
        self.message = body.get("message", "")
        self.details = body.get("details", {})
        self.retry_after_s = body.get("retry_after_s")
        super().__init__("%d %s: %s" % (status, self.code, self.message))


class Client:
    """One principal's session: the base URL of the service and an API token (``actionledger token create``)."""

    def __init__(self, base_url, token, timeout_s=30.0):
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout_s = timeout_s

    def request(self, method, path, body=None, query=None):
        url = self.base_url + path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v is not None})
        data = None
        headers = {"authorization": "Bearer " + self.token, "accept": "application/json"}
        if body is not None:
            data = json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
            headers["content-type"] = "application/json"
        req = urllib.request.Request(url, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_s) as res:
                return json.loads(res.read().decode("utf-8"))
        except urllib.error.HTTPError as err:
            raw = err.read().decode("utf-8", "replace")
            try:
                parsed = json.loads(raw)
            except ValueError:
                parsed = {"message": raw[:200]}
            raise ApiError(err.code, parsed) from None

    # --- who am I
    def status(self):
        return self.request("GET", "/v1/status")

    # --- the gate
    def call(self, tool, arguments, task_id, step_id, **context):
        """A tool call through the gate. ``context``: conversation_id, turn_id, plan_version, role, user, ttl_s."""
        body = {"tool": tool, "arguments": arguments, "task_id": task_id, "workflow_step_id": step_id}
        body.update(context)
        return self.request("POST", "/v1/calls", body)

    # --- approvals
    def pending_approvals(self, **filters):
        return self.request("GET", "/v1/approvals", query=filters)

    def approval(self, approval_id):
        return self.request("GET", "/v1/approvals/" + urllib.parse.quote(approval_id, safe=""))

    def approve(self, approval_id, envelope_sha256, role=None):
        body = {"envelope_sha256": envelope_sha256}
        if role is not None:
            body["role"] = role
        return self.request("POST", "/v1/approvals/%s/approve" % urllib.parse.quote(approval_id, safe=""), body)

    def reject(self, approval_id, reason, role=None):
        body = {"reason": reason}
        if role is not None:
            body["role"] = role
        return self.request("POST", "/v1/approvals/%s/reject" % urllib.parse.quote(approval_id, safe=""), body)

    # --- operations
    def operation(self, operation_id):
        return self.request("GET", "/v1/operations/" + urllib.parse.quote(operation_id, safe=""))

    def wait_for(self, operation_id, statuses=("succeeded", "failed", "review", "cancelled", "compensated"), timeout_s=60.0):
        """Polls the operation until its status is one of ``statuses``; returns it, or raises TimeoutError."""
        deadline = time.monotonic() + timeout_s
        delay = 0.1
        while True:
            op = self.operation(operation_id)["operation"]
            if op["status"] in statuses:
                return op
            if time.monotonic() > deadline:
                raise TimeoutError("operation %s still %s" % (operation_id, op["status"]))
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
