-- actionledger 0008: who is calling. Principals (services and people), the roles each holds per tenant, API
-- tokens (only their sha256 is kept), the HTTP API's request windows shared by the whole fleet, and the role
-- each approver voted with.

CREATE TABLE principals (
  principal_id  text PRIMARY KEY,
  kind          text NOT NULL CHECK (kind IN ('service', 'person')),
  display_name  text NOT NULL,
  created_at    timestamptz NOT NULL DEFAULT now(),
  created_by    text NOT NULL
);

-- A role held in one tenant. Revoking deletes the grant and records a gate_role_revocations row in the same
-- transaction, so the gate, the approvals and the authorization service (which read the revocations) see it.
CREATE TABLE principal_roles (
  principal_id  text NOT NULL REFERENCES principals ON DELETE CASCADE,
  tenant_id     text NOT NULL,
  role          text NOT NULL,
  granted_at    timestamptz NOT NULL DEFAULT now(),
  granted_by    text NOT NULL,
  PRIMARY KEY (principal_id, tenant_id, role)
);
CREATE INDEX principal_roles_tenant_idx ON principal_roles (tenant_id, role);

-- An API token acts for one principal in one tenant: the tenant of every call it makes.
CREATE TABLE api_tokens (
  token_id      uuid PRIMARY KEY,
  principal_id  text NOT NULL REFERENCES principals ON DELETE CASCADE,
  tenant_id     text NOT NULL,
  name          text NOT NULL,
  token_sha256  text NOT NULL UNIQUE CHECK (token_sha256 ~ '^[0-9a-f]{64}$'),
  created_at    timestamptz NOT NULL DEFAULT now(),
  created_by    text NOT NULL,
  expires_at    timestamptz NOT NULL,
  last_used_at  timestamptz,
  revoked_at    timestamptz,
  revoked_by    text,
  CHECK (expires_at > created_at)
);
CREATE INDEX api_tokens_principal_idx ON api_tokens (principal_id, tenant_id);

-- Requests per principal and tenant in fixed windows, counted in one statement with the authentication, so a
-- limit holds across every process of the fleet. Unlogged: counting a request writes no WAL and waits for no
-- disk flush; after a PostgreSQL crash the table is empty, which only restarts the current windows.
CREATE UNLOGGED TABLE api_rate_windows (
  tenant_id     text NOT NULL,
  principal_id  text NOT NULL,
  window_start  timestamptz NOT NULL,
  requests      integer NOT NULL,
  PRIMARY KEY (tenant_id, principal_id, window_start)
);

-- The role each approver voted with, in the order of `approvers`: the authorization service checks at
-- dispatch that every approver still holds it.
ALTER TABLE gate_approvals ADD COLUMN approver_roles text[] NOT NULL DEFAULT '{}';
