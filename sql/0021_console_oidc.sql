-- actionledger 0021: console sign-in through an OpenID Connect provider (api.console.oidc). Such a session
-- keeps the claims it signed in with (the provider's subject and groups): its roles are not the principal's
-- grants but what the running configuration's mapping gives those claims, less the roles revoked
-- (gate_role_revocations), worked out again on every request, so a role taken out of the mapping or revoked is
-- gone at the next request.

ALTER TABLE console_sessions DROP CONSTRAINT console_sessions_method_check;
ALTER TABLE console_sessions
  ADD CONSTRAINT console_sessions_method_check CHECK (method IN ('link', 'trusted_header', 'oidc'));
ALTER TABLE console_sessions ADD COLUMN oidc_subject text;
ALTER TABLE console_sessions ADD COLUMN oidc_groups text[];
ALTER TABLE console_sessions
  ADD CONSTRAINT console_sessions_oidc_claims CHECK ((method = 'oidc') = (oidc_subject IS NOT NULL AND oidc_groups IS NOT NULL));

-- Which principal each of the provider's people is: the subject (issuer and sub) is bound to the principal it
-- first signed in as, and that principal to it, both ways one to one. A later sign-in where the subject would be
-- another principal (a changed email or username claim), or the principal another subject (someone else's claim
-- with that value), is refused: one person, one principal, so one person never holds two votes on a
-- two-approver approval, nor gets a revoked role back under a fresh principal. Deleting a row (a deliberate act
-- of an operator with the database credentials) lets the subject bind again.
CREATE TABLE console_oidc_subjects (
  issuer        text NOT NULL,
  subject       text NOT NULL,
  principal_id  text NOT NULL UNIQUE REFERENCES principals ON DELETE CASCADE,
  created_at    timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (issuer, subject)
);
