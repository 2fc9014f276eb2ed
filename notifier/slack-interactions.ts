/**
 * A click on an approval message's Approve or Reject button, as Slack posts it to the interactivity endpoint
 * (`application/x-www-form-urlencoded`, one field `payload` holding JSON). In order:
 *
 *   1. the destination must be a configured Slack app; the request's signature and timestamp are checked with
 *      its signing secret (notifier/signing.ts): otherwise 401 `unauthenticated`, nothing read further
 *   2. the payload must be a `block_actions` from the destination's workspace (the payload's team and, when
 *      given, the user's own team), on a message this system posted (looked up by channel and message ts):
 *      the approval and the envelope hash come from that record, never from the click
 *   3. the Slack user must be linked to a principal of the approval's tenant (`actionledger principal
 *      slack-link`) that still holds an active credential there (an API token or certificate, or an open
 *      console session); otherwise the click is refused and the user told why, privately
 *   4. the gate decides, exactly as for the console and the API: `approve(id, hash the message showed,
 *      reviewer)` or `reject`; four eyes, approver roles, revocation, expiry and `reapproval_required` are the
 *      gate's. The person is told the outcome privately: a refused approval with the gate's blockers for them
 *      (`gate.approvals.blockers`, read before the click is decided: each code and why), or its own message
 *      when there are none; the message itself is updated through the notification outbox (the approval's
 *      status change writes the event)
 *
 * Every signed click, refused or not, is an audit row (`notification`, `slack_click:<outcome>`); the gate
 * writes its own decision row as well. A request whose signature does not hold is logged and counted only.
 */
import { Counter, type Registry } from 'prom-client';
import type { Config } from '../config/index.js';
import { bindQueries, withTransaction, type Pool } from '../db/index.js';
import { ActionLedgerError, asActionLedgerError, type ErrorCode } from '../core/errors.js';
import { parseStrictJson, type JsonObject } from '../core/json.js';
import type { Logger } from '../core/log.js';
import type { ApprovalBlocker, AuditWriter, Gate, GateResult } from '../gate/index.js';
import type { PrincipalStore } from '../principals/index.js';
import { notifierQueries } from './queries.js';
import { APPROVE_ACTION, REJECT_ACTION, txt } from './render.js';
import { verifySlackRequest } from './signing.js';
import { destinationClients, slackCall, type DestinationClient } from './transport.js';

export interface SlackInteractionsOptions {
  config: Config;
  pool: Pool;
  gate: Gate;
  principals: PrincipalStore;
  audit: AuditWriter;
  log: Logger;
  env: NodeJS.ProcessEnv;
  /** Where `actionledger_slack_requests_unauthenticated_total{destination,reason}` is registered (else unexposed). */
  registry?: Registry;
  /** Seconds since the epoch; tests never need it, it exists so the window is the one clock read. */
  now?: () => number;
}

/**
 * What the endpoint answers: Slack needs a 200 for anything it sent correctly, the refusal goes to the user. A
 * request refused before it is read answers its code's status, as the API's table has it: 404 `not_found`, 401
 * `unauthenticated`, 422 `invalid_request`.
 */
export interface SlackAnswer {
  status: number;
  body: {
    ok: boolean;
    outcome?: string;
    error?: ErrorCode;
    message: string;
    /** With a refused approval: why this person cannot approve it, as the gate reads it (told to them too). */
    blockers?: ApprovalBlocker[];
  };
}

interface Click {
  action: 'approve' | 'reject';
  userId: string;
  teamId: string;
  /** The clicking user's own workspace, when Slack says (a guest from another one, in a shared channel). */
  userTeamId: string | null;
  channel: string;
  messageTs: string;
  approvalId: string | null;
}

const str = (v: unknown): string | null => (typeof v === 'string' && v.length > 0 && v.length <= 200 ? v : null);
const obj = (v: unknown): JsonObject =>
  v !== null && typeof v === 'object' && !Array.isArray(v) ? (v as JsonObject) : {};

