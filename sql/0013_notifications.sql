-- Notifications: the moments a person must act or know, written as events in the same transaction as the
-- change that caused them (by the triggers below, so no writer can forget one), then fanned out to the
-- configured destinations and delivered by the dispatcher workers' notification loop.
--
-- Trigger functions run with whatever search_path the writer has; they carry `SET search_path FROM CURRENT`,
-- the schema this file runs in.

CREATE TABLE notification_events (
  event_id       uuid PRIMARY KEY DEFAULT gen_random_uuid(),
  event_type     text NOT NULL CHECK (event_type IN (
                   'approval.requested', 'approval.decided', 'approval.expired', 'operation.review',
                   'kill_switch.engaged', 'kill_switch.lifted', 'compensation.escalated')),
  tenant_id      text NOT NULL,
  -- Null for a kill switch over every tool ('*').
  tool_name      text,
  subject_id     text NOT NULL,
  payload        jsonb NOT NULL CHECK (jsonb_typeof(payload) = 'object'),
  created_at     timestamptz NOT NULL DEFAULT now(),
  -- Set once the event's deliveries exist (one per matching destination, possibly none).
  fanned_out_at  timestamptz
);
CREATE INDEX notification_events_unrouted_idx ON notification_events (created_at) WHERE fanned_out_at IS NULL;

-- One delivery per (event, destination). The webhook-id a receiver sees is the event id, on every attempt.
-- A worker claims a delivery with a lease (claim_token, claimed_until); a worker that dies leaves the lease to
-- run out and another worker sends it again, with the same id.
CREATE TABLE notification_deliveries (
  event_id         uuid NOT NULL REFERENCES notification_events (event_id),
  destination      text NOT NULL,
  status           text NOT NULL DEFAULT 'pending' CHECK (status IN ('pending', 'delivered', 'failed')),
  attempts         integer NOT NULL DEFAULT 0 CHECK (attempts >= 0),
  next_attempt_at  timestamptz NOT NULL DEFAULT now(),
  claim_token      uuid,
  claimed_until    timestamptz,
  last_error       text,
  ended_at         timestamptz,
  PRIMARY KEY (event_id, destination)
);
CREATE INDEX notification_deliveries_due_idx ON notification_deliveries (next_attempt_at) WHERE status = 'pending';

-- Which Slack user is which principal, per tenant and Slack workspace, set by an operator
-- (`actionledger principal slack-link`). An unmapped user's click is refused.
CREATE TABLE notification_slack_users (
  tenant_id      text NOT NULL,
  slack_team_id  text NOT NULL,
  slack_user_id  text NOT NULL,
  principal_id   text NOT NULL,
  linked_by      text NOT NULL,
  linked_at      timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (tenant_id, slack_team_id, slack_user_id)
);

-- The Slack message that showed an approval request: where it is (to update it) and the envelope hash it
-- showed (a click approves with this hash, never with one the click supplies).
CREATE TABLE notification_slack_messages (
  destination      text NOT NULL,
  channel          text NOT NULL,
  message_ts       text NOT NULL,
  approval_id      uuid NOT NULL,
  tenant_id        text NOT NULL,
  envelope_sha256  text NOT NULL CHECK (envelope_sha256 ~ '^[0-9a-f]{64}$'),
  posted_at        timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (destination, channel, message_ts),
  UNIQUE (destination, approval_id)
);

CREATE FUNCTION notification_on_approval() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  IF TG_OP = 'INSERT' THEN
    INSERT INTO notification_events (event_type, tenant_id, tool_name, subject_id, payload)
    VALUES ('approval.requested', NEW.tenant_id, NEW.tool_name, NEW.approval_id::text, jsonb_build_object(
      'approval_id', NEW.approval_id, 'status', NEW.status, 'tool', NEW.tool_name,
      'requester_id', NEW.requester_id, 'requester_role', NEW.requester_role,
      'envelope', NEW.envelope_json, 'envelope_sha256', NEW.envelope_sha256,
      'required_approvals', NEW.required_approvals,
      'created_at', NEW.created_at, 'expires_at', NEW.expires_at));
  ELSE
    INSERT INTO notification_events (event_type, tenant_id, tool_name, subject_id, payload)
    VALUES (CASE WHEN NEW.status = 'expired' THEN 'approval.expired' ELSE 'approval.decided' END,
      NEW.tenant_id, NEW.tool_name, NEW.approval_id::text, jsonb_build_object(
      'approval_id', NEW.approval_id, 'status', NEW.status, 'previous_status', OLD.status, 'tool', NEW.tool_name,
      'requester_id', NEW.requester_id, 'approvers', to_jsonb(NEW.approvers), 'reason', NEW.reason,
      'operation_id', NEW.operation_id, 'envelope_sha256', NEW.envelope_sha256,
      'decided_at', coalesce(NEW.decided_at, now()), 'expires_at', NEW.expires_at));
  END IF;
  RETURN NULL;
END $$;

CREATE TRIGGER notification_approval_requested
  AFTER INSERT ON gate_approvals
  FOR EACH ROW EXECUTE FUNCTION notification_on_approval();
CREATE TRIGGER notification_approval_decided
  AFTER UPDATE OF status ON gate_approvals
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION notification_on_approval();

-- Only a move into needs_review fires: the WHEN clause keeps every other status change of the hot path free
-- of the function call.
CREATE FUNCTION notification_on_review() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
BEGIN
  INSERT INTO notification_events (event_type, tenant_id, tool_name, subject_id, payload)
  VALUES (CASE WHEN OLD.status = 'compensating' THEN 'compensation.escalated' ELSE 'operation.review' END,
    NEW.tenant_id, NEW.tool_name, NEW.operation_id::text, jsonb_build_object(
    'operation_id', NEW.operation_id, 'tool', NEW.tool_name, 'principal_id', NEW.principal_id,
    'task_id', NEW.task_id, 'workflow_step_id', NEW.workflow_step_id, 'previous_status', OLD.status,
    'reason', NEW.review_reason, 'approval_id', NEW.current_approval_id, 'at', now()));
  RETURN NULL;
END $$;

CREATE TRIGGER notification_operation_review
  AFTER UPDATE OF status ON operations
  FOR EACH ROW WHEN (NEW.status = 'needs_review' AND OLD.status IS DISTINCT FROM NEW.status)
  EXECUTE FUNCTION notification_on_review();

CREATE FUNCTION notification_on_kill_switch() RETURNS trigger
LANGUAGE plpgsql SET search_path FROM CURRENT AS $$
DECLARE
  r gate_kill_switches;
BEGIN
  IF TG_OP = 'DELETE' THEN r := OLD; ELSE r := NEW; END IF;
  INSERT INTO notification_events (event_type, tenant_id, tool_name, subject_id, payload)
  VALUES (CASE WHEN TG_OP = 'DELETE' THEN 'kill_switch.lifted' ELSE 'kill_switch.engaged' END,
    r.tenant_id, NULLIF(r.tool_name, '*'), r.tenant_id || '/' || r.tool_name, jsonb_build_object(
    'tenant_id', r.tenant_id, 'tool', r.tool_name, 'engaged_by', r.engaged_by, 'reason', r.reason,
    'engaged_at', r.engaged_at, 'at', now()));
  RETURN NULL;
END $$;

CREATE TRIGGER notification_kill_switch
  AFTER INSERT OR UPDATE OR DELETE ON gate_kill_switches
  FOR EACH ROW EXECUTE FUNCTION notification_on_kill_switch();
