/**
 * Sign-in to the operator console: one-time sign-in links and the sessions they start. Both secrets are 32
 * random bytes shown once (the link in the CLI's output, the session in an HttpOnly cookie); only their
 * sha256 is stored, so a copy of the database signs nobody in.
 *
 *   link: created --redeem (once, before expires_at)--> used
 *   session: active --expires_at passed | sign-out | a role of its principal revoked after it began--> ended
 *   OIDC session: also --the mapping (api.console.oidc) gives its claims no role, or another principal--> ended
 *
 * A link is redeemed by one conditional UPDATE (`used_at IS NULL AND expires_at > now()`), so two browsers
 * racing with the same link start one session. A session is read again on every request together with the
 * principal's current grants (revoked roles left out); a revocation recorded after the session began ends it
 * there and then, so the next request of that browser is signed out. A session started through an OpenID
 * Connect provider holds no grants of its own: its roles are what the running configuration's mapping gives the
 * claims it keeps (subject, groups), less the principal's revoked roles, worked out on every request.
 */
import { createHash, randomBytes, randomUUID } from 'node:crypto';
import { bindQueries, type Pool, type Queryable } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError } from '../core/errors.js';
import { identifier, identifierProblem } from '../core/identifier.js';
import { SQLSTATE, sqlState } from '../core/sqlstate.js';
import { oidcMapping, type Config, type OidcClaims } from '../config/index.js';
import type { AuditWriter } from '../gate/index.js';
import { audited, mustExist } from './audited.js';
import { principalQueries } from './queries.js';
import type { PrincipalKind } from './store.js';

const notRevoked = `AND NOT EXISTS (SELECT 1 FROM @schema.gate_role_revocations v
                   WHERE v.tenant_id = r.tenant_id AND v.principal_id = r.principal_id AND v.role = r.role)`;

export const consoleSessionQueries = {
  linkInsert: `
    INSERT INTO @schema.console_login_links (link_id, principal_id, link_sha256, created_by, expires_at)
    VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5)) RETURNING expires_at`,
  /** Redeems a link once: the UPDATE is the check. */
  linkRedeem: `
    UPDATE @schema.console_login_links SET used_at = now()
    WHERE link_sha256 = $1 AND used_at IS NULL AND expires_at > now()
    RETURNING link_id, principal_id`,
  linkState: `
    SELECT used_at IS NOT NULL AS used, expires_at <= now() AS expired
    FROM @schema.console_login_links WHERE link_sha256 = $1`,
  sessionInsert: `
    INSERT INTO @schema.console_sessions (session_id, principal_id, session_sha256, method, expires_at,
                                          oidc_subject, oidc_groups)
    VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5), $6, $7) RETURNING expires_at`,
  /** The roles revoked from a principal, as `tenant_id`/`role` pairs (an OIDC session's roles leave them out). */
  revokedSelect: `
    SELECT tenant_id, role FROM @schema.gate_role_revocations WHERE principal_id = $1`,
  /** The session with its principal's grants now, and whether a role was revoked since it began. */
  sessionSelect: `
    SELECT s.session_id, s.principal_id, s.method, s.expires_at, s.ended_at IS NOT NULL AS ended,
           s.expires_at <= now() AS expired, p.kind, p.display_name, s.oidc_subject, s.oidc_groups,
           CASE WHEN s.method = 'oidc' THEN
             COALESCE((SELECT jsonb_agg(jsonb_build_object('tenant_id', v.tenant_id, 'role', v.role))
                       FROM @schema.gate_role_revocations v WHERE v.principal_id = s.principal_id), '[]'::jsonb)
           END AS revoked,
           EXISTS (SELECT 1 FROM @schema.gate_role_revocations v
                   WHERE v.principal_id = s.principal_id AND v.revoked_at >= s.created_at) AS role_revoked,
           COALESCE((SELECT jsonb_agg(jsonb_build_object('tenant_id', r.tenant_id, 'role', r.role)
                                      ORDER BY r.tenant_id, r.role)
                     FROM @schema.principal_roles r WHERE r.principal_id = s.principal_id ${notRevoked}),
                    '[]'::jsonb) AS grants
    FROM @schema.console_sessions s JOIN @schema.principals p ON p.principal_id = s.principal_id
    WHERE s.session_sha256 = $1`,
  /**
   * Takes over the principal's newest live trusted-header session with a new secret (its row, id and expiry
   * stay): a cookieless request from the proxy is served by it instead of starting another.
   */
  trustedReuse: `
    UPDATE @schema.console_sessions s SET session_sha256 = $2
    WHERE s.session_id = (
      SELECT x.session_id FROM @schema.console_sessions x
      WHERE x.principal_id = $1 AND x.method = 'trusted_header' AND x.ended_at IS NULL AND x.expires_at > now()
        AND NOT EXISTS (SELECT 1 FROM @schema.gate_role_revocations v
                        WHERE v.principal_id = x.principal_id AND v.revoked_at >= x.created_at)
      ORDER BY x.created_at DESC LIMIT 1 FOR UPDATE)
    RETURNING s.session_id`,
  /** The principal an OIDC subject is bound to, and the subject bound to a principal (sql/0021). */
  subjectBinding: `
    SELECT issuer, subject, principal_id FROM @schema.console_oidc_subjects
    WHERE (issuer = $1 AND subject = $2) OR principal_id = $3`,
  /** No ON CONFLICT: a race between two sign-ins binding the same subject or principal fails one of them. */
  subjectBind: `
    INSERT INTO @schema.console_oidc_subjects (issuer, subject, principal_id) VALUES ($1, $2, $3)`,
  sessionEnd: `
    UPDATE @schema.console_sessions SET ended_at = now(), ended_reason = $2
    WHERE session_id = $1 AND ended_at IS NULL RETURNING session_id`,
} as const;