/** The fields of a block_actions payload this endpoint acts on; throws `invalid_request` when one is missing. */
function clickOf(payload: JsonObject): Click {
  const bad = (what: string) => new ActionLedgerError('invalid_request', `the Slack payload has no ${what}`);
  if (payload.type !== 'block_actions') throw bad('block_actions type');
  const actions = Array.isArray(payload.actions) ? payload.actions : [];
  if (actions.length !== 1) throw bad('single action');
  const a = obj(actions[0]);
  const action = a.action_id === APPROVE_ACTION ? 'approve' : a.action_id === REJECT_ACTION ? 'reject' : null;
  if (action === null) throw bad('known action');
  const user = obj(payload.user);
  const container = obj(payload.container);
  const userId = str(user.id);
  const userTeamId = str(user.team_id);
  const teamId = str(obj(payload.team).id) ?? userTeamId;
  const channel = str(container.channel_id) ?? str(obj(payload.channel).id);
  const messageTs = str(container.message_ts) ?? str(obj(payload.message).ts);
  if (userId === null || teamId === null) throw bad('user or team');
  if (channel === null || messageTs === null) throw bad('message');
  let approvalId: string | null = null;
  try {
    approvalId = str(obj(JSON.parse(txt(a.value))).approval_id);
  } catch {
    approvalId = null;
  }
  return { action, userId, teamId, userTeamId, channel, messageTs, approvalId };
}

/**
 * The fields of a signed form body, read strictly: the bytes must be UTF-8 and every percent-escape must decode
 * to UTF-8 (neither is replaced with U+FFFD), and each field comes once. A repeated field (`payload` twice) is
 * refused rather than one of them taken: the signature covers both, and which the sender meant is not said.
 * Throws `invalid_request`.
 */
export function signedForm(rawBody: Buffer): Map<string, string> {
  let text: string;
  try {
    text = new TextDecoder('utf-8', { fatal: true }).decode(rawBody);
  } catch {
    throw new ActionLedgerError('invalid_request', 'the Slack request body is not valid UTF-8');
  }
  const out = new Map<string, string>();
  for (const part of text.split('&')) {
    if (part === '') continue;
    const eq = part.indexOf('=');
    const [rawName, rawValue] = eq === -1 ? [part, ''] : [part.slice(0, eq), part.slice(eq + 1)];
    let name: string;
    let value: string;
    try {
      name = decodeURIComponent(rawName.replaceAll('+', ' '));
      value = decodeURIComponent(rawValue.replaceAll('+', ' '));
    } catch {
      throw new ActionLedgerError('invalid_request', 'the Slack request body has a malformed percent-escape');
    }
    if (out.has(name))
      throw new ActionLedgerError(
        'invalid_request',
        `the Slack request sent the field ${JSON.stringify(name.slice(0, 64))} more than once`,
        {
          details: { field: name.slice(0, 64) },
        },
      );
    out.set(name, value);
  }
  return out;
}

/**
 * What a refused click tells the person: the gate's code, and why they cannot approve this (the gate's blockers,
 * each its code and text, read before the click was decided) or, with none, the gate's own message.
 */
export function refusalText(error: ErrorCode, message: string, blockers: readonly ApprovalBlocker[]): string {
  const why = blockers.length === 0 ? message : blockers.map((b) => `${b.code}: ${b.message}`).join('; ');
  return `Refused (${error}): ${why}. Nothing was approved by this click.`;
}

export class SlackInteractions {
  readonly #o: SlackInteractionsOptions;
  readonly #q: Readonly<typeof notifierQueries>;
  readonly #clients: ReadonlyMap<string, DestinationClient>;
  readonly #unauthenticated: Counter<'destination' | 'reason'>;

