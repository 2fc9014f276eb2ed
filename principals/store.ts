/**
 * Who is calling, kept in PostgreSQL: principals (services and people), the roles each holds per tenant, and
 * API tokens. Every change commits with its audit row or not at all.
 *
 * A token is shown once, when it is created: `alt_` and 43 base64url characters (32 random bytes); only its
 * sha256 is stored. It acts for one principal in one tenant, until it expires or is revoked; each request
 * reads it again, so a revocation (of the token, or of a role) is seen by the next request.
 *
 * Revoking a role deletes the grant and records a role revocation in the same transaction, so every check
 * that already reads revocations sees it at once: new gate calls, approvals, and the authorization service at
 * dispatch. The revoked principal's votes on approvals still pending in that tenant stop counting.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { bindQueries, type Pool, type Queryable } from '../db/index.js';
import { ActionLedgerError } from '../core/errors.js';
import { identifier } from '../core/identifier.js';
import type { Config } from '../config/index.js';
import { AuditWriter, withdrawPendingVotes } from '../gate/index.js';
import { audited, mustExist } from './audited.js';
import { PrincipalCertificates } from './certificates.js';
import { principalQueries } from './queries.js';

export type PrincipalKind = 'service' | 'person';
export const PRINCIPAL_KINDS: readonly PrincipalKind[] = ['service', 'person'];

export interface PrincipalRow {
  principal_id: string;
  kind: PrincipalKind;
  display_name: string;
  created_at: Date;
  roles: { tenant_id: string; role: string; granted_at: string }[];
}

export interface TokenRow {
  token_id: string;
  principal_id: string;
  tenant_id: string;
  name: string;
  created_at: Date;
  created_by: string;
  expires_at: Date;
  last_used_at: Date | null;
  revoked_at: Date | null;
  active: boolean;
}

/** A new token: `token` is shown this once and never stored. */
export interface CreatedToken {
  token_id: string;
  token: string;
  principal_id: string;
  tenant_id: string;
  expires_at: string;
}

/** An authenticated caller: the token's principal in the token's tenant, with the roles it holds there. */
export interface Authenticated {
  token_id: string;
  principal_id: string;
  tenant_id: string;
  kind: PrincipalKind;
  roles: readonly string[];
  /** Requests counted in the current window (this one included), and the seconds left in it. */
  requests: number;
  window_left_s: number;
}

const TOKEN_FORMAT = /^alt_[A-Za-z0-9_-]{43}$/;

/** The stored form of a token. */
export function tokenHash(token: string): string {
  return createHash('sha256').update(token, 'utf8').digest('hex');
}

export class PrincipalStore {
  readonly #pool: Pool;
  readonly #q: Readonly<typeof principalQueries>;
  readonly #audit: AuditWriter;
  readonly #config: Config;
  /** Client certificates mapped to principals (principals/certificates.ts). */
  readonly certificates: PrincipalCertificates;

