/** The principal store's SQL, fixed text with `$n` parameters; `@schema.` is bound once at start (db/db.ts). */
/**
 * The `counted` CTE: this request counted in the caller's current window ($2 seconds, aligned to the epoch by
 * the database clock), only for a credential (the CTE named `credential`) that may be used.
 */
const countRequest = (credential: string): string => `counted AS (
      INSERT INTO @schema.api_rate_windows AS w (tenant_id, principal_id, window_start, requests)
      SELECT tenant_id, principal_id, to_timestamp(floor(extract(epoch FROM now()) / $2) * $2), 1
      FROM ${credential} WHERE NOT revoked AND NOT expired
      ON CONFLICT (tenant_id, principal_id, window_start) DO UPDATE SET requests = w.requests + 1
      RETURNING requests, window_start
    )`;

/** The count and the whole seconds left in the window, from `counted`. */
const windowCount = `counted.requests,
           ceil(extract(epoch FROM counted.window_start + make_interval(secs => $2) - now()))::int AS window_left_s`;

/**
 * A grant whose role is revoked in the tenant (`actionledger gate revoke-role` records only the revocation)
 * gives the caller nothing: every capability check reads the roles this leaves.
 */
const notRevoked = `AND NOT EXISTS (SELECT 1 FROM @schema.gate_role_revocations v
                   WHERE v.tenant_id = r.tenant_id AND v.principal_id = r.principal_id AND v.role = r.role)`;

