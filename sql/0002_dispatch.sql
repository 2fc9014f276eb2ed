-- actionledger 0002: dispatcher workers and their heartbeats.
-- A claim belongs to a worker; the reconciler touches an `executing` row only when its worker has stopped
-- heartbeating (age of the claim alone never decides).
CREATE TABLE workers (
  worker_id     text PRIMARY KEY,
  pid           integer NOT NULL,
  host          text NOT NULL,
  started_at    timestamptz NOT NULL DEFAULT now(),
  heartbeat_at  timestamptz NOT NULL DEFAULT now(),
  stopped_at    timestamptz
);

-- The reconciler's and the status views' lookup of claims by worker.
CREATE INDEX operations_claimed_by_idx ON operations (claimed_by) WHERE status = 'executing';
