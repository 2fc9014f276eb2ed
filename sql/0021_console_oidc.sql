-- actionledger 0020: console sign-in through an OpenID Connect provider (api.console.oidc). Such a session
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
