-- actionledger 0014: notification events only where something consumes them, and removed once done with.
--
-- A session whose setting `actionledger.notifications` is 'off' writes no notification events: a process
-- whose configuration names no destination sets it on its connections (and the gate sets it for the
-- transaction that stores an approval), so no copy of an unredacted envelope waits in an outbox nothing
-- drains. Unset, or any other value, the events are written as before.
--
-- The delivery loop removes events older than its retention period once none of their deliveries is pending
-- (sql/0013 kept them for ever); the index below serves that sweep.

DROP TRIGGER notification_approval_requested ON gate_approvals;
CREATE TRIGGER notification_approval_requested
  AFTER INSERT ON gate_approvals
  FOR EACH ROW WHEN (coalesce(current_setting('actionledger.notifications', true), '') <> 'off')
  EXECUTE FUNCTION notification_on_approval();

DROP TRIGGER notification_approval_decided ON gate_approvals;
CREATE TRIGGER notification_approval_decided
  AFTER UPDATE OF status ON gate_approvals
  FOR EACH ROW WHEN (OLD.status IS DISTINCT FROM NEW.status
    AND coalesce(current_setting('actionledger.notifications', true), '') <> 'off')
  EXECUTE FUNCTION notification_on_approval();

DROP TRIGGER notification_operation_review ON operations;
CREATE TRIGGER notification_operation_review
  AFTER UPDATE OF status ON operations
  FOR EACH ROW WHEN (NEW.status = 'needs_review' AND OLD.status IS DISTINCT FROM NEW.status
    AND coalesce(current_setting('actionledger.notifications', true), '') <> 'off')
  EXECUTE FUNCTION notification_on_review();

DROP TRIGGER notification_kill_switch ON gate_kill_switches;
CREATE TRIGGER notification_kill_switch
  AFTER INSERT OR UPDATE OR DELETE ON gate_kill_switches
  FOR EACH ROW WHEN (coalesce(current_setting('actionledger.notifications', true), '') <> 'off')
  EXECUTE FUNCTION notification_on_kill_switch();

CREATE INDEX notification_events_created_idx ON notification_events (created_at);
