-- actionledger 0012: the operator console's sign-in. A one-time sign-in link (made by
-- `actionledger principal login-link`) is exchanged once for a session; only the sha256 of either secret is
-- kept. A session ends when it expires, when its person signs out, or when any role of its principal is
-- revoked after it began (the check reads gate_role_revocations on every request).

CREATE TABLE console_login_links (
  link_id       uuid PRIMARY KEY,
  principal_id  text NOT NULL REFERENCES principals ON DELETE CASCADE,
  link_sha256   text NOT NULL UNIQUE CHECK (link_sha256 ~ '^[0-9a-f]{64}$'),
  created_at    timestamptz NOT NULL DEFAULT now(),
  created_by    text NOT NULL,
  expires_at    timestamptz NOT NULL,
  used_at       timestamptz,
  CHECK (expires_at > created_at)
);

CREATE TABLE console_sessions (
  session_id     uuid PRIMARY KEY,
  principal_id   text NOT NULL REFERENCES principals ON DELETE CASCADE,
  session_sha256 text NOT NULL UNIQUE CHECK (session_sha256 ~ '^[0-9a-f]{64}$'),
  -- how the person signed in: a one-time link, or the authenticating proxy's trusted header
  method         text NOT NULL CHECK (method IN ('link', 'trusted_header')),
  created_at     timestamptz NOT NULL DEFAULT now(),
  expires_at     timestamptz NOT NULL,
  ended_at       timestamptz,
  ended_reason   text,
  CHECK (expires_at > created_at)
);
CREATE INDEX console_sessions_principal_idx ON console_sessions (principal_id) WHERE ended_at IS NULL;
