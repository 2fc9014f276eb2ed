"""An agent asks for a refund above the approval threshold; a supervisor reads the exact envelope and approves
it by its hash; the agent waits for the refund to succeed.

    python3 refund_with_approval.py BASE_URL AGENT_TOKEN SUPERVISOR_TOKEN TASK_ID

Prints one JSON line per step, and exits 0 when the operation succeeded.
"""

import json
import sys

from actionledger_client import ApiError, Client


def main(argv):
    base, agent_token, supervisor_token, task = argv[1:5]
    agent = Client(base, agent_token)
    supervisor = Client(base, supervisor_token)

    asked = agent.call("issue_refund", {"order_id": "o-" + task, "amount": 25000, "currency": "EUR"}, task, "1")
    print(json.dumps({"step": "call", "answer": asked}))
    if asked.get("error") != "approval_required":
        return 1

    shown = supervisor.approval(asked["request_id"])
    print(json.dumps({"step": "envelope", "effect": shown["envelope"]["effect"], "envelope_sha256": shown["envelope_sha256"]}))
    try:
        agent.approve(asked["request_id"], shown["envelope_sha256"])
        print(json.dumps({"step": "requester-approves", "answer": "accepted"}))
        return 1
    except ApiError as err:
        print(json.dumps({"step": "requester-approves", "status": err.status, "error": err.code}))

    approved = supervisor.approve(asked["request_id"], shown["envelope_sha256"])
    print(json.dumps({"step": "approve", "answer": approved}))
    op = agent.wait_for(approved["operation_id"])
    print(json.dumps({"step": "outcome", "status": op["status"], "operation_id": op["operation_id"]}))
    return 0 if op["status"] == "succeeded" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
