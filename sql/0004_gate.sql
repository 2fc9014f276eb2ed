-- actionledger 0004: the gate. Rate windows, value caps and their holds, kill switches, role revocations,
-- proposals (confirmation by the user), approvals (by another person), plan versions, the operations the gate
-- reserved, and the audit log of every decision.
--
-- Trigger functions run in the session of whoever changes a row (a dispatcher worker, the reviewer), whose
-- search_path is not this schema: they carry `SET search_path FROM CURRENT`, the schema this file runs in.

-- One row per (tenant, principal, tool, window): incremented atomically with a conditional upsert.
CREATE TABLE gate_rate_windows (
  tenant_id     text NOT NULL,
  principal_id  text NOT NULL,
  tool_name     text NOT NULL,
  window_start  timestamptz NOT NULL,
  window_s      integer NOT NULL CHECK (window_s > 0),
  used          integer NOT NULL CHECK (used >= 0),
  PRIMARY KEY (tenant_id, principal_id, tool_name, window_start)
);

-- Value and count caps: one counter per (tenant, tool, scope, key, period, currency). The period is the UTC
-- day for the daily scopes and 'all' for a conversation. Reserved by one conditional upsert (used + amount
-- <= cap), released by the triggers below.
CREATE TABLE gate_counters (
  counter_id  bigserial PRIMARY KEY,
  tenant_id   text NOT NULL,
  tool_name   text NOT NULL,
  scope       text NOT NULL CHECK (scope IN ('principal_day', 'account_day', 'conversation')),
  scope_key   text NOT NULL,
  period      text NOT NULL,
  currency    text NOT NULL,
  used_count  integer NOT NULL DEFAULT 0 CHECK (used_count >= 0),
  used_value  numeric NOT NULL DEFAULT 0 CHECK (used_value >= 0),
  UNIQUE (tenant_id, tool_name, scope, scope_key, period, currency)
);

-- What one call holds on each counter, and for which subject: a proposal or an approval until it becomes an
-- operation, then the operation. Released exactly once (released_at).
CREATE TABLE gate_cap_holds (
  hold_id         bigserial PRIMARY KEY,
  counter_id      bigint NOT NULL REFERENCES gate_counters (counter_id),
  amount          numeric NOT NULL CHECK (amount >= 0),
  count           integer NOT NULL CHECK (count >= 0),
  proposal_id     uuid,
  approval_id     uuid,
  operation_id    uuid,
  created_at      timestamptz NOT NULL DEFAULT now(),
  released_at     timestamptz,
  release_reason  text,
  CHECK (num_nonnulls(proposal_id, approval_id, operation_id) >= 1)
);
CREATE INDEX gate_cap_holds_operation_idx ON gate_cap_holds (operation_id) WHERE released_at IS NULL;
CREATE INDEX gate_cap_holds_approval_idx ON gate_cap_holds (approval_id) WHERE released_at IS NULL;
CREATE INDEX gate_cap_holds_proposal_idx ON gate_cap_holds (proposal_id) WHERE released_at IS NULL;

-- Releases the open holds of one subject: decrements each counter by what was held and marks the holds.
CREATE FUNCTION gate_release_holds(p_kind text, p_id uuid, p_reason text) RETURNS void
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  WITH released AS (
    UPDATE gate_cap_holds h
    SET released_at = now(), release_reason = p_reason
    WHERE h.released_at IS NULL
      AND CASE p_kind
            WHEN 'operation' THEN h.operation_id = p_id
            WHEN 'approval' THEN h.approval_id = p_id AND h.operation_id IS NULL
            ELSE h.proposal_id = p_id AND h.operation_id IS NULL
          END
    RETURNING h.counter_id, h.amount, h.count
  ), sums AS (
    SELECT counter_id, sum(amount) AS amount, sum(count) AS count FROM released GROUP BY counter_id
  )
  UPDATE gate_counters c
  SET used_value = c.used_value - s.amount, used_count = c.used_count - s.count
  FROM sums s WHERE c.counter_id = s.counter_id;
END $$;