  /** Reads the Slack destinations' secrets now: throws `secret_missing` or `config_invalid`. */
  constructor(options: SlackInteractionsOptions) {
    this.#o = options;
    this.#unauthenticated = new Counter({
      name: 'actionledger_slack_requests_unauthenticated_total',
      help: 'Requests to the Slack interactivity endpoint refused before their signature held, by destination and reason',
      labelNames: ['destination', 'reason'],
      registers: options.registry === undefined ? [] : [options.registry],
    });
    this.#q = bindQueries(notifierQueries, options.config.schemaQuoted);
    const slackOnly = {
      ...options.config.notifications,
      destinations: new Map([...options.config.notifications.destinations].filter(([, d]) => d.type === 'slack')),
    };
    this.#clients = destinationClients(slackOnly, options.env);
  }

  /** Handles one interactivity request for `destination`; never throws for what the request contains. */
  async handle(
    destination: string,
    headers: { signature: string | undefined; timestamp: string | undefined },
    rawBody: Buffer,
  ): Promise<SlackAnswer> {
    const client = this.#clients.get(destination);
    if (client === undefined || client.slack === null)
      return { status: 404, body: { ok: false, error: 'not_found', message: 'no such Slack destination' } };
    const now = this.#o.now?.() ?? Math.floor(Date.now() / 1000);
    const verdict = verifySlackRequest(client.slack.signingSecret, headers, rawBody, now);
    if (!verdict.ok) {
      // Anyone can send these: a log line and a counter, never an audit row (which an unauthenticated sender
      // could otherwise add without bound).
      this.#unauthenticated.inc({ destination, reason: verdict.reason });
      this.#o.log.warn({ destination, reason: verdict.reason }, 'unauthenticated Slack request refused');
      return {
        status: 401,
        body: { ok: false, error: 'unauthenticated', message: `the Slack request was refused (${verdict.reason})` },
      };
    }
    let click: Click;
    try {
      const payload = signedForm(rawBody).get('payload');
      if (payload === undefined) throw new ActionLedgerError('invalid_request', 'the Slack request has no payload');
      click = clickOf(parseStrictJson(payload, { requireObject: true }) as JsonObject);
    } catch (err) {
      const e = asActionLedgerError(err);
      await this.#audit('invalid', null, { destination, code: e.code });
      return { status: 422, body: { ok: false, error: 'invalid_request', message: e.message } };
    }
    try {
      return await this.#decide(client, click);
    } catch (err) {
      const e = asActionLedgerError(err);
      this.#o.log.warn({ code: e.code, err, destination }, 'Slack interaction failed');
      return { status: 200, body: { ok: false, error: e.code, message: 'the click could not be processed' } };
    }
  }

  async #decide(client: DestinationClient, click: Click): Promise<SlackAnswer> {
    const d = client.destination;
    const detail = {
      destination: d.name,
      slack_user: click.userId,
      slack_team: click.teamId,
      ...(click.userTeamId === null || click.userTeamId === click.teamId ? {} : { slack_user_team: click.userTeamId }),
      action: click.action,
    };
    const refuse = async (error: ErrorCode, message: string, tenant: string | null): Promise<SlackAnswer> => {
      await this.#audit(error, tenant === null ? null : { tenant_id: tenant }, detail);
      await this.#tell(client, click, message);
      return { status: 200, body: { ok: false, error, message } };
    };
    // Both the workspace the click came through and the user's own must be the destination's: a user id is
    // only unique within its workspace, so a guest from another one could carry a linked user's id.
    if (d.type !== 'slack' || click.teamId !== d.teamId || (click.userTeamId !== null && click.userTeamId !== d.teamId))
      return refuse('permission_denied', 'This Slack workspace is not the one this approval channel belongs to.', null);
    const m = (
      await this.#o.pool.query<{ approval_id: string; tenant_id: string; envelope_sha256: string }>(
        this.#q.slackMessageAt,
        [d.name, click.channel, click.messageTs],
      )
    ).rows[0];
    if (m === undefined || (click.approvalId !== null && click.approvalId !== m.approval_id))
      return refuse('not_found', 'This message is not an approval request actionledger posted.', null);
    const principal = (
      await this.#o.pool.query<{ principal_id: string }>(this.#q.slackUserPrincipal, [
        m.tenant_id,
        click.teamId,
        click.userId,
      ])
    ).rows[0]?.principal_id;
    if (principal === undefined)
      return refuse(
        'permission_denied',
        `Your Slack account (${click.userId}) is not linked to an actionledger principal in tenant ${m.tenant_id}, so your click was not counted. An operator links it with: actionledger principal slack-link <principal> ${click.userId} --tenant ${m.tenant_id} --team ${click.teamId}`,
        m.tenant_id,
      );
    // A link is not a credential: it speaks only for a principal that could still sign in some other way, so
    // revoking a principal's last token, certificate and console session ends its Slack clicks too.
    const active = (
      await this.#o.pool.query<{ active: boolean }>(this.#q.principalCanAuthenticate, [principal, m.tenant_id])
    ).rows[0]?.active;
    if (active !== true)
      return refuse(
        'permission_denied',
        `The principal your Slack account is linked to (${principal}) holds no active credential in tenant ${m.tenant_id} (every API token and certificate is revoked or expired, and no console session is open), so your click was not counted.`,
        m.tenant_id,
      );
    const held = (await this.#o.principals.rolesHeld(principal, m.tenant_id)).sort();
    const reviewer = { tenant_id: m.tenant_id, principal_id: principal, role: await this.#role(m, held) };
    // Read before the gate decides (its decision may change the approval): what stands in this person's way.
    const blockers =
      click.action === 'approve'
        ? await this.#o.gate.approvals
            .blockers(m.approval_id, { tenant_id: m.tenant_id, principal_id: principal, roles: held })
            .catch((): ApprovalBlocker[] => [])
        : [];
    const r: GateResult =
      click.action === 'approve'
        ? await this.#o.gate.approve(m.approval_id, m.envelope_sha256, reviewer)
        : await this.#o.gate.reject(m.approval_id, reviewer, `rejected in Slack by ${principal}`);
    const outcome = r.ok ? r.status : r.error;
    await this.#audit(
      outcome,
      { tenant_id: m.tenant_id, principal_id: principal, role: reviewer.role },
      {
        ...detail,
        approval_id: m.approval_id,
        envelope_sha256: m.envelope_sha256,
      },
    );
    if (r.ok) {
      await this.#tell(client, click, `Done: ${r.message}.`);
      return { status: 200, body: { ok: true, outcome, message: r.message } };
    }
    const why = refusalText(r.error, r.message, blockers);
    await this.#tell(client, click, why);
    return {
      status: 200,
      body: { ok: false, error: r.error, message: r.message, ...(blockers.length === 0 ? {} : { blockers }) },
    };
  }

  /** The role the principal decides with: one it holds that the tool lets approve (else one it holds: refused). */
  async #role(m: { approval_id: string; tenant_id: string }, held: readonly string[]): Promise<string> {
    const view = await this.#o.gate.approvals.show(m.approval_id, { tenant_id: m.tenant_id }).catch(() => null);
    const tool = view === null ? undefined : this.#o.gate.tool(txt(view.envelope.tool));
    return held.find((r) => tool?.approverRoles.has(r) === true) ?? held[0] ?? 'none';
  }

  /** Tells the clicking user privately (best effort: the decision stands whether or not Slack takes it). */
  async #tell(client: DestinationClient, click: Click, text: string): Promise<void> {
    const d = this.#o.config.notifications.delivery;
    const r = await slackCall(
      client,
      'chat.postEphemeral',
      { channel: click.channel, user: click.userId, text },
      { timeoutMs: d.timeoutMs, maxBytes: d.maxResponseBytes },
    );
    if (!r.ok) this.#o.log.warn({ error: r.error }, 'Slack ephemeral reply failed');
  }

  async #audit(
    outcome: string,
    context: { tenant_id: string; principal_id?: string; role?: string } | null,
    detail: Record<string, unknown>,
  ): Promise<void> {
    await this.#o.audit.after({
      action: 'notification',
      outcome: `slack_click:${outcome}`,
      context: context ?? {},
      subjectId: typeof detail.approval_id === 'string' ? detail.approval_id : null,
      detail,
    });
  }
}

