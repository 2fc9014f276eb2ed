-- actionledger 0001: the operation ledger, its outbox, authorization evidence and state history.
-- Applied by `actionledger migrate` with search_path set to the configured schema. To run it by hand:
--   SET search_path TO actionledger;  \i sql/0001_ledger_and_outbox.sql

-- One row per business intent. Identity is (principal, task, workflow step); everything that decides the
-- effect (tool, tenant, provider route, arguments, effect key) is immutable once written (trigger below).
CREATE TABLE operations (
  operation_id            uuid PRIMARY KEY,
  effect_key              text NOT NULL UNIQUE,
  effect_key_id           text NOT NULL,
  principal_id            text NOT NULL,
  task_id                 text NOT NULL,
  workflow_step_id        text NOT NULL,
  tool_name               text NOT NULL,
  tenant_id               text NOT NULL,
  provider_id             text NOT NULL,
  provider_endpoint       text NOT NULL,
  idempotency_header      text NOT NULL,
  canonical_args_sha256   text NOT NULL CHECK (canonical_args_sha256 ~ '^[0-9a-f]{64}$'),
  arguments_json          jsonb NOT NULL CHECK (jsonb_typeof(arguments_json) = 'object'),
  current_approval_id     text NOT NULL,
  current_policy_version  text NOT NULL,
  status                  text NOT NULL CHECK (status IN (
                            'pending', 'executing', 'succeeded', 'unknown',
                            'needs_review', 'compensating', 'compensated', 'failed')),
  attempt                 integer NOT NULL DEFAULT 1 CHECK (attempt >= 1),
  claim_token             uuid,
  claimed_by              text,
  claimed_at              timestamptz,
  provider_receipt        text,
  result_json             jsonb,
  review_reason           text,
  created_at              timestamptz NOT NULL DEFAULT now(),
  updated_at              timestamptz NOT NULL DEFAULT now(),
  UNIQUE (principal_id, task_id, workflow_step_id),
  CHECK (status <> 'executing' OR claim_token IS NOT NULL),
  CHECK (status <> 'needs_review' OR review_reason IS NOT NULL)
);

-- Operations not yet at an end, for `status` (oldest pending) and the reconciler; finished rows stay out.
CREATE INDEX operations_open_idx ON operations (status, updated_at)
  WHERE status IN ('pending', 'executing', 'unknown', 'needs_review', 'compensating');

CREATE FUNCTION operations_immutable() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'operation % effect fields are immutable', OLD.operation_id
    USING ERRCODE = 'P0001', HINT = 'actionledger:immutable';
END $$;

CREATE TRIGGER operations_immutable
  BEFORE UPDATE ON operations
  FOR EACH ROW
  WHEN (OLD.effect_key IS DISTINCT FROM NEW.effect_key
     OR OLD.effect_key_id IS DISTINCT FROM NEW.effect_key_id
     OR OLD.operation_id IS DISTINCT FROM NEW.operation_id
     OR OLD.principal_id IS DISTINCT FROM NEW.principal_id
     OR OLD.task_id IS DISTINCT FROM NEW.task_id
     OR OLD.workflow_step_id IS DISTINCT FROM NEW.workflow_step_id
     OR OLD.tool_name IS DISTINCT FROM NEW.tool_name
     OR OLD.tenant_id IS DISTINCT FROM NEW.tenant_id
     OR OLD.provider_id IS DISTINCT FROM NEW.provider_id
     OR OLD.provider_endpoint IS DISTINCT FROM NEW.provider_endpoint
     OR OLD.idempotency_header IS DISTINCT FROM NEW.idempotency_header
     OR OLD.canonical_args_sha256 IS DISTINCT FROM NEW.canonical_args_sha256
     OR OLD.arguments_json IS DISTINCT FROM NEW.arguments_json
     OR OLD.created_at IS DISTINCT FROM NEW.created_at)
  EXECUTE FUNCTION operations_immutable();

-- Work waiting for a dispatcher: one row per dispatch attempt, deleted when claimed, so the table the
-- claim query scans holds only what is waiting, however large the ledger grows.
CREATE TABLE outbox (
  operation_id  uuid NOT NULL REFERENCES operations (operation_id),
  attempt       integer NOT NULL CHECK (attempt >= 1),
  available_at  timestamptz NOT NULL DEFAULT now(),
  created_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (operation_id, attempt)
);
CREATE INDEX outbox_available_idx ON outbox (available_at);
ALTER TABLE outbox SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- What the dispatcher was told by the authorization service, per claim, before it called the provider.
CREATE TABLE authorization_evidence (
  operation_id     uuid NOT NULL REFERENCES operations (operation_id),
  attempt          integer NOT NULL,
  claim_token      uuid NOT NULL,
  approval_id      text NOT NULL,
  policy_version   text NOT NULL,
  args_sha256      text NOT NULL,
  decision_sha256  text NOT NULL,
  authorized_at    timestamptz NOT NULL,
  expires_at       timestamptz NOT NULL,
  recorded_at      timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (operation_id, claim_token),
  CHECK (expires_at > authorized_at)
);

-- Append-only: every state transition, who made it and why. Rows are never updated or deleted.
CREATE TABLE operation_history (
  id            bigserial PRIMARY KEY,
  operation_id  uuid NOT NULL REFERENCES operations (operation_id),
  from_status   text,
  to_status     text NOT NULL,
  at            timestamptz NOT NULL DEFAULT now(),
  actor         text NOT NULL,
  reason        text NOT NULL,
  detail        jsonb
);
CREATE INDEX operation_history_operation_idx ON operation_history (operation_id, id);

CREATE FUNCTION operation_history_append_only() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION 'operation_history is append-only' USING ERRCODE = 'P0001', HINT = 'actionledger:append_only';
END $$;

CREATE TRIGGER operation_history_append_only
  BEFORE UPDATE OR DELETE ON operation_history
  FOR EACH ROW EXECUTE FUNCTION operation_history_append_only();
