-- actionledger 0003: reconciliation checks, review bookkeeping and compensations.

-- The reconciler's schedule for an `unknown` operation: how many readbacks were inconclusive and when the
-- next one is due. Reset when a reviewed retry starts a new dispatch attempt.
ALTER TABLE operations
  ADD COLUMN reconcile_attempts integer NOT NULL DEFAULT 0 CHECK (reconcile_attempts >= 0),
  ADD COLUMN next_reconcile_at timestamptz;

-- Every readback the reconciler made, whatever it learned: the evidence behind each reconciled state and the
-- history a reviewer reads when the attempts are spent. Append-only.
CREATE TABLE reconciliation_checks (
  id            bigserial PRIMARY KEY,
  operation_id  uuid NOT NULL REFERENCES operations (operation_id),
  attempt       integer NOT NULL,
  from_status   text NOT NULL,
  outcome       text NOT NULL CHECK (outcome IN ('applied', 'no_effect', 'inconclusive', 'failing', 'unreachable', 'no_contract', 'mismatch')),
  at            timestamptz NOT NULL DEFAULT now(),
  actor         text NOT NULL,
  detail        jsonb NOT NULL DEFAULT '{}'
);
CREATE INDEX reconciliation_checks_operation_idx ON reconciliation_checks (operation_id, id);

CREATE TRIGGER reconciliation_checks_append_only
  BEFORE UPDATE OR DELETE ON reconciliation_checks
  FOR EACH ROW EXECUTE FUNCTION operation_history_append_only();

-- The due `unknown` operations, in due order.
CREATE INDEX operations_unknown_due_idx ON operations (next_reconcile_at NULLS FIRST) WHERE status = 'unknown';

-- One compensation per original operation: a separate, server-minted operation with its own identity and
-- effect key. The pair is written in the same transaction as the original's move to `compensating`.
CREATE TABLE compensations (
  original_operation_id      uuid PRIMARY KEY REFERENCES operations (operation_id),
  compensation_operation_id  uuid NOT NULL UNIQUE REFERENCES operations (operation_id),
  requested_by               text NOT NULL,
  reason                     text NOT NULL,
  created_at                 timestamptz NOT NULL DEFAULT now(),
  CHECK (original_operation_id <> compensation_operation_id)
);

-- The compensator's starting points: tasks with a definitively failed step. Tasks are then read whole through
-- the identity UNIQUE index, whose leading columns are (principal, task).
CREATE INDEX operations_failed_task_idx ON operations (principal_id, task_id) WHERE status = 'failed';
