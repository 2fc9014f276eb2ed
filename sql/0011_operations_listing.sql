-- actionledger 0011: listing one tenant's operations, newest first (the HTTP API's GET /v1/operations).
-- Keyset paging on (created_at, operation_id) inside one tenant: the list reads only the rows of the caller's
-- tenant, from the cursor on, however many operations the other tenants hold. The other filters (status,
-- tool, task, principal) are checked on the rows this index yields.
--
-- Built inside the migration's transaction (not CONCURRENTLY): on a large ledger, writes to `operations`
-- wait while it builds. Create it by hand first with CREATE INDEX CONCURRENTLY under this name to avoid that;
-- IF NOT EXISTS then keeps this file a no-op.
CREATE INDEX IF NOT EXISTS operations_tenant_created_idx ON operations (tenant_id, created_at, operation_id);