  constructor(config: Config, pool: Pool, audit?: AuditWriter) {
    this.#config = config;
    this.#pool = pool;
    this.#q = bindQueries(principalQueries, config.schemaQuoted);
    this.#audit = audit ?? new AuditWriter({ config, pool });
    this.certificates = new PrincipalCertificates(config, pool, this.#audit);
  }

  /** Adds a principal; returns false when one of that id exists (nothing changed). Throws `invalid_context`. */
  async add(principalId: string, kind: PrincipalKind, displayName: string, actor: string): Promise<boolean> {
    const id = identifier('principal_id', principalId);
    if (!PRINCIPAL_KINDS.includes(kind))
      throw new ActionLedgerError('invalid_request', `kind must be one of ${PRINCIPAL_KINDS.join(', ')}`, {
        details: { field: 'kind' },
      });
    const name = displayName.trim() === '' ? id : identifier('display_name', displayName);
    return audited(
      this.#pool,
      this.#audit,
      { action: 'principal', outcome: 'added', context: { principal_id: id } },
      actor,
      async (c) => {
        const { rowCount } = await c.query(this.#q.principalInsert, [id, kind, name, actor]);
        return rowCount !== 0;
      },
    );
  }

  /**
   * Grants a role in a tenant (and clears a revocation of it). Returns false when it was held already.
   * Throws `not_found` for an unknown principal, `invalid_context` for a malformed name.
   */
  async grant(principalId: string, tenantId: string, role: string, actor: string): Promise<boolean> {
    const [id, tenant, r] = [
      identifier('principal_id', principalId),
      identifier('tenant_id', tenantId),
      identifier('role', role),
    ];
    return audited(
      this.#pool,
      this.#audit,
      { action: 'role', outcome: 'granted', context: { tenant_id: tenant, principal_id: id, role: r } },
      actor,
      async (c) => {
        await mustExist(c, this.#q, id);
        const { rowCount } = await c.query(this.#q.grantInsert, [id, tenant, r, actor]);
        await c.query(this.#q.revocationClear, [tenant, id, r]);
        return rowCount !== 0;
      },
    );
  }

  /**
   * Takes a role away at once (see the module comment). Returns the approvals whose pending votes by this
   * principal no longer count. A role that was not granted is still recorded as revoked: it may have been
   * named in trusted contexts by code that does not use the principal store.
   */
  async revoke(
    principalId: string,
    tenantId: string,
    role: string,
    actor: string,
  ): Promise<{ votes_withdrawn: string[] }> {
    const [id, tenant, r] = [
      identifier('principal_id', principalId),
      identifier('tenant_id', tenantId),
      identifier('role', role),
    ];
    let withdrawn: string[] = [];
    await audited(
      this.#pool,
      this.#audit,
      { action: 'role', outcome: 'revoked', context: { tenant_id: tenant, principal_id: id, role: r } },
      actor,
      async (c) => {
        await c.query(this.#q.grantDelete, [id, tenant, r]);
        await c.query(this.#q.revocationInsert, [tenant, id, r, actor]);
        withdrawn = await withdrawPendingVotes(c, this.#config.schemaQuoted, {
          tenant_id: tenant,
          principal_id: id,
          role: r,
        });
        return withdrawn;
      },
      () => ({ votes_withdrawn: withdrawn }),
    );
    return { votes_withdrawn: withdrawn };
  }

  /** Principals with their grants, in one tenant or all. */
  async list(tenantId: string | null = null): Promise<PrincipalRow[]> {
    return (await this.#pool.query<PrincipalRow>(this.#q.principalList, [tenantId])).rows;
  }

  /** The roles the principal holds in the tenant. */
  async rolesHeld(principalId: string, tenantId: string): Promise<string[]> {
    const { rows } = await this.#pool.query<{ role: string }>(this.#q.rolesHeld, [principalId, tenantId]);
    return rows.map((r) => r.role);
  }

  /**
   * Creates a token for the principal in the tenant, valid `ttlDays` (at most `api.token_max_ttl_days`).
   * The principal must hold a role there. Throws `not_found`, `permission_denied`, `invalid_request`.
   */
  async createToken(
    principalId: string,
    tenantId: string,
    name: string,
    ttlDays: number,
    actor: string,
  ): Promise<CreatedToken> {
    const [id, tenant] = [identifier('principal_id', principalId), identifier('tenant_id', tenantId)];
    const label = name.trim() === '' ? 'token' : identifier('name', name);
    const max = this.#config.api.tokenMaxTtlDays;
    if (!(Number.isFinite(ttlDays) && ttlDays > 0 && ttlDays <= max))
      throw new ActionLedgerError('invalid_request', `a token lives more than 0 and at most ${max} days`, {
        details: { field: 'ttl_days', max },
      });
    const tokenId = randomUUID();
    const token = `alt_${randomBytes(32).toString('base64url')}`;
    let expires = '';
    await audited(
      this.#pool,
      this.#audit,
      { action: 'token', outcome: 'created', context: { tenant_id: tenant, principal_id: id }, subjectId: tokenId },
      actor,
      async (c) => {
        await mustExist(c, this.#q, id);
        const roles = await c.query(this.#q.rolesHeld, [id, tenant]);
        if (roles.rowCount === 0)
          throw new ActionLedgerError('permission_denied', `${id} holds no role in tenant ${tenant}: grant one first`, {
            details: { principal_id: id, tenant_id: tenant },
          });
        const { rows } = await c.query<{ expires_at: Date }>(this.#q.tokenInsert, [
          tokenId,
          id,
          tenant,
          label,
          tokenHash(token),
          actor,
          Math.round(ttlDays * 86400),
        ]);
        expires = rows[0]?.expires_at.toISOString() ?? '';
      },
      () => ({ name: label, expires_at: expires }),
    );
    return { token_id: tokenId, token, principal_id: id, tenant_id: tenant, expires_at: expires };
  }

  /** Revokes a token; the next request with it is refused. Returns false when it was revoked already. Throws `not_found`. */
  async revokeToken(tokenId: string, actor: string): Promise<boolean> {
    if (!/^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i.test(tokenId))
      throw new ActionLedgerError('not_found', 'there is no token with that id');
    return audited(
      this.#pool,
      this.#audit,
      { action: 'token', outcome: 'revoked', subjectId: tokenId },
      actor,
      async (c) => {
        const found = await c.query(this.#q.tokenSelect, [tokenId]);
        if (found.rowCount === 0) throw new ActionLedgerError('not_found', 'there is no token with that id');
        const { rowCount } = await c.query(this.#q.tokenRevoke, [tokenId, actor]);
        return rowCount !== 0;
      },
    );
  }

  /** Tokens (never their hashes), of one principal and/or tenant, or all. */
  async listTokens(filter: { principal_id?: string; tenant_id?: string } = {}): Promise<TokenRow[]> {
    const { rows } = await this.#pool.query<TokenRow>(this.#q.tokenList, [
      filter.principal_id ?? null,
      filter.tenant_id ?? null,
    ]);
    return rows;
  }

  /**
   * The caller a bearer token stands for, with this request counted in the fleet-wide window. Throws
   * `unauthenticated` (details.reason: malformed, unknown, expired, revoked) and the database's coded errors.
   */
  async authenticate(token: string, db: Queryable = this.#pool): Promise<Authenticated> {
    if (!TOKEN_FORMAT.test(token)) throw unauthenticated('malformed');
    type Row = Omit<Authenticated, 'requests' | 'window_left_s'> & {
      revoked: boolean;
      expired: boolean;
      requests: number | null;
      window_left_s: number | null;
    };
    // Named: each connection plans this statement once (its planning cost more than its execution).
    const { rows } = await db.query<Row>({
      name: `actionledger_authenticate_${this.#config.schema}`,
      text: this.#q.authenticate,
      values: [tokenHash(token), this.#config.api.rateLimit.windowS],
    });
    const row = rows[0];
    if (row === undefined) throw unauthenticated('unknown');
    if (row.revoked) throw unauthenticated('revoked');
    if (row.expired) throw unauthenticated('expired');
    return {
      token_id: row.token_id,
      principal_id: row.principal_id,
      tenant_id: row.tenant_id,
      kind: row.kind,
      roles: row.roles,
      requests: row.requests ?? 0,
      window_left_s: Math.max(1, row.window_left_s ?? 1),
    };
  }

  /**
   * Counts `more` requests of an authenticated caller in its current window besides the one authentication
   * counted (the further messages of one HTTP request); returns the window's count and seconds left, as
   * {@link authenticate} does.
   */
  async countMore(
    caller: Pick<Authenticated, 'tenant_id' | 'principal_id'>,
    more: number,
  ): Promise<Pick<Authenticated, 'requests' | 'window_left_s'>> {
    const { rows } = await this.#pool.query<{ requests: number; window_left_s: number }>(this.#q.countMore, [
      caller.tenant_id,
      caller.principal_id,
      this.#config.api.rateLimit.windowS,
      more,
    ]);
    const row = rows[0];
    return { requests: row?.requests ?? 0, window_left_s: Math.max(1, row?.window_left_s ?? 1) };
  }

  /** Deletes request windows that ended; returns how many. */
  async pruneRateWindows(): Promise<number> {
    const { rowCount } = await this.#pool.query(this.#q.rateWindowPrune, [this.#config.api.rateLimit.windowS]);
    return rowCount ?? 0;
  }
}

export function unauthenticated(reason: 'malformed' | 'unknown' | 'expired' | 'revoked'): ActionLedgerError {
  const messages = {
    malformed: 'the bearer token is malformed',
    unknown: 'the bearer token is not known',
    expired: 'the bearer token has expired',
    revoked: 'the bearer token was revoked',
  };
  return new ActionLedgerError('unauthenticated', messages[reason], { details: { reason } });
}
