-- actionledger 0017: a task's plan version belongs to the principal whose context reported it.
--
-- Until now the plan version was keyed by (tenant, task) alone, so another principal of the tenant calling any
-- tool with the same (guessable) task id and a new plan version invalidated the first principal's pending
-- approvals and sent its approved operations to review at dispatch. The operation identity already is
-- (tenant, principal, task, step) (0010); the plan is now (tenant, principal, task) too, and so is everything
-- that reads or moves it: the invalidation of approvals (only the same requester's), the plan bound into a new
-- envelope, the check at execute and at dispatch (joined on the approval's requester).
--
-- Existing rows had no principal. Each is given to every principal that has an approval (its requester), a
-- proposal or an operation in that tenant and task, with the version and time it had: one principal in the
-- usual case; several where principals shared a task id, each then starting from the version the shared row
-- held. An approval is checked against its requester's row, which after this migration holds exactly the
-- version the shared row held, so no approval's check (at approve, at execute, at dispatch) changes by it.
-- Dropping a shared row instead would turn every approval bound to its version into a `plan_version` refusal
-- (a missing row reads as the default plan '-').
--
-- A row nobody can be attributed to (no approval, proposal or operation of anyone in that task: a call only
-- records its plan in the transaction that also writes one of those, so this is a row whose records are gone)
-- is dropped. No existing approval reads it; the next call of that task with a plan version records it afresh
-- (and invalidates that principal's approvals bound to another version, as a first report always did), and one
-- without a plan version binds the default '-', which a missing row reads as: no refusal and no pass that the
-- row would have decided otherwise.

ALTER TABLE gate_task_plans ADD COLUMN principal_id text;
ALTER TABLE gate_task_plans DROP CONSTRAINT gate_task_plans_pkey;

INSERT INTO gate_task_plans (tenant_id, principal_id, task_id, plan_version, updated_at)
SELECT p.tenant_id, w.principal_id, p.task_id, p.plan_version, p.updated_at
FROM gate_task_plans p
JOIN (
  SELECT tenant_id, requester_id AS principal_id, task_id FROM gate_approvals
  UNION
  SELECT tenant_id, principal_id, task_id FROM gate_proposals
  UNION
  SELECT tenant_id, principal_id, task_id FROM operations
) w ON w.tenant_id = p.tenant_id AND w.task_id = p.task_id
WHERE p.principal_id IS NULL;

DELETE FROM gate_task_plans WHERE principal_id IS NULL;

ALTER TABLE gate_task_plans ALTER COLUMN principal_id SET NOT NULL;
ALTER TABLE gate_task_plans ADD PRIMARY KEY (tenant_id, principal_id, task_id);