CREATE FUNCTION gate_release_on_operation_end() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  PERFORM gate_release_holds('operation', NEW.operation_id, 'operation_' || NEW.status);
  RETURN NULL;
END $$;

-- An operation that ends failed gives its budget back; the dispatcher and the reviewer need not know.
CREATE TRIGGER gate_release_on_operation_end
  AFTER UPDATE OF status ON operations
  FOR EACH ROW WHEN (NEW.status = 'failed' AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION gate_release_on_operation_end();

-- Kill switches: '*' matches every tenant or every tool. New calls are refused; the dispatcher's claim query
-- skips matching pending operations until the row is deleted.
CREATE TABLE gate_kill_switches (
  tenant_id   text NOT NULL,
  tool_name   text NOT NULL,
  engaged_at  timestamptz NOT NULL DEFAULT now(),
  engaged_by  text NOT NULL,
  reason      text NOT NULL,
  PRIMARY KEY (tenant_id, tool_name)
);

-- Roles taken away from a principal, effective at once for new calls, approvals and dispatch authorization.
CREATE TABLE gate_role_revocations (
  tenant_id     text NOT NULL,
  principal_id  text NOT NULL,
  role          text NOT NULL,
  revoked_at    timestamptz NOT NULL DEFAULT now(),
  revoked_by    text NOT NULL,
  PRIMARY KEY (tenant_id, principal_id, role)
);

-- The current plan version of each task, as the workflow last reported it through the trusted context.
CREATE TABLE gate_task_plans (
  tenant_id     text NOT NULL,
  task_id       text NOT NULL,
  plan_version  text NOT NULL,
  updated_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, task_id)
);

-- Confirmation by the user (seed 000). Only the sha256 of the confirm token is stored.
CREATE TABLE gate_proposals (
  proposal_id        uuid PRIMARY KEY,
  tenant_id          text NOT NULL,
  principal_id       text NOT NULL,
  role               text NOT NULL,
  account_id         text NOT NULL,
  conversation_id    text NOT NULL,
  turn_id            text NOT NULL,
  trace_id           text NOT NULL,
  task_id            text NOT NULL,
  workflow_step_id   text NOT NULL,
  tool_name          text NOT NULL,
  arguments_json     jsonb NOT NULL,
  args_sha256        text NOT NULL CHECK (args_sha256 ~ '^[0-9a-f]{64}$'),
  token_sha256       text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
  policy_version     text NOT NULL,
  status             text NOT NULL CHECK (status IN ('proposed', 'confirmed', 'executed', 'cancelled', 'expired')),
  confirmed_by       text,
  confirmed_turn_id  text,
  actor_mismatch     boolean NOT NULL DEFAULT false,
  operation_id       uuid,
  created_at         timestamptz NOT NULL DEFAULT now(),
  expires_at         timestamptz NOT NULL,
  confirmed_at       timestamptz,
  ended_at           timestamptz,
  CHECK (expires_at > created_at),
  CHECK (status <> 'executed' OR operation_id IS NOT NULL)
);

-- Approval by another person (seeds 001, 002): the canonical envelope and its sha256, approved by id AND hash.
CREATE TABLE gate_approvals (
  approval_id         uuid PRIMARY KEY,
  tenant_id           text NOT NULL,
  requester_id        text NOT NULL,
  requester_role      text NOT NULL,
  account_id          text NOT NULL,
  conversation_id     text NOT NULL,
  trace_id            text NOT NULL,
  task_id             text NOT NULL,
  workflow_step_id    text NOT NULL,
  tool_name           text NOT NULL,
  arguments_json      jsonb NOT NULL,
  args_sha256         text NOT NULL CHECK (args_sha256 ~ '^[0-9a-f]{64}$'),
  resources           jsonb NOT NULL DEFAULT '[]',
  plan_version        text NOT NULL,
  policy_version      text NOT NULL,
  envelope_json       jsonb NOT NULL,
  envelope_sha256     text NOT NULL CHECK (envelope_sha256 ~ '^[0-9a-f]{64}$'),
  status              text NOT NULL CHECK (status IN ('pending', 'approved', 'executed', 'rejected', 'expired', 'invalidated')),
  required_approvals  integer NOT NULL DEFAULT 1 CHECK (required_approvals >= 1),
  approvers           text[] NOT NULL DEFAULT '{}',
  decided_at          timestamptz,
  reason              text,
  operation_id        uuid,
  created_at          timestamptz NOT NULL DEFAULT now(),
  expires_at          timestamptz NOT NULL,
  CHECK (expires_at > created_at),
  CHECK (NOT (requester_id = ANY (approvers))),
  CHECK (status <> 'executed' OR operation_id IS NOT NULL)
);
CREATE INDEX gate_approvals_pending_idx ON gate_approvals (tenant_id, expires_at) WHERE status IN ('pending', 'approved');
CREATE INDEX gate_approvals_task_idx ON gate_approvals (tenant_id, task_id) WHERE status IN ('pending', 'approved');