/** A signed-in person: who, and the roles held in each tenant now. */
export interface ConsoleSession {
  session_id: string;
  principal_id: string;
  display_name: string;
  kind: PrincipalKind;
  method: 'link' | 'trusted_header' | 'oidc';
  expires_at: Date;
  /** Tenant -> the roles held there (revoked ones left out), tenants in order. */
  grants: ReadonlyMap<string, readonly string[]>;
}

export interface CreatedLoginLink {
  link_id: string;
  /** Shown once; only its sha256 is stored. */
  secret: string;
  principal_id: string;
  expires_at: string;
}

type Revoked = { tenant_id: string; role: string };

const SECRET = /^[A-Za-z0-9_-]{43}$/;
const sha = (s: string) => createHash('sha256').update(s, 'utf8').digest('hex');

/** The console is for people: a service principal (an agent) gets no sign-in link. */
function notAPerson(id: string, kind: string | undefined): ActionLedgerError {
  return new ActionLedgerError(
    'permission_denied',
    `${id} is a ${kind ?? 'principal'} principal, not a person: sign-in links are for people only`,
    { details: { principal_id: id, reason: 'not_a_person', kind } },
  );
}

function notMapped(id: string, reason: string, message: string): ActionLedgerError {
  return new ActionLedgerError('oidc_not_mapped', message, { details: { principal_id: id, reason } });
}

/**
 * A principal id made from a provider's claim (not named by a subject rule): a narrow ASCII set, so it cannot
 * look like another (`alice` spelled with a Cyrillic a, U+0430) nor like a break-glass actor (`break-glass:NAME`, as the CLI
 * records one, bin/commands/acting.ts: its `:` is outside the set).
 */
export const CLAIMED_PRINCIPAL = /^[A-Za-z0-9][A-Za-z0-9._@+-]{0,127}$/;

/** Who an OpenID Connect provider vouched for, and how the mapping picked the principal. */
export interface OidcSignIn {
  /** The provider's issuer and `sub`: the person. */
  issuer: string;
  claims: OidcClaims;
  /** True when a subject rule names the principal, false when it is the principal claim's value. */
  named: boolean;
}

function signedOut(reason: string, message: string): ActionLedgerError {
  return new ActionLedgerError('unauthenticated', message, { details: { reason } });
}

export class ConsoleSessions {
  readonly #pool: Pool;
  readonly #q: Readonly<typeof consoleSessionQueries>;
  readonly #pq: Readonly<typeof principalQueries>;
  readonly #audit: AuditWriter;
  readonly #config: Config;

