-- actionledger 0010: the operation identity includes the tenant. One principal may act in several tenants with
-- the same task and workflow step ids; those are separate operations, each with its own id and effect key.

-- The new identity first, then the old one goes: the table is never without a unique identity.
ALTER TABLE operations
  ADD CONSTRAINT operations_identity_key UNIQUE (tenant_id, principal_id, task_id, workflow_step_id);
ALTER TABLE operations DROP CONSTRAINT operations_principal_id_task_id_workflow_step_id_key;

-- The compensator reads a task whole through the identity index, whose leading columns are now (tenant,
-- principal, task); its starting points follow.
DROP INDEX operations_failed_task_idx;
CREATE INDEX operations_failed_task_idx ON operations (tenant_id, principal_id, task_id) WHERE status = 'failed';