/**
 * Links a Slack user of a workspace to a principal in a tenant (replacing an earlier link), with its audit
 * row in the same transaction (`audit_unavailable`: nothing linked).
 */
export async function linkSlackUser(
  config: Config,
  pool: Pool,
  audit: AuditWriter,
  link: { tenant_id: string; team_id: string; slack_user_id: string; principal_id: string; actor: string },
): Promise<void> {
  const q = bindQueries(notifierQueries, config.schemaQuoted);
  await withTransaction(pool, async (c) => {
    await c.query(q.slackUserLink, [link.tenant_id, link.team_id, link.slack_user_id, link.principal_id, link.actor]);
    await audit.decision(c, {
      action: 'principal',
      outcome: 'slack_linked',
      context: { tenant_id: link.tenant_id, principal_id: link.actor },
      subjectId: link.principal_id,
      detail: { slack_team: link.team_id, slack_user: link.slack_user_id, principal_id: link.principal_id },
    });
  });
}

/** Removes a link (audited); returns whether there was one. */
export async function unlinkSlackUser(
  config: Config,
  pool: Pool,
  audit: AuditWriter,
  link: { tenant_id: string; team_id: string; slack_user_id: string; actor: string },
): Promise<boolean> {
  const q = bindQueries(notifierQueries, config.schemaQuoted);
  return withTransaction(pool, async (c) => {
    const n = (await c.query(q.slackUserUnlink, [link.tenant_id, link.team_id, link.slack_user_id])).rowCount ?? 0;
    await audit.decision(c, {
      action: 'principal',
      outcome: n > 0 ? 'slack_unlinked' : 'slack_not_linked',
      context: { tenant_id: link.tenant_id, principal_id: link.actor },
      detail: { slack_team: link.team_id, slack_user: link.slack_user_id },
    });
    return n > 0;
  });
}