  constructor(config: Config, pool: Pool, audit: AuditWriter) {
    this.#config = config;
    this.#pool = pool;
    this.#audit = audit;
    this.#q = bindQueries(consoleSessionQueries, config.schemaQuoted);
    this.#pq = bindQueries(principalQueries, config.schemaQuoted);
  }

  /**
   * A one-time sign-in link secret for a person (kind `person`) that holds at least one role, valid
   * `api.console.login_link_ttl_s`. Audited (action `token`, outcome `login_link`). Throws `not_found`,
   * `permission_denied` (details.reason `not_a_person` for a service principal, `no_role` without a role
   * anywhere), `invalid_context`, and the database's coded errors.
   */
  async createLoginLink(principalId: string, actor: string): Promise<CreatedLoginLink> {
    const id = identifier('principal_id', principalId);
    const linkId = randomUUID();
    const secret = randomBytes(32).toString('base64url');
    let expires = '';
    await audited(
      this.#pool,
      this.#audit,
      { action: 'token', outcome: 'login_link', context: { principal_id: id }, subjectId: linkId },
      actor,
      async (c) => {
        await mustExist(c, this.#pq, id);
        const kind = (await c.query<{ kind: string }>(this.#pq.principalSelect, [id])).rows[0]?.kind;
        if (kind !== 'person') throw notAPerson(id, kind);
        const grants = await c.query(this.#pq.principalList, [null]);
        const mine = (grants.rows as { principal_id: string; roles: unknown[] }[]).find((p) => p.principal_id === id);
        if (mine === undefined || mine.roles.length === 0)
          throw new ActionLedgerError('permission_denied', `${id} holds no role in any tenant: grant one first`, {
            details: { principal_id: id, reason: 'no_role' },
          });
        const { rows } = await c.query<{ expires_at: Date }>(this.#q.linkInsert, [
          linkId,
          id,
          sha(secret),
          identifier('actor', actor),
          this.#config.api.console.loginLinkTtlS,
        ]);
        expires = rows[0]?.expires_at.toISOString() ?? '';
      },
      () => ({ expires_at: expires }),
    );
    return { link_id: linkId, secret, principal_id: id, expires_at: expires };
  }

  /**
   * Exchanges a link secret for a new session (once). Throws `unauthenticated` with details.reason
   * `malformed`, `unknown`, `used` or `expired`.
   */
  async redeemLink(secret: string): Promise<{ token: string; session_id: string; principal_id: string }> {
    if (!SECRET.test(secret)) throw signedOut('malformed', 'this sign-in link is malformed');
    try {
      const { rows } = await this.#pool.query<{ link_id: string; principal_id: string }>(this.#q.linkRedeem, [
        sha(secret),
      ]);
      const row = rows[0];
      if (row === undefined) {
        const state = (await this.#pool.query<{ used: boolean; expired: boolean }>(this.#q.linkState, [sha(secret)]))
          .rows[0];
        if (state === undefined) throw signedOut('unknown', 'this sign-in link is not known');
        if (state.used) throw signedOut('used', 'this sign-in link was used already: ask for a new one');
        throw signedOut('expired', 'this sign-in link has expired: ask for a new one');
      }
      return { ...(await this.#start(row.principal_id, 'link', row.link_id)), principal_id: row.principal_id };
    } catch (err) {
      throw asActionLedgerError(err);
    }
  }

  /**
   * A session for the person an authenticating proxy vouched for. Throws `unauthenticated` (details.reason
   * `unknown_principal`, or `not_a_person` when the header names a service principal). With `reuse`, the
   * principal's live trusted-header session, if there is one, is taken over under a new secret instead of
   * starting another (not audited again), so cookieless requests do not pile up sessions.
   */
  async startTrusted(principalId: string, reuse = false): Promise<{ token: string; session_id: string }> {
    const id = identifier('principal_id', principalId);
    const found = await this.#pool.query<{ kind: string }>(this.#pq.principalSelect, [id]).catch((err: unknown) => {
      throw asActionLedgerError(err);
    });
    if (found.rowCount === 0) throw signedOut('unknown_principal', 'the proxy named a principal that is not known');
    if (found.rows[0]?.kind !== 'person')
      throw signedOut('not_a_person', 'the proxy named a service principal: only a person signs in to the console');
    if (reuse) {
      const token = randomBytes(32).toString('base64url');
      const { rows } = await this.#pool
        .query<{ session_id: string }>(this.#q.trustedReuse, [id, sha(token)])
        .catch((err: unknown) => {
          throw asActionLedgerError(err);
        });
      const taken = rows[0];
      if (taken !== undefined) return { token, session_id: taken.session_id };
    }
    return this.#start(id, 'trusted_header', null);
  }

  /**
   * A session for a person an OpenID Connect provider vouched for (server/console/oidc.ts checked the provider's
   * answer): the principal is added as a person when it is not known yet (audited, by `oidc`), the subject
   * (issuer and sub) is bound to it at its first sign-in, and the session keeps the claims the mapping reads on
   * every request. Throws `oidc_not_mapped` with details.reason `principal_invalid` (a claimed id outside
   * {@link CLAIMED_PRINCIPAL}), `not_a_person` (the principal is a service), `subject_bound_elsewhere` (this
   * subject signed in before as another principal), `principal_bound_elsewhere` (another subject signed in before
   * as this principal), `principal_not_oidc` (a claim names an existing principal the provider did not add, which
   * only a subject rule naming it may sign in as), `roles_revoked` (every role the mapping gives was revoked);
   * `invalid_context` for a principal id that is no identifier, and the database's coded errors.
   */
  async startOidc(
    principalId: string,
    displayName: string,
    who: OidcSignIn,
  ): Promise<{ token: string; session_id: string }> {
    const id = identifier('principal_id', principalId);
    if (!who.named && !CLAIMED_PRINCIPAL.test(id))
      throw notMapped(
        id,
        'principal_invalid',
        'the identity provider’s claim is not a usable principal id (letters, digits and . _ @ + - only)',
      );
    const name = identifierProblem(displayName) === null ? displayName.normalize('NFC') : id;
    const { claims } = who;
    return this.#start(id, 'oidc', null, {
      claims,
      before: async (c) => {
        const added = (await c.query(this.#pq.principalInsert, [id, 'person', name, 'oidc'])).rowCount === 1;
        if (added)
          await this.#audit.decision(c, {
            action: 'principal',
            outcome: 'added',
            context: { principal_id: id },
            detail: { by: 'oidc', kind: 'person' },
          });
        const kind = (await c.query<{ kind: string }>(this.#pq.principalSelect, [id])).rows[0]?.kind;
        if (kind !== 'person')
          throw notMapped(id, 'not_a_person', `${id} is a ${kind ?? 'service'} principal, not a person`);
        type Binding = { issuer: string; subject: string; principal_id: string };
        const bindings = (await c.query<Binding>(this.#q.subjectBinding, [who.issuer, claims.subject, id])).rows;
        const mine = bindings.find((b) => b.issuer === who.issuer && b.subject === claims.subject);
        if (mine !== undefined && mine.principal_id !== id)
          throw notMapped(
            id,
            'subject_bound_elsewhere',
            `you signed in before as ${mine.principal_id}: one person is one principal, so you cannot sign in as ${id}`,
          );
        if (mine === undefined && bindings.length > 0)
          throw notMapped(
            id,
            'principal_bound_elsewhere',
            `${id} belongs to another person of the identity provider: you cannot sign in as it`,
          );
        if (mine === undefined && !added && !who.named)
          throw notMapped(
            id,
            'principal_not_oidc',
            `${id} is an existing principal the identity provider did not add: only a subject rule naming it signs in as it`,
          );
        if (mine === undefined)
          await c.query(this.#q.subjectBind, [who.issuer, claims.subject, id]).catch((err: unknown) => {
            // Two first sign-ins at once binding one subject (or one principal): the later one loses.
            if (sqlState(err) !== SQLSTATE.uniqueViolation) throw err;
            throw notMapped(id, 'subject_bound_elsewhere', 'another sign-in bound you (or this principal) just now');
          });
        const revoked = (await c.query<Revoked>(this.#q.revokedSelect, [id])).rows;
        if (this.#oidcGrants(claims, revoked).size === 0)
          throw notMapped(id, 'roles_revoked', `every role the mapping gives ${id} is revoked`);
      },
    });
  }

  /** The roles the mapping gives these claims now, less the revoked ones; tenants with none left out. */
  #oidcGrants(claims: OidcClaims, revoked: readonly Revoked[]): Map<string, string[]> {
    const out = new Map<string, string[]>();
    for (const [tenant, roles] of oidcMapping(this.#config.api.console.oidc, claims).grants) {
      const kept = roles.filter((r) => !revoked.some((v) => v.tenant_id === tenant && v.role === r));
      if (kept.length > 0) out.set(tenant, kept);
    }
    return out;
  }

  async #start(
    principalId: string,
    method: ConsoleSession['method'],
    linkId: string | null,
    oidc?: { claims: OidcClaims; before: (c: Queryable) => Promise<void> },
  ): Promise<{ token: string; session_id: string }> {
    const token = randomBytes(32).toString('base64url');
    const sessionId = randomUUID();
    await audited(
      this.#pool,
      this.#audit,
      {
        action: 'token',
        outcome: 'console_signed_in',
        context: { principal_id: principalId },
        subjectId: sessionId,
        detail: { method, link_id: linkId, ...(oidc === undefined ? {} : { oidc_subject: oidc.claims.subject }) },
      },
      principalId,
      async (c) => {
        await oidc?.before(c);
        await c.query(this.#q.sessionInsert, [
          sessionId,
          principalId,
          sha(token),
          method,
          this.#config.api.console.sessionTtlS,
          oidc?.claims.subject ?? null,
          oidc === undefined ? null : [...oidc.claims.groups],
        ]);
      },
    );
    return { token, session_id: sessionId };
  }

  /**
   * The session a cookie stands for, with the principal's grants read now (for an OIDC session, what the
   * mapping gives its claims now, less revoked roles). A session past its time, one whose principal lost a role
   * after it began, or an OIDC session the mapping no longer gives a role (or maps to another principal), is
   * ended here. Throws `unauthenticated` (details.reason `malformed`, `unknown`, `ended`, `expired`,
   * `role_revoked`, `not_mapped`).
   */
  async authenticate(token: string): Promise<ConsoleSession> {
    if (!SECRET.test(token)) throw signedOut('malformed', 'you are not signed in');
    type Row = Omit<ConsoleSession, 'grants'> & {
      ended: boolean;
      expired: boolean;
      role_revoked: boolean;
      grants: { tenant_id: string; role: string }[];
      oidc_subject: string | null;
      oidc_groups: string[] | null;
      revoked: Revoked[] | null;
    };
    const row = (await this.#pool.query<Row>(this.#q.sessionSelect, [sha(token)])).rows[0];
    if (row === undefined) throw signedOut('unknown', 'you are not signed in');
    if (row.ended) throw signedOut('ended', 'this session has ended: sign in again');
    let grants = new Map<string, string[]>();
    if (row.method === 'oidc') {
      const claims = { subject: row.oidc_subject ?? '', groups: row.oidc_groups ?? [] };
      const named = oidcMapping(this.#config.api.console.oidc, claims).principal;
      grants = this.#oidcGrants(claims, row.revoked ?? []);
      if (grants.size === 0 || (named !== null && named !== row.principal_id)) row.ended = true;
    } else {
      for (const g of row.grants) grants.set(g.tenant_id, [...(grants.get(g.tenant_id) ?? []), g.role]);
    }
    for (const [cause, message] of [
      ['expired', 'your session has expired: sign in again'],
      ['role_revoked', 'a role of yours was revoked, which ends your session: sign in again'],
      ['not_mapped', 'the identity provider mapping gives you no role here any more, which ends your session'],
    ] as const) {
      if (cause === 'expired' ? row.expired : cause === 'role_revoked' ? row.role_revoked : row.ended) {
        await this.#pool.query(this.#q.sessionEnd, [row.session_id, cause]);
        throw signedOut(cause, message);
      }
    }
    return {
      session_id: row.session_id,
      principal_id: row.principal_id,
      display_name: row.display_name,
      kind: row.kind,
      method: row.method,
      expires_at: row.expires_at,
      grants,
    };
  }

  /** Signs a session out; false when it had ended already. */
  async end(sessionId: string, reason = 'signed_out'): Promise<boolean> {
    const { rowCount } = await this.#pool.query(this.#q.sessionEnd, [sessionId, reason]);
    return rowCount === 1;
  }
}