CREATE FUNCTION gate_release_on_subject_end() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_TABLE_NAME = 'gate_approvals' THEN
    PERFORM gate_release_holds('approval', NEW.approval_id, 'approval_' || NEW.status);
  ELSE
    PERFORM gate_release_holds('proposal', NEW.proposal_id, 'proposal_' || NEW.status);
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER gate_approvals_release
  AFTER UPDATE OF status ON gate_approvals
  FOR EACH ROW WHEN (NEW.status IN ('rejected', 'expired', 'invalidated') AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION gate_release_on_subject_end();

CREATE TRIGGER gate_proposals_release
  AFTER UPDATE OF status ON gate_proposals
  FOR EACH ROW WHEN (NEW.status IN ('cancelled', 'expired') AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION gate_release_on_subject_end();

-- Final states stay final: nothing revives an expired, rejected, invalidated, cancelled or executed subject.
CREATE FUNCTION gate_final_states() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
  RAISE EXCEPTION '% % is final', TG_TABLE_NAME, OLD.status USING ERRCODE = 'P0001', HINT = 'actionledger:final_state';
END $$;
CREATE TRIGGER gate_approvals_final
  BEFORE UPDATE ON gate_approvals
  FOR EACH ROW WHEN (OLD.status IN ('executed', 'rejected', 'expired', 'invalidated'))
  EXECUTE FUNCTION gate_final_states();
CREATE TRIGGER gate_proposals_final
  BEFORE UPDATE ON gate_proposals
  FOR EACH ROW WHEN (OLD.status IN ('executed', 'cancelled', 'expired'))
  EXECUTE FUNCTION gate_final_states();

-- The operations the gate reserved: who asked, in which role, under which approval (for the built-in
-- authorization service's fresh decision).
CREATE TABLE gate_operations (
  operation_id    uuid PRIMARY KEY REFERENCES operations (operation_id),
  tenant_id       text NOT NULL,
  principal_id    text NOT NULL,
  role            text NOT NULL,
  approval_kind   text NOT NULL CHECK (approval_kind IN ('auto', 'proposal', 'approval')),
  created_at      timestamptz NOT NULL DEFAULT now()
);

-- One row per decision: every call (allowed or refused), confirmation, approval, rejection, expiry, cancel,
-- execution and operator action. Arguments are redacted before they are written. Append-only.
CREATE TABLE gate_audit (
  id               bigserial PRIMARY KEY,
  at               timestamptz NOT NULL DEFAULT now(),
  action           text NOT NULL,
  outcome          text NOT NULL,
  tenant_id        text,
  principal_id     text,
  role             text,
  account_id       text,
  conversation_id  text,
  turn_id          text,
  trace_id         text,
  tool_name        text,
  subject_id       text,
  arguments        jsonb,
  detail           jsonb NOT NULL DEFAULT '{}',
  duration_ms      double precision
);
CREATE INDEX gate_audit_conversation_idx ON gate_audit (tenant_id, conversation_id, id);
CREATE INDEX gate_audit_subject_idx ON gate_audit (subject_id) WHERE subject_id IS NOT NULL;

CREATE TRIGGER gate_audit_append_only
  BEFORE UPDATE OR DELETE ON gate_audit
  FOR EACH ROW EXECUTE FUNCTION operation_history_append_only();
