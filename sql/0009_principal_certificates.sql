-- actionledger 0009: client certificates mapped to principals, and indexes for the API's listings. When the API listener serves TLS with a client
-- CA, a request without a bearer token is authenticated by its verified client certificate, looked up by the
-- certificate's SHA-256 fingerprint; the mapping names the principal and the one tenant it acts in.
CREATE TABLE principal_certificates (
  fingerprint_sha256  text PRIMARY KEY CHECK (fingerprint_sha256 ~ '^[0-9a-f]{64}$'),
  principal_id        text NOT NULL REFERENCES principals ON DELETE CASCADE,
  tenant_id           text NOT NULL,
  subject             text NOT NULL,
  not_after           timestamptz NOT NULL,
  created_at          timestamptz NOT NULL DEFAULT now(),
  created_by          text NOT NULL,
  revoked_at          timestamptz,
  revoked_by          text
);
CREATE INDEX principal_certificates_principal_idx ON principal_certificates (principal_id, tenant_id);

-- The API's tenant-scoped listings read in index order: approvals oldest first, the audit log newest first.
CREATE INDEX gate_approvals_tenant_created_idx ON gate_approvals (tenant_id, created_at, approval_id);
CREATE INDEX gate_audit_tenant_idx ON gate_audit (tenant_id, id);