export const principalQueries = {
  principalInsert: `
    INSERT INTO @schema.principals (principal_id, kind, display_name, created_by) VALUES ($1, $2, $3, $4)
    ON CONFLICT (principal_id) DO NOTHING RETURNING principal_id`,

  principalSelect: `SELECT principal_id, kind, display_name, created_at FROM @schema.principals WHERE principal_id = $1`,

  /** Principals with their grants; $1 a tenant or null for every tenant. */
  principalList: `
    SELECT p.principal_id, p.kind, p.display_name, p.created_at,
           coalesce(json_agg(json_build_object('tenant_id', r.tenant_id, 'role', r.role, 'granted_at', r.granted_at)
                             ORDER BY r.tenant_id, r.role) FILTER (WHERE r.role IS NOT NULL), '[]') AS roles
    FROM @schema.principals p
    LEFT JOIN @schema.principal_roles r ON r.principal_id = p.principal_id AND ($1::text IS NULL OR r.tenant_id = $1)
    GROUP BY p.principal_id
    HAVING $1::text IS NULL OR count(r.role) > 0
    ORDER BY p.principal_id`,

  grantInsert: `
    INSERT INTO @schema.principal_roles (principal_id, tenant_id, role, granted_by) VALUES ($1, $2, $3, $4)
    ON CONFLICT DO NOTHING RETURNING role`,

  /** A grant gives back a role that was revoked: the revocation row goes with it. */
  revocationClear: `DELETE FROM @schema.gate_role_revocations WHERE tenant_id = $1 AND principal_id = $2 AND role = $3`,

  grantDelete: `DELETE FROM @schema.principal_roles WHERE principal_id = $1 AND tenant_id = $2 AND role = $3 RETURNING role`,

  revocationInsert: `
    INSERT INTO @schema.gate_role_revocations (tenant_id, principal_id, role, revoked_by) VALUES ($1, $2, $3, $4)
    ON CONFLICT (tenant_id, principal_id, role) DO NOTHING`,

  tokenInsert: `
    INSERT INTO @schema.api_tokens (token_id, principal_id, tenant_id, name, token_sha256, created_by, expires_at)
    VALUES ($1, $2, $3, $4, $5, $6, now() + make_interval(secs => $7))
    RETURNING expires_at`,

  tokenRevoke: `
    UPDATE @schema.api_tokens SET revoked_at = now(), revoked_by = $2
    WHERE token_id = $1 AND revoked_at IS NULL RETURNING principal_id, tenant_id`,

  tokenSelect: `SELECT token_id, principal_id, tenant_id, revoked_at FROM @schema.api_tokens WHERE token_id = $1`,

  /** Tokens (never their hashes); $1 a principal or null, $2 a tenant or null. */
  tokenList: `
    SELECT token_id, principal_id, tenant_id, name, created_at, created_by, expires_at, last_used_at, revoked_at,
           revoked_at IS NULL AND expires_at > now() AS active
    FROM @schema.api_tokens
    WHERE ($1::text IS NULL OR principal_id = $1) AND ($2::text IS NULL OR tenant_id = $2)
    ORDER BY created_at, token_id`,

  /**
   * Authentication and the fleet-wide request count in one statement. The token by its sha256 ($1), with the
   * principal's roles in the token's tenant; the request counted in the current window ($2 window seconds)
   * only for a token that may be used; last_used_at refreshed at most once a minute (a write per request would
   * serialize a busy token's requests on its row).
   */
  authenticate: `
    WITH tok AS (
      SELECT t.token_id, t.principal_id, t.tenant_id, t.expires_at, t.revoked_at IS NOT NULL AS revoked,
             t.expires_at <= now() AS expired, p.kind,
             coalesce(t.last_used_at < now() - interval '1 minute', true) AS touch,
             ARRAY(SELECT r.role FROM @schema.principal_roles r
                   WHERE r.principal_id = t.principal_id AND r.tenant_id = t.tenant_id ${notRevoked}
                   ORDER BY r.role) AS roles
      FROM @schema.api_tokens t JOIN @schema.principals p ON p.principal_id = t.principal_id
      WHERE t.token_sha256 = $1
    ),
    ${countRequest('tok')},
    touched AS (
      UPDATE @schema.api_tokens t SET last_used_at = now()
      FROM tok WHERE t.token_id = tok.token_id AND tok.touch AND NOT tok.revoked AND NOT tok.expired
      RETURNING t.token_id
    )
    SELECT tok.token_id, tok.principal_id, tok.tenant_id, tok.kind, tok.roles, tok.revoked, tok.expired,
           ${windowCount}
    FROM tok LEFT JOIN counted ON true`,

  /**
   * $4 more requests counted in the current window ($3 window seconds) of tenant $1, principal $2: the
   * messages of one request beyond the first, which authentication counted.
   */
  countMore: `
    INSERT INTO @schema.api_rate_windows AS w (tenant_id, principal_id, window_start, requests)
    VALUES ($1, $2, to_timestamp(floor(extract(epoch FROM now()) / $3) * $3), $4)
    ON CONFLICT (tenant_id, principal_id, window_start) DO UPDATE SET requests = w.requests + $4
    RETURNING requests,
              ceil(extract(epoch FROM w.window_start + make_interval(secs => $3) - now()))::int AS window_left_s`,

  /** Request windows that ended over a minute ago. */
  rateWindowPrune: `
    DELETE FROM @schema.api_rate_windows WHERE window_start < now() - make_interval(secs => $1) - interval '1 minute'`,

  /** The roles a principal holds in a tenant (the CLI's token check and the mTLS mapping). */
  rolesHeld: `
    SELECT r.role FROM @schema.principal_roles r
    WHERE r.principal_id = $1 AND r.tenant_id = $2 ${notRevoked}
    ORDER BY r.role`,

  certificateInsert: `
    INSERT INTO @schema.principal_certificates
      (fingerprint_sha256, principal_id, tenant_id, subject, not_after, created_by)
    VALUES ($1, $2, $3, $4, $5, $6)
    ON CONFLICT (fingerprint_sha256) DO NOTHING RETURNING fingerprint_sha256`,

  certificateRevoke: `
    UPDATE @schema.principal_certificates SET revoked_at = now(), revoked_by = $2
    WHERE fingerprint_sha256 = $1 AND revoked_at IS NULL RETURNING principal_id`,

  certificateSelect: `SELECT principal_id FROM @schema.principal_certificates WHERE fingerprint_sha256 = $1`,

  certificateList: `
    SELECT fingerprint_sha256, principal_id, tenant_id, subject, not_after, created_at, created_by, revoked_at,
           revoked_at IS NULL AND not_after > now() AS active
    FROM @schema.principal_certificates
    WHERE ($1::text IS NULL OR principal_id = $1) AND ($2::text IS NULL OR tenant_id = $2)
    ORDER BY created_at, fingerprint_sha256`,

  /** As {@link principalQueries.authenticate}, for a verified client certificate by its fingerprint ($1). */
  authenticateCertificate: `
    WITH cert AS (
      SELECT c.fingerprint_sha256, c.principal_id, c.tenant_id, c.revoked_at IS NOT NULL AS revoked,
             c.not_after <= now() AS expired, p.kind,
             ARRAY(SELECT r.role FROM @schema.principal_roles r
                   WHERE r.principal_id = c.principal_id AND r.tenant_id = c.tenant_id ${notRevoked}
                   ORDER BY r.role) AS roles
      FROM @schema.principal_certificates c JOIN @schema.principals p ON p.principal_id = c.principal_id
      WHERE c.fingerprint_sha256 = $1
    ),
    ${countRequest('cert')}
    SELECT cert.fingerprint_sha256, cert.principal_id, cert.tenant_id, cert.kind, cert.roles, cert.revoked,
           cert.expired, ${windowCount}
    FROM cert LEFT JOIN counted ON true`,
} as const;
